"""End to end over real gRPC, real brokers in Spark tasks and real Delta tables."""

from __future__ import annotations

import threading

import grpc
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from deltabus.client.cluster_client import ClusterClient
from deltabus.client.partitioner import partition_for_key
from deltabus.log_tables.layout import replica_path
from deltabus.records import produce_batch, to_ipc
from deltabus.rpc.status import ERROR_CODE_KEY
from deltabus.rpc.v1 import deltabus_pb2 as pb
from tests.conftest import read_records


def create(cluster, name: str, partitions: int = 1, **configs: str) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(name, partitions, 1, configs or None)])


def consume_all(cluster, topic: str, partitions: int, expected: int):
    return read_records(cluster.bootstrap_servers, topic, partitions, expected, timeout_s=30)


def test_records_come_back_in_order_with_offsets_keys_headers(cluster, topic_name):
    create(cluster, topic_name, partitions=1)
    with Producer(cluster.bootstrap_servers) as producer:
        futures = [producer.send(topic_name, f"value-{i}", key=f"k{i}",
                                 headers=[("trace", f"{i}".encode())],
                                 timestamp_ms=1_700_000_000_000 + i)
                   for i in range(500)]
        producer.flush()
        metadata = [f.get(10) for f in futures]
    assert [m.offset for m in metadata] == list(range(500))
    records = consume_all(cluster, topic_name, 1, 500)
    assert [r.offset for r in records] == list(range(500))
    assert [r.value for r in records] == [f"value-{i}".encode() for i in range(500)]
    assert [r.key for r in records] == [f"k{i}".encode() for i in range(500)]
    assert records[7].headers == [("trace", b"7")]
    assert records[7].timestamp == 1_700_000_000_007


def test_same_key_always_lands_in_kafkas_partition(cluster, topic_name):
    create(cluster, topic_name, partitions=3)
    keys = [f"user-{i % 17}".encode() for i in range(300)]
    with Producer(cluster.bootstrap_servers) as producer:
        futures = [producer.send(topic_name, b"v", key=k) for k in keys]
        producer.flush()
        partitions = [f.get(10).partition for f in futures]
    assert partitions == [partition_for_key(k, 3) for k in keys]
    records = consume_all(cluster, topic_name, 3, 300)
    by_key: dict[bytes, set[int]] = {}
    for r in records:
        by_key.setdefault(r.key, set()).add(r.partition)
    assert len(records) == 300
    assert all(len(p) == 1 for p in by_key.values())


def test_unkeyed_records_spread_across_partitions(cluster, topic_name):
    create(cluster, topic_name, partitions=3)
    with Producer(cluster.bootstrap_servers, batch_size=1000, linger_ms=0) as producer:
        futures = [producer.send(topic_name, b"x" * 100) for _ in range(600)]
        producer.flush()
    assert len({f.get(10).partition for f in futures}) == 3


def test_topic_is_a_delta_table_on_disk(cluster, topic_name):
    create(cluster, topic_name, partitions=1)
    with Producer(cluster.bootstrap_servers) as producer:
        producer.send(topic_name, b"in-the-lakehouse", key=b"k").get(10)
    leader = cluster.controller.image().partition(topic_name, 0).leader
    table = DeltaTable(replica_path(cluster.config.root, topic_name, 0, leader)).to_pyarrow_table()
    assert table.column("value").to_pylist() == [b"in-the-lakehouse"]
    assert table.column("offset").to_pylist() == [0]
    assert table.column("key").to_pylist() == [b"k"]


def test_bulk_arrow_send_and_batch_poll(cluster, topic_name):
    create(cluster, topic_name, partitions=1)
    values = [i.to_bytes(4, "big") for i in range(20_000)]
    with Producer(cluster.bootstrap_servers, max_request_size=100_000) as producer:
        futures = producer.send_batch(topic_name, pa.table({"value": pa.array(values)}))
        assert len(futures) > 1  # chunked to respect max_request_size
        assert futures[0].get(30).offset == 0
    consumer = Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic_name, 0)])
    got: list[bytes] = []
    while len(got) < len(values):
        for table in consumer.poll_batch(1000).values():
            got.extend(table.column("value").to_pylist())
    assert got == values


