"""The controller over a real metadata log (a Delta table under tmp_path), with no Spark and no
brokers: a log written in the old dict form still loads, what the controller writes now is that
same form, and a restart replays it to the same image."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.controller import Controller
from deltabus.cluster.metadata_log import MetadataLog
from deltabus.cluster.producer_id_control import PRODUCER_ID_BLOCK
from deltabus.log_tables.layout import metadata_path, replica_path, topic_path
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.metadata import (
    BrokerEndpoint,
    MetadataPosition,
    NewTopic,
    PartitionState,
    TopicState,
)
from deltabus.records import normalize_produce, produce_batch
from tests.cluster.controller_server import LiveBrokers
from tests.conftest import wait_until

# A log as the dict-based controller wrote it: every record type, several commits.
OLD_LOG: list[list[dict[str, Any]]] = [
    [{"type": "cluster", "cluster_id": "old-cluster"}],
    [{"type": "topic", "name": "orders", "topic_id": "tid-orders"},
     {"type": "partition", "topic": "orders", "partition": 0, "replicas": [0, 1, 2],
      "isr": [0, 1, 2], "leader": 0, "leader_epoch": 0},
     {"type": "partition", "topic": "orders", "partition": 1, "replicas": [1, 2, 0],
      "isr": [1, 2, 0], "leader": 1, "leader_epoch": 0},
     {"type": "config", "topic": "orders", "key": "retention.ms", "value": "1000"}],
    [{"type": "producer_ids", "end": 1000}],
    [{"type": "transactional_id", "id": "tx", "producer_id": 0}],
    [{"type": "partition_change", "topic": "orders", "partition": 0, "isr": [0, 2]}],
    [{"type": "partition_change", "topic": "orders", "partition": 0, "leader": 2,
      "leader_epoch": 1, "isr": [2]}],
    [{"type": "partition_change", "topic": "orders", "partition": 1, "replicas": [1, 2, 0, 3],
      "adding": [3], "removing": [0]}],
    [{"type": "topic", "name": "gone", "topic_id": "tid-gone"},
     {"type": "partition", "topic": "gone", "partition": 0, "replicas": [1], "isr": [1],
      "leader": 1, "leader_epoch": 0}],
    [{"type": "config", "topic": "orders", "key": "cleanup.policy", "value": "compact"},
     {"type": "config", "topic": "orders", "key": "retention.ms", "value": None}],
    [{"type": "remove_topic", "name": "gone", "topic_id": "tid-gone"}],
]

OLD_LOG_TOPICS = {
    "orders": TopicState("orders", "tid-orders", (
        PartitionState(0, 2, 1, (0, 1, 2), (2,)),
        PartitionState(1, 1, 0, (1, 2, 0, 3), (1, 2, 0), (3,), (0,))),
        {"cleanup.policy": "compact"}),
}


def _config(tmp_path: Path) -> cfg.ClusterConfig:
    return cfg.ClusterConfig(root=str(tmp_path), brokers=3, kafka_port=-1)


def _stored(tmp_path: Path) -> list[dict[str, Any]]:
    table = DeltaTable(metadata_path(str(tmp_path))).to_pyarrow_table().sort_by("offset")
    return [json.loads(r) for r in table.column("record").to_pylist()]


def _start_brokers(controller: Controller, count: int) -> dict[int, int]:
    """Register and unfence brokers, as their first heartbeats would."""
    epochs = {b: controller.register_broker(BrokerEndpoint(b, "127.0.0.1", 9000 + b), 100 + b)
              for b in range(count)}
    for b, epoch in epochs.items():
        controller.heartbeat(b, epoch, controller.image().version, 0)
    assert controller.live_brokers() == list(range(count))
    return epochs


def test_a_log_in_the_old_dict_form_replays_to_the_same_image(tmp_path: Path) -> None:
    log = MetadataLog(metadata_path(str(tmp_path)))
    for commit in OLD_LOG:
        log.append(commit)
    controller = Controller(_config(tmp_path))
    image = controller.image()
    assert image.cluster_id == "old-cluster"
    assert image.topics == OLD_LOG_TOPICS
    assert _stored(tmp_path) == [r for commit in OLD_LOG for r in commit]  # nothing added
    # Producer ids go on after the reserved block; a transactional id keeps its id.
    assert controller.init_producer_id() == (1000, 0)
    assert controller.init_producer_id("tx") == (0, 0)


def test_the_controller_writes_the_old_stored_form(tmp_path: Path) -> None:
    controller = Controller(_config(tmp_path))
    epochs = _start_brokers(controller, 3)
    [created] = controller.create_topics(
        [NewTopic("orders", replica_assignment={0: [0, 1], 1: [1, 2]},
                  configs={"retention.ms": "1000"})], timeout_ms=0)
    controller.alter_partition(0, epochs[0], "orders", 0, 0, [0, 1], [0])
    controller.fence_broker(1, "test")
    controller.alter_configs({"orders": [cfg.AlterConfigOp("retention.ms", cfg.DELETE)]},
                             timeout_ms=0)
    controller.init_producer_id("tx")
    controller.delete_topics(["orders"], timeout_ms=0)
    cluster_id, topic_id = controller.image().cluster_id, created.topic_id
    assert _stored(tmp_path) == [
        {"type": "cluster", "cluster_id": cluster_id},
        {"type": "topic", "name": "orders", "topic_id": topic_id},
        {"type": "partition", "topic": "orders", "partition": 0, "replicas": [0, 1],
         "isr": [0, 1], "leader": 0, "leader_epoch": 0},
        {"type": "partition", "topic": "orders", "partition": 1, "replicas": [1, 2],
         "isr": [1, 2], "leader": 1, "leader_epoch": 0},
        {"type": "config", "topic": "orders", "key": "retention.ms", "value": "1000"},
        {"type": "partition_change", "topic": "orders", "partition": 0, "isr": [0]},
        {"type": "partition_change", "topic": "orders", "partition": 1, "isr": [2],
         "leader": 2, "leader_epoch": 1},
        {"type": "config", "topic": "orders", "key": "retention.ms", "value": None},
        {"type": "producer_ids", "end": PRODUCER_ID_BLOCK},
        {"type": "transactional_id", "id": "tx", "producer_id": 0},
        {"type": "remove_topic", "name": "orders", "topic_id": topic_id},
    ]


def test_a_restart_replays_the_log_to_the_same_image(tmp_path: Path) -> None:
    controller = Controller(_config(tmp_path))
    epochs = _start_brokers(controller, 3)
    controller.create_topics([NewTopic("orders", 4, 3, configs={"retention.ms": "5"})],
                             timeout_ms=0)
    state = controller.image().topics["orders"].partitions[0]
    controller.alter_partition(state.leader, epochs[state.leader], "orders", 0, 0,
                               list(state.isr), [state.leader])
    controller.shut_down_broker(2)
    controller.elect_leaders("preferred")
    before = controller.image()

    restarted = Controller(_config(tmp_path))
    after = restarted.image()
    assert after.cluster_id == before.cluster_id
    assert after.topics == before.topics
    assert after.brokers == ()  # brokers are not in the log: they register again


def test_only_changes_brokers_see_make_a_new_version(tmp_path: Path) -> None:
    controller = Controller(_config(tmp_path))
    epochs = _start_brokers(controller, 1)
    version = controller.image().version
    controller.init_producer_id("tx")
    controller.create_topics([NewTopic("orders")], timeout_ms=0, validate_only=True)
    assert controller.image().version == version
    assert controller.image().topics == {}
    controller.create_topics([NewTopic("orders")], timeout_ms=0)
    assert controller.image().version == version + 1
    stop, batch, refresh = controller.heartbeat(0, epochs[0], version, 0)
    assert not stop and batch is not None and refresh == []
    assert batch.end == MetadataPosition(version + 1)  # the broker ends at the new version


def test_a_broker_registering_after_a_restart_changes_no_partition(tmp_path: Path) -> None:
    controller = Controller(_config(tmp_path))
    _start_brokers(controller, 3)
    controller.create_topics([NewTopic("orders", 3, 3)], timeout_ms=0)
    before = controller.image().topics
    records = len(_stored(tmp_path))

    restarted = Controller(_config(tmp_path))
    epoch = restarted.register_broker(BrokerEndpoint(0, "127.0.0.1", 9000), 100)
    assert restarted.image().topics == before  # fenced: it leads nothing, leaves no ISR
    assert len(_stored(tmp_path)) == records
    restarted.heartbeat(0, epoch, restarted.image().version, 0)  # caught up: unfenced
    assert restarted.live_brokers() == [0]
    for p in restarted.image().topics["orders"].partitions:
        assert p.leader == 0 and p.leader_epoch == (0 if p.replicas[0] == 0 else 1)


def _log_with_records(path: str, topic: str, count: int) -> None:
    log = PartitionLog(path, topic=topic, partition=0)
    log.append(normalize_produce(produce_batch([b"r"] * count)), leader_epoch=0).result(30)
    log.close()


def test_a_create_never_deletes_what_the_topics_directory_holds(tmp_path: Path) -> None:
    """The directory of a topic deleted while the controller was down (or, on a
    case-insensitive file system, of a topic whose name differs in case) still holds records:
    CreateTopics refuses rather than deleting them."""
    controller = Controller(_config(tmp_path))
    _start_brokers(controller, 1)
    leftover = replica_path(str(tmp_path), "orders", 0, 0)
    _log_with_records(leftover, "orders", 3)
    for validate_only in (True, False):
        [result] = controller.create_topics([NewTopic("orders")], timeout_ms=0,
                                            validate_only=validate_only)
        assert isinstance(result.error, errors.TopicAlreadyExistsError)
        assert "already holds data" in str(result.error)
    assert "orders" not in controller.image().topics
    assert DeltaTable(leftover).to_pyarrow_table().num_rows == 3


def test_a_topic_whose_directory_resists_removal_is_deleted_all_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeleteTopics commits the removal, then removes the topic's directory. A storage failure
    there (a broker still closing a log writes into it: "Directory not empty") once failed the
    whole request with KAFKA_STORAGE_ERROR, a retriable code: the client sent it again and heard
    that the topic it had just deleted does not exist. The topic is deleted either way; the
    controller removes the directory again until it goes."""
    controller = Controller(_config(tmp_path))
    _start_brokers(controller, 1)
    controller.create_topics([NewTopic("orders", 2, 1)], timeout_ms=0)
    path = topic_path(str(tmp_path), "orders")
    storage = controller._storage
    remove = storage.delete_tree
    failures = [2]

    def busy_once_or_twice(uri: str) -> None:
        if failures[0]:
            failures[0] -= 1
            raise errors.KafkaStorageError(f"cannot delete {uri}: Directory not empty")
        remove(uri)

    monkeypatch.setattr(storage, "delete_tree", busy_once_or_twice)
    [result] = controller.delete_topics(["orders"], timeout_ms=0)
    assert result.error is None and result.name == "orders"
    assert "orders" not in controller.image().topics
    wait_until(lambda: not storage.exists(path), "the deleted topic's directory to go")
    assert failures == [0]


