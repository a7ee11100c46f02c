"""A hostile client against the real cluster (brokers as Spark tasks, the controller in this
process), on both doors, while a well-behaved producer runs beside it.

Each input of issue 17's review is sent as a client can send it: tiny requests that declared or
unpacked to gigabytes, requests naming one partition 100,000 times or 100,000 new topics, ids
and names of 50 MB, floods of connections. For each: Kafka's error for it, nothing written, and
the next request served. Over the whole attack: no broker died or was fenced, every record the
well-behaved producer was told it wrote is there, and the resident memory of the driver (this
process, which also builds the attack) and of each broker stays within a stated bound of where
it started.

Each limit has its own tests against in-memory brokers (tests/rpc, tests/kafka, tests/offsets,
tests/cluster/test_controller_limits.py); this suite proves the running cluster as a whole
holds up under all of them at once.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import AdminClient, NewTopic, Producer
from deltabus import config as cfg
from deltabus.rpc.channel import open_channel
from deltabus.rpc.kafka.apis import FETCH, PRODUCE
from deltabus.rpc.kafka.frames import make, nested
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from tests.conftest import read_records, wait_until
from tests.kafka import raw_frames
from tests.kafka.test_produce_limits import CODECS, record_batch
from tests.rpc.test_produce_limits import null_rows

MIB = 1024 * 1024
# What the attack may add to resident memory, at its peak: a broker holds no more than a
# request or two of it at a time; the driver also builds every request (100 MiB of zeros to
# pack, 50 MB strings serialised once more by protobuf).
BROKER_RSS_GROWTH_MAX = 512 * MIB
DRIVER_RSS_GROWTH_MAX = 1024 * MIB
HUGE = 50_000_000  # the review's 50 MB topic names and transactional ids
MANY = 100_000  # the review's 100,000 entries
HOSTILE_ANSWER_WAIT_S = 300  # the attacker's patience: the answer is checked, not its speed
OFFSET_COMMIT, OFFSET_COMMIT_VERSION = 8, 8
INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION = 22, 4
METADATA, METADATA_VERSION = 3, 12


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """The highest resident memory each process reached while sampled (every 50 ms)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.start = {name: rss_bytes(pid) for name, pid in pids.items()}
        self.peak = dict(self.start)
        self._pids = pids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            for name, pid in self._pids.items():
                self.peak[name] = max(self.peak[name], rss_bytes(pid))

    def stop(self) -> dict[str, int]:
        """Each process's growth at its peak, in bytes."""
        self._stop.set()
        self._thread.join()
        return {name: self.peak[name] - self.start[name] for name in self._pids}


class WellBehavedProducer:
    """Sends numbered records (acks=all) until stopped; remembers what it was told it wrote."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.acked: list[bytes] = []
        self.failed: list[BaseException] = []
        self._producer = Producer(bootstrap, acks="all", linger_ms=5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            batch = [f"good-{i + n}".encode() for n in range(100)]
            futures = [(v, self._producer.send(self.topic, value=v)) for v in batch]
            for value, future in futures:
                try:
                    future.get(timeout=120)
                    self.acked.append(value)
                except Exception as e:  # noqa: BLE001 - reported by the test, not raised here
                    self.failed.append(e)
            i += len(batch)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.close()


@pytest.fixture
def target(cluster: Any, topic_name: str) -> Iterator[dict[str, Any]]:
    """The attacked topic (1 partition, 3 replicas) holding 3 records, and where its leader's
    doors are."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3), NewTopic(f"{topic_name}-good", 1, 3)])
    producer = Producer(cluster.bootstrap_servers, acks="all")
    for value in (b"a", b"b", b"c"):
        producer.send(topic_name, value=value).get(timeout=60)
    producer.close()
    channel = open_channel(cluster.bootstrap_servers, "hostile")
    driver = pb_grpc.DeltaBusStub(channel)
    meta = driver.Metadata(pb.MetadataRequest(topics=[topic_name]), timeout=60)
    leader = meta.topics[0].partitions[0].leader
    (broker,) = [b for b in meta.brokers if b.broker_id == leader]
    leader_channel = open_channel(f"{broker.host}:{broker.port}", "hostile")
    yield {"topic": topic_name, "driver": driver, "leader": pb_grpc.DeltaBusStub(leader_channel),
           "leader_kafka": f"{broker.host}:{broker.kafka_port}",
           "driver_kafka": cluster.kafka_bootstrap_servers}
    leader_channel.close()
    channel.close()


