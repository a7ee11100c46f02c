"""Shared fixtures: one SparkSession and one 3-broker deltabus cluster per test session.

Timeouts are shortened through the environment (DELTABUS_*_MS) before any cluster starts, so
failure detection in tests takes seconds, not Kafka's defaults.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("DELTABUS_BROKER_HEARTBEAT_INTERVAL_MS", "200")
# 6 s (Kafka: 9 s): at 3 s a loaded 2-core machine fenced idle brokers whose heartbeats
# waited behind the other test worker (a broker fenced in the middle of a test it is no part of)
os.environ.setdefault("DELTABUS_BROKER_SESSION_TIMEOUT_MS", "6000")
os.environ.setdefault("DELTABUS_STARTUP_TIMEOUT_MS", "90000")
os.environ.setdefault("DELTABUS_REPLICA_LAG_TIME_MAX_MS", "5000")
# Consumer groups: members may use short sessions; a new group forms without Kafka's 3 s wait.
os.environ.setdefault("DELTABUS_GROUP_MIN_SESSION_TIMEOUT_MS", "1000")
os.environ.setdefault("DELTABUS_GROUP_INITIAL_REBALANCE_DELAY_MS", "200")
# Leadership goes back to preferred replicas within a second: every test must live with it.
os.environ.setdefault("DELTABUS_LEADER_IMBALANCE_CHECK_INTERVAL_MS", "1000")
# The periodic log cleaner merges no test's files behind its back (tests merge on demand).
os.environ.setdefault("DELTABUS_LOG_CLEANER_MERGE_MIN_AGE_MS", "3600000")
os.environ.setdefault("DELTABUS_KAFKA_PORT", "0")  # Kafka listeners on any free ports
# Every JVM a test starts (its Spark driver, a standalone cluster's, a notebook's) compiles with
# C1 only and collects with one thread: a Spark start costs 13-15 s of CPU instead of 20-24, and
# a run starts dozens on two cores. Tests measure behaviour, not JIT-compiled throughput.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

# Shared cluster: 3 brokers; a second, short-lived cluster in restart tests: 3 more; 2 spare.
SPARK_TASK_SLOTS = 8


SPARK_FIXTURES = {"spark", "cluster"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `spark` marker covers every test that starts Spark: those using the shared session
    (directly or through `cluster`, `cli`, ...) are marked here; those starting Spark in a
    process of their own carry the marker in their module. So `-m "not spark"` is a fast unit
    run with no JVM."""
    for item in items:
        if SPARK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spark)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one process keeps the collection's order
        _by_cost(items)


# `make test PYTEST_WORKERS=N` runs the suite on N pytest-xdist workers (`--dist loadfile`), each
# with its own Spark and shared cluster; a module's tests run on one worker, so its module
# fixtures start once. The modules below start JVMs of their own or kill brokers on a timetable:
# each group's modules run on one worker, one after the other, so at most two of them compete
# for the machine's two cores. A group of JVM starters and a group of broker killers: a kill
# test waits on the cluster's progress, not a clock, so a JVM starting beside it slows it only.
HEAVY_GROUPS = {
    "tests/notebooks/test_notebooks.py": "heavy: own JVMs",
    "tests/spark/test_spark_source_and_sink.py": "heavy: own JVMs",
    "tests/cluster/test_standalone_cluster.py": "heavy: own JVMs",
    "tests/cluster/test_object_storage.py": "heavy: broker kills",
    "tests/cluster/test_local_cluster.py": "heavy: broker kills",
    "tests/cluster/test_fault_injection.py": "heavy: broker kills",
    "tests/faults/test_network_partitions.py": "heavy: broker kills",
    "tests/faults/test_paused_leader.py": "heavy: broker kills",
    "tests/faults/test_transactions_under_faults.py": "heavy: broker kills",
}


