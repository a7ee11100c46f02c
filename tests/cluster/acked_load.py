"""Load under which the failure jobs kill executors and machines (local_cluster_job.py,
standalone_job.py): two idempotent producers sending keyed records with acks=all, every
acknowledgement kept, then everything read back and checked against them. Each job runs in a
process of its own, so this is plain code with a stderr progress line, not pytest fixtures."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from deltabus import Consumer, Producer, TopicPartition

WAIT_S = 180  # any one wait: a loaded two-core machine relaunching JVMs is slow
# Each producer's steady rate. Unbounded, they sent over 5,000 records a second (a commit takes
# a millisecond), and a relaunched broker copying the backlog on a loaded two-core machine never
# caught up with them to rejoin the ISR: a test of overload, not of failover.
PRODUCER_RECORDS_PER_S = 1_000


def progress(what: str) -> None:
    """A time-stamped line on stderr, so a slow or stuck run shows how far it got."""
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    progress(f"waiting for {what}")
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


class AckedLoad:
    """Producers "p" and "q" sending `p-0000000`, `p-0000001`, ... to `topic` until stopped;
    `acked` holds (partition, offset, value) of every acknowledged record, `failed` every
    error."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.acked: list[tuple[int, int, bytes]] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._senders = [threading.Thread(target=self._produce, args=(n,)) for n in "pq"]

    def __enter__(self) -> AckedLoad:
        for t in self._senders:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._senders:
            t.join()
        progress(f"producers done: {len(self.acked)} acknowledged, {len(self.failed)} failed")

    def _on_done(self, value: bytes) -> Callable[[Any], None]:
        def done(future: Any) -> None:
            error = future.exception()
            if error is None:
                meta = future.get(0)
                self.acked.append((meta.partition, meta.offset, value))
            else:
                self.failed.append(repr(error))
        return done

    def _produce(self, name: str) -> None:
        producer = Producer(self.bootstrap, acks="all", linger_ms=2,
                            delivery_timeout_ms=WAIT_S * 1000)
        try:
            i = 0
            started = time.monotonic()
            while not self._stop.is_set():
                value = f"{name}-{i:07d}".encode()
                producer.send(self.topic, value, key=f"{name}{i % 11}").add_done_callback(
                    self._on_done(value))
                i += 1
                if i % 10 == 0:
                    ahead = started + i / PRODUCER_RECORDS_PER_S - time.monotonic()
                    if ahead > 0:
                        self._stop.wait(ahead)
            producer.flush(WAIT_S)
        except Exception as e:  # counted, so the loss check still runs
            self.failed.append(f"flush: {e!r}")
        finally:
            with contextlib.suppress(Exception):
                producer.close(1)

    def check(self, partitions: int) -> dict[str, Any]:
        """Read the topic back: what was acknowledged and is not there, what is there twice,
        and whether each producer's records are in send order in every partition. With a loss,
        `partitions` says per partition where the missing records were and what the read found
        there, and `read` how the read ended, so a failed run explains itself."""
        highest: dict[int, int] = {}
        for p, offset, _ in self.acked:
            highest[p] = max(highest.get(p, -1), offset)
        records, read = read_all(self.bootstrap, self.topic, partitions, len(self.acked),
                                 {p: o + 1 for p, o in highest.items()})
        progress(f"read {len(records)} records: {read}")
        stored = {(r.partition, r.offset): r.value for r in records}
        values = [r.value for r in records]
        in_order = all(
            [r.value for r in records if r.partition == p and r.value.startswith(name)]
            == sorted(r.value for r in records if r.partition == p and r.value.startswith(name))
            for p in range(partitions) for name in (b"p", b"q"))
        first_of_each = list({e.split(":")[0]: e for e in reversed(self.failed)}.values())
        # A retry the leader answered DUPLICATE_SEQUENCE_NUMBER (it holds the batch but no
        # longer remembers where) is acknowledged with offset -1, as Kafka's producer does: such
        # a record must be in its partition, wherever.
        partition_of = {r.value: r.partition for r in records}
        missing = [a for a in self.acked
                   if (stored.get((a[0], a[1])) != a[2] if a[1] >= 0
                       else partition_of.get(a[2]) != a[0])]
        found: dict[str, Any] = {
            "acked": len(self.acked), "failed": self.failed[:3] + first_of_each[:3],
            "lost": len(missing), "duplicates": len(values) - len(set(values)),
            "in_order": in_order,
            "acked_without_offset": sum(1 for a in self.acked if a[1] < 0)}
        if missing:
            found["read"] = read
            found["partitions"] = loss_by_partition(self.acked, missing, records, partitions)
        return found


