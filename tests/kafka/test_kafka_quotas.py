"""Client quotas on the Kafka door of the shared cluster, in Kafka's own frames (neither
kafka-python nor confluent-kafka has the client quota APIs): AlterClientQuotas (49) and
DescribeClientQuotas (48) as kafka-configs.sh sends them, with Kafka's error codes and
validate_only; a produce over its client id's quota is answered with throttle_time, and the
broker mutes that connection for the throttle (KIP-219): a request sent at once is not even read
until the throttle is over, while another connection is answered meanwhile. A fetch over its
quota is answered with throttle_time and no records, as Kafka's.

A first request of N bytes is a rate of N / 10 s (Kafka's Rate), so 30 kB against 1,000 B/s is
three times the quota: the throttle is the 11 s cap.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import AdminClient, NewTopic
from deltabus.quotas import THROTTLE_TIME_MS_MAX
from deltabus.rpc.kafka.frames import make, nested
from tests.kafka.raw_frames import (
    FETCH,
    PRODUCE,
    api_versions,
    call,
    fetch,
    produce,
    read_response,
)

DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS, API_VERSIONS = 48, 49, 18
VERSION = 1


Entry = tuple[dict[str, str | None], list[tuple[str, float | None]]]  # (entity, ops)


def _alter(address: str, entries: list[Entry],
           validate_only: bool = False) -> list[tuple[ErrorCode, str | None]]:
    cls = load_request_schema(ALTER_CLIENT_QUOTAS, VERSION)
    entry_cls, entity_cls, op_cls = (nested(cls, n) for n in ("EntryData", "EntityData",
                                                               "OpData"))
    body = make(cls, validate_only=validate_only, entries=tuple(
        make(entry_cls, entity=tuple(make(entity_cls, entity_type=t, entity_name=n)
                                     for t, n in entity.items()),
             ops=tuple(make(op_cls, key=k, value=v or 0.0, remove=v is None) for k, v in ops))
        for entity, ops in entries))
    answer = call(address, ALTER_CLIENT_QUOTAS, VERSION, body)
    return [(e.error_code, e.error_message) for e in answer.entries]


def _describe(address: str, components: list[tuple[str, int, str | None]],
              strict: bool = False) -> Any:
    cls = load_request_schema(DESCRIBE_CLIENT_QUOTAS, VERSION)
    component_cls = nested(cls, "ComponentData")
    return call(address, DESCRIBE_CLIENT_QUOTAS, VERSION, make(
        cls, strict=strict, components=tuple(
            make(component_cls, entity_type=t, match_type=m, match=n)
            for t, m, n in components)))


def _entries(answer: Any) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    return {tuple((e.entity_type, e.entity_name) for e in entry.entity):
            {v.key: v.value for v in entry.values} for entry in answer.entries or ()}


@pytest.fixture
def leader(cluster: Any, topic_name: str) -> str:
    """host:port of the Kafka listener of the leader of `topic_name`'s one partition."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
        state = admin.describe_topics([topic_name])[0]
    endpoint = cluster.controller.image().broker(state.partitions[0].leader)
    return f"{endpoint.host}:{endpoint.kafka_port}"


def test_alter_and_describe_as_kafka_configs_sends_them(leader: str, topic_name: str,
                                                        no_quotas_left: None) -> None:
    user = topic_name
    assert _alter(leader, [({"user": user}, [("producer_byte_rate", 1024.0),
                                             ("request_percentage", 200.0)]),
                           ({"user": user, "client-id": None}, [("consumer_byte_rate", 2048.0)]),
                           ({"client-id": "app"}, [("bogus", 1.0)]),
                           ({"ip": "10.0.0.1"}, [("producer_byte_rate", 1.0)])]) == [
        (ErrorCode.none, None), (ErrorCode.none, None),
        (ErrorCode.invalid_request, "Invalid configuration key bogus: use one of "
                                    "producer_byte_rate, consumer_byte_rate, request_percentage"),
        (ErrorCode.invalid_request,
         "IP quotas (connection_creation_rate) are not supported by deltabus")]
    # validate_only: checked, nothing changes
    assert _alter(leader, [({"client-id": "app"}, [("producer_byte_rate", 5.0)])],
                  validate_only=True) == [(ErrorCode.none, None)]
    answer = _describe(leader, [("user", 0, user)])
    assert answer.error_code == ErrorCode.none
    assert _entries(answer) == {
        (("user", user),): {"producer_byte_rate": 1024.0, "request_percentage": 200.0},
        (("client-id", None), ("user", user)): {"consumer_byte_rate": 2048.0}}
    assert set(_entries(_describe(leader, [("user", 0, user)], strict=True))) == {
        (("user", user),)}
    assert not _entries(_describe(leader, [("client-id", 0, "app")]))
    refused = _describe(leader, [("user", 0, None)])  # exact match without a name
    assert refused.error_code == ErrorCode.invalid_request and refused.entries is None
    assert _alter(leader, [({"user": user}, [("producer_byte_rate", None),
                                             ("request_percentage", None)])]) == [
        (ErrorCode.none, None)]
    assert set(_entries(_describe(leader, [("user", 0, user)]))) == {
        (("client-id", None), ("user", user))}


