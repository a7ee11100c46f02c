"""The schema registry's REST door: Confluent Schema Registry's API, so existing serializers
(confluent-kafka's AvroSerializer, JSONSerializer, ProtobufSerializer, Java's KafkaAvroSerializer)
and tools (curl scripts written for Confluent) work unchanged against deltabus.

Served in the driver beside the controller, on a thread per request (rpc/http_door.py): every
call goes to the registry (`SchemaRegistryHandler`), which runs under the controller's
lock, so the door keeps no state. Answers are Confluent's: JSON bodies of
`application/vnd.schemaregistry.v1+json`, errors as {"error_code", "message"} with the HTTP status
the code starts with (40401 -> 404).

Security follows the cluster's client listener, so one set of users and ACLs guards the
registry on every door:
- TLS (security.protocol SSL, SASL_SSL): the door serves HTTPS with the listeners' certificate
  (and asks for client certificates with ssl.client.auth=required: the subject names the
  caller).
- SASL (SASL_PLAINTEXT, SASL_SSL): every request carries HTTP Basic credentials of a SCRAM user
  (confluent-kafka's `basic.auth.user.info`), or is answered 401.
- With an authorizer, reading needs DESCRIBE on the cluster and changing (registering,
  deleting, setting a level) ALTER on the cluster, as over gRPC: else 403 (error code 40301).

What it does not serve (answered 404 with error code 404, as an unknown path): modes other than
READWRITE, contexts, data-contract rule sets and metadata (accepted on register and ignored),
exporters.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from deltabus.cluster.handler import SchemaRegistryHandler
from deltabus.config import ListenerSecurity
from deltabus.metrics import RequestMeters
from deltabus.rpc.authentication import CredentialLookup
from deltabus.rpc.http_door import HttpDoor, HttpRequest, HttpResponse
from deltabus.schemas import (
    LATEST_VERSION,
    SchemaReference,
    SchemaRegistryError,
    SchemaType,
    StoredSchema,
    SubjectVersion,
    check_version,
    invalid_version,
)
from deltabus.security.acls import Authorizer, Operation

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
REQUEST_BYTES_MAX = 16 * 1024 * 1024  # a schema request's body, at most

Query = dict[str, str]
Route = tuple[str, re.Pattern[str], Callable[..., Any]]


class RestError(Exception):
    """A request the door itself refuses (bad JSON, unknown path), with Confluent's code."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.error_code, self.message = status, error_code, message


def _version(text: str) -> int:
    """A version in a path: "latest", -1, or 1 to 2^31-1 (INVALID_VERSION 42202)."""
    if text == "latest":
        return LATEST_VERSION
    try:
        return check_version(int(text), text)
    except ValueError:
        raise invalid_version(text) from None


def _flag(query: Query, name: str) -> bool:
    return query.get(name, "false").lower() == "true"


def _schema_body(stored: StoredSchema) -> dict[str, Any]:
    body: dict[str, Any] = {"schema": stored.text}
    if stored.schema_type != SchemaType.AVRO:  # Confluent leaves Avro's type out
        body["schemaType"] = stored.schema_type.value
    if stored.references:
        body["references"] = [{"name": r.name, "subject": r.subject, "version": r.version}
                              for r in stored.references]
    return body


def _references(body: dict[str, Any]) -> tuple[SchemaReference, ...]:
    items = body.get("references") or []
    if not isinstance(items, list):
        raise SchemaRegistryError(42201, "Invalid schema: references must be a list")
    out = []
    for item in items:
        try:
            out.append(SchemaReference(str(item["name"]), str(item["subject"]),
                                       int(item["version"])))
        except (KeyError, TypeError, ValueError):
            raise SchemaRegistryError(
                42201, f"Invalid schema: a reference needs a name, a subject and a version: "
                f"{item}") from None
    return tuple(out)


def _schema_request(body: Any) -> tuple[str, str, tuple[SchemaReference, ...]]:
    """(type, text, references) of a register, lookup or compatibility request's body."""
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise SchemaRegistryError(42201, "Invalid schema: the body must be a JSON object with "
                                  "the schema as a string under \"schema\"")
    return str(body.get("schemaType") or SchemaType.AVRO.value), body["schema"], \
        _references(body)


