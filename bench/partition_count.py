"""Bench step (p): partitions by the thousand (issue 17) on the embedded 3-broker cluster.

Kafka's guidance is up to 4,000 partitions per broker; the targets are 12,000 partitions in a
3-broker cluster (4,000 a broker) created and led with no broker ever fenced, brokers' threads
independent of their partition count, and keyed per-record produce over 1,000 partitions at
least half its rate on one partition, measured in the same run.

1. Keyed per-record send() (acks=1) to a topic of one partition and to one of
   `keyed_partitions`, alternating, `keyed_rounds` times each; the ratio of the medians.
2. Topics of `partitions_step` partitions (replication factor 1) created one after another up
   to `partitions`;
   after each, one record sent to every new partition (each must be led and take it). Per
   step: seconds to create, seconds until every partition took its record, every broker's
   threads and resident memory (its Python worker, read from /proc), and fence events.
3. One broker killed (SIGKILL, as a crash) with its thousands of partitions: seconds until it
   is back and leading again (every partition takes a record), and whether any other broker
   was fenced meanwhile.
Linux only (/proc); only with the embedded cluster, whose brokers' processes it can see. Its
topics are deleted at the end.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

from bench.sizes import Sizes
from deltabus.client.admin import AdminClient
from deltabus.client.producer import Producer
from deltabus.metadata import NewTopic

WAIT_S = 1_800.0  # a loaded machine slows the step; it does not fail it


def partitions_by_the_thousand(cluster: Any, sizes: Sizes) -> dict[str, Any]:
    """The figures of step (p) on `cluster` (a started deltabus Cluster of this process)."""
    run_id = uuid.uuid4().hex[:8]
    total, step = sizes.partitions, sizes.partitions_step
    try:
        return _measure(cluster, run_id, sizes, total, step)
    finally:
        _delete_mine(cluster.bootstrap_servers, run_id)


def _delete_mine(bootstrap: str, run_id: str) -> None:
    """Delete the step's topics one at a time, each with as long as the step waits: deleting
    thousands of partition tables takes longer than the admin default of 30 s, and a request
    that times out is sent again to the next broker, which no longer finds what the first
    one deleted."""
    with AdminClient(bootstrap) as admin:
        for topic in [t for t in admin.list_topics() if run_id in t]:
            admin.delete_topics([topic], timeout_ms=int(WAIT_S * 1000))


def _measure(cluster: Any, run_id: str, sizes: Sizes, total: int, step: int) -> dict[str, Any]:
    figures: dict[str, Any] = {"keyed": _keyed_one_vs_many(
        cluster.bootstrap_servers, run_id, sizes.keyed_partitions, sizes.keyed_records,
        sizes.keyed_rounds)}
    fenced_before = sum(cluster.controller.fenced.values())
    steps: list[dict[str, Any]] = []
    made = 0
    while made < total:
        count = min(step, total - made)
        topic = f"bench-count-{run_id}-{len(steps)}"
        start = time.monotonic()
        with AdminClient(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(topic, count, 1)])
        created = time.monotonic()
        _one_record_each(cluster.bootstrap_servers, topic, count)
        made += count
        steps.append({"partitions": made, "create_s": created - start,
                      "led_s": time.monotonic() - created,
                      "fenced": sum(cluster.controller.fenced.values()) - fenced_before,
                      "brokers": _brokers(cluster)})
        print(f" {made:,}", end="", flush=True)
    figures["steps"] = steps
    figures["relaunch"] = _relaunch(cluster, [f"bench-count-{run_id}-{i}"
                                              for i in range(len(steps))], step, total)
    last = steps[-1]["brokers"]
    first = steps[0]["brokers"]
    figures.update(
        partitions=made, fenced=steps[-1]["fenced"],
        partitions_per_broker=made / len(last),
        threads_per_broker_max=max(b["threads"] for b in last.values()),
        threads_added_max=max(last[b]["threads"] - first[b]["threads"] for b in last),
        rss_mib_per_broker_max=max(b["rss_mib"] for b in last.values()))
    return figures


def _keyed_one_vs_many(bootstrap: str, run_id: str, partitions: int, records: int,
                       rounds: int) -> dict[str, Any]:
    one, many = f"bench-keyed-1-{run_id}", f"bench-keyed-{partitions}-{run_id}"
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(one, 1, 1), NewTopic(many, partitions, 1)])
    _one_record_each(bootstrap, many, partitions)  # every partition led before timing
    rates: dict[str, list[float]] = {"one": [], "many": []}
    for _ in range(rounds):
        rates["one"].append(_send_keyed(bootstrap, one, records))
        rates["many"].append(_send_keyed(bootstrap, many, records))
    one_rps, many_rps = statistics.median(rates["one"]), statistics.median(rates["many"])
    return {"partitions": partitions, "records": records, "rounds": rates,
            "one_partition_rps": one_rps, "many_partitions_rps": many_rps,
            "many_vs_one": many_rps / one_rps}


def _send_keyed(bootstrap: str, topic: str, records: int) -> float:
    """Records/s of a keyed send() loop (acks=1, linger.ms=5), flush included."""
    value = b"v" * 100
    keys = [str(i).encode() for i in range(records)]
    with Producer(bootstrap, acks=1, linger_ms=5) as producer:
        start = time.perf_counter()
        for key in keys:
            producer.send(topic, value, key=key)
        producer.flush(WAIT_S)
        return records / (time.perf_counter() - start)


def _one_record_each(bootstrap: str, topic: str, partitions: int) -> None:
    """One record to each partition of `topic`; raises if any is refused. A partition with no
    leader yet (a relaunched broker taking its thousands back) is retried for as long as the
    step waits, not the producer's default 2 minutes."""
    with Producer(bootstrap, acks=1, linger_ms=20,
                  delivery_timeout_ms=int(WAIT_S * 1000)) as producer:
        futures = [producer.send(topic, b"x", partition=p) for p in range(partitions)]
        producer.flush(WAIT_S)
    for future in futures:
        future.get(0)


def _relaunch(cluster: Any, topics: list[str], step: int, total: int) -> dict[str, Any]:
    """Kill broker 0 and time its return: registered and unfenced, then leading its share
    again (a record taken by every partition of every topic)."""
    controller = cluster.controller
    fenced_before = dict(controller.fenced)
    old_pid = cluster.broker_pids()[0]
    start = time.monotonic()
    cluster.kill_broker(0)
    deadline = start + WAIT_S
    while (cluster.broker_pids().get(0, old_pid) == old_pid
           or 0 not in controller.live_brokers()):
        if time.monotonic() > deadline:
            raise TimeoutError("broker 0 did not come back")
        time.sleep(0.2)
    back = time.monotonic()
    for i, topic in enumerate(topics):
        _one_record_each(cluster.bootstrap_servers, topic, min(step, total - i * step))
    others_fenced = sum(n - fenced_before.get(b, 0) for b, n in controller.fenced.items()
                        if b != 0)
    return {"back_s": back - start, "leading_again_s": time.monotonic() - start,
            "others_fenced": others_fenced}


def _brokers(cluster: Any) -> dict[int, dict[str, float]]:
    """Each broker's threads and resident memory, from its Python worker's /proc entry."""
    page = os.sysconf("SC_PAGE_SIZE")
    out = {}
    for broker, pid in sorted(cluster.broker_pids().items()):
        with open(f"/proc/{pid}/statm") as statm:
            rss = int(statm.read().split()[1]) * page
        out[broker] = {"threads": len(os.listdir(f"/proc/{pid}/task")),
                       "rss_mib": rss / 2**20}
    return out
