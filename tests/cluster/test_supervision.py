"""Supervisors outlive a failed round: a metadata write the storage refuses (once or a few
times) must not end broker session checks, a reassignment, or leave a dead broker down for good;
an unexpected error in a broker's heartbeat round must not end its heartbeats.

Failures are injected at the controller's metadata log (its `append` raises KAFKA_STORAGE_ERROR,
as a storage outage would); everything else is real: the controller, its Delta metadata log, and
for the relaunch the shared cluster's Spark broker tasks.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from deltabus import AdminClient, Cluster, NewTopic, Producer, errors
from deltabus import config as cfg
from deltabus.cluster.broker import Broker, BrokerSpec
from deltabus.cluster.broker_metadata_publisher import BrokerMetadataPublisher
from deltabus.cluster.controller import Controller
from deltabus.metadata import BrokerEndpoint, MetadataImage
from tests.cluster.controller_server import ControllerServer
from tests.conftest import wait_until
from tests.faults.pause import Pause


def fail_metadata_writes(monkeypatch: pytest.MonkeyPatch, controller: Controller,
                         failing: threading.Event, times: int | None = None,
                         thread: str | None = None) -> list[str]:
    """While `failing` is set (and for at most `times` writes, of `thread` alone when named),
    the controller's metadata-log writes fail as a storage outage would. Returns the names of
    the threads whose write failed, in order."""
    metadata_log = controller._log
    append = metadata_log.append
    failed: list[str] = []

    def flaky_append(records: list[dict]) -> None:
        if (records and failing.is_set() and (times is None or len(failed) < times)
                and thread in (None, threading.current_thread().name)):
            failed.append(threading.current_thread().name)
            raise errors.KafkaStorageError("injected: the metadata log's storage is unavailable")
        append(records)

    monkeypatch.setattr(metadata_log, "append", flaky_append)
    return failed


def _start_brokers(controller: Controller, count: int) -> dict[int, int]:
    """Register and unfence brokers, as their first heartbeats would; they stay silent after.
    Returns their epochs."""
    epochs = {}
    for b in range(count):
        epochs[b] = controller.register_broker(BrokerEndpoint(b, "127.0.0.1", 9000 + b), 100 + b)
        controller.heartbeat(b, epochs[b], controller.image().version, 0)
    assert controller.live_brokers() == list(range(count))
    return epochs


def test_session_checks_go_on_after_fencing_writes_fail(spark, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster's session checker, driven on its own (no broker tasks): brokers that stop
    heartbeating are fenced even though the first fencing writes fail."""
    cluster = Cluster(spark, root=str(tmp_path), brokers=3, port=0, kafka_port=-1,
                      broker_heartbeat_interval_ms=100, broker_session_timeout_ms=500)
    controller = cluster.controller = Controller(cluster.config)
    _start_brokers(controller, 3)
    controller.create_topics([NewTopic("orders", 3, 3)], timeout_ms=0)  # fencing writes ISRs
    failing = threading.Event()
    failing.set()
    failed = fail_metadata_writes(monkeypatch, controller, failing, times=2)
    checker = threading.Thread(target=cluster._check_sessions_loop, daemon=True,
                               name="session-checker-under-test")
    checker.start()
    try:
        wait_until(lambda: not controller.live_brokers(), "every silent broker to be fenced", 30)
    finally:
        cluster._stopping.set()
        checker.join(5)
    assert failed == ["session-checker-under-test"] * 2
    for partition in controller.image().topics["orders"].partitions:
        assert partition.leader == -1  # nobody left to lead


