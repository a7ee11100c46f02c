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
            while not self._stop.is_set():
                value = f"{name}-{i:07d}".encode()
                producer.send(self.topic, value, key=f"{name}{i % 11}").add_done_callback(
                    self._on_done(value))
                i += 1
                if i % 100 == 0:
                    time.sleep(0.02)
            producer.flush(WAIT_S)
        except Exception as e:  # counted, so the loss check still runs
            self.failed.append(f"flush: {e!r}")
        finally:
            with contextlib.suppress(Exception):
                producer.close(1)

    def check(self, partitions: int) -> dict[str, Any]:
        """Read the topic back: what was acknowledged and is not there, what is there twice,
        and whether each producer's records are in send order in every partition."""
        records = read_all(self.bootstrap, self.topic, partitions, len(self.acked))
        progress(f"read {len(records)} records")
        stored = {(r.partition, r.offset): r.value for r in records}
        values = [r.value for r in records]
        in_order = all(
            [r.value for r in records if r.partition == p and r.value.startswith(name)]
            == sorted(r.value for r in records if r.partition == p and r.value.startswith(name))
            for p in range(partitions) for name in (b"p", b"q"))
        first_of_each = list({e.split(":")[0]: e for e in reversed(self.failed)}.values())
        return {"acked": len(self.acked), "failed": self.failed[:3] + first_of_each[:3],
                "lost": sum(1 for a in self.acked if stored.get((a[0], a[1])) != a[2]),
                "duplicates": len(values) - len(set(values)), "in_order": in_order}


def read_all(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Any]:
    """Every record of `topic` from the beginning, until `expected` arrived or WAIT_S passed."""
    consumer = Consumer(bootstrap, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    records: list[Any] = []
    deadline = time.monotonic() + WAIT_S
    while len(records) < expected and time.monotonic() < deadline:
        records.extend(consumer.poll(1000, max_records=100_000))
    consumer.close()
    return records
