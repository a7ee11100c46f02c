"""Exactly-once from topic to topic: a pipeline that crashes after writing a batch's output but
before committing its input offsets is replaced by one that writes nothing twice and loses
nothing (the idempotent producer, made deterministic; see deltabus.client.exactly_once)."""

from __future__ import annotations

import collections
import time

import pytest

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from deltabus.client.exactly_once import ExactlyOncePipeline
from deltabus.records import ConsumerRecord
from tests.conftest import read_records


class Crash(Exception):
    pass


class CrashingPipeline(ExactlyOncePipeline):
    """Dies at the worst moment: the output of its second batch is written, its input offsets
    are not committed."""

    batches = 0

    def _before_commit(self, tp: TopicPartition, end: int) -> None:
        self.batches += 1
        if self.batches == 2:
            raise Crash(f"crashed before committing {tp.topic}-{tp.partition} up to {end}")


def transform(record: ConsumerRecord) -> list[tuple[bytes | None, bytes]]:
    out: list[tuple[bytes | None, bytes]] = [(record.key, record.value.upper())]
    if int(record.value.decode().split("-")[1]) % 10 == 0:  # some outputs without a key
        out.append((None, b"extra-" + record.value))
    return out


def test_a_crash_between_output_and_commit_neither_loses_nor_duplicates(cluster, topic_name):
    source, sink, group = f"{topic_name}-in", f"{topic_name}-out", f"g-{topic_name}"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(source, 2), NewTopic(sink, 3)])
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(200):
            producer.send(source, f"v-{i:03d}".encode(), key=f"k{i % 10}".encode())
        producer.flush(60)
    settings = {"auto_offset_reset": "earliest", "session_timeout_ms": 3000,
                "heartbeat_interval_ms": 300}
    first = CrashingPipeline(cluster.bootstrap_servers, group, source, sink, transform,
                             batch_records=40, **settings)
    with pytest.raises(Crash):
        for _ in range(200):
            first.run_once(200)
    first.close()  # what a crash leaves: output written, input offsets not committed
    written_before = len(read_records(cluster.bootstrap_servers, sink, 3, 1, timeout_s=5))
    assert written_before > 0
    second = ExactlyOncePipeline(cluster.bootstrap_servers, group, source, sink, transform,
                                 batch_records=40, **settings)
    expected = [o for i in range(200) for o in transform(_record(i))]
    deadline = time.monotonic() + 60
    with Consumer(cluster.bootstrap_servers, group_id=group) as probe:
        def committed_all() -> bool:
            offsets = probe.committed([TopicPartition(source, p) for p in (0, 1)])
            ends = probe.end_offsets([TopicPartition(source, p) for p in (0, 1)])
            return all(offsets[tp] is not None and offsets[tp].offset == ends[tp] for tp in ends)
        while not committed_all():
            assert time.monotonic() < deadline, "the second pipeline did not finish"
            second.run_once(200)
    second.close()
    output = read_records(cluster.bootstrap_servers, sink, 3, len(expected))
    assert collections.Counter((r.key, r.value) for r in output) == collections.Counter(
        expected), "an output is missing or written twice"
    for key in {r.key for r in output if r.key is not None}:  # input order per key holds
        values = [r.value for r in sorted(output, key=lambda r: r.offset) if r.key == key]
        assert values == sorted(values)


def _record(i: int) -> ConsumerRecord:
    return ConsumerRecord(topic="", partition=0, offset=i, timestamp=0, timestamp_type=0,
                          key=f"k{i % 10}".encode(), value=f"v-{i:03d}".encode(), headers=[])