def test_a_name_that_differs_from_a_topic_only_in_case_is_refused(tmp_path: Path) -> None:
    """PAYMENTS beside payments would share one directory where the root lives on a
    case-insensitive file system, and creating one would take the other's data."""
    controller = Controller(_config(tmp_path))
    _start_brokers(controller, 1)
    [created] = controller.create_topics([NewTopic("payments")], timeout_ms=0)
    assert created.error is None
    for validate_only in (True, False):
        [refused] = controller.create_topics([NewTopic("PAYMENTS")], timeout_ms=0,
                                             validate_only=validate_only)
        assert isinstance(refused.error, errors.InvalidTopicError)
        assert "collides with existing topic: payments" in str(refused.error)
    first, second = controller.create_topics([NewTopic("Audit"), NewTopic("audit")],
                                             timeout_ms=0, validate_only=True)
    assert first.error is None and isinstance(second.error, errors.InvalidTopicError)
    assert sorted(controller.image().topics) == ["payments"]


def test_the_controller_creates_every_replica_table_before_the_metadata_names_it(
        tmp_path: Path) -> None:
    """Only the controller creates replica tables (brokers open them, never create them), so a
    missing table later means lost records, not a replica nobody created yet."""
    controller = Controller(_config(tmp_path))
    _start_brokers(controller, 3)
    controller.create_topics([NewTopic("orders", 2, 3)], timeout_ms=0, validate_only=True)
    assert not (tmp_path / "topics" / "orders").exists()
    controller.create_topics([NewTopic("orders", 2, 3)], timeout_ms=0)
    controller.create_partitions({"orders": 3}, timeout_ms=0)
    for p in range(3):
        for b in range(3):
            table = DeltaTable(replica_path(str(tmp_path), "orders", p, b))
            assert table.version() == 0 and not table.file_uris()
    controller.create_topics([NewTopic("audit", replica_assignment={0: [0, 1]})], timeout_ms=0)
    added = tmp_path / "topics" / "audit" / "0" / "replica-2"
    assert not added.exists()
    assert controller.reassign_partitions({("audit", 0): [0, 1, 2]}) == {("audit", 0): None}
    wait_until(lambda: (added / "_delta_log").exists(), "the added replica's table")
    controller.begin_shutdown()  # ends the reassignment's thread, waiting for an ISR


