"""The driver's metrics: the controller's (Kafka's KafkaController MBeans), consumer lag as the
group coordinator sees it, the Spark jobs the driver runs, and the service discovery of every
node's metrics endpoint (rpc/metrics_http.py).

Consumer lag, as kafka_exporter and kafka-lag-exporter name it, per group, topic and partition:
- kafka_consumergroup_current_offset: the group's committed offset;
- kafka_topic_partition_current_offset: the partition's high watermark, as its leader last
  reported it (every offsets.report.interval.ms, with its heartbeats);
- kafka_consumergroup_lag: the one less the other, never below 0;
- kafka_consumergroup_lag_seconds: how long ago the first record the group has not read
  arrived, estimated as kafka-lag-exporter does: from the times the high watermarks were seen
  to pass each offset, interpolated between two sightings (a group further behind than the
  history reaches gets at least the age of the oldest sighting).

Runs in the driver; thread-safe.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import Histogram
from prometheus_client.core import Metric

from deltabus.metadata import BrokerEndpoint, LogReport, MetadataImage
from deltabus.metrics import JOB_SECONDS_BUCKETS, NodeMetrics, family
from deltabus.offsets.group_coordinator import GroupCoordinator

SIGHTINGS_MAX = 120  # high watermark sightings kept per partition (lag in seconds)

PartitionKey = tuple[str, int]


class ControllerView(Protocol):
    """What the metrics read of the Controller (which imports this module's users)."""

    def image(self) -> MetadataImage: ...

    def live_brokers(self) -> list[int]: ...

    def members(self) -> list[int]: ...

    def broker_epochs(self) -> dict[int, int]: ...

    def log_reports(self) -> dict[PartitionKey, LogReport]: ...


class HighWatermarkHistory:
    """When each partition's high watermark was seen to move: (offset, time.time()) pairs,
    oldest first, at most SIGHTINGS_MAX each. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sightings: dict[PartitionKey, list[tuple[int, float]]] = {}

    def observe(self, high_watermarks: dict[PartitionKey, int], now_s: float) -> None:
        with self._lock:
            for key, hw in high_watermarks.items():
                seen = self._sightings.setdefault(key, [])
                if not seen or seen[-1][0] != hw:
                    seen.append((hw, now_s))
                    del seen[:-SIGHTINGS_MAX]
            for gone in self._sightings.keys() - high_watermarks.keys():
                del self._sightings[gone]

    def lag_seconds(self, key: PartitionKey, committed: int, now_s: float) -> float:
        """How long ago offset `committed` (the first record a group has not read) came in:
        0 when the group is at the high watermark."""
        with self._lock:
            seen = list(self._sightings.get(key, ()))
        if not seen or committed >= seen[-1][0]:
            return 0.0
        # the first sighting whose high watermark passed `committed`
        i = bisect.bisect_right([hw for hw, _ in seen], committed)
        hw1, t1 = seen[i]
        if i == 0:
            return now_s - t1
        hw0, t0 = seen[i - 1]
        arrived = t0 + (committed + 1 - hw0) / (hw1 - hw0) * (t1 - t0)
        return max(0.0, now_s - arrived)


class DriverMetrics:
    """The driver's metrics (`node`: its registry, served on its metrics door with the
    service discovery `sd_nodes` lists)."""

    def __init__(self, controller: ControllerView, coordinator: GroupCoordinator,
                 driver_node: Callable[[], BrokerEndpoint | None]) -> None:
        """`driver_node`: the driver's own node, once its doors are open."""
        self.node = NodeMetrics()
        self._controller = controller
        self._coordinator = coordinator
        self._driver_node = driver_node
        self._history = HighWatermarkHistory()
        self._jobs = Histogram("deltabus_spark_job_seconds", "Duration of the Spark jobs the "
                               "driver runs: the log cleaner's, the catch-ups of replicas",
                               ("job",), buckets=JOB_SECONDS_BUCKETS, registry=self.node.registry)
        self.node.add_gauges(self._controller_gauges)
        self.node.add_gauges(self._lag_gauges)

    def sd_nodes(self) -> list[BrokerEndpoint]:
        """Every node serving metrics: the driver and the registered brokers."""
        driver = self._driver_node()
        return [*([driver] if driver else []), *self._controller.image().brokers]

    @contextlib.contextmanager
    def timed(self, job: str) -> Iterator[None]:
        """Time a Spark job of the driver's (`job`: "log_cleaner", "catch_up")."""
        started = time.monotonic()
        try:
            yield
        finally:
            self._jobs.labels(job).observe(time.monotonic() - started)

    def _controller_gauges(self) -> Iterator[Metric]:
        controller = self._controller
        image = controller.image()
        partitions = [p for t in image.topics.values() for p in t.partitions]
        live, members = set(controller.live_brokers()), set(controller.members())
        prefix = "kafka_controller_kafkacontroller_"
        for name, doc, value in (
                ("activecontrollercount", "1 on the active controller (the driver)", 1),
                ("globaltopiccount", "Topics in the cluster", len(image.topics)),
                ("globalpartitioncount", "Partitions in the cluster", len(partitions)),
                ("offlinepartitionscount", "Partitions with no leader",
                 sum(1 for p in partitions if p.leader < 0)),
                ("preferredreplicaimbalancecount", "Partitions not led by their first replica",
                 sum(1 for p in partitions if p.replicas and p.leader != p.replicas[0])),
                ("activebrokercount", "Brokers registered and not fenced", len(live)),
                ("fencedbrokercount", "Member brokers not registered or fenced",
                 len(members - live))):
            yield family(prefix + name, doc, "gauge", [({}, value)])

    def _lag_gauges(self) -> Iterator[Metric]:
        now_s = time.time()
        topics = self._controller.image().topics
        high_watermarks = {key: r.high_watermark
                           for key, r in self._controller.log_reports().items()
                           if key[0] in topics}  # not those of deleted topics
        self._history.observe(high_watermarks, now_s)
        offsets: list[tuple[dict[str, str], float]] = []
        lags: list[tuple[dict[str, str], float]] = []
        lag_seconds: list[tuple[dict[str, str], float]] = []
        for group_id, _, _ in sorted(self._coordinator.list_groups()):
            for (topic, partition), committed in sorted(
                    self._coordinator.fetch_offsets(group_id).items()):
                labels = {"consumergroup": group_id, "topic": topic,
                          "partition": str(partition)}
                offsets.append((labels, committed.offset))
                hw = high_watermarks.get((topic, partition))
                if hw is None:  # not reported yet (or the topic is gone)
                    continue
                lags.append((labels, max(0, hw - committed.offset)))
                lag_seconds.append((labels, self._history.lag_seconds(
                    (topic, partition), committed.offset, now_s)))
        yield family("kafka_topic_partition_current_offset",
                     "A partition's high watermark, as its leader last reported it", "gauge",
                     [({"topic": t, "partition": str(p)}, hw)
                      for (t, p), hw in sorted(high_watermarks.items())])
        yield family("kafka_consumergroup_current_offset", "A group's committed offset",
                     "gauge", offsets)
        yield family("kafka_consumergroup_lag", "Records a group has not read: the high "
                     "watermark less its committed offset", "gauge", lags)
        yield family("kafka_consumergroup_lag_seconds", "Age of the first record a group "
                     "has not read (estimated from when the high watermark passed it)",
                     "gauge", lag_seconds)
