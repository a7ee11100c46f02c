"""The schema registry's REST door, as Confluent's clients use it: confluent-kafka's own
SchemaRegistryClient and serializers against a real controller (its metadata log a Delta table
under tmp_path) and the real HTTP server, with no Spark.

- ids and versions as Confluent gives them: the same schema, written any way, keeps its id under
  every subject, and a subject's versions grow by one;
- compatibility levels checked on register (BACKWARD by default), per subject or global, and the
  compatibility endpoint that answers without registering;
- soft and permanent deletes, references between subjects, Confluent's error codes;
- everything acknowledged survives a controller restart (replayed from the metadata log).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka.schema_registry import (
    Schema,
    SchemaReference,
    SchemaRegistryClient,
    SchemaRegistryError,
)

from deltabus import config as cfg
from deltabus.cluster.controller import Controller
from deltabus.rpc.schema_registry_http import SchemaRegistryServer
from deltabus.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from deltabus.security.scram import make_credential


def record(name: str, *fields: tuple[str, Any], default: dict[str, Any] | None = None) -> str:
    """An Avro record schema's text; a field is (name, type), with its default if in
    `default`."""
    out = []
    for field_name, kind in fields:
        entry = {"name": field_name, "type": kind}
        if default and field_name in default:
            entry["default"] = default[field_name]
        out.append(entry)
    return json.dumps({"type": "record", "name": name, "namespace": "shop", "fields": out})


PAYMENT_V1 = record("Payment", ("id", "string"), ("amount", "double"))
# a field added with a default: BACKWARD (the new schema reads old data)
PAYMENT_V2 = record("Payment", ("id", "string"), ("amount", "double"), ("currency", "string"),
                    default={"currency": "EUR"})
# a field added without a default: the new schema cannot read old data
PAYMENT_NO_DEFAULT = record("Payment", ("id", "string"), ("amount", "double"),
                            ("country", "string"))


class Registry:
    """A controller and the REST door over it; `restart` replays the metadata log anew."""

    def __init__(self, root: Path) -> None:
        self.config = cfg.ClusterConfig(root=str(root), port=0, kafka_port=-1)
        self._start()

    def _start(self) -> None:
        self.controller = Controller(self.config)
        self.server = SchemaRegistryServer(self.controller.schema_registry, "127.0.0.1",
                                           0).start()
        self.client = SchemaRegistryClient({"url": self.server.url})

    def restart(self) -> None:
        self.server.stop()
        self._start()

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, JSON answer) of a raw request, for what the client library hides."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    r = Registry(tmp_path)
    yield r
    r.server.stop()


def avro(text: str, references: list[SchemaReference] | None = None) -> Schema:
    return Schema(text, "AVRO", references or [])


def error_code(call: Any) -> int:
    with pytest.raises(SchemaRegistryError) as raised:
        call()
    return raised.value.error_code


def test_the_same_schema_keeps_its_id_under_every_subject_and_versions_grow_by_one(
        registry: Registry) -> None:
    client = registry.client
    first = client.register_schema_full_response("payments-value", avro(PAYMENT_V1))
    assert (first.schema_id, first.version) == (1, 1)
    spaced = json.dumps(json.loads(PAYMENT_V1), indent=4)  # the same schema, written otherwise
    assert client.register_schema("payments-value", avro(spaced)) == 1
    assert client.get_versions("payments-value") == [1]  # no new version
    assert client.register_schema("refunds-value", avro(PAYMENT_V1)) == 1
    second = client.register_schema_full_response("payments-value", avro(PAYMENT_V2))
    assert (second.schema_id, second.version) == (2, 2)
    assert client.get_versions("payments-value") == [1, 2]
    assert client.get_subjects() == ["payments-value", "refunds-value"]
    latest = client.get_latest_version("payments-value")
    assert (latest.schema_id, latest.version) == (2, 2)
    assert json.loads(latest.schema.schema_str) == json.loads(PAYMENT_V2)
    assert json.loads(client.get_schema(1).schema_str) == json.loads(PAYMENT_V1)
    found = client.lookup_schema("payments-value", avro(PAYMENT_V1))
    assert (found.schema_id, found.version) == (1, 1)
    assert registry.http("GET", "/schemas/ids/1/versions") == (200, [
        {"subject": "payments-value", "version": 1}, {"subject": "refunds-value", "version": 1}])
    assert registry.http("GET", "/schemas/types")[1] == ["AVRO", "JSON", "PROTOBUF"]


def test_an_incompatible_schema_is_refused_at_the_subjects_level_and_nothing_is_written(
        registry: Registry) -> None:
    client = registry.client
    client.register_schema("payments-value", avro(PAYMENT_V1))
    assert client.get_compatibility() == "BACKWARD"  # Confluent's default
    assert not client.test_compatibility("payments-value", avro(PAYMENT_NO_DEFAULT))
    assert client.test_compatibility("payments-value", avro(PAYMENT_V2))
    status, answer = registry.http(
        "POST", "/compatibility/subjects/payments-value/versions/latest?verbose=true",
        {"schema": PAYMENT_NO_DEFAULT})
    assert status == 200 and answer["is_compatible"] is False
    assert any("country" in message for message in answer["messages"])
    assert error_code(lambda: client.register_schema(
        "payments-value", avro(PAYMENT_NO_DEFAULT))) == 409
    assert client.get_versions("payments-value") == [1]
    client.set_compatibility("payments-value", "NONE")  # this subject only
    assert client.get_compatibility("payments-value") == "NONE"
    assert client.get_compatibility() == "BACKWARD"
    assert client.register_schema("payments-value", avro(PAYMENT_NO_DEFAULT)) == 2
    client.register_schema("orders-value", avro(PAYMENT_V1))  # another subject: BACKWARD
    assert error_code(lambda: client.register_schema(
        "orders-value", avro(PAYMENT_NO_DEFAULT))) == 409


def test_a_transitive_level_checks_every_live_version_not_only_the_latest(
        registry: Registry) -> None:
    """v1 has no currency; v2 adds it with a default; v3 drops its default. v3 reads v2's data
    (it has the field) but not v1's: BACKWARD accepts v3, BACKWARD_TRANSITIVE refuses it."""
    client = registry.client
    v3 = record("Payment", ("id", "string"), ("amount", "double"), ("currency", "string"))
    for subject, level in (("lenient", "BACKWARD"), ("strict", "BACKWARD_TRANSITIVE")):
        client.set_compatibility(subject, level)
        client.register_schema(subject, avro(PAYMENT_V1))
        client.register_schema(subject, avro(PAYMENT_V2))
    assert client.register_schema("lenient", avro(v3)) == 3
    assert error_code(lambda: client.register_schema("strict", avro(v3))) == 409


