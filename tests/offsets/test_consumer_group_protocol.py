"""KIP-848's consumer group protocol in the group coordinator, driven directly with a controlled
clock (no Spark, no sockets; a real __consumer_offsets Delta table under tmp_path): epochs,
server-side assignment, revoke-before-assign reconciliation, fencing, leaving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deltabus import errors
from deltabus.config import GroupConfig
from deltabus.metadata import MetadataImage, PartitionState, TopicState
from deltabus.offsets.consumer_group import range_assign, uniform_assign
from deltabus.offsets.group_coordinator import GroupCoordinator, HeartbeatResult
from deltabus.offsets.offset_store import OffsetAndMetadata, OffsetStore
from tests.offsets.test_group_coordinator import Clock

TOPIC = "t"


def image() -> MetadataImage:
    partitions = tuple(PartitionState(p, 0, 0, (0,), (0,)) for p in range(6))
    return MetadataImage(1, "c", 0, (), {TOPIC: TopicState(TOPIC, "t-id", partitions)})


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def coordinator(tmp_path: Path, clock: Clock) -> Iterator[GroupCoordinator]:
    c = GroupCoordinator(OffsetStore(str(tmp_path / "__consumer_offsets")), GroupConfig(),
                         clock, metadata=image)
    yield c
    c.close()


class Member:
    """A consumer as the KIP-848 protocol wants it: it owns what its last answer assigned and
    acknowledges a revocation on its next heartbeat."""

    def __init__(self, c: GroupCoordinator, member_id: str) -> None:
        self.c, self.member_id, self.epoch = c, member_id, 0
        self.owned: dict[str, frozenset[int]] = {}

    def heartbeat(self) -> HeartbeatResult:
        first = self.epoch == 0
        result = self.c.consumer_group_heartbeat(
            "g", self.member_id, self.epoch, rebalance_timeout_ms=60_000 if first else -1,
            subscribed_topic_names=[TOPIC] if first else None, owned=dict(self.owned))
        self.epoch = result.member_epoch
        if result.assignment is not None:
            self.owned = dict(result.assignment)
        return result

    def partitions(self) -> set[int]:
        return set(self.owned.get(TOPIC, ()))


def converge(members: list[Member], rounds: int = 6) -> None:
    for _ in range(rounds):
        for m in members:
            m.heartbeat()


def test_one_member_gets_every_partition_with_epoch_1(coordinator: GroupCoordinator) -> None:
    a = Member(coordinator, "a")
    result = a.heartbeat()
    assert result.member_epoch == 1 and result.heartbeat_interval_ms == 5000
    assert a.partitions() == set(range(6))


def test_a_third_member_gets_partitions_only_after_others_revoked_them(
        coordinator: GroupCoordinator) -> None:
    a, b = Member(coordinator, "a"), Member(coordinator, "b")
    converge([a, b])
    assert a.partitions() | b.partitions() == set(range(6))
    assert len(a.partitions()) == len(b.partitions()) == 3
    c = Member(coordinator, "c")
    c.heartbeat()  # a and b still own everything: c gets nothing yet
    assert c.partitions() == set() and c.epoch == 3
    a.heartbeat()  # a is told to give one up, and keeps its epoch until it has
    assert len(a.partitions()) == 2 and a.epoch == 2
    c.heartbeat()  # a has not said it released it: still nothing for c
    assert c.partitions() == set()
    a.heartbeat()  # a's heartbeat shows it no longer owns it: a moves to the new epoch
    assert a.epoch == 3
    c.heartbeat()  # what a released goes to c; b's one is not released yet
    assert len(c.partitions()) == 1 and not c.partitions() & (a.partitions() | b.partitions())
    converge([a, b, c])
    owned = [a.partitions(), b.partitions(), c.partitions()]
    assert sorted(len(p) for p in owned) == [2, 2, 2]
    assert set().union(*owned) == set(range(6))
    assert a.epoch == b.epoch == c.epoch == 3


def test_partitions_never_held_by_two_members_while_reconciling(
        coordinator: GroupCoordinator) -> None:
    members = [Member(coordinator, "a")]
    converge(members)
    for name in "bcd":
        members.append(Member(coordinator, name))
        for _ in range(4):
            for m in members:
                m.heartbeat()
                held = [p for x in members for p in x.partitions()]
                assert len(held) == len(set(held))


def test_a_silent_member_is_fenced_and_its_partitions_reassigned(
        coordinator: GroupCoordinator, clock: Clock) -> None:
    a, b = Member(coordinator, "a"), Member(coordinator, "b")
    converge([a, b])
    for _ in range(12):  # b stops heartbeating; a goes on past b's session timeout
        clock.now += 5
        a.heartbeat()
        coordinator.tick()
    assert a.partitions() == set(range(6))
    with pytest.raises(errors.UnknownMemberIdError):
        b.heartbeat()


def test_an_old_epoch_is_fenced(coordinator: GroupCoordinator) -> None:
    a, b = Member(coordinator, "a"), Member(coordinator, "b")
    converge([a, b])
    with pytest.raises(errors.FencedMemberEpochError):
        coordinator.consumer_group_heartbeat("g", "a", a.epoch + 1, owned=None)
    with pytest.raises(errors.UnknownMemberIdError):
        coordinator.consumer_group_heartbeat("g", "nobody", 1, owned=None)


def test_a_leaving_member_gives_its_partitions_to_the_others(
        coordinator: GroupCoordinator) -> None:
    a, b = Member(coordinator, "a"), Member(coordinator, "b")
    converge([a, b])
    assert coordinator.consumer_group_heartbeat("g", "b", -1).member_epoch == -1
    converge([a], 2)
    assert a.partitions() == set(range(6))


def test_a_static_member_that_comes_back_keeps_its_partitions(
        coordinator: GroupCoordinator) -> None:
    a = Member(coordinator, "a")
    b = coordinator.consumer_group_heartbeat("g", "b1", 0, instance_id="i",
                                             rebalance_timeout_ms=60_000,
                                             subscribed_topic_names=[TOPIC], owned={})
    converge([a])
    for _ in range(3):
        b = coordinator.consumer_group_heartbeat("g", "b1", b.member_epoch, owned={})
        a.heartbeat()
    b = coordinator.consumer_group_heartbeat("g", "b1", b.member_epoch, owned={},
                                             rebalance_timeout_ms=60_000,
                                             subscribed_topic_names=[TOPIC])  # a full request
    kept = b.assignment
    with pytest.raises(errors.UnreleasedInstanceIdError):  # b1 is live: "i" is not free
        coordinator.consumer_group_heartbeat("g", "b0", 0, instance_id="i",
                                             subscribed_topic_names=[TOPIC], owned={})
    assert kept and coordinator.consumer_group_heartbeat("g", "b1", -2).member_epoch == -2
    back = coordinator.consumer_group_heartbeat("g", "b2", 0, instance_id="i",
                                                subscribed_topic_names=[TOPIC], owned={})
    assert back.member_epoch == b.member_epoch and back.assignment == kept


def test_classic_and_consumer_groups_do_not_mix(coordinator: GroupCoordinator) -> None:
    Member(coordinator, "a").heartbeat()
    with pytest.raises(errors.InconsistentGroupProtocolError):
        coordinator.join_group("g", "", "consumer", [("range", b"")], session_timeout_ms=10_000,
                               rebalance_timeout_ms=10_000)
    with pytest.raises(errors.UnsupportedAssignorError):
        coordinator.consumer_group_heartbeat("g", "x", 0, server_assignor="sticky", owned={})


def test_a_consumer_heartbeat_to_a_classic_group_with_members_is_inconsistent(
        coordinator: GroupCoordinator) -> None:
    with pytest.raises(errors.MemberIdRequiredError) as handed:
        coordinator.join_group("classic", "", "consumer", [("range", b"")],
                               session_timeout_ms=10_000, rebalance_timeout_ms=10_000)
    coordinator.join_group("classic", handed.value.member_id, "consumer",  # type: ignore
                           [("range", b"")], session_timeout_ms=10_000,
                           rebalance_timeout_ms=10_000)
    with pytest.raises(errors.InconsistentGroupProtocolError):
        coordinator.consumer_group_heartbeat("classic", "x", 0, rebalance_timeout_ms=1000,
                                             subscribed_topic_names=[TOPIC], owned={})


def test_a_subscription_change_revokes_the_partitions_of_topics_left(
        coordinator: GroupCoordinator) -> None:
    a = Member(coordinator, "a")
    converge([a])
    epoch = a.epoch
    result = coordinator.consumer_group_heartbeat("g", "a", a.epoch, owned=a.owned,
                                                  subscribed_topic_names=["other"])
    assert result.assignment == {} and result.member_epoch == epoch  # revoke first
    result = coordinator.consumer_group_heartbeat("g", "a", epoch, owned={})
    assert result.member_epoch > epoch


def test_commits_check_the_member_epoch(coordinator: GroupCoordinator) -> None:
    a = Member(coordinator, "a")
    a.heartbeat()
    offsets = {(TOPIC, 0): OffsetAndMetadata(5)}
    assert coordinator.commit_offsets("g", a.epoch, "a", offsets).result(30) == {(TOPIC, 0): None}
    with pytest.raises(errors.StaleMemberEpochError):
        coordinator.commit_offsets("g", a.epoch - 1, "a", offsets)
    with pytest.raises(errors.FencedMemberEpochError):
        coordinator.commit_offsets("g", a.epoch + 1, "a", offsets)
    with pytest.raises(errors.UnknownMemberIdError):
        coordinator.commit_offsets("g", -1, "", offsets)
    assert coordinator.fetch_offsets("g")[(TOPIC, 0)].offset == 5


def test_assignors_balance_and_range_is_contiguous() -> None:
    subs = {"a": {"t"}, "b": {"t"}, "c": {"t"}}
    uniform = uniform_assign(subs, {"t": 7}, {"a": {"t": frozenset(range(7))}})
    assert sorted(len(a["t"]) for a in uniform.values()) == [2, 2, 3]
    assert uniform["a"]["t"] <= frozenset(range(7))  # a keeps what it had
    ranged = range_assign(subs, {"t": 7}, {})
    assert ranged["a"]["t"] == {0, 1, 2} and ranged["b"]["t"] == {3, 4}