def test_a_reassignment_goes_on_after_its_metadata_writes_fail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reassignment's thread starts the reassignment and completes it though a write of
    each fails (the thread died at the first before, leaving the reassignment never started)."""
    controller = Controller(cfg.ClusterConfig(root=str(tmp_path), brokers=3, kafka_port=-1))
    epochs = _start_brokers(controller, 3)
    controller.create_topics([NewTopic("audit", replica_assignment={0: [0, 1]})], timeout_ms=0)
    failing = threading.Event()
    failing.set()
    failed = fail_metadata_writes(monkeypatch, controller, failing, times=1,
                                  thread="deltabus-reassignment")
    assert controller.reassign_partitions({("audit", 0): [0, 1, 2]}) == {("audit", 0): None}
    try:
        wait_until(lambda: controller.image().partition("audit", 0).adding_replicas == (2,),
                   "the reassignment to start", 30)
        failed.clear()  # and its completion's first write fails too
        state = controller.image().partition("audit", 0)
        controller.alter_partition(0, epochs[0], "audit", 0, state.leader_epoch,
                                   list(state.isr), [0, 1, 2])  # the new replica caught up
        wait_until(lambda: not controller.image().partition("audit", 0).adding_replicas,
                   "the reassignment to complete", 30)
    finally:
        controller.begin_shutdown()
    assert failed == ["deltabus-reassignment"]
    assert controller.image().partition("audit", 0).replicas == (0, 1, 2)


def test_a_broker_keeps_heartbeating_after_a_round_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker (in this process, around a controller server) whose metadata round fails
    with an unexpected error applies the metadata at the next round (its heartbeat thread
    ended before, and it never learnt of the topic)."""
    server = ControllerServer(tmp_path)
    apply = BrokerMetadataPublisher.apply
    failed: list[int] = []

    def flaky_apply(self: BrokerMetadataPublisher, image: MetadataImage) -> None:
        if image.topics and not failed:
            failed.append(image.version)
            raise RuntimeError("injected: a bug while applying metadata")
        apply(self, image)

    monkeypatch.setattr(BrokerMetadataPublisher, "apply", flaky_apply)
    broker = Broker(BrokerSpec(0, server.node, server.config))
    try:
        broker.start()
        wait_until(lambda: server.controller.live_brokers() == [0], "the broker to be live", 30)
        server.controller.create_topics([NewTopic("orders", replica_assignment={0: [0]})],
                                        timeout_ms=10_000)
        with Producer(server.address, delivery_timeout_ms=20_000) as producer:
            assert producer.send("orders", b"after the failed round").get(30).offset == 0
    finally:
        broker.close()
        server.stop()
    assert len(failed) == 1


def _running(name: str) -> bool:
    return any(t.name == name and t.is_alive() for t in threading.enumerate())


def test_a_killed_broker_comes_back_though_fencing_it_failed(
        cluster, topic_name, all_brokers_back, monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker's task is killed while metadata writes fail: the supervisor's fence and the
    session checker's both fail, and once the storage is back the broker is relaunched."""
    victim = 2
    with AdminClient(cluster.bootstrap_servers) as admin:  # the victim leads: its fence writes
        admin.create_topics([NewTopic(topic_name, replica_assignment={0: [victim, 0]})])
    failing = threading.Event()
    failing.set()
    failed = fail_metadata_writes(monkeypatch, cluster.controller, failing)
    old_pid = cluster.broker_pids()[victim]
    cluster.kill_broker(victim)
    try:
        wait_until(lambda: {"deltabus-session-checker", f"deltabus-supervisor-{victim}"}
                   <= set(failed), "the supervisor and the session checker to fail fencing it")
    finally:
        failing.clear()
    wait_until(lambda: cluster.broker_pids().get(victim) not in (None, old_pid),
               f"broker {victim} to be relaunched", 90)
    assert _running("deltabus-session-checker")
    assert _running(f"deltabus-supervisor-{victim}")
    state = cluster.controller.image().partition(topic_name, 0)
    assert state.leader in (victim, 0)


def test_a_broker_fenced_for_its_silence_comes_back_on_its_ports_after_its_last_process(
        cluster, all_brokers_back) -> None:
    """A broker the controller fences for missed heartbeats (here a paused process; in a
    network partition one that is cut off) loses its registration at once, while its process
    may still run, lead and write its tables until Spark kills it. Its next incarnation must
    wait for that process to end, on the ports the fenced registration named, and comes back
    on those ports: clients and followers find it where they knew it, and no two processes
    write its tables at once (the network partition test lost acknowledged records to that)."""
    victim = 1
    before = cluster.controller.registered_endpoint(victim)
    relaunches = cluster.relaunches[victim]
    with Pause(cluster) as pause:
        old_pid = pause.pause(victim)
        wait_until(lambda: cluster.relaunches[victim] > relaunches
                   and cluster.broker_pids().get(victim) not in (None, old_pid),
                   f"broker {victim} to be fenced and relaunched", 180)
    after = cluster.controller.registered_endpoint(victim)
    assert after is not None
    assert (after.port, after.kafka_port, after.listeners) == (
        before.port, before.kafka_port, before.listeners)