def test_a_replica_reported_offline_leaves_its_isr_and_is_never_elected(tmp_path: Path) -> None:
    controller = Controller(_config(tmp_path))
    epochs = _start_brokers(controller, 3)
    controller.create_topics([NewTopic("orders", replica_assignment={0: [0, 1, 2]})],
                             timeout_ms=0)
    lost = [("orders", 0)]

    def state() -> PartitionState:
        return controller.image().topics["orders"].partitions[0]

    def heartbeat(broker: int, offline: list[tuple[str, int]]) -> None:
        controller.heartbeat(broker, epochs[broker], controller.image().version, 0, offline)

    heartbeat(1, lost)  # a follower lost its table: it leaves the ISR
    assert (state().leader, state().isr) == (0, (0, 2))
    heartbeat(0, lost)  # so did the leader: leadership moves to the replica in sync
    assert (state().leader, state().isr) == (2, (2,))
    assert controller.elect_leaders("preferred")[("orders", 0)] is not None  # 0 is not elected
    with pytest.raises(errors.IneligibleReplicaError):  # nor can 1 join the ISR
        controller.alter_partition(2, epochs[2], "orders", 0, state().leader_epoch, [2], [2, 1])
    controller.fence_broker(2, "test")  # the last in-sync replica goes
    assert (state().leader, state().isr) == (-1, (2,))
    assert isinstance(controller.elect_leaders("unclean")[("orders", 0)],  # 0 and 1 are lost
                      errors.EligibleLeadersNotAvailableError)
    heartbeat(1, [])  # 1's table is back (restored): it may be elected again
    assert controller.elect_leaders("unclean")[("orders", 0)] is None
    assert (state().leader, state().isr) == (1, (1,))