class SchemaRegistryApi:
    """Confluent's REST API over a `SchemaRegistryHandler`: one method per route, each taking
    the path's parts, the query and the JSON body, and returning the JSON answer."""

    name = "schema registry"
    request_bytes_max = REQUEST_BYTES_MAX

    def __init__(self, registry: SchemaRegistryHandler) -> None:
        self.registry = registry
        r = registry
        self.routes: list[Route] = [
            ("GET", re.compile(r"/"), lambda q, b: {}),
            ("GET", re.compile(r"/schemas/types"),
             lambda q, b: [t.value for t in SchemaType]),
            ("GET", re.compile(r"/schemas/ids/(\d+)"), self.schema_by_id),
            ("GET", re.compile(r"/schemas/ids/(\d+)/schema"),
             lambda i, q, b: r.schema_by_id(int(i), q.get("format", "")).text),
            ("GET", re.compile(r"/schemas/ids/(\d+)/subjects"),
             lambda i, q, b: sorted({v.subject for v in r.schema_versions(
                 int(i), _flag(q, "deleted"))})),
            ("GET", re.compile(r"/schemas/ids/(\d+)/versions"),
             lambda i, q, b: [{"subject": v.subject, "version": v.version}
                              for v in r.schema_versions(int(i), _flag(q, "deleted"))]),
            ("GET", re.compile(r"/subjects"),
             lambda q, b: r.subjects(_flag(q, "deleted"), q.get("subjectPrefix", ""))),
            ("GET", re.compile(r"/subjects/([^/]+)/versions"),
             lambda s, q, b: [v.version for v in r.subject_versions(s, _flag(q, "deleted"))]),
            ("GET", re.compile(r"/subjects/([^/]+)/versions/([^/]+)"), self.subject_version),
            ("GET", re.compile(r"/subjects/([^/]+)/versions/([^/]+)/schema"),
             lambda s, v, q, b: r.schema_by_id(r.subject_version(
                 s, _version(v), _flag(q, "deleted")).schema_id, q.get("format", "")).text),
            ("GET", re.compile(r"/subjects/([^/]+)/versions/([^/]+)/referencedby"),
             lambda s, v, q, b: r.referenced_by(s, _version(v))),
            ("POST", re.compile(r"/subjects/([^/]+)/versions"), self.register),
            ("POST", re.compile(r"/subjects/([^/]+)"), self.lookup),
            ("DELETE", re.compile(r"/subjects/([^/]+)"),
             lambda s, q, b: r.delete_subject(s, _flag(q, "permanent"))),
            ("DELETE", re.compile(r"/subjects/([^/]+)/versions/([^/]+)"),
             lambda s, v, q, b: r.delete_schema_version(s, _version(v),
                                                        _flag(q, "permanent"))),
            ("POST", re.compile(r"/compatibility/subjects/([^/]+)/versions"),
             lambda s, q, b: self.compatibility(s, None, q, b)),
            ("POST", re.compile(r"/compatibility/subjects/([^/]+)/versions/([^/]+)"),
             lambda s, v, q, b: self.compatibility(s, _version(v), q, b)),
            ("GET", re.compile(r"/config"),
             lambda q, b: {"compatibilityLevel": r.compatibility_level("", True).value}),
            ("PUT", re.compile(r"/config"), lambda q, b: self.set_config("", q, b)),
            ("GET", re.compile(r"/config/([^/]+)"),
             lambda s, q, b: {"compatibilityLevel": r.compatibility_level(
                 s, _flag(q, "defaultToGlobal")).value}),
            ("PUT", re.compile(r"/config/([^/]+)"), self.set_config),
            ("DELETE", re.compile(r"/config/([^/]+)"),
             lambda s, q, b: {"compatibilityLevel": r.set_compatibility_level(s, None).value}),
            ("GET", re.compile(r"/mode(?:/[^/]+)?"), lambda *a: {"mode": "READWRITE"}),
        ]

    def serve(self, request: HttpRequest) -> HttpResponse:
        """The door's request answered in Confluent's JSON, errors as {"error_code",
        "message"} with the HTTP status the code starts with."""
        status: int
        try:
            self._authorize(request)
            status, answer = HTTPStatus.OK, self.answer(
                request.method, request.path, dict(request.query), self._json(request.body))
        except SchemaRegistryError as e:
            status, answer = e.http_status, {"error_code": e.error_code, "message": e.message}
        except RestError as e:
            status, answer = e.status, {"error_code": e.error_code, "message": e.message}
        except Exception as e:  # a bug: the client gets Confluent's 50001, the log says why
            log.exception("schema registry: %s %s failed", request.method, request.path)
            status, answer = HTTPStatus.INTERNAL_SERVER_ERROR, {
                "error_code": 50001, "message": f"Error in the backend data store: {e}"}
        return HttpResponse(status, json.dumps(answer).encode(), CONTENT_TYPE)

    def refusal(self, status: int, message: str) -> HttpResponse:
        """The door's own refusals (401, 413) in Confluent's shape."""
        return HttpResponse(status, json.dumps({"error_code": int(status),
                                                "message": message}).encode(), CONTENT_TYPE)

    def _authorize(self, request: HttpRequest) -> None:
        """RestError 403 unless the cluster's ACLs let the caller do what it asks."""
        operation = self.operation(request.method, request.path)
        refusal = request.access.cluster(operation)
        if refusal is not None:
            raise RestError(HTTPStatus.FORBIDDEN, 40301, f"{refusal.message}: "
                            f"{request.method} {request.path} needs {operation.name} on the "
                            "cluster")

    @staticmethod
    def _json(body: bytes) -> Any:
        if not body:
            return None
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RestError(HTTPStatus.BAD_REQUEST, 400, f"Unrecognized JSON: {e}") from None

    @staticmethod
    def operation(method: str, path: str) -> Operation:
        """What a request does to the registry, for the cluster's ACLs: reads (GET, a lookup,
        a compatibility test) are DESCRIBE, every change ALTER."""
        if method == "GET" or (method == "POST" and (
                path.startswith("/compatibility/") or not path.endswith("/versions"))):
            return Operation.DESCRIBE
        return Operation.ALTER

    def answer(self, method: str, path: str, query: Query, body: Any) -> Any:
        """The JSON answer of a request; raises SchemaRegistryError or RestError."""
        known_path = False
        for route_method, pattern, call in self.routes:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            known_path = True
            if route_method == method:
                parts = [urllib.parse.unquote(p) for p in match.groups()]
                return call(*parts, query, body)
        if known_path:
            raise RestError(HTTPStatus.METHOD_NOT_ALLOWED, 405, "HTTP 405 Method Not Allowed")
        raise RestError(HTTPStatus.NOT_FOUND, 404, "HTTP 404 Not Found")

    def schema_by_id(self, schema_id: str, query: Query, body: Any) -> dict[str, Any]:
        return _schema_body(self.registry.schema_by_id(int(schema_id), query.get("format", "")))

    def _version_body(self, held: SubjectVersion, fmt: str = "") -> dict[str, Any]:
        return {"subject": held.subject, "version": held.version, "id": held.schema_id,
                **_schema_body(self.registry.schema_by_id(held.schema_id, fmt))}

    def subject_version(self, subject: str, version: str, query: Query,
                        body: Any) -> dict[str, Any]:
        held = self.registry.subject_version(subject, _version(version), _flag(query, "deleted"))
        return self._version_body(held, query.get("format", ""))

    def register(self, subject: str, query: Query, body: Any) -> dict[str, Any]:
        schema_type, text, references = _schema_request(body)
        held = self.registry.register_schema(subject, schema_type, text, references)
        return self._version_body(held)

    def lookup(self, subject: str, query: Query, body: Any) -> dict[str, Any]:
        schema_type, text, references = _schema_request(body)
        held = self.registry.lookup_schema(subject, schema_type, text, references,
                                           _flag(query, "deleted"))
        return self._version_body(held)

    def compatibility(self, subject: str, version: int | None, query: Query,
                      body: Any) -> dict[str, Any]:
        schema_type, text, references = _schema_request(body)
        if version is not None:
            self.registry.subject_version(subject, version, False)  # 40401 / 40402 first
        problems = self.registry.test_compatibility(subject, version, schema_type, text,
                                                    references)
        answer: dict[str, Any] = {"is_compatible": not problems}
        if _flag(query, "verbose"):
            answer["messages"] = problems
        return answer

    def set_config(self, subject: str, query: Query, body: Any) -> dict[str, str]:
        level = body.get("compatibility") if isinstance(body, dict) else None
        if not isinstance(level, str):
            raise SchemaRegistryError(42203, "Invalid compatibility level: the body must be "
                                      "{\"compatibility\": LEVEL}")
        return {"compatibility": self.registry.set_compatibility_level(subject, level).value}


class SchemaRegistryServer(HttpDoor):
    """The REST door on (host, port) (port 0: any free one), on threads of its own, secured
    as the cluster's client listener is (`security`: its TLS and SASL; `credentials`: the
    users' SCRAM credentials, for SASL; `authorizer`: the cluster's ACLs, None without)."""

    def __init__(self, registry: SchemaRegistryHandler, host: str, port: int, *,
                 security: ListenerSecurity | None = None,
                 credentials: CredentialLookup | None = None,
                 authorizer: Callable[[], Authorizer | None] = lambda: None,
                 meters: RequestMeters | None = None) -> None:
        super().__init__(SchemaRegistryApi(registry), host, port, security=security,
                         credentials=credentials, authorizer=authorizer, meters=meters)