def refused(call: Callable[[], Any]) -> Any:
    """The deltabus error of a gRPC call that must fail."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    return error_from_rpc(info.value)


def log_end(t: dict[str, Any]) -> int:
    answer = t["leader"].ListOffsets(pb.ListOffsetsRequest(partitions=[pb.ListOffsetsPartition(
        topic=t["topic"], partition=0, timestamp=-1)]), timeout=60)
    return answer.partitions[0].offset


def topic_names(t: dict[str, Any]) -> set[str]:
    return {m.name for m in t["driver"].Metadata(pb.MetadataRequest(), timeout=60).topics}


# ---- the attack: each sends one input and checks its answer ------------------------------------

def grpc_a_billion_declared_rows(t: dict[str, Any]) -> None:
    (answer,) = t["leader"].Produce(pb.ProduceRequest(acks=pb.ACKS_ALL, partitions=[
        pb.PartitionProduceData(topic=t["topic"], partition=0,
                                arrow_records=null_rows(10**9))]), timeout=60).partitions
    assert answer.error_code == pb.RECORD_LIST_TOO_LARGE, answer.error_message
    assert str(cfg.PRODUCE_BATCH_RECORDS_MAX) in answer.error_message


def grpc_one_partition_fetched_100000_times(t: dict[str, Any]) -> None:
    error = refused(lambda: t["leader"].Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
        pb.FetchPartition(topic=t["topic"], partition=0, fetch_offset=0)] * MANY), timeout=60))
    assert error.code == pb.INVALID_REQUEST, error


def grpc_offset_commits_past_every_limit(t: dict[str, Any]) -> None:
    def commit(entries: list[tuple[str, int]]) -> list[pb.PartitionResult]:
        return list(t["driver"].OffsetCommit(pb.OffsetCommitRequest(
            group_id=f"{t['topic']}-hostile", partitions=[pb.OffsetCommitPartition(
                topic=topic, partition=p, committed_offset=1) for topic, p in entries]),
            timeout=60).results)

    assert {r.error_code for r in commit([("no-such-topic", 0)])} == {
        pb.UNKNOWN_TOPIC_OR_PARTITION}
    assert {r.error_code for r in commit([(t["topic"], p) for p in range(MANY)])} == {
        pb.INVALID_REQUEST}
    (answer,) = commit([("x" * HUGE, 0)])
    assert answer.error_code == pb.UNKNOWN_TOPIC_OR_PARTITION and len(answer.error_message) < 1000


def grpc_a_50_mb_transactional_id(t: dict[str, Any]) -> None:
    error = refused(lambda: t["driver"].InitProducerId(
        pb.InitProducerIdRequest(transactional_id="x" * HUGE), timeout=60))
    assert error.code in (pb.INVALID_REQUEST, pb.RECORD_LIST_TOO_LARGE), error
    assert len(error.message) < 1000


def grpc_100000_new_topics(t: dict[str, Any]) -> None:
    answer = t["driver"].Metadata(pb.MetadataRequest(
        topics=[f"{t['topic']}-new-{i}" for i in range(MANY)], allow_auto_topic_creation=True),
        timeout=120)
    assert {m.error_code for m in answer.topics} == {pb.POLICY_VIOLATION}


def kafka_produce(address: str, topic: str, records: bytes) -> Any:
    cls = load_request_schema(PRODUCE, 9)
    topic_cls, partition_cls = nested(cls, "TopicProduceData"), nested(cls, "PartitionProduceData")
    return raw_frames.call(address, PRODUCE, 9, make(
        cls, transactional_id=None, acks=-1, timeout=timedelta(seconds=60),
        topic_data=(make(topic_cls, name=topic, partition_data=(
            make(partition_cls, index=0, records=records),)),)),
        timeout_s=HOSTILE_ANSWER_WAIT_S).responses[0].partition_responses[0]


def kafka_decompression_bombs(t: dict[str, Any]) -> None:
    for codec in ("gzip", "zstd"):
        bomb = record_batch([bytes(MIB)] * 101, CODECS[codec])  # 101 MiB of zeros, packed
        answer = kafka_produce(t["leader_kafka"], t["topic"], bomb)
        assert answer.error_code == ErrorCode.record_list_too_large, (codec, answer)
        assert str(cfg.PRODUCE_UNPACKED_BYTES_MAX) in answer.error_message


def kafka_one_partition_fetched_100000_times(t: dict[str, Any]) -> None:
    cls = load_request_schema(FETCH, 12)
    partition = nested(cls, "FetchPartition")(
        partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=1 << 20)
    answer = raw_frames.call(t["leader_kafka"], FETCH, 12, make(
        cls, replica_id=-1, max_wait=timedelta(0), min_bytes=0, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=(),
        rack_id="", topics=(nested(cls, "FetchTopic")(
            topic=t["topic"], partitions=(partition,) * MANY),)), timeout_s=HOSTILE_ANSWER_WAIT_S)
    assert answer.error_code == ErrorCode.invalid_request
    assert all(not p.records for r in answer.responses for p in r.partitions)


def kafka_100000_new_topics(t: dict[str, Any]) -> None:
    """Refusing 100,000 names takes the driver about 6 s on an idle machine, and on a loaded
    one more than a client's 30 s: the attackers wait (HOSTILE_ANSWER_WAIT_S)."""
    cls = load_request_schema(METADATA, METADATA_VERSION)
    answer = raw_frames.call(t["driver_kafka"], METADATA, METADATA_VERSION, make(
        cls, topics=tuple(nested(cls, "MetadataRequestTopic")(
            topic_id=None, name=f"{t['topic']}-kafka-new-{i}") for i in range(MANY)),
        allow_auto_topic_creation=True, include_topic_authorized_operations=False),
        timeout_s=HOSTILE_ANSWER_WAIT_S)
    assert {m.error_code for m in answer.topics} == {ErrorCode.policy_violation}


