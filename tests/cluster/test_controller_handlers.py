"""The controller's handlers: a request in, the records to commit and the answer out, and the
state left as it was. Replaying the records then gives the new state. No Spark, no Delta."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator

import pytest

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster import (
    broker_registry,
    config_control,
    producer_id_control,
    replication_control,
)
from deltabus.cluster.broker_registry import BrokerHeartbeatManager
from deltabus.cluster.metadata_records import (
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    ControllerResult,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    TransactionalIdRecord,
    UnfenceBrokerRecord,
)
from deltabus.cluster.metadata_state import MetadataState, PartitionRegistration
from deltabus.metadata import NO_LEADER, BrokerEndpoint, NewTopic, PartitionState
from deltabus.storage import Storage

CONFIG = cfg.ClusterConfig(root="/tmp/unused", brokers=4, kafka_port=-1)
EPOCH = {0: 100, 1: 101, 2: 102}


def _endpoint(broker_id: int) -> BrokerEndpoint:
    return BrokerEndpoint(broker_id, "127.0.0.1", 9000 + broker_id, rack=f"r{broker_id % 2}")


def _state() -> MetadataState:
    """Brokers 0-2 live; topic orders: p0 (0,1,2) led by 0, all in sync; p1 (1,2,0) led by 1,
    ISR (1,2); topic solo: p0 (2,) led by 2."""
    state = MetadataState()
    for b, epoch in EPOCH.items():
        state.replay(RegisterBrokerRecord(_endpoint(b), epoch, 1000 + b, 1))
        state.replay(UnfenceBrokerRecord(b, epoch))
    for record in (TopicRecord("orders", "t-orders"),
                   PartitionRecord("orders", 0, (0, 1, 2), (0, 1, 2), 0, 0),
                   PartitionRecord("orders", 1, (1, 2, 0), (1, 2), 1, 3),
                   TopicRecord("solo", "t-solo"), PartitionRecord("solo", 0, (2,), (2,), 2, 0)):
        state.replay(record)
    return state


@pytest.fixture
def state() -> Iterator[MetadataState]:
    """The state, checked after the test to be what it was: handlers change nothing."""
    state = _state()
    yield state
    assert state == _state()


def _apply(state: MetadataState, result: ControllerResult[object]) -> MetadataState:
    after = copy.deepcopy(state)
    for record in result.records:
        after.replay(record)
    return after


# ---- topics ----------------------------------------------------------------------------------

def test_create_topic_returns_topic_partition_and_config_records(state: MetadataState) -> None:
    random.seed(3)
    result = replication_control.create_topic(
        state, CONFIG, NewTopic("events", 4, 2, configs={"retention.ms": "5"}))
    topic, *rest = result.records
    assert isinstance(topic, TopicRecord) and topic.name == "events"
    partitions = [r for r in rest if isinstance(r, PartitionRecord)]
    assert [p.partition for p in partitions] == [0, 1, 2, 3]
    for p in partitions:
        assert len(set(p.replicas)) == 2 and p.isr == p.replicas
        assert p.leader == p.replicas[0] and p.leader_epoch == 0
        assert set(p.replicas) <= {0, 1, 2}
    assert rest[-1] == ConfigRecord("events", "retention.ms", "5")
    assert result.response.topic_id == topic.topic_id
    assert (result.response.num_partitions, result.response.replication_factor) == (4, 2)
    after = _apply(state, result)
    assert after.topic_states()["events"].configs == {"retention.ms": "5"}


def test_create_topic_with_explicit_assignment(state: MetadataState) -> None:
    result = replication_control.create_topic(
        state, CONFIG, NewTopic("events", replica_assignment={0: [2, 0], 1: [1, 2]}))
    assert [(r.replicas, r.leader) for r in result.records if isinstance(r, PartitionRecord)] \
        == [((2, 0), 2), ((1, 2), 1)]


@pytest.mark.parametrize(("topic", "duplicated", "error"), [
    (NewTopic("orders"), False, errors.TopicAlreadyExistsError),
    (NewTopic("events"), True, errors.InvalidRequestError),
    (NewTopic("bad name"), False, errors.InvalidTopicError),
    (NewTopic("events", 0), False, errors.InvalidPartitionsError),
    (NewTopic("events", 1, 4), False, errors.InvalidReplicationFactorError),
    (NewTopic("events", configs={"no.such.config": "1"}), False, errors.InvalidConfigError),
    (NewTopic("events", replica_assignment={0: [3]}), False,
     errors.InvalidReplicaAssignmentError),
    (NewTopic("events", replica_assignment={0: [1, 1]}), False,
     errors.InvalidReplicaAssignmentError),
    (NewTopic("events", replica_assignment={1: [1]}), False,
     errors.InvalidReplicaAssignmentError),
    (NewTopic("events", 1, replica_assignment={0: [1]}), False, errors.InvalidRequestError),
])
def test_create_topic_refused(state: MetadataState, topic: NewTopic, duplicated: bool,
                              error: type[Exception]) -> None:
    with pytest.raises(error):
        replication_control.create_topic(state, CONFIG, topic, duplicated=duplicated)


def test_create_partitions_adds_only_the_new_ones(state: MetadataState) -> None:
    result = replication_control.create_partitions(state, CONFIG, "orders", 4)
    assert [r.partition for r in result.records if isinstance(r, PartitionRecord)] == [2, 3]
    assert all(len(r.replicas) == 3 for r in result.records if isinstance(r, PartitionRecord))
    assert result.response.num_partitions == 4
    assert len(_apply(state, result).topics["orders"].partitions) == 4
    with pytest.raises(errors.InvalidPartitionsError):
        replication_control.create_partitions(state, CONFIG, "orders", 2)
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        replication_control.create_partitions(state, CONFIG, "nope", 2)


def test_create_topics_counts_the_topics_before_it_against_the_clusters_limits(
        state: MetadataState) -> None:
    """orders (2 partitions) and solo (1) exist: room for two more topics and 4 partitions."""
    config = CONFIG.with_(max_topics=4, max_partitions=7)
    result = replication_control.create_topics(state, config, [
        NewTopic("a", 3, 1), NewTopic("b", 2, 1), NewTopic("c", 1, 1)])
    outcomes = {r.name: type(r.error) for r in result.response}
    assert outcomes == {"a": type(None), "b": errors.PolicyViolationError, "c": type(None)}
    assert {r.name for r in result.records if isinstance(r, TopicRecord)} == {"a", "c"}
    with pytest.raises(errors.PolicyViolationError):  # auto-creation: all or nothing
        replication_control.auto_create_topics(state, config, ["x", "y", "z"])
    with pytest.raises(errors.PolicyViolationError):
        replication_control.auto_create_topics(
            state, CONFIG.with_(auto_create_topics_per_request_max=1), ["x", "y", "orders"])
    made = replication_control.auto_create_topics(state, config, ["x", "orders", "x"])
    assert [r.name for r in made.response] == ["x"]  # the missing ones, once each
    with pytest.raises(errors.PolicyViolationError):
        replication_control.create_partitions(state, config, "orders", 7)


def test_delete_topic(state: MetadataState) -> None:
    result = replication_control.delete_topic(state, "orders")
    assert result.records == [RemoveTopicRecord("orders", "t-orders")]
    assert result.response.topic_id == "t-orders"
    assert "orders" not in _apply(state, result).topics
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        replication_control.delete_topic(state, "nope")
    internal = _apply(state, ControllerResult([TopicRecord("__consumer_offsets", "x")], None))
    with pytest.raises(errors.InvalidTopicError, match="internal"):
        replication_control.delete_topic(internal, "__consumer_offsets")


# ---- ISR changes -----------------------------------------------------------------------------

def test_alter_partition_shrinks_the_isr_in_replica_order(state: MetadataState) -> None:
    result = replication_control.alter_partition(state, 0, EPOCH[0], "orders", 0, 0,
                                                 [2, 1, 0], [2, 0])
    assert result.records == [PartitionChangeRecord("orders", 0, isr=(0, 2))]
    assert result.response == PartitionState(0, 0, 0, (0, 1, 2), (0, 2))
    assert _apply(state, result).partition("orders", 0) == PartitionRegistration(
        (0, 1, 2), (0, 2), 0, 0)


def test_alter_partition_to_the_same_isr_writes_nothing(state: MetadataState) -> None:
    result = replication_control.alter_partition(state, 1, EPOCH[1], "orders", 1, 3, [1, 2],
                                                 [2, 1])
    assert result.records == []
    assert result.response == PartitionState(1, 1, 3, (1, 2, 0), (1, 2))


@pytest.mark.parametrize(("args", "error"), [
    ((0, 99, "orders", 0, 0, [0, 1, 2], [0]), errors.StaleBrokerEpochError),
    ((0, EPOCH[0], "nope", 0, 0, [0], [0]), errors.UnknownTopicOrPartitionError),
    ((1, EPOCH[1], "orders", 0, 0, [0, 1, 2], [1]), errors.NotLeaderOrFollowerError),
    ((0, EPOCH[0], "orders", 0, 1, [0, 1, 2], [0]), errors.FencedLeaderEpochError),
    ((0, EPOCH[0], "orders", 0, 0, [0, 1], [0]), errors.InvalidUpdateVersionError),
    ((0, EPOCH[0], "orders", 0, 0, [0, 1, 2], [1, 2]), errors.InvalidRequestError),
    ((0, EPOCH[0], "orders", 0, 0, [0, 1, 2], [0, 5]), errors.InvalidRequestError),
])
def test_alter_partition_refused(state: MetadataState, args: tuple, error: type[Exception]
                                 ) -> None:
    with pytest.raises(error):
        replication_control.alter_partition(state, *args)


def test_alter_partition_cannot_add_a_replica_that_is_not_live(state: MetadataState) -> None:
    shutting = _apply(state, ControllerResult(
        [BrokerRegistrationChangeRecord(0, EPOCH[0], in_controlled_shutdown=True)], None))
    with pytest.raises(errors.IneligibleReplicaError):
        replication_control.alter_partition(shutting, 1, EPOCH[1], "orders", 1, 3, [1, 2],
                                            [1, 2, 0])


# ---- elections -------------------------------------------------------------------------------

def test_fencing_a_leader_elects_the_next_in_sync_replica(state: MetadataState) -> None:
    fence = [FenceBrokerRecord(1, EPOCH[1])]
    records = replication_control.elect_after_broker_change(state, CONFIG, fence, leaving=1)
    assert records == fence + [
        PartitionChangeRecord("orders", 0, isr=(0, 2)),
        PartitionChangeRecord("orders", 1, leader=2, leader_epoch=4, isr=(2,)),
    ]
    after = _apply(state, ControllerResult(records, None))
    assert after.brokers.live_broker_ids() == [0, 2]


def test_the_last_isr_member_stays_and_its_partition_goes_offline(state: MetadataState) -> None:
    records = replication_control.elect_after_broker_change(
        state, CONFIG, [FenceBrokerRecord(2, EPOCH[2])], leaving=2)
    assert PartitionChangeRecord("solo", 0, leader=NO_LEADER, leader_epoch=1) in records


def test_unclean_election_where_the_topic_allows_it(state: MetadataState) -> None:
    unclean = _apply(state, ControllerResult([
        PartitionChangeRecord("orders", 1, isr=(1,)),
        ConfigRecord("orders", "unclean.leader.election.enable", "true")], None))
    records = replication_control.elect_after_broker_change(
        unclean, CONFIG, [FenceBrokerRecord(1, EPOCH[1])], leaving=1)
    assert PartitionChangeRecord("orders", 1, leader=2, leader_epoch=4, isr=(2,)) in records


def test_controlled_shutdown_keeps_what_no_other_replica_can_lead(state: MetadataState) -> None:
    change = [BrokerRegistrationChangeRecord(2, EPOCH[2], in_controlled_shutdown=True)]
    records = replication_control.elect_after_broker_change(state, CONFIG, change, leaving=2)
    assert records == change + [
        PartitionChangeRecord("orders", 0, isr=(0, 1)),
        PartitionChangeRecord("orders", 1, isr=(1,)),
    ]  # solo-0 has no other replica: broker 2 leads it until it stops


def test_unfencing_a_broker_gives_offline_partitions_a_leader(state: MetadataState) -> None:
    offline = _apply(state, ControllerResult(replication_control.elect_after_broker_change(
        state, CONFIG, [FenceBrokerRecord(2, EPOCH[2])], leaving=2), None))
    back = _apply(offline, ControllerResult(
        [RegisterBrokerRecord(_endpoint(2), 200, 1, 1)], None))
    records = replication_control.elect_after_broker_change(
        back, CONFIG, [UnfenceBrokerRecord(2, 200)])
    assert PartitionChangeRecord("solo", 0, leader=2, leader_epoch=2) in records


def test_elect_preferred_leaders(state: MetadataState) -> None:
    moved = _apply(state, ControllerResult(
        [PartitionChangeRecord("orders", 0, leader=1, leader_epoch=1)], None))
    result = replication_control.elect_leaders(moved, "preferred", None)
    assert result.records == [
        PartitionChangeRecord("orders", 0, leader=0, leader_epoch=2, isr=(0, 1, 2))]
    assert result.response[("orders", 0)] is None
    assert isinstance(result.response[("orders", 1)], errors.ElectionNotNeededError)
    assert moved == _apply(state, ControllerResult(
        [PartitionChangeRecord("orders", 0, leader=1, leader_epoch=1)], None))


def test_elect_leaders_answers_per_partition(state: MetadataState) -> None:
    result = replication_control.elect_leaders(state, "unclean", [("orders", 0), ("nope", 0)])
    assert result.records == []
    assert isinstance(result.response[("orders", 0)], errors.ElectionNotNeededError)
    assert isinstance(result.response[("nope", 0)], errors.UnknownTopicOrPartitionError)
    with pytest.raises(errors.InvalidRequestError):
        replication_control.elect_leaders(state, "bogus", None)


# ---- reassignments ---------------------------------------------------------------------------

def test_reassignment_is_checked_started_and_completed(state: MetadataState) -> None:
    checked = replication_control.reassign_partitions(
        state, {("orders", 0): [1, 2], ("orders", 1): [1, 2, 0], ("nope", 0): [1],
                ("solo", 0): [2, 2]})
    results, started = checked.response
    assert checked.records == []
    assert started == [("orders", 0, [1, 2])]  # orders-1 already has those replicas
    assert results[("orders", 0)] is None and results[("orders", 1)] is None
    assert isinstance(results[("nope", 0)], errors.UnknownTopicOrPartitionError)
    assert isinstance(results[("solo", 0)], errors.InvalidReplicaAssignmentError)

    records = replication_control.start_reassignments(state, started)
    assert records == [PartitionChangeRecord("orders", 0, replicas=(1, 2, 0),
                                             adding_replicas=(), removing_replicas=(0,))]
    moving = _apply(state, ControllerResult(records, None))
    again = replication_control.reassign_partitions(moving, {("orders", 0): [1]})
    assert isinstance(again.response[0][("orders", 0)], errors.InvalidRequestError)

    done = replication_control.complete_reassignment(moving, "orders", 0)
    assert done.response == (0,)
    assert done.records == [PartitionChangeRecord(
        "orders", 0, leader=1, leader_epoch=1, isr=(1, 2), replicas=(1, 2),
        adding_replicas=(), removing_replicas=())]  # the leader was removed: it hands over


def test_reassignment_waits_for_added_replicas_to_join_the_isr(state: MetadataState) -> None:
    moving = _apply(state, ControllerResult(replication_control.start_reassignments(
        state, [("solo", 0, [0, 2])]), None))
    assert moving.partition("solo", 0) == PartitionRegistration((0, 2), (2,), 2, 0, (0,), ())
    assert replication_control.reassignment_catch_up_tasks(
        state, Storage("/root"), [("solo", 0, [0, 2])])[0].target == 0
    assert replication_control.complete_reassignment(moving, "solo", 0).response is None
    synced = _apply(moving, ControllerResult([PartitionChangeRecord("solo", 0, isr=(2, 0))],
                                             None))
    done = replication_control.complete_reassignment(synced, "solo", 0)
    assert done.response == ()
    assert done.records == [PartitionChangeRecord("solo", 0, isr=(0, 2), replicas=(0, 2),
                                                  adding_replicas=(), removing_replicas=())]
    assert replication_control.complete_reassignment(state, "solo", 0) == \
        ControllerResult([], ())  # nothing in progress: moot


def test_cancelling_a_reassignment_goes_back_to_the_replicas_it_started_from(
        state: MetadataState) -> None:
    moving = _apply(state, ControllerResult(replication_control.start_reassignments(
        state, [("solo", 0, [0])]), None))  # adding 0, removing 2
    cancelled = replication_control.cancel_reassignment(moving, "solo", 0)
    assert cancelled.response == (0,)  # the added replica's table may go
    assert cancelled.records == [PartitionChangeRecord(
        "solo", 0, replicas=(2,), isr=(2,), adding_replicas=(), removing_replicas=())]
    led = _apply(moving, ControllerResult([PartitionChangeRecord(
        "solo", 0, isr=(2, 0), leader=0, leader_epoch=1)], None))
    assert replication_control.cancel_reassignment(led, "solo", 0).records == [
        PartitionChangeRecord("solo", 0, replicas=(2,), isr=(2,), adding_replicas=(),
                              removing_replicas=(), leader=2, leader_epoch=2)]  # hands back
    with pytest.raises(errors.NoReassignmentInProgressError):
        replication_control.cancel_reassignment(state, "solo", 0)
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        replication_control.cancel_reassignment(state, "nope", 0)


# ---- configs ---------------------------------------------------------------------------------

def test_alter_configs_records_only_what_changes(state: MetadataState) -> None:
    result = config_control.alter_configs(state, CONFIG, "orders", [
        cfg.AlterConfigOp("retention.ms", cfg.SET, "10"),
        cfg.AlterConfigOp("cleanup.policy", cfg.APPEND, "compact")])
    assert result.records == [ConfigRecord("orders", "cleanup.policy", "delete,compact"),
                              ConfigRecord("orders", "retention.ms", "10")]
    after = _apply(state, result)
    unset = config_control.alter_configs(after, CONFIG, "orders", [
        cfg.AlterConfigOp("retention.ms", cfg.DELETE), cfg.AlterConfigOp("cleanup.policy",
                                                                         cfg.SET,
                                                                         "delete,compact")])
    assert unset.records == [ConfigRecord("orders", "retention.ms", None)]
    with pytest.raises(errors.InvalidConfigError):
        config_control.alter_configs(state, CONFIG, "orders",
                                     [cfg.AlterConfigOp("retention.ms", cfg.SET, "x")])
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        config_control.alter_configs(state, CONFIG, "nope", [])


def test_describe_configs(state: MetadataState) -> None:
    results = config_control.describe_configs(state, CONFIG, ["orders", "nope"])
    assert isinstance(results["nope"], errors.UnknownTopicOrPartitionError)
    entries = results["orders"]
    assert isinstance(entries, list) and any(e.name == "retention.ms" for e in entries)


# ---- producer ids ----------------------------------------------------------------------------

def test_producer_ids_are_reserved_in_blocks(state: MetadataState) -> None:
    first = producer_id_control.init_producer_id(state, 0)
    assert first == ControllerResult([ProducerIdsRecord(producer_id_control.PRODUCER_ID_BLOCK)],
                                     (0, 0))
    reserved = _apply(state, first)
    assert producer_id_control.init_producer_id(reserved, 1) == ControllerResult([], (1, 0))
    block_end = producer_id_control.PRODUCER_ID_BLOCK
    assert producer_id_control.init_producer_id(reserved, block_end).records == [
        ProducerIdsRecord(2 * block_end)]


def test_a_transactional_id_keeps_its_producer_id(state: MetadataState) -> None:
    first = producer_id_control.init_producer_id(state, 0, "tx")
    assert first.records == [ProducerIdsRecord(producer_id_control.PRODUCER_ID_BLOCK),
                             TransactionalIdRecord("tx", 0)]
    known = _apply(state, first)
    assert producer_id_control.init_producer_id(known, 5, "tx") == ControllerResult([], (0, 0))


# ---- brokers ---------------------------------------------------------------------------------

def test_register_broker_gives_a_new_fenced_epoch(state: MetadataState) -> None:
    result = broker_registry.register_broker(state.brokers, _endpoint(3), 42, members=range(4),
                                             held=set(), version=9)
    assert result.response == max(EPOCH.values()) + 1
    assert result.records == [RegisterBrokerRecord(_endpoint(3), result.response, 42, 9)]
    after = _apply(state, result)
    assert after.brokers.get(3) is not None and after.brokers.live_broker_ids() == [0, 1, 2]


def test_a_new_incarnation_fences_the_old_one(state: MetadataState) -> None:
    result = broker_registry.register_broker(state.brokers, _endpoint(1), 42, members=range(4),
                                             held=set(), version=9)
    assert result.records[0] == FenceBrokerRecord(1, EPOCH[1])
    after = _apply(state, result)
    with pytest.raises(errors.StaleBrokerEpochError):
        after.brokers.check_epoch(1, EPOCH[1])
    assert after.brokers.check_epoch(1, result.response).fenced


def test_register_broker_refused(state: MetadataState) -> None:
    with pytest.raises(errors.InvalidRequestError):
        broker_registry.register_broker(state.brokers, _endpoint(4), 1, members=range(4),
                                        held=set(), version=1)
    with pytest.raises(errors.BrokerNotAvailableError):
        broker_registry.register_broker(state.brokers, _endpoint(3), 1, members=range(4),
                                        held={3}, version=1)


def test_heartbeat_unfences_a_broker_once_caught_up() -> None:
    state = MetadataState()
    state.replay(RegisterBrokerRecord(_endpoint(0), 7, 1, registered_version=5))
    assert broker_registry.heartbeat(state.brokers, 0, 7, 4).records == []
    result = broker_registry.heartbeat(state.brokers, 0, 7, 5)
    assert result.records == [UnfenceBrokerRecord(0, 7)]
    assert state.brokers.live_broker_ids() == []
    with pytest.raises(errors.StaleBrokerEpochError):
        broker_registry.heartbeat(state.brokers, 0, 6, 5)


def test_fence_and_shut_down_only_what_runs(state: MetadataState) -> None:
    assert broker_registry.fence_broker(state.brokers, 1) == [FenceBrokerRecord(1, EPOCH[1])]
    assert broker_registry.fence_broker(state.brokers, 3) == []
    assert broker_registry.shut_down_broker(state.brokers, 1) == [
        BrokerRegistrationChangeRecord(1, EPOCH[1], in_controlled_shutdown=True)]
    assert broker_registry.shut_down_broker(state.brokers, 3) == []


def test_heartbeat_manager_expires_silent_brokers(state: MetadataState) -> None:
    heartbeats = BrokerHeartbeatManager()
    for b in EPOCH:
        heartbeats.register(b, 100.0)
    heartbeats.touch(1, 105.0)
    assert heartbeats.set_applied_version(1, 3) and not heartbeats.set_applied_version(1, 3)
    assert heartbeats.applied_version(1) == 3 and heartbeats.applied_version(0) == 0
    assert heartbeats.expired(state.brokers, 109.0, 5.0) == [0, 2]


def test_records_from_handlers_are_all_typed(state: MetadataState) -> None:
    random.seed(1)
    results: list[ControllerResult[object]] = [
        replication_control.create_topic(state, CONFIG, NewTopic("events", 2, 2)),
        replication_control.delete_topic(state, "solo"),
        replication_control.elect_leaders(state, "preferred", None),
        producer_id_control.init_producer_id(state, 0, "tx"),
    ]
    assert all(isinstance(r, MetadataRecord) for res in results for r in res.records)
