"""Partition assignors: Kafka's documented examples, the seeds' three cases, and properties that
must hold for any subscriptions (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltabus import errors
from deltabus.client.assignors import ASSIGNORS, assignor
from deltabus.client.consumer_protocol import Subscription

RANGE, ROUND_ROBIN, STICKY = (ASSIGNORS[n] for n in ("range", "roundrobin",
                                                     "cooperative-sticky"))


def subs(**topics: list[str]) -> dict[str, Subscription]:
    return {m: Subscription(t) for m, t in topics.items()}


def test_range_matches_kafkas_example():
    plan = RANGE.assign({"t0": 3, "t1": 3}, subs(C0=["t0", "t1"], C1=["t0", "t1"]))
    assert plan == {"C0": [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)],
                    "C1": [("t0", 2), ("t1", 2)]}


def test_roundrobin_matches_kafkas_examples():
    plan = ROUND_ROBIN.assign({"t0": 3, "t1": 3}, subs(C0=["t0", "t1"], C1=["t0", "t1"]))
    assert plan == {"C0": [("t0", 0), ("t0", 2), ("t1", 1)],
                    "C1": [("t0", 1), ("t1", 0), ("t1", 2)]}
    plan = ROUND_ROBIN.assign({"t0": 1, "t1": 2, "t2": 3},
                              subs(C0=["t0"], C1=["t0", "t1"], C2=["t0", "t1", "t2"]))
    assert plan == {"C0": [("t0", 0)], "C1": [("t1", 0)],
                    "C2": [("t1", 1), ("t2", 0), ("t2", 1), ("t2", 2)]}


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@pytest.mark.parametrize("members,counts", [(3, [1, 1, 1]), (4, [0, 1, 1, 1]), (2, [1, 2])])
def test_the_seeds_three_cases(name, members, counts):
    plan = ASSIGNORS[name].assign({"t": 3}, {f"m{i}": Subscription(["t"])
                                            for i in range(members)})
    assert sorted(len(tps) for tps in plan.values()) == counts


def test_sticky_keeps_owners_and_a_newcomer_waits_for_the_revocation():
    owned = {"a": [("t", [0, 1])], "b": [("t", [2, 3])]}
    before = {m: Subscription(["t"], owned_partitions=o, generation_id=1)
              for m, o in owned.items()}
    assert STICKY.assign({"t": 4}, before) == {"a": [("t", 0), ("t", 1)],
                                               "b": [("t", 2), ("t", 3)]}
    with_c = {**before, "c": Subscription(["t"])}
    plan = STICKY.assign({"t": 4}, with_c)
    # One partition must move to c: this round it is only taken away (cooperative).
    assert sum(len(v) for v in plan.values()) == 3 and plan["c"] == []
    moved = ({("t", 0), ("t", 1), ("t", 2), ("t", 3)} - {tp for v in plan.values() for tp in v})
    assert len(moved) == 1


def test_unknown_assignor_names_the_choices():
    with pytest.raises(errors.InvalidConfigError, match="cooperative-sticky"):
        assignor("sticky-ish")
    assert assignor("org.apache.kafka.clients.consumer.RangeAssignor").name == "range"


@st.composite
def groups(draw):
    topics = {f"t{i}": draw(st.integers(0, 6)) for i in range(draw(st.integers(1, 3)))}
    members = draw(st.integers(1, 5))
    subscriptions = {}
    for m in range(members):
        chosen = draw(st.lists(st.sampled_from(sorted(topics)), min_size=1, unique=True))
        owned = [(t, sorted(draw(st.sets(st.integers(0, 7), max_size=3)))) for t in chosen]
        subscriptions[f"m{m}"] = Subscription(chosen, owned_partitions=owned,
                                              generation_id=draw(st.integers(-1, 3)))
    return topics, subscriptions


@settings(max_examples=200, deadline=None)
@given(groups(), st.sampled_from(sorted(ASSIGNORS)))
def test_every_assignor_gives_each_partition_to_at_most_one_subscribed_member(group, name):
    topics, subscriptions = group
    plan = ASSIGNORS[name].assign(topics, subscriptions)
    assert set(plan) == set(subscriptions)
    given_out = [tp for tps in plan.values() for tp in tps]
    assert len(given_out) == len(set(given_out))
    for member, tps in plan.items():
        assert all(t in subscriptions[member].topics and 0 <= p < topics[t] for t, p in tps)
    subscribed = {(t, p) for t, n in topics.items() for p in range(n)
                  if any(t in s.topics for s in subscriptions.values())}
    if name != "cooperative-sticky":  # eager assignors hand out everything at once
        assert set(given_out) == subscribed


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(1, 6))
def test_identical_subscriptions_are_balanced_within_one(partitions, members):
    for name in ("range", "roundrobin", "cooperative-sticky"):
        plan = ASSIGNORS[name].assign({"t": partitions},
                                      {f"m{i}": Subscription(["t"]) for i in range(members)})
        sizes = [len(v) for v in plan.values()]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == partitions