def _by_cost(items: list[pytest.Item]) -> None:
    """Order the modules by which goes to the workers first (xdist hands out scopes in
    collection order): the heavy groups, then modules on the shared cluster, then the unit
    modules that fill the gaps at the end. The longest first is what keeps the workers finishing
    together. A module's tests stay together and in their order."""
    rank: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        cost = (0 if module in HEAVY_GROUPS
                else 1 if SPARK_FIXTURES & set(getattr(item, "fixturenames", ())) else 2)
        rank[module] = min(rank.get(module, cost), cost)
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])  # stable


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with each of HEAVY_GROUPS as one file (xdist's `loadgroup` cannot
    group them: it marks the groups in node ids, which pytest 9.2's items no longer take), and
    the scopes handed out in collection order (`_by_cost`), not by their count of tests."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False

    class HeavyModulesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return HEAVY_GROUPS.get(module, module)

    return HeavyModulesTogether(config, log)


@pytest.fixture(scope="session")
def latency_trace_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Where this session's processes stamp the records of bench steps (e) and (g)
    (deltabus.trace): set before Spark starts, so the shared cluster's brokers stamp too."""
    from bench.run import LATENCY_TOPIC_PREFIXES
    from deltabus import trace

    folder = str(tmp_path_factory.mktemp("latency-trace"))
    trace.start(folder, LATENCY_TOPIC_PREFIXES)
    return folder


@pytest.fixture(scope="session")
def spark(latency_trace_dir: str) -> Iterator[object]:
    from deltabus import local_spark

    session = local_spark(SPARK_TASK_SLOTS, app_name="deltabus-tests", ui=False)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3() -> Iterator[Any]:
    """moto's S3 server on loopback, for the session (tests/object_stores.py)."""
    from tests.object_stores import s3_server

    with s3_server() as server:
        yield server


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Azurite's Blob (ADLS) server on loopback, for the session (tests/object_stores.py)."""
    from tests.object_stores import azurite_server

    with azurite_server(tmp_path_factory.mktemp("azurite")) as server:
        yield server


@pytest.fixture(scope="session")
def gcs() -> Iterator[Any]:
    """fake-gcs-server on loopback, for the session (tests/object_stores.py)."""
    from tests.object_stores import gcs_server

    with gcs_server() as server:
        yield server


@pytest.fixture(scope="session")
def cluster(spark: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from deltabus import Cluster

    root = tmp_path_factory.mktemp("cluster")
    c = Cluster(spark, root=str(root), brokers=3, port=0).start()  # 0: any free port
    yield c
    c.stop()


@pytest.fixture(autouse=True)
def shared_cluster_whole(request: pytest.FixtureRequest) -> None:
    """A test on the shared cluster starts with every broker live. On a loaded machine a broker
    can miss heartbeats past its session timeout between tests: the controller fences it and
    its supervisor relaunches it after a catch-up job, and a test creating a topic of 3 replicas
    meanwhile gets INVALID_REPLICATION_FACTOR (7 typed-topic tests once did). Kafka's test
    harnesses wait for their brokers the same way."""
    if "cluster" not in request.fixturenames:
        return
    shared = request.getfixturevalue("cluster")
    controller, config = getattr(shared, "controller", None), getattr(shared, "config", None)
    if controller is not None and config is not None:
        assert controller.wait_for_brokers(config.brokers, 180), (
            f"the shared cluster's {config.brokers} brokers are not all live after 180 s")


@pytest.fixture
def all_brokers_back(cluster) -> Iterator[None]:
    """Whatever a test stops, every broker of the shared cluster runs again afterwards."""
    yield
    for broker_id in range(cluster.config.brokers):
        cluster.start_broker(broker_id)
    assert cluster.controller.wait_for_brokers(cluster.config.brokers, 90)


def free_port_block(count: int) -> int:
    """A loopback port whose next `count - 1` ports are free too: `cluster start --port P` has
    broker b listen on P + 1 + b, so a port picked alone can have a taken neighbour. The block
    lies below the kernel's ephemeral range, where no `bind(0)` of another test (or another
    xdist worker) can take a neighbour in the seconds before the cluster binds them."""
    low = _lowest_ephemeral_port()
    for _ in range(200):
        port = random.randrange(10_000, low - count)
        sockets = [socket.socket() for _ in range(count)]
        try:
            for i, s in enumerate(sockets):
                s.bind(("127.0.0.1", port + i))
            return port
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError(f"no {count} free loopback ports in a row")


def _lowest_ephemeral_port() -> int:
    """Where the range `bind(0)` takes ports from begins (Linux: ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except OSError:
        return 32768


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    """Poll `condition` (every 50 ms) until it holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def wait_for_kafka_assignment(consumer: Any, cluster: Any, group: str,
                              timeout_s: float = 180) -> None:
    """A Kafka client's subscribed consumer (kafka-python) polls until its group gives it
    partitions. A join is several round trips (FindCoordinator, KIP-394's MEMBER_ID_REQUIRED,
    group.initial.rebalance.delay.ms), and on a loaded machine a broker the last test relaunched
    may move the coordinator meanwhile: the wait is long, and a timeout says what the
    coordinator saw of the group."""
    from deltabus import AdminClient

    try:
        wait_until(lambda: consumer.poll(200) is not None and bool(consumer.assignment()),
                   f"a member of group {group} to be assigned partitions", timeout_s)
    except AssertionError as e:
        with AdminClient(cluster.bootstrap_servers) as admin:
            seen = admin.describe_consumer_groups([group])
        raise AssertionError(f"{e}; the coordinator describes the group as {seen}") from None


def read_records(bootstrap: str, topic: str, partitions: int, expected: int,
                 timeout_s: float = 60, **settings: object) -> list:
    """Every record of a topic from the beginning: polls until `expected` arrived or time is up.
    `settings`: more Consumer settings (a secured cluster's)."""
    from deltabus import Consumer, TopicPartition

    consumer = Consumer(bootstrap, auto_offset_reset="earliest", **settings)
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    records: list = []
    deadline = time.monotonic() + timeout_s
    while len(records) < expected and time.monotonic() < deadline:
        records.extend(consumer.poll(500, max_records=100_000))
    consumer.close()
    return records


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test."""
    return "t-" + request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:100]


@pytest.fixture
def no_quotas_left(cluster: Any) -> Iterator[None]:
    """Remove every client quota a test set on the shared cluster, so none throttles the next."""
    from deltabus import AdminClient
    from deltabus.quotas import QuotaAlteration

    yield
    with AdminClient(cluster.bootstrap_servers) as admin:
        for entity, values in admin.describe_client_quotas().items():
            admin.alter_client_quotas([QuotaAlteration(entity, tuple((k, None) for k in values))])


def client_pool_is_full(stub: Any) -> bool:
    """A Metadata call (answered at once by a free thread of the server behind `stub`, a
    DeltaBusStub) gets no answer in a second: every thread of its pool is held."""
    import grpc

    from deltabus.rpc.v1 import deltabus_pb2 as pb

    try:
        stub.Metadata(pb.MetadataRequest(), timeout=1)
    except grpc.RpcError as e:
        return e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return False
