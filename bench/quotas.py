"""Bench step (o): client quotas (issue 17): a producer held to its producer_byte_rate while an
unquota'd one runs beside it.

Two deltabus Producers send records of QUOTA_VALUE_BYTES as fast as they can, each to a topic of
one partition, for `run_s`: one under a client id with a producer_byte_rate quota, one without.
Each producer's rate is the value bytes its acknowledged records carry per second of the run.

Kafka's rate lets a new client send (quota.window.num - 1) windows' worth at once (it never
measures over less than 10 s), and a producer that sends all it can gets that burst again each
time its burst's sample leaves the 11 s window, then waits out its throttle: its rate comes in
bursts with an 11 s period. So the quota'd producer's figure is taken over the whole run, a
whole number of periods, less the first burst's allowance (10 s of its quota, which every new
client is granted): what the quota holds it to from then on, which the target holds within 10%.
Its plain rate over the run is reported beside it. The records are large, so what the broker
counts (the requests' bytes) and what is measured (the values') differ by under 1%.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from deltabus import AdminClient, NewTopic, Producer
from deltabus.quotas import (
    PRODUCER_BYTE_RATE,
    QUOTA_WINDOW_NUM,
    QUOTA_WINDOW_SIZE_SECONDS,
    QuotaAlteration,
    QuotaEntity,
)

QUOTA_VALUE_BYTES = 10_000  # one record's value
# What Kafka's rate lets a new client send at once: (samples - 1) windows of its quota.
FIRST_BURST_WINDOWS_S = (QUOTA_WINDOW_NUM - 1) * QUOTA_WINDOW_SIZE_SECONDS


class _Acked:
    """(time, bytes) of each acknowledged record of one producer. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.times: list[float] = []

    def add(self, _: Any) -> None:
        with self._lock:
            self.times.append(time.monotonic())

    def bytes(self, start: float, end: float) -> int:
        """Value bytes acknowledged within [start, end)."""
        with self._lock:
            return sum(1 for t in self.times if start <= t < end) * QUOTA_VALUE_BYTES


def _produce_until(bootstrap: str, topic: str, client_id: str, until: float,
                   acked: _Acked, outstanding_max: int | None) -> None:
    """Send until `until`, then flush. `outstanding_max`: records sent and not yet
    acknowledged, at most (the quota'd producer: two seconds' worth of its quota, so its flush
    at the end does not drain a whole buffer at the quota's rate); None: the buffer's room."""
    value = b"q" * QUOTA_VALUE_BYTES
    room = threading.BoundedSemaphore(outstanding_max) if outstanding_max else None

    def done(future: Any) -> None:
        acked.add(future)
        if room is not None:
            room.release()

    with Producer(bootstrap, client_id=client_id, acks=1, linger_ms=5) as producer:
        while time.monotonic() < until:
            if room is not None and not room.acquire(timeout=max(0.0, until - time.monotonic())):
                break
            producer.send(topic, value, partition=0).add_done_callback(done)
        producer.flush()


def quota_beside_unquotad(bootstrap: str, quota_bytes_per_s: int,
                          run_s: float) -> dict[str, Any]:
    """Produce rates of a quota'd producer and an unquota'd one running beside it."""
    run = uuid.uuid4().hex[:8]
    held_id, free_id = f"bench-quota-held-{run}", f"bench-quota-free-{run}"
    topics = [f"bench-quota-held-{run}", f"bench-quota-free-{run}"]
    entity = QuotaEntity.client(held_id)
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(t, 1, 1) for t in topics])
        error = admin.alter_client_quotas([QuotaAlteration(
            entity, ((PRODUCER_BYTE_RATE, float(quota_bytes_per_s)),))])[entity]
        if error is not None:
            raise error
    started = time.monotonic()
    until = started + run_s
    held, free = _Acked(), _Acked()
    held_outstanding = max(1, 2 * quota_bytes_per_s // QUOTA_VALUE_BYTES)
    threads = [threading.Thread(target=_produce_until, args=(bootstrap, topic, client_id, until,
                                                             acked, outstanding))
               for topic, client_id, acked, outstanding in (
                   (topics[0], held_id, held, held_outstanding),
                   (topics[1], free_id, free, None))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        with AdminClient(bootstrap) as admin:
            admin.alter_client_quotas([QuotaAlteration(entity, ((PRODUCER_BYTE_RATE, None),))])
    held_bytes = held.bytes(started, until)
    first_burst = FIRST_BURST_WINDOWS_S * quota_bytes_per_s
    held_rate = max(0, held_bytes - first_burst) / run_s
    return {"quota_bytes_per_s": quota_bytes_per_s, "run_s": run_s,
            "value_bytes": QUOTA_VALUE_BYTES, "first_burst_bytes": first_burst,
            "held_bytes_per_s": held_rate, "held_vs_quota": held_rate / quota_bytes_per_s,
            "held_with_first_burst_bytes_per_s": held_bytes / run_s,
            # every record acknowledged, the flush after the run included
            "held_records": len(held.times), "unquotad_records": len(free.times),
            "unquotad_bytes_per_s": free.bytes(started, until) / run_s}
