"""Client quotas against the shared cluster's real brokers, on the gRPC door: quotas set with the
AdminClient reach every broker before the call returns, a produce or fetch over its client id's
quota is answered with throttle_time_ms (a throttled fetch without its records, as Kafka's), an
unquota'd client id beside it is not throttled, and deltabus's Producer waits out a throttle.

The figures are Kafka's arithmetic on the broker's own clock, not timings: a first request of
N bytes is a rate of N / 10 s (Kafka's Rate spreads a first burst over quota.window.num - 1
windows), so 30 kB against a quota of 1,000 B/s is 3,000 B/s, twice over: 20 s of throttle,
capped at the 11 s window.
"""

from __future__ import annotations

from typing import Any

import pytest

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from deltabus.client import wire
from deltabus.client.admin import QuotaAlteration, QuotaEntity, QuotaFilterComponent
from deltabus.client.cluster_client import ClusterClient
from deltabus.quotas import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    MATCH_EXACT,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    THROTTLE_TIME_MS_MAX,
    USER,
)
from deltabus.records import produce_batch, to_ipc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from tests.conftest import wait_until

QUOTA_BYTES_PER_S = 1_000
VALUE_BYTES = 30_000  # one request: three times the quota over the 10 s a first burst spans


def _produce(client: ClusterClient, topic: str) -> pb.ProduceResponse:
    broker, _ = client.leader(topic, 0)
    payload = to_ipc(produce_batch([b"v" * VALUE_BYTES]))
    request = pb.ProduceRequest.FromString(wire.produce_request(
        pb.ACKS_ALL, 30_000, [(pb.PartitionProduceData(topic=topic, partition=0), payload)]))
    response = client.call(broker.address, "Produce", request)
    assert response.partitions[0].error_code == 0
    return response


def _fetch(client: ClusterClient, topic: str) -> pb.FetchResponse:
    broker, _ = client.leader(topic, 0)
    return client.call(broker.address, "Fetch", pb.FetchRequest(
        max_wait_ms=0, format=pb.ARROW,
        partitions=[pb.FetchPartition(topic=topic, partition=0, fetch_offset=0)]))


@pytest.fixture
def quotas(cluster: Any) -> Any:
    """An AdminClient; every quota it set is removed after the test."""
    admin = AdminClient(cluster.bootstrap_servers)
    yield admin
    for entity, values in admin.describe_client_quotas().items():
        admin.alter_client_quotas([QuotaAlteration(entity, tuple((k, None) for k in values))])
    admin.close()


def _clients(cluster: Any, topic: str, *client_ids: str) -> list[ClusterClient]:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    out = []
    for client_id in client_ids:
        client = ClusterClient(cluster.bootstrap_servers, client_id=client_id)
        client.partitions_for(topic)
        out.append(client)
    return out


def test_quotas_are_set_described_and_removed(quotas: AdminClient, topic_name: str) -> None:
    alice, app = QuotaEntity.user(topic_name), QuotaEntity.user_client(topic_name, "app")
    default_client = QuotaEntity.client(None)
    results = quotas.alter_client_quotas([
        QuotaAlteration(alice, ((PRODUCER_BYTE_RATE, 1024.0), (REQUEST_PERCENTAGE, 200.0))),
        QuotaAlteration(app, ((CONSUMER_BYTE_RATE, 2048.0),)),
        QuotaAlteration(default_client, ((PRODUCER_BYTE_RATE, 10.0**9),)),
        QuotaAlteration(QuotaEntity.client("x"), (("bogus_rate", 1.0),)),
        QuotaAlteration(QuotaEntity.client("y"), ((PRODUCER_BYTE_RATE, 1.5),))])
    assert list(results.values())[:3] == [None, None, None]
    assert all(isinstance(e, errors.InvalidRequestError) for e in list(results.values())[3:])
    found = quotas.describe_client_quotas([QuotaFilterComponent(USER, MATCH_EXACT, topic_name)])
    assert found == {alice: {PRODUCER_BYTE_RATE: 1024.0, REQUEST_PERCENTAGE: 200.0},
                     app: {CONSUMER_BYTE_RATE: 2048.0}}
    strict = quotas.describe_client_quotas(
        [QuotaFilterComponent(USER, MATCH_EXACT, topic_name), QuotaFilterComponent(CLIENT_ID)],
        strict=True)
    assert strict == {app: {CONSUMER_BYTE_RATE: 2048.0}}
    # validate_only checks and changes nothing
    assert quotas.alter_client_quotas([QuotaAlteration(alice, ((PRODUCER_BYTE_RATE, None),))],
                                      validate_only=True) == {alice: None}
    assert alice in quotas.describe_client_quotas()
    assert quotas.alter_client_quotas([QuotaAlteration(alice, (
        (PRODUCER_BYTE_RATE, None), (REQUEST_PERCENTAGE, None)))]) == {alice: None}
    assert alice not in quotas.describe_client_quotas()


