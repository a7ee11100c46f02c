"""Replay: applying typed records to the controller's in-memory state, brokers included."""

from __future__ import annotations

import copy

import pytest

from deltabus.cluster.broker_registry import BrokerRegistration, BrokerRegistry
from deltabus.cluster.metadata_records import (
    BrokerRegistrationChangeRecord,
    ClusterIdRecord,
    ConfigRecord,
    FenceBrokerRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    TransactionalIdRecord,
    UnfenceBrokerRecord,
    UserScramCredentialRecord,
    to_stored,
)
from deltabus.cluster.metadata_state import MetadataState, PartitionRegistration
from deltabus.metadata import BrokerEndpoint, PartitionState, TopicState
from deltabus.security.scram import ScramCredential

TOPIC_RECORDS: list[MetadataRecord] = [
    ClusterIdRecord("c-1"),
    TopicRecord("orders", "t1"),
    PartitionRecord("orders", 0, (1, 2, 3), (1, 2, 3), 1, 0),
    PartitionRecord("orders", 1, (2, 3, 1), (2, 3, 1), 2, 0),
    ConfigRecord("orders", "retention.ms", "1000"),
    PartitionChangeRecord("orders", 0, leader=2, leader_epoch=1, isr=(2, 3)),
    ConfigRecord("orders", "cleanup.policy", "compact"),
    ConfigRecord("orders", "retention.ms", None),
    ProducerIdsRecord(1000),
    TransactionalIdRecord("tx", 4),
    UserScramCredentialRecord("alice", "SCRAM-SHA-256", b"s1", b"stored1", b"server1", 4096),
    UserScramCredentialRecord("alice", "SCRAM-SHA-512", b"s2", b"stored2", b"server2", 8192),
    UserScramCredentialRecord("bob", "SCRAM-SHA-256", b"s3", b"stored3", b"server3", 4096),
    UserScramCredentialRecord("alice", "SCRAM-SHA-256", b"s4", b"stored4", b"server4", 5000),
    RemoveUserScramCredentialRecord("bob", "SCRAM-SHA-256"),
]


def _replay(records: list[MetadataRecord], state: MetadataState | None = None
            ) -> MetadataState:
    state = state or MetadataState()
    for record in records:
        state.replay(record)
    return state


def _endpoint(broker_id: int) -> BrokerEndpoint:
    return BrokerEndpoint(broker_id, "127.0.0.1", 9000 + broker_id)


def test_replay_of_typed_records() -> None:
    state = _replay(TOPIC_RECORDS)
    assert state.cluster_id == "c-1"
    assert state.producer_ids_end == 1000
    assert state.transactional_ids == {"tx": 4}
    assert state.topic_states() == {"orders": TopicState(
        "orders", "t1",
        (PartitionState(0, 2, 1, (1, 2, 3), (2, 3)), PartitionState(1, 2, 0, (2, 3, 1), (2, 3, 1))),
        {"cleanup.policy": "compact"})}


def test_replay_of_scram_credential_records() -> None:
    state = _replay(TOPIC_RECORDS)
    assert state.scram_credentials == {"alice": {  # bob's only credential went, and bob too
        "SCRAM-SHA-256": ScramCredential("SCRAM-SHA-256", b"s4", b"stored4", b"server4", 5000),
        "SCRAM-SHA-512": ScramCredential("SCRAM-SHA-512", b"s2", b"stored2", b"server2", 8192)}}
    assert state.scram_credential("alice", "SCRAM-SHA-512").iterations == 8192
    assert state.scram_credential("bob", "SCRAM-SHA-256") is None
    copied = state.scram_credentials_copy()
    copied["alice"].clear()
    assert len(state.scram_credentials["alice"]) == 2


def test_removing_a_credential_that_is_not_there_is_a_bug() -> None:
    state = _replay(TOPIC_RECORDS)
    with pytest.raises(ValueError, match="no SCRAM-SHA-256 credential of user 'bob'"):
        state.replay(RemoveUserScramCredentialRecord("bob", "SCRAM-SHA-256"))


