"""A Fetch answer keeps fetch.max.bytes and max.partition.fetch.bytes whatever the number of files
behind it (issue 14): partitions of 500 Delta files each, read from offset 0, come back within
the limits the request sets, and a consumer with Kafka's defaults reads them all (once a 173 MB
answer passed gRPC's 100 MB message limit: RECORD_LIST_TOO_LARGE)."""

from __future__ import annotations

import threading

import pytest
from deltalake import DeltaTable

from deltabus import AdminClient, Consumer, NewTopic, TopicPartition
from deltabus import config as cfg
from deltabus.client.cluster_client import ClusterClient
from deltabus.log_tables.layout import replica_path
from deltabus.records import from_ipc, produce_batch, to_ipc
from deltabus.rpc.v1 import deltabus_pb2 as pb

PARTITIONS = 6
FILES = 500  # per partition: one Produce request, so one Delta commit, each
RECORDS_PER_FILE = 20
VALUE = b"x" * 100
RECORDS = FILES * RECORDS_PER_FILE  # per partition


def produce_files(cluster, topic: str, partitions: int, batches: list[list[bytes]]) -> None:
    """Each batch to every partition, one acknowledged Produce request after the other (so one
    Delta commit, one file, per batch and partition); each leader's partitions in a thread."""
    image = cluster.controller.image()
    by_leader: dict[int, list[int]] = {}
    for p in range(partitions):
        by_leader.setdefault(image.partition(topic, p).leader, []).append(p)
    failures: list[Exception] = []

    def produce(leader: int, parts: list[int]) -> None:
        address = image.broker(leader).address
        client = ClusterClient(address)
        try:
            for values in batches:
                data = to_ipc(produce_batch(values))
                response = client.call(address, "Produce", pb.ProduceRequest(
                    acks=1, timeout_ms=30_000, partitions=[
                        pb.PartitionProduceData(topic=topic, partition=p, arrow_records=data)
                        for p in parts]))
                assert all(r.error_code == 0 for r in response.partitions), response
        except Exception as e:  # re-raised in the test's thread
            failures.append(e)
        finally:
            client.close()

    threads = [threading.Thread(target=produce, args=item) for item in by_leader.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]


@pytest.fixture(scope="module")
def many_files(cluster) -> str:
    """A topic of 6 partitions of 500 files each (20 records of 100 bytes a file), all led by
    one broker, so one Fetch asks for all six: the issue's consumer."""
    topic = "t-fetch-limits-many-files"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, replica_assignment={
            p: [0] for p in range(PARTITIONS)})])
    produce_files(cluster, topic, PARTITIONS, [[VALUE] * RECORDS_PER_FILE] * FILES)
    image = cluster.controller.image()
    for p in range(PARTITIONS):
        path = replica_path(cluster.config.root, topic, p, image.partition(topic, p).leader)
        assert len(DeltaTable(path).file_uris()) >= FILES
    return topic


def fetch(cluster, topic: str, offsets: dict[int, int], *, partition_max_bytes: int,
          max_bytes: int, record_format: int = pb.ARROW) -> dict[int, pb.FetchPartitionResponse]:
    """One raw Fetch to each leader, for its partitions (a consumer's requests)."""
    image = cluster.controller.image()
    by_leader: dict[int, list[int]] = {}
    for p in offsets:
        by_leader.setdefault(image.partition(topic, p).leader, []).append(p)
    out = {}
    for leader, parts in by_leader.items():
        address = image.broker(leader).address
        client = ClusterClient(address)
        try:
            response = client.call(address, "Fetch", pb.FetchRequest(
                max_wait_ms=0, max_bytes=max_bytes, format=record_format, partitions=[
                    pb.FetchPartition(topic=topic, partition=p, fetch_offset=offsets[p],
                                      partition_max_bytes=partition_max_bytes)
                    for p in parts]))
        finally:
            client.close()
        out.update({r.partition: r for r in response.partitions})
        answered = [r.partition for r in response.partitions]
        assert answered == parts
        carried = [record_bytes(r) for r in response.partitions]
        assert sum(carried) <= (max_bytes or cfg.FETCH_MAX_BYTES)
        assert carried[0] > 0  # the first partition always progresses
    return out


def record_bytes(answer: pb.FetchPartitionResponse) -> int:
    """What a partition's answer carries in records, as sent."""
    if answer.arrow_records:
        return len(answer.arrow_records)
    return pb.FetchPartitionResponse(records=answer.records).ByteSize()


def offsets_of(answer: pb.FetchPartitionResponse) -> list[int]:
    if answer.arrow_records:
        return from_ipc(answer.arrow_records).column("offset").to_pylist()
    return [r.offset for r in answer.records]


@pytest.mark.parametrize("record_format", [pb.ARROW, pb.PROTO])
@pytest.mark.parametrize("partition_max_bytes,max_bytes", [
    (0, 0),  # Kafka's defaults: 1 MiB a partition, 50 MiB in all
    (cfg.FETCH_PARTITION_MAX_BYTES, cfg.FETCH_MAX_BYTES),
    (cfg.FETCH_PARTITION_MAX_BYTES, 1_500_000),  # room for one and a half partitions
    (10_000, 1_000_000),
    (100_000, 150_000),
    (100_000, 100_000),  # the first partition spends it all
])
def test_every_answer_keeps_its_limits(cluster, many_files, partition_max_bytes, max_bytes,
                                       record_format):
    answers = fetch(cluster, many_files, dict.fromkeys(range(PARTITIONS), 0),
                    partition_max_bytes=partition_max_bytes, max_bytes=max_bytes,
                    record_format=record_format)
    for answer in answers.values():
        assert answer.error_code == 0 and answer.high_watermark == RECORDS
        assert record_bytes(answer) <= (partition_max_bytes or cfg.FETCH_PARTITION_MAX_BYTES)
        assert offsets_of(answer) == list(range(len(offsets_of(answer))))  # a prefix, in order


def test_a_consumer_reading_500_files_gets_answers_within_its_limits(cluster, many_files):
    """A whole partition read answer after answer: each within 100 kB, every record once."""
    position, answers = 0, 0
    while position < RECORDS:
        (answer,) = fetch(cluster, many_files, {0: position}, partition_max_bytes=100_000,
                          max_bytes=cfg.FETCH_MAX_BYTES).values()
        assert 0 < len(answer.arrow_records) <= 100_000
        offsets = offsets_of(answer)
        assert offsets == list(range(position, position + len(offsets)))
        position += len(offsets)
        answers += 1
    assert answers >= 10


def test_a_consumer_with_default_limits_reads_every_file_of_six_partitions(cluster, many_files):
    consumer = Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition(many_files, p) for p in range(PARTITIONS)])
        records: list = []
        for _ in range(200):
            records.extend(consumer.poll(500, max_records=100_000))
            if len(records) >= PARTITIONS * RECORDS:
                break
    finally:
        consumer.close()
    by_partition: dict[int, list[int]] = {}
    for r in records:
        by_partition.setdefault(r.partition, []).append(r.offset)
    assert by_partition == {p: list(range(RECORDS)) for p in range(PARTITIONS)}
