"""What the console shows, as one JSON-able overview: brokers, topics and partitions, consumer
groups with their lag, and the cluster's throughput over the last minutes. Read from what the
driver already holds (the metadata image, the leaders' log reports, the group coordinator),
so opening the console asks no broker anything.

What a principal sees follows the ACLs as Kafka's describes do: topics it may DESCRIBE, groups
it may DESCRIBE; brokers, as Metadata tells any client.

Throughput is sampled every SAMPLE_INTERVAL_S from the leaders' reports (records: the high
watermarks' growth; bytes: their Delta tables' growth), whether or not the console is open.

Runs in the driver; thread-safe.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from typing import Any

from deltabus import errors
from deltabus.cluster.driver_metrics import ControllerView
from deltabus.metadata import LogReport
from deltabus.offsets.group_coordinator import SHARE_PROTOCOL, GroupCoordinator
from deltabus.rpc.access import Access
from deltabus.security.acls import Operation

SAMPLE_INTERVAL_S = 10.0
SAMPLES_MAX = 60  # ten minutes of throughput


class ConsoleView:
    """The console's overview of one cluster (`overview`), and the sampler of its throughput
    (`sample_until`, on a thread of its own)."""

    def __init__(self, controller: ControllerView, coordinator: GroupCoordinator) -> None:
        self._controller = controller
        self._coordinator = coordinator
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, int, int]] = deque(maxlen=SAMPLES_MAX + 1)
        self._up_since: dict[tuple[int, int], float] = {}  # (broker, epoch) -> first seen

    def sample_until(self, stopping: threading.Event) -> None:
        """Every SAMPLE_INTERVAL_S until `stopping`: the cluster's records and bytes so far."""
        while True:
            self.sample(time.time())
            if stopping.wait(SAMPLE_INTERVAL_S):
                return

    def sample(self, now_s: float) -> None:
        reports = self._controller.log_reports()
        records = sum(r.high_watermark for r in reports.values())
        size = sum(max(0, r.size_bytes) for r in reports.values())
        self._seen(self._controller.broker_epochs(), now_s)
        with self._lock:
            self._samples.append((now_s, records, size))

    def _seen(self, epochs: dict[int, int], now_s: float) -> dict[int, float]:
        """When each broker's registration (its epoch) was first seen, to the sample."""
        with self._lock:
            for key in epochs.items():
                self._up_since.setdefault(key, now_s)
            return {b: self._up_since[(b, e)] for b, e in epochs.items()}

    def overview(self, access: Access) -> dict[str, Any]:
        """The cluster as `access` may see it."""
        image = self._controller.image()
        reports = self._controller.log_reports()
        up_since = self._seen(self._controller.broker_epochs(), time.time())
        live = set(self._controller.live_brokers())
        leaders: dict[int, int] = {}
        replicas: dict[int, int] = {}
        for topic in image.topics.values():
            for p in topic.partitions:
                leaders[p.leader] = leaders.get(p.leader, 0) + 1
                for r in p.replicas:
                    replicas[r] = replicas.get(r, 0) + 1
        visible = access.describable_topics(sorted(image.topics))
        return {
            "cluster_id": image.cluster_id,
            "brokers": [{"id": b.broker_id, "host": b.host, "rack": b.rack,
                         "live": b.broker_id in live, "leaders": leaders.get(b.broker_id, 0),
                         "replicas": replicas.get(b.broker_id, 0),
                         "up_since_ms": _ms(up_since.get(b.broker_id))}
                        for b in sorted(image.brokers, key=lambda b: b.broker_id)],
            "topics": [{"name": name, "partitions": [
                _partition(p, reports.get((name, p.partition)))
                for p in image.topics[name].partitions]} for name in visible],
            "groups": self._groups(access, set(visible), reports),
            "throughput": self._throughput(),
        }

    def _groups(self, access: Access, topics: set[str],
                reports: dict[tuple[str, int], LogReport]) -> list[dict[str, Any]]:
        out = []
        for group_id, protocol_type, state in sorted(self._coordinator.list_groups()):
            if access.group(Operation.DESCRIBE, group_id) is not None:
                continue
            partitions = []
            if protocol_type == SHARE_PROTOCOL:  # its start offsets, and lag past them
                partitions = [{"topic": t, "partition": p, "committed": o.start_offset,
                               "lag": o.lag if o.lag >= 0 else None}
                              for (t, p), o in sorted(self._coordinator
                                                      .describe_share_group_offsets(group_id)
                                                      .items()) if t in topics]
            for (topic, partition), committed in sorted(
                    self._coordinator.fetch_offsets(group_id).items()):
                if topic not in topics:
                    continue
                report = reports.get((topic, partition))
                partitions.append({
                    "topic": topic, "partition": partition, "committed": committed.offset,
                    "lag": (max(0, report.high_watermark - committed.offset)
                            if report is not None else None)})
            out.append({"group": group_id, "protocol": protocol_type or "consumer",
                        "state": state, "members": self._members(group_id),
                        "partitions": partitions})
        return out

    def _members(self, group_id: str) -> int:
        if self._coordinator.is_share_group(group_id):
            try:
                return len(self._coordinator.describe_share_group(group_id).members)
            except errors.DeltaBusError:  # known by its state only: no member since
                return 0
        try:
            return len(self._coordinator.describe_group(group_id).members)
        except errors.DeltaBusError:  # a KIP-848 group
            try:
                return len(self._coordinator.describe_consumer_group(group_id).members)
            except errors.DeltaBusError:
                return 0

    def _throughput(self) -> list[dict[str, float | None]]:
        """Records and bytes in per second between each two samples."""
        with self._lock:
            samples = list(self._samples)
        return [{"t_ms": _ms(t1), "records_in_per_s": max(0, r1 - r0) / (t1 - t0),
                 "bytes_in_per_s": max(0, b1 - b0) / (t1 - t0)}
                for (t0, r0, b0), (t1, r1, b1) in itertools.pairwise(samples) if t1 > t0]


def _partition(p: Any, report: LogReport | None) -> dict[str, Any]:
    return {"partition": p.partition, "leader": p.leader, "replicas": list(p.replicas),
            "isr": list(p.isr),
            "high_watermark": report.high_watermark if report else None,
            "files": report.files if report and report.files >= 0 else None,
            "size_bytes": report.size_bytes if report and report.size_bytes >= 0 else None}


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)
