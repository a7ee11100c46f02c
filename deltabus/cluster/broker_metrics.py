"""A broker's metrics: what its replica manager counts as requests are served (records in and
out by topic, ISR shrinks and expands) and the gauges read from its hosted partitions at each
scrape (Kafka's ReplicaManager and Log MBeans), on top of the node's (deltabus/metrics.py).

Kafka's names, as its JMX exporter renders them:
- kafka_server_replicamanager_{partitioncount, leadercount, underreplicatedpartitions,
  underminisrpartitioncount, offlinereplicacount} and _{isrshrinks, isrexpands}_total;
- kafka_server_delayedoperationpurgatory_purgatorysize{delayedOperation="Fetch"};
- kafka_log_log_{logstartoffset, logendoffset, size}{topic, partition}, and deltabus's own
  deltabus_log_files{topic, partition} (a Delta table's data files, Kafka's segments).

Runs in broker tasks; thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future

from prometheus_client.core import Metric

from deltabus.cluster.handler import FetchResult
from deltabus.cluster.partition import Partition
from deltabus.log_tables.partition_log import AppendResult
from deltabus.metrics import NodeMetrics, family


class BrokerMetrics:
    """One broker's metrics (`node`: its registry, served on its metrics door). Not
    `enabled` (metrics.port -1: none served), nothing is counted either."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.node = NodeMetrics()
        self._lock = threading.Lock()
        self._isr_shrinks = 0
        self._isr_expands = 0

    # ---- counted as requests are served ------------------------------------------------------

    def produced(self, topic: str, appended: Future[AppendResult], records: int,
                 size_bytes: int) -> None:
        """A batch handed to a log: its records and bytes count in once it commits (Kafka's
        MessagesInPerSec counts what the log took), a failure as a failed produce."""
        if not self.enabled:
            return
        topics = self.node.topics
        topics.add("totalproducerequests", topic)

        def count(done: Future[AppendResult]) -> None:
            if done.exception() is None:
                topics.produced(topic, records, size_bytes)
            else:
                topics.add("failedproducerequests", topic)
        appended.add_done_callback(count)

    def produce_refused(self, topic: str) -> None:
        """A batch refused before it reached a log (not the leader, the ISR too small)."""
        if not self.enabled:
            return
        self.node.topics.add("totalproducerequests", topic)
        self.node.topics.add("failedproducerequests", topic)

    def fetched(self, results: list[FetchResult], replica_id: int) -> None:
        """A fetch's answer: bytes out to a consumer or a follower, by topic."""
        if not self.enabled:
            return
        topics = self.node.topics
        for result in results:
            size = result.records.nbytes if result.records is not None else 0
            if replica_id >= 0:
                size += sum(f.size_bytes for f in result.files or ())
                if size:
                    topics.add("replicationbytesout", result.topic, size)
                continue
            topics.add("totalfetchrequests", result.topic)
            if result.error is not None:
                topics.add("failedfetchrequests", result.topic)
            elif size:
                topics.add("bytesout", result.topic, size)

    def fetched_when_done(self, answer: Future[list[FetchResult]], replica_id: int) -> None:
        """`fetched`, once a delayed fetch's answer is there."""
        if not self.enabled:
            return
        def count(done: Future[list[FetchResult]]) -> None:
            if done.exception() is None:
                self.fetched(done.result(), replica_id)
        answer.add_done_callback(count)

    def isr_changed(self, old: Collection[int], new: Collection[int]) -> None:
        """The controller took a leader's ISR change."""
        with self._lock:
            if len(new) < len(old):
                self._isr_shrinks += 1
            elif len(new) > len(old):
                self._isr_expands += 1

    # ---- read at each scrape ---------------------------------------------------------------

    def watch(self, broker_id: int, partitions: Callable[[], Sequence[Partition]],
              offline_replicas: Callable[[], Collection[tuple[str, int]]],
              min_isr: Callable[[str], int], fetches_waiting: Callable[[], int],
              topics: Callable[[], Collection[str]]) -> None:
        """Serve the gauges of the broker's hosted `partitions` (and its `offline_replicas`,
        each topic's `min_isr`, the fetches waiting in its purgatory); the meters of topics
        no longer among `topics` go at each scrape."""
        def collect() -> Iterator[Metric]:
            self.node.topics.forget_all_but(topics())
            hosted = partitions()
            yield from self._replica_manager(broker_id, hosted, len(offline_replicas()),
                                             min_isr)
            yield family("kafka_server_delayedoperationpurgatory_purgatorysize",
                         "Requests waiting in a purgatory", "gauge",
                         [({"delayedOperation": "Fetch"}, fetches_waiting())])
            yield from _log_gauges(hosted)
        self.node.add_gauges(collect)

    def _replica_manager(self, broker_id: int, hosted: Sequence[Partition], offline: int,
                         min_isr: Callable[[str], int]) -> Iterator[Metric]:
        led = [p for p in hosted if p.leader == broker_id]
        under = sum(1 for p in led if len(p.isr) < len(p.replicas))
        under_min = sum(1 for p in led if len(p.isr) < min_isr(p.topic))
        prefix = "kafka_server_replicamanager_"
        for name, doc, value in (
                ("partitioncount", "Partitions this broker hosts", len(hosted)),
                ("leadercount", "Partitions this broker leads", len(led)),
                ("underreplicatedpartitions", "Partitions led here whose ISR is smaller than "
                 "their replicas", under),
                ("underminisrpartitioncount", "Partitions led here whose ISR is smaller than "
                 "min.insync.replicas", under_min),
                ("offlinereplicacount", "Replicas this broker cannot serve (their tables are "
                 "lost or unreadable)", offline)):
            yield family(prefix + name, doc, "gauge", [({}, value)])
        with self._lock:
            shrinks, expands = self._isr_shrinks, self._isr_expands
        yield family(prefix + "isrshrinks", "ISR shrinks of partitions led here", "counter",
                     [({}, shrinks)])
        yield family(prefix + "isrexpands", "ISR expansions of partitions led here",
                     "counter", [({}, expands)])


def _log_gauges(hosted: Sequence[Partition]) -> Iterator[Metric]:
    """Kafka's Log MBeans of every hosted replica, and its Delta table's data files."""
    rows: dict[str, list[tuple[dict[str, str], float]]] = {
        "start": [], "end": [], "size": [], "files": []}
    for p in sorted(hosted, key=lambda p: (p.topic, p.partition)):
        labels = {"topic": p.topic, "partition": str(p.partition)}
        try:
            files, size = p.log.file_stats()
        except Exception:  # an unreadable table (storage trouble): its offsets still tell
            files, size = -1, -1
        rows["start"].append((labels, p.log.log_start_offset))
        rows["end"].append((labels, p.log.log_end_offset))
        if files >= 0:
            rows["size"].append((labels, size))
            rows["files"].append((labels, files))
    yield family("kafka_log_log_logstartoffset", "A replica's log start offset", "gauge",
                 rows["start"])
    yield family("kafka_log_log_logendoffset", "A replica's log end offset", "gauge",
                 rows["end"])
    yield family("kafka_log_log_size", "Bytes of a replica's live data files", "gauge",
                 rows["size"])
    yield family("deltabus_log_files", "Live data files of a replica's Delta table", "gauge",
                 rows["files"])