def test_poll_wakes_when_a_record_arrives(cluster, topic_name):
    create(cluster, topic_name, partitions=1)
    consumer = Consumer(cluster.bootstrap_servers, auto_offset_reset="latest")
    consumer.assign([TopicPartition(topic_name, 0)])
    assert consumer.position(TopicPartition(topic_name, 0)) == 0
    producer = Producer(cluster.bootstrap_servers, linger_ms=0)
    timer = threading.Timer(0.3, lambda: producer.send(topic_name, b"late"))
    timer.start()
    records = consumer.poll(20_000)
    assert [r.value for r in records] == [b"late"]
    producer.close()
    consumer.close()


def test_seek_and_list_offsets(cluster, topic_name):
    create(cluster, topic_name, partitions=1)
    tp = TopicPartition(topic_name, 0)
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(10):
            producer.send(topic_name, f"{i}", timestamp_ms=1_000_000 + i * 1000)
    consumer = Consumer(cluster.bootstrap_servers)
    consumer.assign([tp])
    assert consumer.beginning_offsets([tp]) == {tp: 0}
    assert consumer.end_offsets([tp]) == {tp: 10}
    assert consumer.offsets_for_times({tp: 1_004_500}) == {tp: 5}
    consumer.seek(tp, 7)
    assert [r.value for r in consumer.poll(5000)] == [b"7", b"8", b"9"]
    consumer.seek_to_beginning(tp)
    assert consumer.position(tp) == 0
    consumer.close()


def test_acks_zero_is_answered_at_once_and_still_written(cluster, topic_name):
    create(cluster, topic_name, partitions=1)
    with Producer(cluster.bootstrap_servers, acks=0) as producer:
        future = producer.send(topic_name, b"fire-and-forget")
        assert future.get(10).offset == -1  # no offset: nobody waited for the commit
    assert [r.value for r in consume_all(cluster, topic_name, 1, 1)] == [b"fire-and-forget"]


# ---- bad input: a clear error, nothing written -----------------------------------------------


def test_admin_errors_have_kafka_names(cluster, topic_name):
    with AdminClient(cluster.bootstrap_servers) as admin:
        with pytest.raises(errors.InvalidTopicError, match="illegal"):
            admin.create_topics([NewTopic("bad name!", 1, 1)])
        with pytest.raises(errors.InvalidPartitionsError):
            admin.create_topics([NewTopic(topic_name, 0, 1)])
        with pytest.raises(errors.InvalidPartitionsError):
            admin.create_topics([NewTopic(topic_name, -5, 1)])
        with pytest.raises(errors.InvalidReplicationFactorError,
                           match="larger than available brokers: 3"):
            admin.create_topics([NewTopic(topic_name, 1, 4)])
        with pytest.raises(errors.InvalidConfigError, match="no.such.config"):
            admin.create_topics([NewTopic(topic_name, 1, 1, {"no.such.config": "1"})])
        assert topic_name not in admin.list_topics()
        admin.create_topics([NewTopic(topic_name, 2, 1)])
        with pytest.raises(errors.TopicAlreadyExistsError):
            admin.create_topics([NewTopic(topic_name, 1, 1)])
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            admin.describe_topics(["no-such-topic"])
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            admin.delete_topics(["no-such-topic"])


def test_record_over_max_message_bytes_is_refused_and_nothing_written(cluster, topic_name):
    create(cluster, topic_name, 1, **{"max.message.bytes": "1000"})
    with Producer(cluster.bootstrap_servers) as producer:
        producer.send(topic_name, b"small").get(10)
        with pytest.raises(errors.MessageTooLargeError):
            producer.send(topic_name, b"x" * 2000).get(10)
        assert producer.send(topic_name, b"after").get(10).offset == 1
    assert [r.value for r in consume_all(cluster, topic_name, 1, 2)] == [b"small", b"after"]


def test_keyless_records_to_a_compacted_topic_are_named_in_the_refusal(cluster, topic_name):
    """The gRPC door has no field for KIP-467's record errors: its INVALID_RECORD message names
    the records at fault by their index in the batch as sent. Nothing of the batch is written."""
    create(cluster, topic_name, 1, **{"cleanup.policy": "compact"})
    table = pa.table({"key": pa.array([b"k0", None, b"k2", None, b"k4"], pa.binary()),
                      "value": pa.array([f"v{i}".encode() for i in range(5)], pa.binary())})
    with Producer(cluster.bootstrap_servers) as producer:
        (future,) = producer.send_batch(topic_name, table, partition=0)
        with pytest.raises(errors.InvalidRecordError, match="Compacted topic cannot accept "
                           "message without key.* \\(records 1, 3 of the batch\\)"):
            future.get(30)
        assert producer.send(topic_name, b"v", key=b"k", partition=0).get(30).offset == 0


