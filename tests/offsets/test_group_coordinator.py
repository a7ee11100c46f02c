"""The group coordinator's state machine, driven directly with a controlled clock (no Spark, no
gRPC; a real __consumer_offsets Delta table under tmp_path)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deltabus import errors
from deltabus.config import GroupConfig
from deltabus.metadata import MetadataImage, PartitionState, TopicState
from deltabus.offsets.group_coordinator import (
    COMPLETING_REBALANCE,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    GroupCoordinator,
)
from deltabus.offsets.offset_store import OffsetAndMetadata, OffsetStore

SESSION_MS = 10_000
REBALANCE_MS = 30_000


def image() -> MetadataImage:
    """The cluster the coordinator commits offsets for: topic t, partitions 0 and 1."""
    partitions = tuple(PartitionState(p, 0, 0, (0,), (0,)) for p in range(2))
    return MetadataImage(1, "c", 0, (), {"t": TopicState("t", "t-id", partitions)})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def coordinator(tmp_path: Path, clock: Clock) -> Iterator[GroupCoordinator]:
    config = GroupConfig(group_min_session_timeout_ms=1000, group_initial_rebalance_delay_ms=0)
    c = GroupCoordinator(OffsetStore(str(tmp_path / "__consumer_offsets")), config, clock,
                         metadata=image)
    yield c
    c.close()


def join(c: GroupCoordinator, member_id: str = "", protocols=(("range", b"m"),),
         group: str = "g"):
    """JoinGroup as Kafka's clients do: a new member first gets its id (MEMBER_ID_REQUIRED),
    then joins with it."""
    def call(mid: str):
        return c.join_group(group, mid, "consumer", list(protocols),
                            session_timeout_ms=SESSION_MS, rebalance_timeout_ms=REBALANCE_MS,
                            client_id="client")
    if member_id:
        return call(member_id)
    with pytest.raises(errors.MemberIdRequiredError) as required:
        call("")
    return call(required.value.member_id)


def state(c: GroupCoordinator) -> str:
    return c.describe_group("g").state


def test_first_member_forms_a_generation_and_syncs_alone(coordinator):
    result = join(coordinator).result(1)
    assert result.generation_id == 1 and result.leader_id == result.member_id
    assert result.members == [(result.member_id, b"m")]
    assert state(coordinator) == COMPLETING_REBALANCE
    assignment = coordinator.sync_group("g", 1, result.member_id, {result.member_id: b"a"})
    assert assignment.result(1) == b"a" and state(coordinator) == STABLE


def test_a_second_member_rebalances_the_group_and_the_leader_assigns(coordinator, clock):
    first = join(coordinator).result(1)
    coordinator.sync_group("g", 1, first.member_id, {first.member_id: b"all"}).result(1)
    pending = join(coordinator)  # waits until the first member joins again
    assert not pending.done() and state(coordinator) == PREPARING_REBALANCE
    with pytest.raises(errors.RebalanceInProgressError):
        coordinator.heartbeat("g", 1, first.member_id)
    rejoined = join(coordinator, first.member_id).result(1)
    second = pending.result(1)
    assert rejoined.generation_id == second.generation_id == 2
    assert rejoined.leader_id == first.member_id and len(rejoined.members) == 2
    assert second.members == []  # only the leader gets the members
    follower_sync = coordinator.sync_group("g", 2, second.member_id, {})
    assert not follower_sync.done()  # waits for the leader's assignment
    coordinator.sync_group("g", 2, first.member_id,
                           {first.member_id: b"p0", second.member_id: b"p1"}).result(1)
    assert follower_sync.result(1) == b"p1"
    coordinator.heartbeat("g", 2, second.member_id)
    with pytest.raises(errors.IllegalGenerationError):
        coordinator.heartbeat("g", 1, second.member_id)


def test_silent_member_expires_after_its_session_and_the_group_rebalances(coordinator, clock):
    a = join(coordinator).result(1)
    coordinator.sync_group("g", 1, a.member_id, {}).result(1)
    b_join = join(coordinator)
    join(coordinator, a.member_id)
    b = b_join.result(1)
    coordinator.sync_group("g", 2, a.member_id, {}).result(1)
    clock.now += SESSION_MS / 1000 / 2
    coordinator.heartbeat("g", 2, a.member_id)
    clock.now += SESSION_MS / 1000 / 2 + 0.1  # b silent for the whole session
    coordinator.tick()
    assert [m.member_id for m in coordinator.describe_group("g").members] == [a.member_id]
    assert state(coordinator) == PREPARING_REBALANCE
    with pytest.raises(errors.UnknownMemberIdError):
        coordinator.heartbeat("g", 2, b.member_id)
    assert join(coordinator, a.member_id).result(1).generation_id == 3


def test_member_not_rejoining_by_the_rebalance_deadline_is_removed(coordinator, clock):
    a = join(coordinator).result(1)
    coordinator.sync_group("g", 1, a.member_id, {}).result(1)
    b_join = join(coordinator)  # a never joins again (its application stopped polling)
    for _ in range(int(REBALANCE_MS / 5000)):
        with pytest.raises(errors.RebalanceInProgressError):  # heartbeats alone do not do
            coordinator.heartbeat("g", 1, a.member_id)
        coordinator.tick()
        clock.now += 5.0
    clock.now += 0.1  # past the deadline
    coordinator.tick()
    b = b_join.result(1)
    assert b.generation_id == 2 and b.leader_id == b.member_id
    assert [m.member_id for m in coordinator.describe_group("g").members] == [b.member_id]


def test_leaving_moves_partitions_at_once_and_the_last_one_empties_the_group(coordinator):
    a = join(coordinator).result(1)
    coordinator.sync_group("g", 1, a.member_id, {}).result(1)
    coordinator.leave_group("g", [a.member_id])
    assert state(coordinator) == EMPTY
    with pytest.raises(errors.UnknownMemberIdError):
        coordinator.leave_group("g", [a.member_id])


def test_offset_commits_follow_generation_and_membership(coordinator):
    offsets = {("t", 0): OffsetAndMetadata(5)}
    coordinator.commit_offsets("g", -1, "", offsets).result(5)  # no members: a standalone commit
    assert coordinator.fetch_offsets("g")[("t", 0)].offset == 5
    a = join(coordinator).result(1)
    with pytest.raises(errors.RebalanceInProgressError):  # its assignment is not known yet
        coordinator.commit_offsets("g", 1, a.member_id, offsets)
    coordinator.sync_group("g", 1, a.member_id, {}).result(1)
    coordinator.commit_offsets("g", 1, a.member_id, {("t", 0): OffsetAndMetadata(7, 3, "x")}
                               ).result(5)
    committed = coordinator.fetch_offsets("g", [("t", 0), ("t", 1)])
    assert list(committed) == [("t", 0)]
    assert (committed[("t", 0)].offset, committed[("t", 0)].leader_epoch,
            committed[("t", 0)].metadata) == (7, 3, "x")
    with pytest.raises(errors.IllegalGenerationError):
        coordinator.commit_offsets("g", 0, a.member_id, offsets)
    with pytest.raises(errors.UnknownMemberIdError):  # an outsider while members are active
        coordinator.commit_offsets("g", -1, "", offsets)
    with pytest.raises(errors.OffsetMetadataTooLargeError):
        coordinator.commit_offsets("g", 1, a.member_id,
                                   {("t", 0): OffsetAndMetadata(8, -1, "x" * 5000)})
    assert coordinator.fetch_offsets("g")[("t", 0)].offset == 7


def test_groups_are_listed_described_and_deleted_only_when_empty(coordinator):
    coordinator.commit_offsets("idle", -1, "", {("t", 0): OffsetAndMetadata(1)}).result(5)
    a = join(coordinator).result(1)
    coordinator.sync_group("g", 1, a.member_id, {a.member_id: b"x"}).result(1)
    assert coordinator.list_groups() == [("g", "consumer", STABLE), ("idle", "consumer", EMPTY)]
    d = coordinator.describe_group("g")
    assert (d.protocol, d.generation_id, d.leader_id) == ("range", 1, a.member_id)
    assert d.members[0].assignment == b"x" and d.members[0].client_id == "client"
    assert coordinator.describe_group("nope").state == "Dead"
    results = coordinator.delete_groups(["g", "idle", "nope"])
    assert isinstance(results["g"], errors.NonEmptyGroupError)
    assert results["idle"] is None
    assert isinstance(results["nope"], errors.GroupIdNotFoundError)
    assert coordinator.fetch_offsets("idle") == {}


def test_protocols_must_agree_and_the_vote_picks_the_common_favourite(coordinator):
    a_protocols = [("cooperative-sticky", b"a"), ("range", b"a")]
    a = join(coordinator, protocols=a_protocols).result(1)
    assert a.protocol_name == "cooperative-sticky"
    with pytest.raises(errors.InconsistentGroupProtocolError):
        join(coordinator, protocols=[("roundrobin", b"b")])
    b = join(coordinator, protocols=[("range", b"b"), ("cooperative-sticky", b"b")])
    c = join(coordinator, protocols=[("range", b"c")])
    a2 = join(coordinator, a.member_id, protocols=a_protocols)
    results = [f.result(1) for f in (a2, b, c)]
    assert {r.protocol_name for r in results} == {"range"}  # the only one all support


def test_bad_requests_get_kafka_errors(coordinator):
    with pytest.raises(errors.InvalidGroupIdError):
        coordinator.join_group("", "", "consumer", [("range", b"")],
                               session_timeout_ms=SESSION_MS, rebalance_timeout_ms=REBALANCE_MS)
    with pytest.raises(errors.InvalidSessionTimeoutError):
        coordinator.join_group("g", "", "consumer", [("range", b"")],
                               session_timeout_ms=10, rebalance_timeout_ms=REBALANCE_MS)
    with pytest.raises(errors.UnknownMemberIdError):  # an id the coordinator never handed out
        join(coordinator, "nobody")


def test_offsets_of_a_long_empty_group_expire(tmp_path: Path, clock: Clock):
    config = GroupConfig(group_min_session_timeout_ms=1000, group_initial_rebalance_delay_ms=0,
                         offsets_retention_minutes=0)
    c = GroupCoordinator(OffsetStore(str(tmp_path / "o")), config, clock, metadata=image)
    try:
        c.commit_offsets("old", -1, "", {("t", 0): OffsetAndMetadata(1)}).result(5)
        a = join(c, group="busy").result(1)
        c.sync_group("busy", 1, a.member_id, {}).result(1)
        c.commit_offsets("busy", 1, a.member_id, {("t", 0): OffsetAndMetadata(1)}).result(5)
        assert c.expire_offsets() == ["old"]  # an active group's offsets never expire
        assert c.fetch_offsets("old") == {} and c.fetch_offsets("busy")
    finally:
        c.close()


def test_a_member_that_leaves_while_waiting_to_join_goes_at_once(coordinator):
    """A consumer closed during a rebalance knows its member id (MEMBER_ID_REQUIRED came
    first), so its LeaveGroup takes it out at once rather than after the rebalance timeout."""
    a = join(coordinator).result(1)
    coordinator.sync_group("g", 1, a.member_id, {}).result(1)
    waiting = join(coordinator)
    b = next(m.member_id for m in coordinator.describe_group("g").members
             if m.member_id != a.member_id)
    coordinator.leave_group("g", [b])
    with pytest.raises(errors.UnknownMemberIdError):
        waiting.result(1)
    result = join(coordinator, a.member_id).result(1)
    assert result.members == [(a.member_id, b"m")]  # generation 2 is a alone


def test_offset_metadata_up_to_the_configured_limit_is_stored(tmp_path: Path, clock: Clock):
    """offset.metadata.max.bytes is enforced once, from the config: a cluster configured for
    longer metadata stores it (the store once refused anything above a hard-coded 4096)."""
    config = GroupConfig(group_min_session_timeout_ms=1000, group_initial_rebalance_delay_ms=0,
                         offset_metadata_max_bytes=10_000)
    store = OffsetStore(str(tmp_path / "o"), metadata_max_bytes=config.offset_metadata_max_bytes)
    c = GroupCoordinator(store, config, clock, metadata=image)
    try:
        c.commit_offsets("g", -1, "", {("t", 0): OffsetAndMetadata(3, -1, "é" * 4000)}).result(5)
        assert c.fetch_offsets("g")[("t", 0)].metadata == "é" * 4000  # 8,000 bytes
        with pytest.raises(errors.OffsetMetadataTooLargeError):
            c.commit_offsets("g", -1, "", {("t", 0): OffsetAndMetadata(4, -1, "é" * 5001)})
        assert c.fetch_offsets("g")[("t", 0)].offset == 3
    finally:
        c.close()


# ---- limits: what a hostile or broken client cannot make the coordinator keep or wait for ------

@pytest.fixture
def limited(tmp_path: Path, clock: Clock) -> Iterator[GroupCoordinator]:
    """A coordinator with small limits: 2 members a group, 3 groups, 4 pending member ids,
    rebalances of at most 60 s."""
    config = GroupConfig(group_min_session_timeout_ms=1000, group_initial_rebalance_delay_ms=0,
                         group_max_size=2, group_max_groups=3, group_max_pending_members=4,
                         group_max_rebalance_timeout_ms=60_000)
    c = GroupCoordinator(OffsetStore(str(tmp_path / "o")), config, clock, metadata=image)
    yield c
    c.close()


def ask_id(c: GroupCoordinator, group: str = "g") -> str:
    """A first JoinGroup: the member id the coordinator hands out (and keeps, pending)."""
    with pytest.raises(errors.MemberIdRequiredError) as required:
        c.join_group(group, "", "consumer", [("range", b"")], session_timeout_ms=SESSION_MS,
                     rebalance_timeout_ms=REBALANCE_MS)
    return str(required.value.member_id)  # type: ignore[attr-defined]


def test_member_ids_handed_out_count_toward_group_max_size(limited, clock):
    join(limited).result(1)
    ask_id(limited)  # the second member of two, pending
    with pytest.raises(errors.GroupMaxSizeReachedError) as full:
        ask_id(limited)
    assert "group.max.size" in str(full.value) and "2" in str(full.value)
    clock.now += SESSION_MS / 1000 + 0.1  # the pending id expires unused
    limited.tick()
    ask_id(limited)


def test_the_coordinator_keeps_at_most_group_max_groups(limited, clock):
    ask_id(limited, "g1")
    limited.commit_offsets("g2", -1, "", {("t", 0): OffsetAndMetadata(1)}).result(5)
    join(limited, group="g3").result(1)
    for refused in (lambda: ask_id(limited, "g4"),
                    lambda: limited.commit_offsets("g4", -1, "",
                                                   {("t", 0): OffsetAndMetadata(1)})):
        with pytest.raises(errors.GroupMaxSizeReachedError) as full:
            refused()
        assert "group.max.groups" in str(full.value) and "3" in str(full.value)
    limited.commit_offsets("g2", -1, "", {("t", 1): OffsetAndMetadata(2)}).result(5)  # known
    clock.now += SESSION_MS / 1000 + 0.1  # g1's pending id expires: g1 is gone
    limited.tick()
    assert limited.describe_group("g1").state == "Dead"
    ask_id(limited, "g4")


def test_member_ids_handed_out_are_limited_across_groups(limited):
    for group in ("a", "b"):
        ask_id(limited, group)
        ask_id(limited, group)
    with pytest.raises(errors.GroupMaxSizeReachedError) as full:
        ask_id(limited, "c")
    assert "group.max.pending.members" in str(full.value) and "4" in str(full.value)


def test_a_rebalance_waits_no_longer_than_group_max_rebalance_timeout(limited, clock):
    """A member asking for a 30-minute rebalance timeout gets the limit: a member that never
    joins again holds the join phase (and a server thread per waiting member) 60 s at most."""
    a = join(limited).result(1)
    limited.sync_group("g", 1, a.member_id, {}).result(1)
    b_id = ask_id(limited)
    b_join = limited.join_group("g", b_id, "consumer", [("range", b"")],
                                session_timeout_ms=SESSION_MS,
                                rebalance_timeout_ms=1_800_000)
    for _ in range(11):  # a keeps heartbeating but never joins again
        clock.now += 5.0
        with pytest.raises(errors.RebalanceInProgressError):
            limited.heartbeat("g", 1, a.member_id)
        limited.tick()
    assert not b_join.done()  # 55 s
    clock.now += 5.1
    limited.tick()
    assert b_join.done() and b_join.result().members == [(b_id, b"")]
    assert limited.rebalance_timeout_s("g") == 60.0


# ---- static membership (KIP-345): a consumer restarted with the same group.instance.id takes
# its old place and assignment without a rebalance; an older process with that instance id is
# fenced; an admin removes a static member by its instance id.

def static_join(c: GroupCoordinator, instance: str, member_id: str = "",
                protocols=(("range", b"m"),)):
    return c.join_group("g", member_id, "consumer", list(protocols),
                        session_timeout_ms=SESSION_MS, rebalance_timeout_ms=REBALANCE_MS,
                        client_id="client", group_instance_id=instance)


def stable_pair(c: GroupCoordinator) -> tuple[str, str]:
    """Static members a (the leader) and b, stable in generation 2 with assignments A and B."""
    a = static_join(c, "a").result(1)
    c.sync_group("g", 1, a.member_id, {a.member_id: b"A"}).result(1)
    joined_b = static_join(c, "b")  # needs no MEMBER_ID_REQUIRED round
    joined_a = static_join(c, "a", a.member_id)
    a2, b = joined_a.result(1), joined_b.result(1)
    assert a2.generation_id == b.generation_id == 2 and a2.leader_id == a.member_id
    assert a2.instance_ids == {a.member_id: "a", b.member_id: "b"}
    c.sync_group("g", 2, b.member_id, {}, "b")
    c.sync_group("g", 2, a.member_id, {a.member_id: b"A", b.member_id: b"B"}, "a").result(1)
    assert state(c) == STABLE
    return a.member_id, b.member_id


def test_a_restarted_static_member_gets_its_assignment_back_without_a_rebalance(coordinator):
    a, b = stable_pair(coordinator)
    again = static_join(coordinator, "b").result(1)  # b restarted: no member id
    assert again.member_id != b and again.generation_id == 2
    assert again.leader_id == a and again.members == []
    assert state(coordinator) == STABLE
    assert coordinator.sync_group("g", 2, again.member_id, {}, "b").result(1) == b"B"
    coordinator.heartbeat("g", 2, a, "a")  # the other member goes on in the same generation
    members = {m.group_instance_id: m.member_id for m in coordinator.describe_group("g").members}
    assert members == {"a": a, "b": again.member_id}


def test_a_restarted_static_leader_is_not_told_to_assign_again(coordinator):
    a, _ = stable_pair(coordinator)
    again = static_join(coordinator, "a").result(1)
    assert again.leader_id == a != again.member_id and again.members == []
    assert coordinator.sync_group("g", 2, again.member_id, {}, "a").result(1) == b"A"
    assert coordinator.describe_group("g").leader_id == again.member_id


def test_the_replaced_process_is_fenced(coordinator):
    _, b = stable_pair(coordinator)
    static_join(coordinator, "b").result(1)
    with pytest.raises(errors.FencedInstanceIdError):
        coordinator.heartbeat("g", 2, b, "b")
    with pytest.raises(errors.FencedInstanceIdError):
        coordinator.sync_group("g", 2, b, {}, "b")
    with pytest.raises(errors.FencedInstanceIdError):
        static_join(coordinator, "b", b)


def test_a_restarted_static_member_with_a_protocol_nobody_shares_is_refused(coordinator):
    a, b = stable_pair(coordinator)
    with pytest.raises(errors.InconsistentGroupProtocolError):
        static_join(coordinator, "b", protocols=(("roundrobin", b"m"),))
    assert state(coordinator) == STABLE  # b keeps its place; nothing changed
    coordinator.heartbeat("g", 2, b, "b")


def test_a_static_member_silent_past_its_session_leaves_the_group(coordinator, clock):
    a, b = stable_pair(coordinator)
    clock.now += SESSION_MS / 1000 - 1
    coordinator.heartbeat("g", 2, a, "a")
    clock.now += 2
    coordinator.tick()  # b missed its session: gone, and the group rebalances
    assert state(coordinator) == PREPARING_REBALANCE
    assert [m.member_id for m in coordinator.describe_group("g").members] == [a]
    fresh = static_join(coordinator, "b")  # b comes back as a new member
    a3 = static_join(coordinator, "a", a).result(1)
    assert fresh.result(1).member_id != b and a3.generation_id == 3


def test_an_admin_removes_a_static_member_by_its_instance_id(coordinator):
    a, b = stable_pair(coordinator)
    answers = coordinator.leave_members("g", [("", "b"), ("", "nobody"), ("x", "a")])
    assert answers[("", "b")] is None
    assert isinstance(answers[("", "nobody")], errors.UnknownMemberIdError)
    assert isinstance(answers[("x", "a")], errors.FencedInstanceIdError)
    assert [m.member_id for m in coordinator.describe_group("g").members] == [a]
    assert state(coordinator) == PREPARING_REBALANCE