def _ranges(offsets: list[int], limit: int = 6) -> list[str]:
    """Sorted offsets as at most `limit` runs "a-b" (and "..." when there are more)."""
    runs: list[list[int]] = []
    for o in sorted(set(offsets)):
        if runs and o == runs[-1][1] + 1:
            runs[-1][1] = o
        else:
            runs.append([o, o])
    shown = [f"{a}-{b}" if a != b else str(a) for a, b in runs[:limit]]
    return shown + (["..."] if len(runs) > limit else [])


def loss_by_partition(acked: list[tuple[int, int, bytes]], missing: list[tuple[int, int, bytes]],
                      records: list[Any], partitions: int) -> dict[int, dict[str, Any]]:
    """Per partition: the acknowledged records not read back at their offsets, split into those
    whose offset the read never reached (`unread`: the read stopped early, or the log ends
    below them, or the acknowledgement had no offset: -1), those where another record was read
    instead (`replaced`: the log was truncated and refilled), and of all the missing ones those
    read at another offset (`moved`); with what was acknowledged and read there."""
    where = {r.value: (r.partition, r.offset) for r in records}
    read_at = {(r.partition, r.offset) for r in records}
    out: dict[int, dict[str, Any]] = {}
    for p in range(partitions):
        gone = [a for a in missing if a[0] == p]
        if not gone:
            continue
        acked_offsets = [a[1] for a in acked if a[0] == p]
        read_offsets = [r.offset for r in records if r.partition == p]
        out[p] = {
            "acked": len(acked_offsets),
            "acked_offsets": [min(acked_offsets), max(acked_offsets)],
            "read": len(read_offsets),
            "read_offsets": [min(read_offsets), max(read_offsets)] if read_offsets else [],
            "missing": len(gone),
            "missing_offsets": _ranges([a[1] for a in gone]),
            "unread": sum(1 for a in gone if (p, a[1]) not in read_at),
            "replaced": sum(1 for a in gone if (p, a[1]) in read_at),
            "moved": sum(1 for a in gone if a[2] in where),
            "missing_values": [a[2].decode() for a in gone[:3]],
        }
    return out


def read_all(bootstrap: str, topic: str, partitions: int, expected: int,
             ends: dict[int, int] | None = None) -> tuple[list[Any], dict[str, Any]]:
    """Every record of `topic` from the beginning, until each partition is read up to its end
    offset (the high watermark when the read starts) and to `ends` (partition: the offset after
    the last one acknowledged), or WAIT_S passed; counting records instead could stop early or
    wait in vain (`expected`, the records acknowledged, is only reported). Returns the records
    and how the read ended: the `end_offsets`, the `positions` reached per partition, whether
    it `caught_up` or timed out, and after how many `seconds`."""
    consumer = Consumer(bootstrap, auto_offset_reset="earliest")
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    records: list[Any] = []
    started = time.monotonic()
    deadline = started + WAIT_S
    end_offsets: dict[int, int] = {}
    with contextlib.suppress(Exception):  # then the acknowledged offsets say how far to read
        end_offsets = {tp.partition: o for tp, o in consumer.end_offsets(tps).items()}
    goal = {p: max(end_offsets.get(p, 0), (ends or {}).get(p, 0)) for p in range(partitions)}
    positions: dict[int, int] = {}

    def caught_up() -> bool:
        for tp in tps:
            with contextlib.suppress(Exception):
                positions[tp.partition] = consumer.position(tp)
        return all(positions.get(p, -1) >= goal[p] for p in range(partitions))

    while not (done := caught_up()) and time.monotonic() < deadline:
        records.extend(consumer.poll(1000, max_records=100_000))
    consumer.close()
    return records, {"caught_up": done, "seconds": round(time.monotonic() - started, 1),
                     "expected": expected, "read": len(records), "end_offsets": end_offsets,
                     "goal": goal, "positions": positions}