def test_a_throttled_connection_is_muted_and_another_is_not(leader: str, topic_name: str,
                                                            no_quotas_left: None) -> None:
    client_id = f"{topic_name}-slow"
    assert _alter(leader, [({"client-id": client_id}, [("producer_byte_rate", 1000.0)])]) == [
        (ErrorCode.none, None)]
    host, port = leader.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(produce(topic_name, [b"v" * 30_000], client_id=client_id))
        _, answer = read_response(sock, PRODUCE, 9)
        answered_s = time.monotonic()
        assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none
        throttle_ms = int(answer.throttle_time.total_seconds() * 1000)
        assert throttle_ms == THROTTLE_TIME_MS_MAX
        sock.sendall(api_versions(correlation_id=8))
        # meanwhile another connection (not throttled) is answered at once
        with socket.create_connection((host, int(port)), timeout=30) as other:
            other.sendall(produce(topic_name, [b"w"], client_id=f"{topic_name}-fast"))
            _, fast = read_response(other, PRODUCE, 9)
            assert fast.throttle_time.total_seconds() == 0
            assert time.monotonic() - answered_s < throttle_ms / 1000
        correlation_id, _ = read_response(sock, API_VERSIONS, 3)  # once the mute is over
        assert correlation_id == 8
        assert time.monotonic() - answered_s >= throttle_ms / 1000 * 0.9


def test_a_fetch_over_its_quota_is_answered_without_records(leader: str, topic_name: str,
                                                            no_quotas_left: None) -> None:
    reader = f"{topic_name}-reader"
    host, port = leader.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(produce(topic_name, [b"v" * 30_000], client_id=f"{topic_name}-writer"))
        _, written = read_response(sock, PRODUCE, 9)
        assert written.responses[0].partition_responses[0].error_code == ErrorCode.none
    assert _alter(leader, [({"client-id": reader}, [("consumer_byte_rate", 1000.0)])]) == [
        (ErrorCode.none, None)]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(fetch(topic_name, 0, 0, client_id=reader))
        _, answer = read_response(sock, FETCH, 12)
    assert answer.throttle_time.total_seconds() * 1000 == THROTTLE_TIME_MS_MAX
    assert answer.error_code == ErrorCode.none and answer.responses == ()
    with socket.create_connection((host, int(port)), timeout=30) as sock:  # another client id
        sock.sendall(fetch(topic_name, 0, 0, client_id=f"{topic_name}-other"))
        _, other = read_response(sock, FETCH, 12)
    assert other.throttle_time.total_seconds() == 0
    assert other.responses[0].partitions[0].records


def test_an_acks_0_producer_over_its_quota_is_muted_without_an_answer(
        leader: str, topic_name: str, no_quotas_left: None) -> None:
    client_id = f"{topic_name}-fire-and-forget"
    assert _alter(leader, [({"client-id": client_id}, [("producer_byte_rate", 1000.0)])]) == [
        (ErrorCode.none, None)]
    host, port = leader.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(produce(topic_name, [b"v" * 30_000], client_id=client_id, acks=0))
        sent_s = time.monotonic()
        sock.sendall(api_versions(correlation_id=8))
        correlation_id, _ = read_response(sock, API_VERSIONS, 3)  # the first answer on it
        assert correlation_id == 8
        assert time.monotonic() - sent_s >= THROTTLE_TIME_MS_MAX / 1000 * 0.9


def test_a_kafka_client_over_its_request_percentage_is_throttled(
        leader: str, topic_name: str, no_quotas_left: None) -> None:
    """On the Kafka door every request but ApiVersions and SASL counts its handler thread's time
    against request_percentage: a Produce of a client id whose quota is a millionth of
    a thread is answered with a throttle time, one of another client id is not."""
    busy_id = f"{topic_name}-busy"
    assert _alter(leader, [({"client-id": busy_id}, [("request_percentage", 0.000001)])]) == [
        (ErrorCode.none, None)]
    host, port = leader.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(produce(topic_name, [b"v"], client_id=busy_id))
        _, answer = read_response(sock, PRODUCE, 9)
        assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none
        assert answer.throttle_time.total_seconds() > 0
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(produce(topic_name, [b"w"], client_id=f"{topic_name}-other"))
        _, other = read_response(sock, PRODUCE, 9)
        assert other.throttle_time.total_seconds() == 0