def kafka_offset_commit_to_unknown_and_huge_topics(t: dict[str, Any]) -> None:
    cls = load_request_schema(OFFSET_COMMIT, OFFSET_COMMIT_VERSION)
    topic_cls, partition_cls = (nested(cls, n) for n in ("OffsetCommitRequestTopic",
                                                          "OffsetCommitRequestPartition"))
    entry = partition_cls(partition_index=0, committed_offset=1, committed_leader_epoch=-1,
                          committed_metadata="")
    answer = raw_frames.call(t["driver_kafka"], OFFSET_COMMIT, OFFSET_COMMIT_VERSION, make(
        cls, group_id=f"{t['topic']}-hostile-kafka", generation_id_or_member_epoch=-1,
        member_id="", group_instance_id=None, topics=(
            topic_cls(name="no-such-topic", partitions=(entry,)),
            topic_cls(name="y" * (HUGE // 10), partitions=(entry,)))),
        timeout_s=HOSTILE_ANSWER_WAIT_S)
    assert {p.error_code for r in answer.topics for p in r.partitions} == {
        ErrorCode.unknown_topic_or_partition}


def kafka_a_50_mb_transactional_id(t: dict[str, Any]) -> None:
    cls = load_request_schema(INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION)
    answer = raw_frames.call(t["driver_kafka"], INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION, make(
        cls, transactional_id="x" * HUGE, transaction_timeout=timedelta(seconds=60),
        producer_id=-1, producer_epoch=-1), timeout_s=HOSTILE_ANSWER_WAIT_S)
    assert answer.error_code != ErrorCode.none and answer.producer_id == -1


def kafka_a_frame_declaring_2_gib_and_a_flood_of_connections(t: dict[str, Any]) -> None:
    with raw_frames.connect_to(t["leader_kafka"], timeout_s=60) as sock:
        sock.sendall(struct.pack(">i", 2**31 - 1) + b"\0" * 64)
        assert raw_frames.closed(sock)  # past socket.request.max.bytes: closed, nothing read
    raw_frames.room_for_connections(1_000)
    flood = [raw_frames.connect_to(t["leader_kafka"], timeout_s=60) for _ in range(1_000)]
    try:
        with raw_frames.connect_to(t["leader_kafka"], timeout_s=60) as sock:
            sock.sendall(raw_frames.api_versions())
            assert raw_frames.read_response(sock, 18, 3)[1].error_code == ErrorCode.none
    finally:
        for sock in flood:
            sock.close()


ATTACK = [grpc_a_billion_declared_rows, grpc_one_partition_fetched_100000_times,
          grpc_offset_commits_past_every_limit, grpc_a_50_mb_transactional_id,
          grpc_100000_new_topics, kafka_decompression_bombs,
          kafka_one_partition_fetched_100000_times, kafka_100000_new_topics,
          kafka_offset_commit_to_unknown_and_huge_topics, kafka_a_50_mb_transactional_id,
          kafka_a_frame_declaring_2_gib_and_a_flood_of_connections]


def test_the_cluster_survives_a_hostile_client_beside_a_well_behaved_one(
        cluster, target) -> None:
    pids = cluster.broker_pids()
    fenced = dict(cluster.controller.fenced)
    topics = topic_names(target)
    memory = PeakMemory({"driver": os.getpid()} | {f"broker {b}": p for b, p in pids.items()})
    good = WellBehavedProducer(cluster.bootstrap_servers, f"{target['topic']}-good")
    try:
        for attack in ATTACK:
            started = len(good.acked)
            attack(target)
            assert log_end(target) == 3, f"{attack.__name__} wrote to the log"
            # The well-behaved producer gets on meanwhile: it is never shut out for good.
            wait_until(lambda: len(good.acked) > started or bool(good.failed),  # noqa: B023
                       f"a record of the good producer acked after {attack.__name__}", 120)
    finally:
        good.stop()  # never left sending into the rest of the suite
        growth = memory.stop()

    assert not good.failed, good.failed[:3]
    assert cluster.broker_pids() == pids, "a broker was relaunched"
    assert dict(cluster.controller.fenced) == fenced, "a broker was fenced"
    assert topic_names(target) == topics, "the attack created topics"
    answer = kafka_produce(target["leader_kafka"], target["topic"], record_batch([b"d"]))
    assert answer.error_code == ErrorCode.none and log_end(target) == 4  # both doors serve
    got = read_records(cluster.bootstrap_servers, f"{target['topic']}-good", 1, len(good.acked))
    assert sorted(r.value for r in got) == sorted(good.acked)
    for name, grew in growth.items():
        bound = DRIVER_RSS_GROWTH_MAX if name == "driver" else BROKER_RSS_GROWTH_MAX
        print(f"{name}: resident memory grew {grew / MIB:.0f} MiB at its peak")
        assert grew < bound, f"{name} grew {grew / MIB:.0f} MiB (bound {bound / MIB:.0f} MiB)"

