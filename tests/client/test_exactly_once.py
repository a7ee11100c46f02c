"""ExactlyOncePipeline against the FakeCluster, whose partition logs answer an idempotent
producer's retried sequences as the real ones do: a pipeline that crashes after writing a batch's
output but before committing its input is replaced by one that writes nothing twice and loses
nothing. The same scenario against real brokers is tests/offsets/test_exactly_once.py."""

from __future__ import annotations

import collections
import time

import pytest

from deltabus import TopicPartition
from deltabus.client.exactly_once import ExactlyOncePipeline
from deltabus.records import ConsumerRecord
from tests.client.fake_cluster import FakeCluster

SOURCE, SINK, GROUP = "in", "out", "pipeline"
SETTINGS = {"auto_offset_reset": "earliest", "session_timeout_ms": 1000,
            "heartbeat_interval_ms": 50, "retry_backoff_ms": 10}


class Crash(Exception):
    pass


class CrashingPipeline(ExactlyOncePipeline):
    """Dies at the worst moment: its second batch's output is written, its input offset not
    committed."""

    batches = 0

    def _before_commit(self, tp: TopicPartition, end: int) -> None:
        self.batches += 1
        if self.batches == 2:
            raise Crash(f"crashed before committing {tp.topic}-{tp.partition} up to {end}")


def transform(record: ConsumerRecord) -> list[tuple[bytes | None, bytes]]:
    assert record.value is not None
    out: list[tuple[bytes | None, bytes]] = [(record.key, record.value.upper())]
    if int(record.value.split(b"-")[1]) % 10 == 0:  # some outputs without a key
        out.append((None, b"extra-" + record.value))
    return out


def input_record(i: int) -> ConsumerRecord:
    return ConsumerRecord(SOURCE, 0, i, 0, 0, f"k{i % 10}".encode(), f"v-{i:03d}".encode(), [])


def output(fake: FakeCluster) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of every output record, partition by partition."""
    out = []
    for p in range(3):
        log = fake.log(SINK, p).records
        out += list(zip(log.column("key").to_pylist(), log.column("value").to_pylist(),
                        strict=True))
    return out


def committed_everything(fake: FakeCluster) -> bool:
    offsets = fake.coordinator.fetch_offsets(GROUP)
    return all(offsets.get((SOURCE, p)) is not None
               and offsets[(SOURCE, p)].offset == fake.log(SOURCE, p).log_end_offset
               for p in range(2))


def test_a_crash_between_output_and_commit_neither_loses_nor_duplicates(fake) -> None:
    fake.create_topic(SOURCE, 2)
    fake.create_topic(SINK, 3)
    records = [input_record(i) for i in range(200)]
    for p in range(2):
        mine = [r for r in records if r.offset % 2 == p]
        fake.write(SOURCE, p, [r.value for r in mine], keys=[r.key for r in mine])
    first = CrashingPipeline(fake.bootstrap_servers, GROUP, SOURCE, SINK, transform,
                             batch_records=40, **SETTINGS)
    with pytest.raises(Crash):
        for _ in range(200):
            first.run_once(100)
    first.close()  # what a crash leaves: output written, input offsets not committed
    assert output(fake), "the crash came after some output was written"
    second = ExactlyOncePipeline(fake.bootstrap_servers, GROUP, SOURCE, SINK, transform,
                                 batch_records=40, **SETTINGS)
    deadline = time.monotonic() + 20
    while not committed_everything(fake):
        assert time.monotonic() < deadline, "the second pipeline did not finish"
        second.run_once(100)
    second.close()
    expected = [o for r in records for o in transform(r)]
    assert collections.Counter(output(fake)) == collections.Counter(expected), \
        "an output is missing or written twice"
    for p in range(3):  # input order per key holds in each output partition
        log = fake.log(SINK, p).records
        pairs = list(zip(log.column("key").to_pylist(), log.column("value").to_pylist(),
                         strict=True))
        for key in {k for k, _ in pairs if k is not None}:
            values = [v for k, v in pairs if k == key]
            assert values == sorted(values)