def test_deleted_versions_leave_the_lists_but_their_ids_still_answer(registry: Registry) -> None:
    client = registry.client
    client.register_schema("payments-value", avro(PAYMENT_V1))
    client.register_schema("payments-value", avro(PAYMENT_V2))
    assert error_code(lambda: client.delete_version("payments-value", 1, permanent=True)) == \
        40407  # soft-deleted first, as Confluent
    assert client.delete_version("payments-value", 1) == 1
    assert client.get_versions("payments-value") == [2]
    assert json.loads(client.get_schema(1).schema_str) == json.loads(PAYMENT_V1)  # old records
    assert registry.http("GET", "/subjects/payments-value/versions?deleted=true")[1] == [1, 2]
    assert client.delete_version("payments-value", 1, permanent=True) == 1
    assert registry.http("GET", "/subjects/payments-value/versions?deleted=true")[1] == [2]
    assert client.delete_subject("payments-value") == [2]
    assert client.get_subjects() == []
    assert error_code(lambda: client.get_versions("payments-value")) == 40401
    assert client.delete_subject("payments-value", permanent=True) == [2]
    # a version number is not given out again while its subject lives: a new subject starts
    assert client.register_schema_full_response("payments-value", avro(PAYMENT_V2)).version == 1


def test_a_schema_may_use_a_type_another_subject_holds_and_that_version_cannot_go(
        registry: Registry) -> None:
    client = registry.client
    money = json.dumps({"type": "record", "name": "Money", "namespace": "shop",
                        "fields": [{"name": "units", "type": "long"},
                                   {"name": "currency", "type": "string"}]})
    client.register_schema("money", avro(money))
    order = record("Order", ("id", "string"), ("total", "shop.Money"))
    reference = SchemaReference("shop.Money", "money", 1)
    order_id = client.register_schema("orders-value", avro(order, [reference]))
    held = client.get_schema(order_id)
    assert [(r.name, r.subject, r.version) for r in held.references] == [
        ("shop.Money", "money", 1)]
    assert registry.http("GET", "/subjects/money/versions/1/referencedby")[1] == [order_id]
    assert error_code(lambda: client.delete_version("money", 1)) == 42206
    assert error_code(lambda: client.register_schema("orders-value", avro(order))) == 42201


