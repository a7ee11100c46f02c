"""Consumers in a group (subscribe) against the FakeCluster, whose brokers serve the real group
coordinator over an in-memory offset store: joining, splitting partitions, rebalance listeners,
auto-commit, commits from a member the group left behind. Members in one process and one
thread: JoinGroup is a long poll the next poll() picks up, so alternating polls drives the
protocol. Members in separate processes are in tests/offsets/test_consumer_groups.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from deltabus import CommitFailedError, Consumer, ConsumerRebalanceListener, TopicPartition
from deltabus.records import ConsumerRecord
from tests.client.fake_cluster import FakeCluster

TOPIC = "clicks"
ALL = {TopicPartition(TOPIC, p) for p in range(4)}


@pytest.fixture
def members(fake: FakeCluster) -> Iterator[list[Consumer]]:
    made: list[Consumer] = []
    yield made
    for consumer in made:
        consumer.close()


def member(members: list[Consumer], fake: FakeCluster, group: str = "g",
           **settings: Any) -> Consumer:
    """A member with short timers: sessions of 1 s, heartbeats every 50 ms."""
    options: dict[str, Any] = {"group_id": group, "auto_offset_reset": "earliest",
                                  "session_timeout_ms": 1000, "heartbeat_interval_ms": 50,
                                  "retry_backoff_ms": 10, **settings}
    consumer = Consumer(fake.bootstrap_servers, **options)
    members.append(consumer)
    return consumer


def poll_all_until(consumers: list[Consumer], condition: Callable[[], bool], what: str,
                   timeout_s: float = 10) -> None:
    """Poll every consumer in turn until `condition` holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        for consumer in consumers:
            consumer.poll(50)


def poll_records(consumers: list[Consumer], count: int,
                 timeout_s: float = 10) -> list[list[ConsumerRecord]]:
    """Poll every consumer in turn until together they got `count` records; each one's."""
    got: list[list[ConsumerRecord]] = [[] for _ in consumers]
    deadline = time.monotonic() + timeout_s
    while sum(len(records) for records in got) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {count} records")
        for records, consumer in zip(got, consumers, strict=True):
            records += consumer.poll(50)
    return got


def write_everywhere(fake: FakeCluster, per_partition: int) -> None:
    for p in range(4):
        fake.write(TOPIC, p, [f"{p}-{i}".encode() for i in range(per_partition)])


class Recorder(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.events.append(("revoked", set(revoked)))

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.events.append(("assigned", set(assigned)))


def test_a_lone_member_gets_every_partition_and_the_next_one_resumes_after_it(
        fake, members) -> None:
    fake.create_topic(TOPIC, 4)
    write_everywhere(fake, 5)
    first = member(members, fake)
    listener = Recorder()
    first.subscribe([TOPIC], listener=listener)
    assert first.subscription() == {TOPIC}
    [got] = poll_records([first], 20)
    assert len(got) == 20 and first.assignment() == ALL
    assert listener.events == [("assigned", ALL)]
    first.close()  # commits what poll returned, leaves at once
    write_everywhere(fake, 2)  # offsets 5 and 6 of each partition
    second = member(members, fake)
    second.subscribe([TOPIC])
    [more] = poll_records([second], 8)
    assert sorted((r.partition, r.offset) for r in more) == [
        (p, o) for p in range(4) for o in (5, 6)]


def test_two_members_split_the_partitions_and_each_reads_only_its_own(fake, members) -> None:
    fake.create_topic(TOPIC, 4)
    a, b = member(members, fake), member(members, fake)
    listener_a = Recorder()
    a.subscribe([TOPIC], listener=listener_a)
    poll_all_until([a], lambda: a.assignment() == ALL, "the first member's assignment")
    b.subscribe([TOPIC])
    poll_all_until([a, b], lambda: bool(a.assignment()) and bool(b.assignment()),
                   "a rebalance that gives both members partitions")
    assert a.assignment() | b.assignment() == ALL
    assert not a.assignment() & b.assignment()
    assert listener_a.events[:2] == [("assigned", ALL), ("revoked", ALL)]  # eager: all go
    assert listener_a.events[-1] == ("assigned", a.assignment())
    write_everywhere(fake, 5)
    got_a, got_b = poll_records([a, b], 20)
    assert {TopicPartition(r.topic, r.partition) for r in got_a} == a.assignment()
    assert {TopicPartition(r.topic, r.partition) for r in got_b} == b.assignment()
    assert sorted((r.partition, r.offset) for r in got_a + got_b) == [
        (p, o) for p in range(4) for o in range(5)]


def test_cooperative_sticky_moves_only_what_must_move(fake, members) -> None:
    fake.create_topic(TOPIC, 4)
    a, b = (member(members, fake, partition_assignment_strategy=["cooperative-sticky"])
            for _ in range(2))
    listener_a = Recorder()
    a.subscribe([TOPIC], listener=listener_a)
    poll_all_until([a], lambda: a.assignment() == ALL, "the first member's assignment")
    b.subscribe([TOPIC])
    poll_all_until([a, b], lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2,
                   "two partitions each")
    revoked = [tps for event, tps in listener_a.events if event == "revoked"]
    assert revoked == [ALL - a.assignment()]  # only what went to the new member
    assert a.assignment() | b.assignment() == ALL


def test_pattern_subscription_covers_matching_topics_but_not_internal_ones(fake,
                                                                           members) -> None:
    for name in ("logs.web", "logs.db", "metrics", "__logs.internal"):
        fake.create_topic(name, 1)
    consumer = member(members, fake)
    consumer.subscribe(pattern=r"(__)?logs\..*")
    wanted = {TopicPartition("logs.web", 0), TopicPartition("logs.db", 0)}
    poll_all_until([consumer], lambda: consumer.assignment() == wanted, "the matching topics")
    assert consumer.subscription() == {"logs.web", "logs.db"}


def test_auto_commit_commits_what_poll_returned_at_the_next_poll(fake, members) -> None:
    fake.create_topic(TOPIC, 4)
    write_everywhere(fake, 3)
    consumer = member(members, fake, auto_commit_interval_ms=0)
    consumer.subscribe([TOPIC])
    poll_records([consumer], 12)
    consumer.poll(0)  # auto-commit runs at the start of a poll
    committed = consumer.committed(sorted(ALL))
    assert {tp: om.offset for tp, om in committed.items()} == {tp: 3 for tp in ALL}


def test_a_member_the_group_moved_on_from_cannot_commit_then_rejoins(fake, members) -> None:
    fake.create_topic(TOPIC, 4)
    # Stops polling for longer than max_poll_interval_ms: its partitions go to the other member.
    stale = member(members, fake, max_poll_interval_ms=500, enable_auto_commit=False)
    stale.subscribe([TOPIC])
    poll_all_until([stale], lambda: stale.assignment() == ALL, "the first member's assignment")
    other = member(members, fake)
    other.subscribe([TOPIC])
    poll_all_until([other], lambda: other.assignment() == ALL, "the group to move on")
    with pytest.raises(CommitFailedError, match="rebalanced"):
        stale.commit({TopicPartition(TOPIC, 0): 1})
    poll_all_until([stale, other], lambda: bool(stale.assignment()) and bool(
        other.assignment()), "the stale member to rejoin")
    assert stale.assignment() | other.assignment() == ALL