def test_typed_and_stored_records_replay_to_the_same_state() -> None:
    typed = _replay(TOPIC_RECORDS)
    stored = MetadataState()
    for record in TOPIC_RECORDS:
        stored.replay(to_stored(record))
    assert stored == typed


def test_partition_change_keeps_what_it_does_not_name() -> None:
    state = _replay(TOPIC_RECORDS[:4] + [
        PartitionChangeRecord("orders", 1, replicas=(2, 3, 1, 4), adding_replicas=(4,),
                              removing_replicas=(1,))])
    assert state.partition("orders", 1) == PartitionRegistration(
        (2, 3, 1, 4), (2, 3, 1), 2, 0, (4,), (1,))
    state.replay(PartitionChangeRecord("orders", 1, replicas=(2, 3, 4), isr=(2, 3, 4),
                                       adding_replicas=(), removing_replicas=()))
    assert state.partition("orders", 1) == PartitionRegistration((2, 3, 4), (2, 3, 4), 2, 0)


def test_remove_topic_drops_partitions_and_configs() -> None:
    state = _replay(TOPIC_RECORDS + [RemoveTopicRecord("orders", "t1"),
                                     TopicRecord("orders", "t2")])
    assert state.topic_states() == {"orders": TopicState("orders", "t2", (), {})}
    assert state.partition("orders", 0) is None


def test_broker_registration_lifecycle() -> None:
    state = _replay([RegisterBrokerRecord(_endpoint(1), 10, 111, 5)])
    assert state.brokers.get(1) == BrokerRegistration(_endpoint(1), 10, 111, 5, fenced=True)
    assert state.brokers.live_broker_ids() == []
    state.replay(UnfenceBrokerRecord(1, 10))
    assert state.brokers.live_broker_ids() == [1]
    assert state.brokers.leader_candidates() == {1}
    state.replay(BrokerRegistrationChangeRecord(1, 10, in_controlled_shutdown=True))
    assert state.brokers.live_broker_ids() == [1]
    assert state.brokers.leader_candidates() == set()
    state.replay(FenceBrokerRecord(1, 10))
    assert state.brokers.get(1) is None
    assert state.brokers.last_broker_epoch == 10


def test_broker_records_of_a_stale_epoch_change_nothing() -> None:
    state = _replay([RegisterBrokerRecord(_endpoint(1), 10, 111, 5), UnfenceBrokerRecord(1, 10),
                     RegisterBrokerRecord(_endpoint(1), 11, 112, 7)])
    before = copy.deepcopy(state)
    for record in (UnfenceBrokerRecord(1, 10), FenceBrokerRecord(1, 10),
                   BrokerRegistrationChangeRecord(1, 10, True), FenceBrokerRecord(2, 1)):
        state.replay(record)
    assert state == before
    assert state.brokers.get(1) == BrokerRegistration(_endpoint(1), 11, 112, 7)


def test_replayed_registry_is_a_copy() -> None:
    registry = BrokerRegistry(last_broker_epoch=9)
    registry.replay(RegisterBrokerRecord(_endpoint(1), 10, 111, 5))
    before = copy.deepcopy(registry)
    after = registry.replayed([UnfenceBrokerRecord(1, 10), ConfigRecord("t", "k", "v"),
                               RegisterBrokerRecord(_endpoint(2), 11, 112, 6)])
    assert registry == before
    assert after.live_broker_ids() == [1]
    assert sorted(after.registrations) == [1, 2]
    assert after.last_broker_epoch == 11


def test_topic_states_share_nothing_mutable_with_the_state() -> None:
    state = _replay(TOPIC_RECORDS)
    states = state.topic_states()
    states["orders"].configs["retention.ms"] = "1"
    assert state.topics["orders"].configs == {"cleanup.policy": "compact"}