def test_bad_requests_get_confluents_error_codes(registry: Registry) -> None:
    client = registry.client
    client.register_schema("payments-value", avro(PAYMENT_V1))
    assert error_code(lambda: client.get_schema(99)) == 40403
    assert error_code(lambda: client.get_version("nobody", 1)) == 40401
    assert error_code(lambda: client.get_version("payments-value", 7)) == 40402
    assert error_code(lambda: client.register_schema(
        "payments-value", avro('{"type": "recrod"}'))) == 42201
    assert error_code(lambda: client.register_schema(
        "payments-value", Schema(PAYMENT_V1, "XML"))) == 42201
    assert error_code(lambda: client.set_compatibility("payments-value", "SIDEWAYS")) == 42203
    assert error_code(lambda: client.lookup_schema("payments-value", avro(PAYMENT_V2))) == \
        40403
    assert registry.http("GET", "/subjects/payments-value/versions/abc")[1]["error_code"] == \
        42202
    status, answer = registry.http("GET", "/no/such/path")
    assert status == 404 and answer["error_code"] == 404
    status, answer = registry.http("POST", "/subjects/payments-value/versions", {"scheme": 1})
    assert status == 422 and answer["error_code"] == 42201


def test_what_the_registry_acknowledged_survives_a_controller_restart(
        registry: Registry) -> None:
    client = registry.client
    client.register_schema("payments-value", avro(PAYMENT_V1))
    client.register_schema("payments-value", avro(PAYMENT_V2))
    client.set_compatibility("payments-value", "FULL")
    client.delete_version("payments-value", 1)
    registry.restart()
    client = registry.client
    assert client.get_versions("payments-value") == [2]
    assert client.get_compatibility("payments-value") == "FULL"
    assert json.loads(client.get_schema(1).schema_str) == json.loads(PAYMENT_V1)
    third = record("Payment", ("id", "string"), ("amount", "double"),
                   ("currency", "string"), ("note", ["null", "string"]),
                   default={"currency": "EUR", "note": None})
    registered = client.register_schema_full_response("payments-value", avro(third))
    assert (registered.schema_id, registered.version) == (3, 3)  # ids and versions go on


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[SchemaRegistryServer, str]]:
    """The REST door of a SASL_SSL cluster with an authorizer: alice may read the registry
    (DESCRIBE on the cluster), bob may change it (ALTER), carol may do nothing. Yields the
    server and the CA's PEM file."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    security = cfg.ListenerSecurity(
        security_protocol="SASL_SSL",
        ssl_certificate=b"".join(p.bytes() for p in cert.cert_chain_pems),
        ssl_key=cert.private_key_pem.bytes())
    users = {name: make_credential("SCRAM-SHA-256", f"{name}-secret")
             for name in ("alice", "bob", "carol")}
    authorizer = Authorizer([
        AclBinding(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL, f"User:{name}", "*",
                   operation, Permission.ALLOW)
        for name, operation in (("alice", Operation.DESCRIBE), ("bob", Operation.ALTER))])
    controller = Controller(cfg.ClusterConfig(root=str(tmp_path / "root"), port=0,
                                              kafka_port=-1))
    server = SchemaRegistryServer(
        controller.schema_registry, "127.0.0.1", 0, security=security,
        credentials=lambda name, mechanism: users.get(name) if mechanism == "SCRAM-SHA-256"
        else None, authorizer=lambda: authorizer).start()
    yield server, str(ca_file)
    server.stop()


def test_a_secured_clusters_registry_takes_its_users_and_acls_over_https(secured) -> None:
    """On a SASL_SSL cluster with an authorizer the REST door is HTTPS, every request names a
    SCRAM user with HTTP Basic (confluent-kafka's basic.auth.user.info), and the cluster's ACLs
    decide: DESCRIBE on the cluster reads, ALTER changes, as over gRPC."""
    server, ca_file = secured
    assert server.url.startswith("https://")

    def client(user_info: str | None) -> SchemaRegistryClient:
        conf = {"url": server.url, "ssl.ca.location": ca_file}
        if user_info is not None:
            conf["basic.auth.user.info"] = user_info
        return SchemaRegistryClient(conf)

    schema = avro(record("Payment", ("id", "string")))
    for anonymous in (client(None), client("bob:wrong")):
        with pytest.raises(SchemaRegistryError) as raised:
            anonymous.get_subjects()
        assert raised.value.http_status_code == 401
    schema_id = client("bob:bob-secret").register_schema("payments-value", schema)
    assert json.loads(client("alice:alice-secret").get_schema(schema_id).schema_str) == (
        json.loads(schema.schema_str))
    for refused in (lambda: client("alice:alice-secret").register_schema("other", schema),
                    lambda: client("carol:carol-secret").get_subjects()):
        with pytest.raises(SchemaRegistryError) as raised:
            refused()
        assert (raised.value.http_status_code, raised.value.error_code) == (403, 40301)
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP on TLS
        urllib.request.urlopen(server.url.replace("https", "http") + "/subjects", timeout=30)