def test_produce_to_unknown_topic_without_auto_create(cluster):
    producer = Producer(cluster.bootstrap_servers, allow_auto_create_topics=False, max_block_ms=500)
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        producer.send("never-created", b"x")
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        Consumer(cluster.bootstrap_servers).assign([TopicPartition("never-created", 0)])
    producer.close()


def test_producing_to_a_new_topic_creates_it_as_kafka_does(cluster, topic_name):
    with Producer(cluster.bootstrap_servers) as producer:
        assert producer.send(topic_name, b"first").get(30).offset == 0
    with AdminClient(cluster.bootstrap_servers) as admin:
        assert topic_name in admin.list_topics()


def _leader_and_other(cluster, topic: str) -> tuple[str, str]:
    client = ClusterClient(cluster.bootstrap_servers)
    image = client.refresh_metadata()
    leader = image.partition(topic, 0).leader
    addresses = {b.broker_id: b.address for b in image.brokers}
    other = next(a for b, a in addresses.items() if b != leader)
    client.close()
    return addresses[leader], other


def _raw_produce(address: str, request: pb.ProduceRequest) -> pb.ProduceResponse:
    client = ClusterClient(address)
    try:
        return client.call(address, "Produce", request)
    finally:
        client.close()


def test_wire_errors_for_malformed_and_misdirected_requests(cluster, topic_name):
    create(cluster, topic_name, partitions=1)
    leader, other = _leader_and_other(cluster, topic_name)
    good = to_ipc(produce_batch([b"ok"]))
    not_leader = _raw_produce(other, pb.ProduceRequest(acks=1, partitions=[
        pb.PartitionProduceData(topic=topic_name, partition=0, arrow_records=good)]))
    assert not_leader.partitions[0].error_code == errors.NotLeaderOrFollowerError.code
    garbage = _raw_produce(leader, pb.ProduceRequest(acks=1, partitions=[
        pb.PartitionProduceData(topic=topic_name, partition=0, arrow_records=b"not arrow")]))
    assert garbage.partitions[0].error_code == errors.CorruptMessageError.code
    unknown = _raw_produce(leader, pb.ProduceRequest(acks=1, partitions=[
        pb.PartitionProduceData(topic=topic_name, partition=9, arrow_records=good)]))
    assert unknown.partitions[0].error_code == errors.UnknownTopicOrPartitionError.code
    # A request-level error: a gRPC status carrying the Kafka code.
    channel = grpc.insecure_channel(leader)
    from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
    with pytest.raises(grpc.RpcError) as info:
        pb_grpc.DeltaBusStub(channel).Produce(pb.ProduceRequest(acks=7), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(info.value.trailing_metadata())[ERROR_CODE_KEY] == str(
        errors.InvalidRequiredAcksError.code)
    channel.close()
    # Fetch past the log end: OFFSET_OUT_OF_RANGE, and the log is untouched.
    client = ClusterClient(leader)
    fetched = client.call(leader, "Fetch", pb.FetchRequest(partitions=[
        pb.FetchPartition(topic=topic_name, partition=0, fetch_offset=5)]))
    assert fetched.partitions[0].error_code == errors.OffsetOutOfRangeError.code
    fetched = client.call(leader, "Fetch", pb.FetchRequest(format=pb.PROTO, partitions=[
        pb.FetchPartition(topic=topic_name, partition=0, fetch_offset=0)]))
    assert [r.value for r in fetched.partitions[0].records] == []  # nothing was written
    assert fetched.partitions[0].high_watermark == 0
    client.close()


def test_proto_records_for_clients_without_arrow(cluster, topic_name):
    create(cluster, topic_name, partitions=1)
    leader, _ = _leader_and_other(cluster, topic_name)
    response = _raw_produce(leader, pb.ProduceRequest(acks=1, partitions=[
        pb.PartitionProduceData(topic=topic_name, partition=0, records=[
            pb.Record(key=b"k", value=b"v", headers=[pb.Header(key="h", value=b"1")])])]))
    assert response.partitions[0].error_code == 0
    client = ClusterClient(leader)
    fetched = client.call(leader, "Fetch", pb.FetchRequest(format=pb.PROTO, partitions=[
        pb.FetchPartition(topic=topic_name, partition=0, fetch_offset=0)]))
    record = fetched.partitions[0].records[0]
    assert (record.key, record.value, record.offset) == (b"k", b"v", 0)
    assert record.headers[0].key == "h"
    client.close()
