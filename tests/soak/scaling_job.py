"""Run by soak_scaling.py in its own process: a deltabus cluster scaled 3 -> 6 -> 3
brokers on a master of separate executor JVMs (local-cluster, or a standalone master whose
workers stand for machines), while producers send with acks=all through both doors and a
consumer group reads. Prints one JSON line of findings for the test to check.

Every acknowledged record must be read back once, in send order; the group's one consumer must
read every record once with no reset; after each step every partition is fully replicated and
the spread of replicas and leaders over the brokers within the balancer's bounds.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from confluent_kafka import Producer as KafkaProducer

from bench.scaling import spread
from deltabus import AdminClient, Cluster, Consumer, NewTopic
from deltabus.cluster.balancer import bounds
from tests.cluster.acked_load import WAIT_S, AckedLoad, progress, read_all, wait_until
from tests.soak.job_session import job_session

TOPIC, PARTITIONS, RF = "scaled", 12, 3
KAFKA_RECORDS_PER_S = 300


def settled(cluster: Cluster) -> bool:
    """Every partition fully replicated, led by its preferred replica, no move in progress."""
    return all(sorted(p.isr) == sorted(p.replicas) and p.leader == p.replicas[0]
               and not p.adding_replicas and not p.removing_replicas
               for p in cluster.controller.image().topics[TOPIC].partitions)


def balanced(counts: dict[int, list[int]], brokers: int) -> bool:
    replicas_lo, replicas_hi = bounds(PARTITIONS * RF, brokers)
    leaders_lo, leaders_hi = bounds(PARTITIONS, brokers)
    return len(counts) == brokers and all(
        replicas_lo <= r <= replicas_hi and leaders_lo <= lead <= leaders_hi
        for r, lead in counts.values())


class KafkaLoad:
    """A confluent-kafka producer (acks=all, idempotent) sending k-0000000, k-0000001, ... to
    the topic through the Kafka door until stopped; `acked` holds every value delivered."""

    def __init__(self, bootstrap: str) -> None:
        self.acked: list[bytes] = []
        self.failed: list[str] = []
        self._producer = KafkaProducer({"bootstrap.servers": bootstrap, "acks": "all",
                                        "enable.idempotence": True, "linger.ms": 5})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> KafkaLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _delivered(self, error: Any, message: Any) -> None:
        if error is None:
            self.acked.append(message.value())
        else:
            self.failed.append(str(error))

    def _run(self) -> None:
        i, started = 0, time.monotonic()
        while not self._stop.is_set():
            self._producer.produce(TOPIC, f"k-{i:07d}".encode(), key=f"k{i % 13}",
                                   on_delivery=self._delivered)
            i += 1
            self._producer.poll(0)
            ahead = started + i / KAFKA_RECORDS_PER_S - time.monotonic()
            if ahead > 0:
                self._stop.wait(ahead)
        self._producer.flush(WAIT_S)


class GroupReader:
    """One member of a consumer group reading the topic from the start and committing after
    each poll; `values` holds what it read, `resets` the times a partition's position went
    back."""

    def __init__(self, bootstrap: str) -> None:
        self.values: list[bytes] = []
        self.resets = 0
        self._bootstrap = bootstrap
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        consumer = Consumer(self._bootstrap, group_id="scaling", auto_offset_reset="earliest",
                            enable_auto_commit=False)
        consumer.subscribe([TOPIC])
        last: dict[int, int] = {}
        try:
            while not self._stop.is_set():
                for r in consumer.poll(500, max_records=5000):
                    if r.offset <= last.get(r.partition, -1):
                        self.resets += 1
                    last[r.partition] = r.offset
                    self.values.append(r.value)
                consumer.commit()
        finally:
            consumer.close()


def racks_apart(cluster: Cluster, racks: dict[int, str]) -> bool:
    """Each partition's replicas on as many racks as it can have (the balancer's first goal)."""
    kinds = len(set(racks.values()))
    return all(len({racks[b] for b in p.replicas}) == min(len(p.replicas), kinds)
               for p in cluster.controller.image().topics[TOPIC].partitions)


def scale(cluster: Cluster, brokers: int) -> dict[str, Any]:
    """Scale, wait until settled, and say how the goals hold: racks apart; the counts within
    bounds where the racks allow it (as many brokers on each); and a second balance finding
    nothing more to move."""
    started = time.monotonic()
    status = cluster.scale(brokers)
    wait_until(lambda: settled(cluster), f"every partition settled on {brokers} brokers")
    counts = spread(cluster, TOPIC)
    racks = {b.broker_id: b.rack for b in cluster.controller.image().brokers}
    per_rack = [list(racks.values()).count(r) for r in set(racks.values())]
    plan = cluster.balance()  # a dry run: what is left, and the spread of bytes in
    progress(f"scaled to {brokers}: {status.step}; spread {counts}; racks {racks}; "
             f"bytes in {[round(b.bytes_in_per_s) for b in plan.before]}")
    return {"seconds": round(time.monotonic() - started, 1), "members": list(status.members),
            "spread": counts, "racks": racks, "racks_apart": racks_apart(cluster, racks),
            "even_racks": len(set(per_rack)) == 1, "balanced": balanced(counts, brokers),
            "bytes_in_per_s": {b.broker_id: round(b.bytes_in_per_s) for b in plan.before},
            "unmet": plan.unmet, "left_to_move": len(plan.moves)}


def main(master: str, root: str, dump_after_s: float) -> None:
    spark = job_session(master, dump_after_s)
    cluster = Cluster(spark, root=root, brokers=3, port=0, kafka_port=0,
                      load_report_interval_ms=5000).start()
    try:
        with AdminClient(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, RF)])
        wait_until(lambda: settled(cluster), "the topic's partitions settled")
        result: dict[str, Any] = {"start": spread(cluster, TOPIC)}
        reader = GroupReader(cluster.bootstrap_servers)
        reader.start()
        with AckedLoad(cluster.bootstrap_servers, TOPIC) as load, \
                KafkaLoad(cluster.kafka_bootstrap_servers) as kafka:
            wait_until(lambda: len(load.acked) > 500 and len(kafka.acked) > 100,
                       "records acknowledged through both doors")
            # the leaders' bytes in reach the controller (two reports), so the balance weighs it
            time.sleep(2 * cluster.config.load_report_interval_ms / 1000 + 5)
            result["out"] = scale(cluster, 6)
            result["in"] = scale(cluster, 3)
        found = load.check(PARTITIONS)
        records, _ = read_all(cluster.bootstrap_servers, TOPIC, PARTITIONS, len(kafka.acked))
        read_values = {r.value for r in records}
        expected = {v for _, _, v in load.acked} | set(kafka.acked)
        wait_until(lambda: expected <= set(reader.values), "the group to read every record")
        reader.stop()
        result.update(
            grpc=found,
            kafka={"acked": len(kafka.acked), "failed": kafka.failed[:3],
                   "lost": len(set(kafka.acked) - read_values)},
            group={"read": len(reader.values), "distinct": len(set(reader.values)),
                   "resets": reader.resets, "missing": len(expected - set(reader.values))},
            live=cluster.controller.live_brokers())
        print(json.dumps(result))
    finally:
        cluster.stop()
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