def test_a_produce_over_its_quota_is_throttled_and_one_beside_it_is_not(
        cluster: Any, quotas: AdminClient, topic_name: str) -> None:
    slow_id, fast_id = f"{topic_name}-slow", f"{topic_name}-fast"
    slow, fast = _clients(cluster, topic_name, slow_id, fast_id)
    quotas.alter_client_quotas([QuotaAlteration(QuotaEntity.client(slow_id), (
        (PRODUCER_BYTE_RATE, float(QUOTA_BYTES_PER_S)),))])
    try:
        throttled = _produce(slow, topic_name)
        assert throttled.throttle_time_ms == THROTTLE_TIME_MS_MAX  # 2x over: capped
        for _ in range(3):
            assert _produce(fast, topic_name).throttle_time_ms == 0
    finally:
        slow.close()
        fast.close()


def test_a_fetch_over_its_quota_gets_no_records(cluster: Any, quotas: AdminClient,
                                                topic_name: str) -> None:
    reader_id, other_id = f"{topic_name}-reader", f"{topic_name}-other"
    reader, other = _clients(cluster, topic_name, reader_id, other_id)
    try:
        _produce(other, topic_name)
        quotas.alter_client_quotas([QuotaAlteration(QuotaEntity.client(reader_id), (
            (CONSUMER_BYTE_RATE, float(QUOTA_BYTES_PER_S)),))])
        answer = _fetch(reader, topic_name)
        assert answer.throttle_time_ms > 0
        assert not answer.partitions[0].arrow_records  # not sent, and not counted
        unquotad = _fetch(other, topic_name)
        assert unquotad.throttle_time_ms == 0 and unquotad.partitions[0].arrow_records
        # the quota raised: the same fetch is answered in full (the throttled one did not count)
        quotas.alter_client_quotas([QuotaAlteration(QuotaEntity.client(reader_id), (
            (CONSUMER_BYTE_RATE, 10.0 * VALUE_BYTES),))])
        again = _fetch(reader, topic_name)
        assert again.throttle_time_ms == 0 and again.partitions[0].arrow_records
    finally:
        reader.close()
        other.close()


def test_the_producer_waits_out_its_throttle(cluster: Any, quotas: AdminClient,
                                             topic_name: str) -> None:
    """deltabus's Producer takes throttle_time_ms as Kafka's does: it sends that broker nothing
    more until the time is over (it notes until when), and its records are all written."""
    client_id = f"{topic_name}-producer"
    _clients(cluster, topic_name)
    quotas.alter_client_quotas([QuotaAlteration(QuotaEntity.client(client_id), (
        (PRODUCER_BYTE_RATE, float(QUOTA_BYTES_PER_S)),))])
    with Producer(cluster.bootstrap_servers, client_id=client_id) as producer:
        futures = [producer.send(topic_name, b"v" * VALUE_BYTES, partition=0)]
        producer.flush()
        assert futures[0].get().offset == 0
        assert producer._throttled_until, "the broker's throttle was not taken"


def test_the_consumer_waits_out_its_throttle_and_reads_everything(
        cluster: Any, quotas: AdminClient, topic_name: str) -> None:
    """Two records of 30 kB against a consumer_byte_rate of 5,000 B/s (50 kB in the first 10 s):
    the first fits, the second's fetch is throttled and answered without it until the first
    leaves the rate's window; the Consumer waits each throttle out and reads both."""
    client_id = f"{topic_name}-consumer"
    (writer,) = _clients(cluster, topic_name, f"{topic_name}-writer")
    try:
        _produce(writer, topic_name)
        _produce(writer, topic_name)
    finally:
        writer.close()
    quotas.alter_client_quotas([QuotaAlteration(QuotaEntity.client(client_id), (
        (CONSUMER_BYTE_RATE, 5_000.0),))])
    with Consumer(cluster.bootstrap_servers, client_id=client_id,
                  max_partition_fetch_bytes=VALUE_BYTES + 10_000) as consumer:
        consumer.assign([TopicPartition(topic_name, 0)])
        consumer.seek_to_beginning()
        read: list[Any] = []
        wait_until(lambda: bool(read.extend(consumer.poll(1_000))) or len(read) == 2,
                   "the consumer read both records", timeout_s=60)
        assert [r.offset for r in read] == [0, 1]
        assert consumer._throttled_until, "the broker's throttle was not taken"


def test_handler_thread_time_over_request_percentage_is_throttled(
        cluster: Any, quotas: AdminClient, topic_name: str) -> None:
    """request_percentage counts the handler thread's time (Kafka's request quota): a produce
    costs its thread some CPU time, so a quota of a millionth of a thread is exceeded at once,
    and the answer says to wait; a client id without the quota beside it is not throttled."""
    busy_id, idle_id = f"{topic_name}-busy", f"{topic_name}-idle"
    busy, idle = _clients(cluster, topic_name, busy_id, idle_id)
    quotas.alter_client_quotas([QuotaAlteration(QuotaEntity.client(busy_id), (
        (REQUEST_PERCENTAGE, 0.000001),))])
    try:
        assert _produce(busy, topic_name).throttle_time_ms > 0
        assert _fetch(busy, topic_name).throttle_time_ms > 0
        assert _produce(idle, topic_name).throttle_time_ms == 0
    finally:
        busy.close()
        idle.close()
