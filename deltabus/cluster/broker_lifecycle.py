"""A broker's lifecycle manager (Kafka's BrokerLifecycleManager): its session with the
controller. It registers the broker (and learns its broker epoch), then heartbeats on a thread
of its own until told to stop: each heartbeat says the metadata version the broker applied and
its offline replicas, and brings back the metadata records to replay (into the broker's
`MetadataLoader`), the logs the cleaner changed, and whether to shut down. A broker fenced by
the controller stops.

Separate from applying the metadata it brings (`broker_metadata_publisher`, on the metadata
thread: a heartbeat never waits for thousands of logs to open) and from the requests the broker
serves (`replica_manager`), so the rules of staying registered read in one place. Runs on
executors, in a broker task: `register` on the task's thread, then `heartbeat_loop` on the
heartbeat thread, the only thread that replays records into the loader or registers.
Invariant: a broker whose registration is gone does not register again (see `heartbeat_loop`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.broker_metadata_publisher import BrokerMetadataPublisher
from deltabus.cluster.doors import Doors
from deltabus.cluster.executor_process import local_host
from deltabus.cluster.metadata_loader import MetadataLoader
from deltabus.cluster.replica_manager import ReplicaManager
from deltabus.metadata import LogReport
from deltabus.rpc.controller_channel import ControllerChannel

log = logging.getLogger(__name__)


class BrokerLifecycleManager:
    """One broker's registration and heartbeats. `broker_epoch` and `loader` are replaced as
    it registers (on the task's thread, then only by the heartbeat thread); other threads read
    them (a reference read is atomic)."""

    def __init__(self, broker_id: int, config: cfg.ClusterConfig,
                 controller: ControllerChannel, publisher: BrokerMetadataPublisher,
                 replicas: ReplicaManager, stopped: threading.Event) -> None:
        self.broker_id = broker_id
        self._config = config
        self._controller = controller
        self._publisher = publisher
        self._replicas = replicas
        self._stopped = stopped
        self.broker_epoch = -1
        self._reported_version = 0  # the applied version the last heartbeat said
        # Bytes in of the partitions led, as last reported, and when (partition_loads).
        self._bytes_in: dict[tuple[str, int], int] = {}
        self._loads_at = time.monotonic()
        # The logs of the partitions led, as last reported, and when (log_reports).
        self._log_reports: dict[tuple[str, int], LogReport] = {}
        self._log_reports_at = 0.0
        self.loader: MetadataLoader  # set by new_loader, at every registration
        self.new_loader()

    def register(self, doors: Doors) -> None:
        """Register the broker with its listeners (`doors`, started), retrying while the
        controller does not answer, up to startup.timeout.ms; the epoch it gets is
        `broker_epoch`, and its metadata is replayed from a snapshot."""
        # The rack is the executor's machine: replicas spread across machines where there are
        # several.
        rack = os.environ.get("DELTABUS_RACK") or local_host()
        endpoint = doors.node(
            self.broker_id, self._config.listener_config().inter_broker_listener_name, rack)
        incarnation_id = uuid.uuid4().hex
        deadline = time.monotonic() + self._config.startup_timeout_ms / 1000
        while True:
            try:
                self.broker_epoch = self._controller.register(
                    endpoint, pid=os.getpid(), incarnation_id=incarnation_id)
                self.new_loader()
                log.info("broker %d registered, epoch %d, listeners %s", self.broker_id,
                         self.broker_epoch,
                         ", ".join(f"{e.name}://{e.host}:{e.port} ({e.door})"
                                   for e in endpoint.listeners))
                return
            except errors.NetworkError as e:  # no answer yet: the controller may be starting
                if time.monotonic() > deadline:
                    raise errors.NetworkError(f"cannot reach the controller: {e}") from None
                time.sleep(0.2)

    def new_loader(self) -> None:
        """Replay the controller's metadata records from a snapshot (at every registration:
        positions in them are one controller's own), saying none applied until it is loaded;
        the image served until then stays."""
        self.loader = MetadataLoader(self._config.root)
        self._publisher.new_generation()

    def _partition_loads(self) -> dict[tuple[str, int], float]:
        """Every load.report.interval.ms, the bytes in per second of each partition led since
        the last report ({} in between: the heartbeats stay small)."""
        now = time.monotonic()
        if now - self._loads_at < self._config.load_report_interval_ms / 1000:
            return {}
        totals = self._replicas.bytes_in_led()
        elapsed_s = now - self._loads_at
        loads = {key: (total - self._bytes_in.get(key, 0)) / elapsed_s
                 for key, total in totals.items() if key in self._bytes_in}
        self._bytes_in, self._loads_at = totals, now
        return loads

    def _moved_logs(self) -> dict[tuple[str, int], LogReport]:
        """Every offsets.report.interval.ms, the logs of the partitions led that moved since
        the last report ({} in between, and when none moved)."""
        now = time.monotonic()
        if now - self._log_reports_at < self._config.offsets_report_interval_ms / 1000:
            return {}
        current = self._replicas.logs_led()
        moved = {key: r for key, r in current.items() if self._log_reports.get(key) != r}
        self._log_reports, self._log_reports_at = current, now
        return moved

    def heartbeat_loop(self) -> None:
        """Heartbeat and apply metadata until told to stop. A round that fails in any way is
        logged and the next one runs: without heartbeats the broker is fenced for good.

        A broker whose registration is gone (STALE_BROKER_EPOCH: the controller fenced it for
        missed heartbeats, or its supervisor after its Spark task ended, or a newer incarnation
        registered) stops: it does not register again. Its supervisor relaunches it as a new
        task, after catching its replicas up with a Spark job that writes their tables. A
        fenced broker that registered again from its old process would be live beside that
        job and beside its own successor (each fencing the other as it registers): several
        writers of its tables, each with its own idea of what they hold and of its role."""
        interval_ms = self._config.broker_heartbeat_interval_ms
        while not self._stopped.is_set():
            try:
                self._heartbeat(interval_ms)
            except errors.StaleBrokerEpochError:
                log.warning("broker %d was fenced (epoch %d); stopping: it is relaunched as a "
                            "new task", self.broker_id, self.broker_epoch)
                self._stopped.set()
            except errors.DeltaBusError as e:
                log.warning("heartbeat to the controller failed: %s", e)
                self._stopped.wait(interval_ms / 1000)
            except Exception:
                log.exception("broker %d: a heartbeat round failed", self.broker_id)
                self._stopped.wait(interval_ms / 1000)

    def _heartbeat(self, interval_ms: int) -> None:
        """One round: heartbeat (a long poll, unless a newly applied version is to be said),
        replay the records the answer carries, and hand the loader's image, if new, to the
        metadata thread. The version said applied is the last image applied: one whose
        `apply` failed is applied again. An apply that ends within the heartbeat interval is
        said at once; a longer one (thousands of partition tables to open) never holds the
        heartbeats up."""
        loader = self.loader
        applied = self._publisher.applied_version()
        answer = self._controller.heartbeat(
            self.broker_id, self.broker_epoch, applied,
            max_wait_ms=0 if applied != self._reported_version else interval_ms,
            position=loader.position, offline_replicas=self._publisher.offline_replicas(),
            partition_loads=self._partition_loads(),
            log_reports=self._moved_logs())
        self._reported_version = applied
        if answer.metadata is not None:
            try:
                loader.replay(answer.metadata)
            except Exception:
                log.exception("broker %d cannot replay the metadata records it was sent; "
                              "loading a snapshot", self.broker_id)
                self.new_loader()
                return
        image = loader.image
        if image is not None:
            self._publisher.hand_over(image, interval_ms / 1000)
        if answer.refresh_logs:
            self._replicas.refresh_logs(answer.refresh_logs)
        if answer.should_shut_down:
            self._stopped.set()