def test_a_balance_weighs_partitions_by_the_bytes_in_their_leaders_report(
        tmp_path: Path) -> None:
    """Leaders report bytes in with their heartbeats; the balancer's last goal spreads them.
    Broker 0 leads both hot partitions: the plan swaps one for a cold one of broker 1, and a
    dry run moves nothing."""
    controller = Controller(cfg.ClusterConfig(root=str(tmp_path), brokers=2, kafka_port=-1))
    brokers = LiveBrokers(controller, 2)  # heartbeating: the create needs no timeout
    epochs = brokers.epochs
    controller.create_topics([NewTopic("t", replica_assignment={
        0: [0], 1: [0], 2: [1], 3: [1]})])
    version = controller.image().version
    controller.heartbeat(0, epochs[0], version, 0,
                         partition_loads={("t", 0): 1000.0, ("t", 1): 1000.0})
    controller.heartbeat(1, epochs[1], version, 0,
                         partition_loads={("t", 2): 10.0, ("t", 3): 10.0})
    plan = controller.balance()
    assert [(b.broker_id, b.bytes_in_per_s) for b in plan.before] == [(0, 2000.0), (1, 20.0)]
    assert [(b.broker_id, b.bytes_in_per_s) for b in plan.after] == [(0, 1010.0), (1, 1010.0)]
    assert len(plan.moves) == 2 and plan.unmet == []
    assert [p.replicas for p in controller.image().topics["t"].partitions] == [
        (0,), (0,), (1,), (1,)]
    brokers.close()
    controller.begin_shutdown()


def test_a_heartbeat_waiting_behind_a_slow_commit_keeps_its_broker_alive(tmp_path: Path) -> None:
    """A heartbeat that arrives while the controller's lock is held (a metadata commit to a
    store answering in seconds) counts as contact on arrival: the session check that runs
    before it gets the lock fences only the brokers that were silent. Fencing the others too
    brought more commits, so more waiting: every broker fenced in turn, on a slow store."""
    controller = Controller(cfg.ClusterConfig(root=str(tmp_path), brokers=3, kafka_port=-1,
                                              broker_heartbeat_interval_ms=100,
                                              broker_session_timeout_ms=1000))
    epochs = _start_brokers(controller, 3)
    contacts = controller._cluster_control._heartbeats
    beat = threading.Thread(target=controller.heartbeat, daemon=True,
                            args=(0, epochs[0], controller.image().version, 0))
    with controller._lock:  # a slow commit: it holds the lock past every session
        time.sleep(1.5)
        silent_since = contacts._contacts[0].last_heartbeat_s
        beat.start()  # broker 0's heartbeat arrives and waits for the lock
        wait_until(lambda: contacts._contacts[0].last_heartbeat_s > silent_since,
                   "broker 0's heartbeat counted on arrival")
        assert sorted(controller.check_sessions()) == [1, 2]
    beat.join(30)
    assert controller.live_brokers() == [0]
