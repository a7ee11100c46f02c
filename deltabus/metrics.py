"""A node's metrics, named as Kafka's JMX exporter renders Kafka's MBeans for Prometheus, so
dashboards and alert rules written for Kafka work with few changes:

    kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec,topic=t
        -> kafka_server_brokertopicmetrics_messagesin_total{topic="t"}
    kafka.network:type=RequestMetrics,name=TotalTimeMs,request=Produce
        -> kafka_network_requestmetrics_totaltimems_bucket{request="Produce",door="kafka",...}

A meter in all topics has no topic label, as the exporter renders the MBean without one.
Request metrics carry a `door` label ("kafka" or "grpc"): the same request through either
door is the same work. deltabus's own metrics (Delta commits, the tail cache, the Spark jobs of
the driver) are named `deltabus_*`.

Each node (a broker, the driver) has a registry of its own, never the process's default one:
several brokers may share a process (tests), and a notebook's driver is the user's process,
whose own metrics stay theirs. Gauges of state the node already holds (partition counts, the
ISR, purgatory sizes) are read at scrape time by collectors, so keeping them costs nothing
between scrapes; counters on the request path cost a lock and a dict update a batch.

Runs in the driver and in broker tasks; every class is thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

# Request times in milliseconds (Kafka's TotalTimeMs is in ms): a produce to the tail cache
# takes a few, a long-polling fetch up to its max wait, a join up to the rebalance timeout.
REQUEST_MS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
                      60000)
THROTTLE_MS_BUCKETS = (0, 1, 10, 100, 1000, 10000, 30000)
COMMIT_SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                          2.5, 5, 10)
COMMIT_BYTES_BUCKETS = tuple(4 ** i * 256 for i in range(11))  # 256 B to 256 MiB
JOB_SECONDS_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

DOORS = ("kafka", "grpc")


def family(name: str, documentation: str, kind: str,
           samples: Iterable[tuple[dict[str, str], float]]) -> Metric:
    """A metric family of `kind` ("counter" or "gauge") whose samples may carry different
    labels (a meter in all topics has none, one per topic has `topic`)."""
    metric = Metric(name, documentation, kind)
    sample_name = name + "_total" if kind == "counter" else name
    for labels, value in samples:
        metric.add_sample(sample_name, labels, value)
    return metric


class TopicMeters:
    """Kafka's BrokerTopicMetrics: what came in and went out, by topic and in all."""

    METERS = {
        "messagesin": "Records appended to the logs this broker leads",
        "bytesin": "Bytes of records appended to the logs this broker leads",
        "bytesout": "Bytes of records sent to consumers",
        "replicationbytesout": "Bytes of records and files sent to followers",
        "failedproducerequests": "Produce batches refused or failed",
        "failedfetchrequests": "Fetches of a partition answered with an error",
        "totalproducerequests": "Produce batches",
        "totalfetchrequests": "Partition fetches of consumers",
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_meter: dict[str, defaultdict[str, float]] = {
            meter: defaultdict(float) for meter in self.METERS}

    def add(self, meter: str, topic: str, value: float = 1) -> None:
        with self._lock:
            self._by_meter[meter][topic] += value

    def produced(self, topic: str, records: int, size_bytes: int) -> None:
        with self._lock:
            self._by_meter["messagesin"][topic] += records
            self._by_meter["bytesin"][topic] += size_bytes

    def forget_all_but(self, topics: Collection[str]) -> None:
        """Drop the meters of topics not in `topics` (deleted), as Kafka removes their
        MBeans."""
        with self._lock:
            for by_topic in self._by_meter.values():
                for gone in by_topic.keys() - set(topics):
                    del by_topic[gone]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snapshot = {meter: dict(by_topic) for meter, by_topic in self._by_meter.items()}
        for meter, by_topic in snapshot.items():
            total: tuple[dict[str, str], float] = ({}, sum(by_topic.values()))
            per_topic = (({"topic": topic}, value) for topic, value in sorted(by_topic.items()))
            yield family(f"kafka_server_brokertopicmetrics_{meter}", self.METERS[meter],
                         "counter", [total, *per_topic])


class RequestMeters:
    """Kafka's RequestMetrics (requests, total and throttle time per API), per door, and the
    request handlers' idle ratio (Kafka's RequestHandlerAvgIdlePercent) over the time since
    the last scrape."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("kafka_network_requestmetrics_requests",
                                "Requests answered, per API and door", ("request", "door"),
                                registry=registry)
        self.total_time_ms = Histogram(
            "kafka_network_requestmetrics_totaltimems",
            "Time from a request's arrival to its answer, in ms", ("request", "door"),
            buckets=REQUEST_MS_BUCKETS, registry=registry)
        self.throttle_time_ms = Histogram(
            "kafka_network_requestmetrics_throttletimems",
            "Quota throttle time a request's answer carried, in ms", ("request", "door"),
            buckets=THROTTLE_MS_BUCKETS, registry=registry)
        self._lock = threading.Lock()
        self._busy_s = 0.0
        self._threads = 0
        self._last = (time.monotonic(), 0.0)  # (when, busy seconds) at the last scrape

    def answered(self, request: str, door: str, elapsed_s: float, throttle_ms: int = 0,
                 busy_s: float | None = None) -> None:
        """A request answered `elapsed_s` after it arrived; `busy_s`: how long a handler
        thread worked on it (all of `elapsed_s` when not given: the gRPC door's threads wait
        with their call)."""
        self.requests.labels(request, door).inc()
        self.total_time_ms.labels(request, door).observe(elapsed_s * 1000)
        self.throttle_time_ms.labels(request, door).observe(throttle_ms)
        with self._lock:
            self._busy_s += elapsed_s if busy_s is None else busy_s

    def add_handler_threads(self, threads: int) -> None:
        """A door opened with `threads` request handler threads (closing: negative)."""
        with self._lock:
            self._threads += threads

    def idle_ratio(self) -> float:
        """The handlers' idle share since the last call, 0 to 1."""
        now = time.monotonic()
        with self._lock:
            then, busy_then = self._last
            self._last = (now, self._busy_s)
            capacity = self._threads * (now - then)
            busy = self._busy_s - busy_then
        return 1.0 if capacity <= 0 else min(1.0, max(0.0, 1 - busy / capacity))


class LogMeters:
    """deltabus's partition logs: Delta commits (how long, how big) and the tail cache."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.commit_seconds = Histogram(
            "deltabus_log_commit_seconds", "Time of a Delta commit of a partition log, from "
            "its batch taken to the commit file written", buckets=COMMIT_SECONDS_BUCKETS,
            registry=registry)
        self.commit_bytes = Histogram(
            "deltabus_log_commit_bytes", "Size of the data file a Delta commit adds",
            buckets=COMMIT_BYTES_BUCKETS, registry=registry)
        self.tail_cache_hits = Counter(
            "deltabus_log_tail_cache_hits", "Reads answered from a log's tail cache",
            registry=registry)
        self.tail_cache_misses = Counter(
            "deltabus_log_tail_cache_misses", "Reads that went to the Delta table's files",
            registry=registry)

    def committed(self, seconds: float, size_bytes: int) -> None:
        self.commit_seconds.observe(seconds)
        if size_bytes:
            self.commit_bytes.observe(size_bytes)

    def read(self, from_cache: bool) -> None:
        (self.tail_cache_hits if from_cache else self.tail_cache_misses).inc()


class _Gauges(Collector):
    """Families computed at scrape time by `collect`."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()


class NodeMetrics:
    """The metrics of one node: a broker (`broker_id` >= 0) or the driver (-1)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.topics = TopicMeters()
        self.registry.register(_Gauges(self.topics.collect))
        self.requests = RequestMeters(self.registry)
        self.logs = LogMeters(self.registry)
        self.registry.register(_Gauges(self._handler_gauges))

    def add_gauges(self, collect: Callable[[], Iterable[Metric]]) -> None:
        """Serve the families `collect` computes at each scrape."""
        self.registry.register(_Gauges(collect))

    def exposition(self) -> bytes:
        """Every family in Prometheus' text format."""
        return generate_latest(self.registry)

    def _handler_gauges(self) -> Iterator[Metric]:
        yield family("kafka_server_kafkarequesthandlerpool_requesthandleravgidlepercent",
                     "Share of the request handler threads' time spent idle since the last "
                     "scrape", "gauge", [({}, self.requests.idle_ratio())])
