"""`Cluster`: a deltabus cluster inside a Spark application. Runs on the driver.

The controller runs in the driver and serves the bootstrap address. Each broker is its own Spark
job of one long-running task (job group `deltabus-broker-N-<this cluster's tag>`, shown as
"deltabus broker N" in the Spark UI), watched by a supervisor thread: when the task dies (its
process killed, its executor lost) or the controller fences the broker for missed heartbeats, the
supervisor launches it again, and the new broker reopens its partitions from Delta. One broker
per job means one broker failing never fails the others, whatever the master (`local[N]`,
`local-cluster[...]`, standalone, Databricks).

Thread-safe: `start` and `stop` are meant for one thread; the rest may be called from any.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import secrets
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.broker import STOPPED, BrokerSpec, run_broker_task
from deltabus.cluster.catch_up import (
    REASSIGNMENT,
    CatchUpTask,
    catch_up_before_relaunch,
    catch_up_replicas,
)
from deltabus.cluster.console_view import ConsoleView
from deltabus.cluster.controller import Controller
from deltabus.cluster.controller_apis import ControllerHandler
from deltabus.cluster.doors import Doors, open_doors
from deltabus.cluster.driver_metrics import DriverMetrics
from deltabus.cluster.executor_process import executor_pid
from deltabus.cluster.incarnation import await_last_incarnation
from deltabus.cluster.log_cleaner import LogCleaner
from deltabus.cluster.replication_quota import move_rates
from deltabus.cluster.scaling import Scaler, autoscale
from deltabus.listeners import GRPC, KAFKA, ListenerBindError
from deltabus.log_tables.layout import consumer_offsets_path, share_group_state_path
from deltabus.metadata import (
    CONTROLLER_NODE_ID,
    BalancePlan,
    BrokerEndpoint,
    ListenerEndpoint,
    ScaleStatus,
    ScramCredentialUpsertion,
)
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.offsets.offset_store import OffsetStore
from deltabus.offsets.share_state_store import ShareStateStore
from deltabus.rpc.metrics_http import (
    CONSOLE_LISTENER_NAME,
    METRICS_LISTENER_NAME,
    SD_PATH,
    http_url,
)
from deltabus.rpc.schema_registry_http import SchemaRegistryServer
from deltabus.security.scram import DEFAULT_ITERATIONS, salted_password
from deltabus.spark import register
from deltabus.storage import SPARK_CONF_PREFIX, normalize_root, spark_storage_options

log = logging.getLogger(__name__)

RELAUNCH_BACKOFF_S = 0.5
COORDINATOR_TICK_S = 0.1
# Broker configs in the Spark conf: spark.deltabus.NAME, by Kafka's server.properties NAME.
SPARK_BROKER_CONFIG_PREFIX = "spark.deltabus."


def local_spark(task_slots: int, *, app_name: str = "deltabus", ui: bool = True) -> Any:
    """A local-mode SparkSession with enough task slots for the brokers and other jobs.

    Everything binds loopback (SPARK_LOCAL_IP) unless the environment says otherwise; the Python
    workers use this interpreter, so they import the same deltabus.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", cfg.DEFAULT_HOST)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    host = os.environ["SPARK_LOCAL_IP"]
    session = (
        SparkSession.builder.master(f"local[{task_slots}]")
        .appName(app_name)
        .config("spark.driver.host", host)
        .config("spark.driver.bindAddress", host)
        .config("spark.ui.enabled", str(ui).lower())
        .config("spark.ui.showConsoleProgress", "false")
        # Anyone who reaches the UI could kill the broker jobs: its kill links are off.
        .config("spark.ui.killEnabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    register(session)
    return session


def spark_broker_configs(spark: Any) -> dict[str, str]:
    """Broker configs set in a SparkSession's conf as spark.deltabus.NAME (where a Databricks
    cluster's Spark config or spark-defaults.conf puts them, or spark.conf.set), by NAME; the
    spark.deltabus.storage. keys are storage options (deltabus.storage)."""
    try:
        pairs = dict(spark.conf.getAll)
    except Exception:  # a session whose conf cannot be listed: none set there
        return {}
    return {key[len(SPARK_BROKER_CONFIG_PREFIX):]: value for key, value in pairs.items()
            if key.startswith(SPARK_BROKER_CONFIG_PREFIX)
            and not key.startswith(SPARK_CONF_PREFIX)}


class Cluster:
    """A deltabus cluster: the controller here in the driver, brokers as Spark tasks.

    >>> cluster = Cluster(spark, root="./data", brokers=3).start()
    >>> cluster.bootstrap_servers
    '127.0.0.1:9192'

    `port=0` binds any free port; `bootstrap_servers` then names the one bound.

    `root` may be an object store (s3://bucket/path, abfss://..., gs://...) reached with
    `storage_options` (delta-rs's names, e.g. AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID), which
    extend any set in the Spark conf as spark.deltabus.storage.KEY (a Databricks cluster
    policy's place for them); the brokers get them with their config, whatever their
    environment holds.

    `settings` are ClusterConfig's fields (num_partitions=3, default_replication_factor=2,
    ...). Kafka's broker configs deltabus takes may also be set in the Spark conf as
    spark.deltabus.NAME, by their server.properties names (spark.deltabus.num.partitions 3:
    cfg.BROKER_CONFIGS); a keyword argument wins over them, and any other spark.deltabus. name
    is refused (InvalidConfigError naming it).
    """

    def __init__(self, spark: Any = None, *, root: str = "./data", brokers: int = 3,
                 port: int = cfg.DEFAULT_BOOTSTRAP_PORT, host: str | None = None,
                 storage_options: Mapping[str, str] | None = None, **settings: Any) -> None:
        extra: dict[str, Any] = {"host": host} if host else {}
        self._owns_spark = spark is None
        # room to scale to twice the brokers (Cluster.scale), each holding a slot, and one more
        self.spark = spark if spark is not None else local_spark(2 * brokers + 2)
        options = {**spark_storage_options(self.spark), **(storage_options or {})}
        from_spark = cfg.broker_settings(spark_broker_configs(self.spark),
                                         source=SPARK_BROKER_CONFIG_PREFIX)
        self.config = cfg.ClusterConfig(root=normalize_root(root), storage_options=options,
                                        brokers=brokers, port=port, **extra,
                                        **{**from_spark, **settings})
        # format("deltabus") reads and writes this cluster's topics, reaching its tables
        register(self.spark, self.config.storage_options)
        self.controller: Controller | None = None
        self.coordinator: GroupCoordinator | None = None
        self.log_cleaner: LogCleaner | None = None  # retention as Spark jobs, once started
        self.scaler: Scaler | None = None  # brokers joining and leaving, once started
        self.metrics: DriverMetrics | None = None  # the driver's, served on its metrics door
        self._doors = Doors()  # the driver's listeners, once started
        self._schema_registry: SchemaRegistryServer | None = None  # its REST door, if served
        self._node: BrokerEndpoint | None = None  # the driver's node, with its listeners
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._tag = uuid.uuid4().hex[:8]  # this cluster's, in its Spark job group names
        self.relaunches: dict[int, int] = {b: 0 for b in range(brokers)}
        # Where each broker fenced by the controller listened, till its supervisor reads it.
        self._fenced_endpoints: dict[int, BrokerEndpoint] = {}
        # Why a broker's last task could not start (a listener's port taken), until it starts.
        self._start_failures: dict[int, str] = {}
        # A broker whose event is clear stays down after its task ends, until start_broker.
        self._may_run = {b: threading.Event() for b in range(brokers)}
        for event in self._may_run.values():
            event.set()

    # ---- starting ----------------------------------------------------------------------------

    def start(self) -> Cluster:
        """Start the controller and every broker; return once all brokers have registered."""
        check_task_slots(self.spark, self.config.brokers)
        warn_of_kill_links(self.spark)
        warning = open_listener_warning(self.config)
        if warning:
            log.warning("%s", warning)
        self.controller = controller = Controller(self.config, on_fence=self._cancel_broker,
                                                  catch_up=self._catch_up)
        group = self.config.group
        self.coordinator = GroupCoordinator(
            OffsetStore(consumer_offsets_path(self.config.root),
                        storage_options=self.config.storage.delta_options,
                        commit_linger_ms=group.offsets_commit_linger_ms,
                        metadata_max_bytes=group.offset_metadata_max_bytes), group,
            metadata=self.controller.image,
            share_state=ShareStateStore(share_group_state_path(self.config.root),
                                        storage_options=self.config.storage.delta_options,
                                        commit_linger_ms=group.offsets_commit_linger_ms),
            high_watermarks=lambda: {key: report.high_watermark for key, report in
                                     controller.log_reports().items()})
        self.metrics = DriverMetrics(self.controller, self.coordinator, lambda: self._node)
        console = ConsoleView(self.controller, self.coordinator)
        self.scaler = Scaler(self.controller, self.config, add_broker=self._add_broker,
                             remove_broker=self._remove_broker,
                             task_slots=self._local_task_slots, stopping=self._stopping)
        handler = ControllerHandler(self.controller, self.scaler)
        self._doors = open_doors(self.config, CONTROLLER_NODE_ID, handler,
                                 credentials=handler.scram_credential,
                                 lifecycle=self.controller, groups=self.coordinator,
                                 transactions=handler, metrics=self.metrics.node,
                                 sd_nodes=self.metrics.sd_nodes, console=console.overview)
        self.controller.markers.offsets_writer = self.coordinator.commit_transactional_offsets
        bootstrap = self.config.listener_config().client_grpc()[0]
        self._node = handler.endpoint = self._doors.node(CONTROLLER_NODE_ID, bootstrap.name)
        if self.config.schema_registry_port >= 0:
            try:
                self._schema_registry = SchemaRegistryServer(
                    self.controller.schema_registry, self.config.host,
                    self.config.schema_registry_port,
                    # the registry is secured as the cluster's bootstrap listener
                    security=self.config.listener_security(bootstrap.security_protocol),
                    credentials=handler.scram_credential,
                    authorizer=self.controller.authorizer,
                    meters=self.metrics.node.requests).start()
            except ListenerBindError:
                self.stop()
                raise
        self.log_cleaner = LogCleaner(self.spark, self.controller.cleaner_tasks,
                                      self.controller.tables_changed,
                                      self.config.log_retention_check_interval_ms,
                                      reserved_slots=self._reserved_slots, metrics=self.metrics)
        self._spawn(self._check_sessions_loop, "deltabus-session-checker")
        self._spawn(lambda: console.sample_until(self._stopping), "deltabus-console-sampler")
        self._spawn(self._coordinator_loop, "deltabus-group-coordinator")
        self._spawn(self._transaction_loop, "deltabus-transaction-timeouts")
        if self.config.broker_autoscale_max:
            controller, scaler = self.controller, self.scaler
            self._spawn(lambda: autoscale(self.config, controller, scaler, self._stopping),
                        "deltabus-autoscaler")
        for broker_id in range(self.config.brokers):
            self._spawn(lambda b=broker_id: self._supervise(b), f"deltabus-supervisor-{broker_id}")
        timeout_s = self.config.startup_timeout_ms / 1000
        deadline = time.monotonic() + timeout_s
        while not self.controller.wait_for_brokers(self.config.brokers, 0.2):
            if self._start_failures:  # relaunching would only meet the same taken port
                broker_id, why = min(self._start_failures.items())
                self.stop()
                raise ListenerBindError(
                    f"broker {broker_id} {why}: broker b listens on port + 1 + b of each "
                    "listener; choose ports whose neighbours are free, or port 0 (any free port)")
            if time.monotonic() > deadline:
                live = self.controller.live_brokers()
                self.stop()
                raise TimeoutError(
                    f"only {len(live)} of {self.config.brokers} brokers started in "
                    f"{timeout_s:.0f} s: is Spark short of task slots or executors?")
        self.log_cleaner.start()
        log.info("deltabus cluster up: bootstrap %s, %d brokers, root %s",
                 self.bootstrap_servers, self.config.brokers, self.config.root)
        return self

    def _local_task_slots(self) -> int | None:
        """Spark's task slots where they are fixed (local mode), else None (executors may
        join)."""
        sc = self.spark.sparkContext
        return sc.defaultParallelism if sc.master.startswith("local[") else None

    def _reserved_slots(self) -> int:
        """The task slots the log cleaner leaves alone: one per broker, one for a relaunch."""
        return len(self.controller.members() if self.controller else self._may_run) + 1

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _supervise(self, broker_id: int) -> None:
        """Run broker `broker_id` as a one-task Spark job again and again, till the cluster stops.

        Nothing between two runs may end this loop: a supervisor that died would leave its
        broker down for good. A failed fence (a metadata write the storage refused) is logged
        and the broker launched anyway, once its last incarnation is gone (incarnation.py)."""
        assert self._node is not None
        spec = BrokerSpec(broker_id, self._node, self.config)
        while not self._stopping.is_set():
            outcome = self._run_broker_job(broker_id, spec)
            if outcome == STOPPED:
                self._start_failures.pop(broker_id, None)
            elif outcome is not None:  # it could not start: Cluster.start fails with this
                self._start_failures[broker_id] = outcome
            if self._stopping.is_set() or self.controller is None:
                break
            registered = self.controller.registered_endpoint(broker_id)
            _survive(f"fencing broker {broker_id} after its task ended",
                     self.controller.fence_broker, broker_id, "its Spark task ended")
            # Where the last incarnation listens: its registration's, or, when the controller
            # fenced it first (missed heartbeats: a pause, a network partition), the fenced
            # registration's, which the fence deleted while the process may still run.
            fenced = self._fenced_endpoints.pop(broker_id, None)
            last = registered or fenced
            if last is not None:  # its relaunch keeps its ports (doors.open_doors)
                spec = dataclasses.replace(spec, previous_listeners=last.listeners)
            _survive(f"waiting for broker {broker_id}'s last process", await_last_incarnation, last)
            self._stopping.wait(RELAUNCH_BACKOFF_S)
            while not self._may_run[broker_id].wait(0.1):
                if self._stopping.is_set():
                    return
            _survive(f"catching broker {broker_id} up before its relaunch",
                     self._catch_up_before_relaunch, broker_id)
            self.relaunches[broker_id] += 1

    def _run_broker_job(self, broker_id: int, spec: BrokerSpec) -> str | None:
        """Run the broker's Spark job until its task ends, for whatever reason. Returns the
        task's outcome (STOPPED, or why the broker could not start), None when it died."""
        sc = self.spark.sparkContext
        try:
            sc.setJobGroup(self._broker_group(broker_id), f"deltabus broker {broker_id}",
                           interruptOnCancel=True)
            outcomes = sc.parallelize([spec], 1).mapPartitions(run_broker_task).collect()
        except Exception as e:  # the task died: its process was killed or its executor lost
            if not self._stopping.is_set():
                log.warning("broker %d stopped abnormally (%s); relaunching", broker_id,
                            str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
            return None
        return outcomes[0][1] if outcomes else None

    def _catch_up(self, tasks: list[CatchUpTask], why: str) -> None:
        """A catch-up job; a reassignment's tasks paced at their shares of the replication
        throttles, as many at once as Spark has task slots beside the brokers."""
        if why == REASSIGNMENT:
            slots = self.spark.sparkContext.defaultParallelism - self._reserved_slots()
            tasks = move_rates(tasks, self.config.leader_replication_throttled_rate,
                               self.config.follower_replication_throttled_rate,
                               parallel=max(1, slots))
        catch_up_replicas(self.spark, tasks, why, metrics=self.metrics)

    def _catch_up_before_relaunch(self, broker_id: int) -> None:
        """Copy what a lost broker's follower replicas missed with a Spark job (files in
        parallel, one task per partition) rather than through its fetcher threads alone.

        Bounded by `catch_up_timeout_ms` and cancelled when the cluster stops: the job may
        wait for a task slot (a killed executor's replacement is still starting), and the
        broker must come back regardless; its fetchers copy whatever the job did not."""
        assert self.controller is not None
        catch_up_before_relaunch(self.spark, self.controller.catch_up_tasks(broker_id),
                                 broker_id, self.job_group("catch-up-broker", broker_id),
                                 self.config.catch_up_timeout_ms, self._stopping, self.metrics)

    def job_group(self, job: str, broker_id: int) -> str:
        """The Spark job group of this cluster's `job` ("broker", "catch-up-broker") for a
        broker, as Spark's status tracker knows it: this cluster's own, so cancelling it (a
        fence, a stop) never touches another cluster's jobs on the same session."""
        return f"deltabus-{job}-{broker_id}-{self._tag}"

    def _broker_group(self, broker_id: int) -> str:
        return self.job_group("broker", broker_id)

    def _cancel_broker(self, broker_id: int, endpoint: BrokerEndpoint) -> None:
        """Called when the controller fences a broker: end its task so the supervisor relaunches
        it (a hung broker must not keep its partitions), once the process at `endpoint` is gone."""
        self._fenced_endpoints[broker_id] = endpoint
        if not self._stopping.is_set():
            self.spark.sparkContext.cancelJobGroup(self._broker_group(broker_id))

    def _check_sessions_loop(self) -> None:
        """Reload the metadata log's end if an append's outcome was unknown (so requests are
        decided on what the log holds as soon as the store answers); fence silent brokers; now
        and then, hand leadership back to preferred replicas. A round that fails (a metadata
        write the storage refused) is logged and the next one runs: broker sessions must be
        checked for as long as the cluster runs."""
        interval_s = self.config.broker_heartbeat_interval_ms / 1000
        rebalance_s = self.config.leader_imbalance_check_interval_ms / 1000
        next_rebalance = time.monotonic() + rebalance_s
        while not self._stopping.wait(interval_s):
            controller = self.controller
            if controller is None:
                continue
            _survive("reloading the metadata log", _reload_metadata, controller)
            _survive("checking broker sessions", controller.check_sessions)
            if self.config.auto_leader_rebalance_enable and time.monotonic() >= next_rebalance:
                next_rebalance = time.monotonic() + rebalance_s
                _survive("preferred leader election", _rebalance, controller)

    def _coordinator_loop(self) -> None:
        """The group coordinator's clock: session expiry, join deadlines, offset expiry."""
        while not self._stopping.wait(COORDINATOR_TICK_S):
            try:
                if self.coordinator is not None:
                    self.coordinator.tick()
            except Exception:  # a storage hiccup must not stop group sessions from expiring
                log.exception("group coordinator tick failed")

    def _transaction_loop(self) -> None:
        """The transaction coordinator's clock: transactions open past their timeout abort."""
        while not self._stopping.wait(cfg.TRANSACTION_ABORT_TIMED_OUT_INTERVAL_MS / 1000):
            try:
                if self.controller is not None:
                    self.controller.abort_timed_out_transactions()
            except Exception:  # a storage hiccup must not stop later checks
                log.exception("aborting timed-out transactions failed")

    # ---- using -------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bootstrap gRPC port: the one bound once started (`port=0` picks any)."""
        return self._node.port if self._node is not None else self.config.port

    @property
    def bootstrap_servers(self) -> str:
        """Where deltabus's clients bootstrap: the first gRPC listener for clients."""
        return self.listener_address(self.config.listener_config().client_grpc()[0].name)

    @property
    def kafka_bootstrap_servers(self) -> str:
        """Where Kafka's own clients bootstrap (`bootstrap.servers`): the first Kafka
        listener."""
        kafka = self.config.listener_config().kafka
        if not kafka:
            raise RuntimeError("this cluster has no Kafka listener (kafka_port=-1)")
        return self.listener_address(kafka[0].name, KAFKA)

    @property
    def schema_registry_url(self) -> str:
        """Where the schema registry's REST API answers (Confluent's `schema.registry.url`)."""
        if self._schema_registry is None:
            raise RuntimeError("this cluster serves no schema registry "
                               "(schema_registry_port=-1)")
        return self._schema_registry.url

    @property
    def metrics_url(self) -> str:
        """The driver's metrics door: /metrics its own, /sd Prometheus' service discovery of
        every node's (`http_sd_configs`)."""
        return http_url(self._node, METRICS_LISTENER_NAME, self.config)

    @property
    def console_url(self) -> str:
        """The console, a read-only web page of the cluster (console_port)."""
        return http_url(self._node, CONSOLE_LISTENER_NAME, self.config)

    @property
    def prometheus_sd_url(self) -> str:
        """Prometheus' HTTP service discovery of every node's metrics (`http_sd_configs`)."""
        return self.metrics_url + SD_PATH

    @property
    def listener_endpoints(self) -> tuple[ListenerEndpoint, ...]:
        """The driver's listeners as clients are told them (advertised)."""
        return tuple(self._doors.endpoints)

    def listener_address(self, name: str, door: str = GRPC) -> str:
        """host:port clients are told for the driver's listener `name` of `door` ("grpc" or
        "kafka"): a named listener's bootstrap address."""
        endpoint = self._doors.endpoint(door, name)
        return f"{endpoint.host}:{endpoint.port}"

    @property
    def spark_ui_url(self) -> str | None:
        return self.spark.sparkContext.uiWebUrl

    def broker_pids(self) -> dict[int, int]:
        """Process id of each live broker (its Python worker), for operators and failure tests."""
        return self.controller.broker_pids() if self.controller else {}

    def scale(self, brokers: int) -> ScaleStatus:
        """Run `brokers` brokers from now on, returning once done: new brokers start (Spark
        finds them task slots) and, with auto.balance.enable, replicas and leaders move onto
        them; leaving brokers (the highest ids) are drained first, then stopped by controlled
        shutdown. `deltabus cluster scale --brokers N` asks for the same from anywhere.
        Raises where it cannot be done (too few brokers for a topic's replication factor,
        too few task slots, another scale in progress), before anything moves."""
        if self.scaler is None:
            raise RuntimeError("start the cluster first")
        return self.scaler.scale(brokers)

    def balance(self, *, execute: bool = False) -> BalancePlan:
        """The balancer's plan over the brokers (`deltabus cluster balance`): with `execute`,
        its moves start (as reassignments) and each moved partition's preferred leader is
        elected once it completes."""
        if self.controller is None:
            raise RuntimeError("start the cluster first")
        return self.controller.balance(execute=execute)

    def _add_broker(self, broker_id: int) -> None:
        """A broker joining (a scale-out): its supervisor starts its task; one a scale-in
        stopped is let run again by its supervisor, still waiting."""
        if broker_id in self._may_run:
            self.start_broker(broker_id)
            return
        self._may_run[broker_id] = threading.Event()
        self._may_run[broker_id].set()
        self.relaunches[broker_id] = 0
        self._spawn(lambda: self._supervise(broker_id), f"deltabus-supervisor-{broker_id}")

    def _remove_broker(self, broker_id: int) -> None:
        """A broker leaving (a scale-in, or a scale-out undone): controlled shutdown, then it
        stays down; its task slot goes back to Spark."""
        self.stop_broker(broker_id, timeout_s=self.config.shutdown_timeout_ms / 1000)

    def kill_broker(self, broker_id: int, *, relaunch: bool = True,
                    executor: bool = False) -> None:
        """SIGKILL a broker's process, as a crash would (for tests and demos): its Python
        worker, or with `executor` the whole executor JVM that runs it (local-cluster or
        standalone on this machine; never the driver). The supervisor relaunches the broker,
        unless `relaunch` is False: then it stays down until `start_broker`."""
        pid = self.broker_pids()[broker_id]
        if executor:
            pid = executor_pid(pid)
        if not relaunch:
            self._hold(broker_id)
        os.kill(pid, signal.SIGKILL)

    def start_broker(self, broker_id: int) -> None:
        """Let a broker held down (`stop_broker`, `kill_broker(relaunch=False)`) start again."""
        if self.controller is not None:
            self.controller.release_broker(broker_id)
        self._may_run[broker_id].set()

    def _hold(self, broker_id: int) -> None:
        """Keep a broker down, whether our supervisor or Spark itself (retrying the task of a
        lost executor) would start it again."""
        self._may_run[broker_id].clear()
        if self.controller is not None:
            self.controller.hold_broker(broker_id)

    def stop_broker(self, broker_id: int, timeout_s: float = 60.0) -> None:
        """Controlled shutdown of one broker, as kafka-server-stop does: leadership moves to
        other in-sync replicas first, then the broker commits what it has queued and stops. It
        stays down until `start_broker`."""
        self._hold(broker_id)
        self._controlled_shutdown(broker_id, timeout_s)

    def restart_broker(self, broker_id: int, timeout_s: float = 60.0) -> None:
        """A rolling restart of one broker: controlled shutdown, then a new broker task; returns
        once it has registered again (with a new epoch: its process may well be the same
        Python worker, which Spark reuses)."""
        assert self.controller is not None
        old_epoch = self.controller.broker_epochs().get(broker_id, -1)
        self._controlled_shutdown(broker_id, timeout_s)
        deadline = time.monotonic() + timeout_s
        while self.controller.broker_epochs().get(broker_id, old_epoch) <= old_epoch:
            if time.monotonic() > deadline:
                raise TimeoutError(f"broker {broker_id} did not come back in {timeout_s:.0f} s")
            time.sleep(0.05)

    def _controlled_shutdown(self, broker_id: int, timeout_s: float) -> None:
        assert self.controller is not None
        self.controller.shut_down_broker(broker_id)
        deadline = time.monotonic() + timeout_s
        while broker_id in self.controller.live_brokers():
            if time.monotonic() > deadline:
                raise TimeoutError(f"broker {broker_id} did not stop in {timeout_s:.0f} s")
            time.sleep(0.05)

    # ---- stopping ----------------------------------------------------------------------------

    def add_scram_user(self, name: str, password: str, *, mechanism: str = "SCRAM-SHA-256",
                       iterations: int = DEFAULT_ITERATIONS) -> None:
        """Set a user's SCRAM password from the driver, which needs no credential: how the
        first (super) user of a SASL cluster is made, as `kafka-storage format --add-scram`
        does for Kafka. Later users can be made by any user allowed ALTER on the cluster
        (`deltabus configs --entity-type users`). Returns once every live broker holds it."""
        if self.controller is None:
            raise RuntimeError("start the cluster first")
        salt = secrets.token_bytes(32)
        results = self.controller.alter_user_scram_credentials([], [ScramCredentialUpsertion(
            name, mechanism, iterations, salt,
            salted_password(mechanism, password, salt, iterations))])
        error = results.get(name)
        if error is not None:
            raise error

    def stop(self) -> None:
        """Tell brokers to flush and stop, wait for their tasks, then stop the controller."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self.log_cleaner is not None:
            self.log_cleaner.stop()
        if self.controller is not None:
            self.controller.begin_shutdown()
        deadline = time.monotonic() + self.config.shutdown_timeout_ms / 1000
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        sc = self.spark.sparkContext
        for broker_id in list(self._may_run):
            if any(t.is_alive() for t in self._threads):
                sc.cancelJobGroup(self._broker_group(broker_id))
        self._doors.stop()
        if self._schema_registry is not None:
            self._schema_registry.stop()
        if self.coordinator is not None:
            self.coordinator.close()
        if self._owns_spark:
            self.spark.stop()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _survive(what: str, step: Callable[..., object], *args: object) -> None:
    """One step of a supervisor's loop, `step(*args)`: an exception is logged with its
    traceback, never raised, so the loop goes on."""
    try:
        step(*args)
    except Exception:
        log.exception("%s failed; the supervisor carries on", what)


def _reload_metadata(controller: Controller) -> None:
    """A line, not a traceback, each round the store still cannot tell (it is expected)."""
    try:
        controller.reload_metadata()
    except errors.KafkaStorageError as e:
        log.warning("the metadata log is not reloaded yet: %s", e)


def _rebalance(controller: Controller) -> None:
    moved = controller.rebalance_leaders()
    if moved:
        log.info("preferred leader election moved %d partitions", moved)


def check_task_slots(spark: Any, brokers: int) -> None:
    """In local mode the slot count is known up front: refuse a cluster that cannot start.
    Elsewhere executors may still be joining, so a shortage shows as a start-up timeout."""
    sc = spark.sparkContext
    if not sc.master.startswith("local["):
        return
    slots = sc.defaultParallelism
    if slots <= brokers:
        raise ValueError(
            f"Spark offers {slots} task slots but {brokers} brokers each hold one for life and "
            f"other jobs need one more: use master local[{brokers + 2}] or add executors")


def warn_of_kill_links(spark: Any) -> None:
    """A session made elsewhere (a notebook's, Databricks') may leave the Spark UI's kill
    links on: say so, since a click there stops a broker (the conf is fixed at start)."""
    if spark.sparkContext.getConf().get("spark.ui.killEnabled", "true") != "false":
        log.warning("spark.ui.killEnabled is on: anyone who reaches the Spark UI can kill "
                    "the deltabus broker jobs; start Spark with spark.ui.killEnabled=false")


def open_listener_warning(config: cfg.ClusterConfig) -> str | None:
    """Plaintext without an authorizer is fine on loopback (`make run`); on an address other
    machines reach, anyone there can do anything: the warning Cluster.start logs, or None.
    Named listeners are checked one by one (an internal listener bound beyond loopback needs
    SASL too: only the broker credential guards it then)."""
    if config.authorizer:
        return None
    listeners = config.listener_config()
    open_ = [item for item in listeners.grpc + listeners.kafka
             if "SASL" not in item.security_protocol and not _is_loopback(item.bind_host)]
    if not open_:
        return None
    named = ", ".join(f"{item.name}://{item.host}:{item.port} ({item.door}, "
                      f"{item.security_protocol})" for item in open_)
    return (f"deltabus listens on {named} without SASL and with no authorizer: ANYONE who "
            "reaches these addresses can read, write and delete every topic. Use "
            "security.protocol SASL_SSL and authorizer=True on a shared network (see the "
            "docs/security.md).")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
