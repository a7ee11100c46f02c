"""Consumer-group steps of the bench: offset commits at scale, and rebalance time.

    (h) 100 consumers (by default), each committing its offsets every 100 ms for a few seconds:
        commits per second the coordinator and `__consumer_offsets` sustain, and commit latency
    (i) a group of 10 members (by default) on a topic of as many partitions; one leaves (close):
        the time until the others hold every partition again
"""

from __future__ import annotations

import multiprocessing
import threading
import time

from deltabus.client.consumer import Consumer, TopicPartition

COMMIT_INTERVAL_S = 0.1
POLL_MS = 50
SETTLE_TIMEOUT_S = 120.0


def offset_commits(bootstrap: str, topic: str, count: int, run_s: float) -> dict[str, float]:
    """`committers` in a process of their own: in the driver's process they would compete with
    the coordinator for one interpreter lock, which no deployment does."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return dict(pool.apply(committers, (bootstrap, topic, count, run_s)))


def committers(bootstrap: str, topic: str, count: int, run_s: float) -> dict[str, float]:
    """`count` consumers, each its own group (as that many applications would be), commit an
    advancing offset every COMMIT_INTERVAL_S for `run_s`; returns commits/s achieved, the rate
    asked for, and latencies."""
    consumers = [Consumer(bootstrap, group_id=f"bench-commit-{i}", client_id=f"committer-{i}")
                 for i in range(count)]
    latencies: list[float] = []
    lock = threading.Lock()
    start = time.monotonic()
    stop_at = start + run_s

    def commit_loop(consumer: Consumer) -> None:
        """commit_async every interval, as applications (and Kafka's auto-commit) do."""
        n = 0
        next_at = time.monotonic()
        while next_at < stop_at:
            time.sleep(max(0.0, next_at - time.monotonic()))
            began = time.monotonic()

            def done(offsets: dict, error: BaseException | None, began: float = began) -> None:
                if error is None:
                    with lock:
                        latencies.append((time.monotonic() - began) * 1000)

            consumer.commit_async({TopicPartition(topic, 0): n}, done)
            n += 1
            next_at += COMMIT_INTERVAL_S

    threads = [threading.Thread(target=commit_loop, args=(c,)) for c in consumers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for c in consumers:
            c.close()  # waits for its async commits
    elapsed = time.monotonic() - start
    if not latencies:
        raise RuntimeError("offset commits: no commit succeeded")
    latencies.sort()
    return {"committers": count, "commits_per_s": len(latencies) / elapsed,
            "asked_per_s": count / COMMIT_INTERVAL_S,
            "p50_ms": latencies[len(latencies) // 2],
            "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]}


def rebalance_time(bootstrap: str, topic: str, count: int) -> float:
    """Seconds from one member's close() until the other `count - 1` cover every partition
    again; the topic has `count` partitions, one for each member before one leaves."""
    group = f"bench-rebalance-{topic}"
    stop = threading.Event()
    members = [Consumer(bootstrap, group_id=group, client_id=f"member-{i}",
                        session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
               for i in range(count)]
    assigned: dict[int, set[TopicPartition]] = {}
    lock = threading.Lock()

    def member(i: int) -> None:
        consumer = members[i]
        consumer.subscribe([topic])
        while not stop.is_set() and i in assigned:
            consumer.poll(POLL_MS)
            with lock:
                if i in assigned:
                    assigned[i] = consumer.assignment()

    everything = {TopicPartition(topic, p) for p in range(count)}

    def covered(expected_members: int) -> bool:
        with lock:
            sets = list(assigned.values())
        return (len(sets) == expected_members and all(len(s) == 1 for s in sets)
                and set().union(*sets) == everything)

    for i in range(count):
        assigned[i] = set()
    threads = [threading.Thread(target=member, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    try:
        _wait(lambda: covered(count), f"the group of {count} to form")
        with lock:
            del assigned[0]  # member 0's thread stops polling
        threads[0].join()
        started = time.monotonic()
        members[0].close()
        _wait(lambda: _rest_cover(assigned, lock, everything, count - 1),
              f"the other {count - 1} to take over")
        return time.monotonic() - started
    finally:
        stop.set()
        for t in threads:
            t.join()
        for c in members[1:]:
            c.close()


def _rest_cover(assigned: dict[int, set[TopicPartition]], lock: threading.Lock,
                everything: set[TopicPartition], rest: int) -> bool:
    with lock:
        sets = list(assigned.values())
    return len(sets) == rest and set().union(*sets) == everything


def _wait(condition: object, what: str) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench: timed out waiting for {what}")
        time.sleep(0.005)
