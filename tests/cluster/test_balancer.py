"""The balancer's plans (deltabus/cluster/balancer.py): what a scale-out, a scale-in, racks and
a hot broker get, and what holds for every assignment."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltabus import errors
from deltabus.cluster.balancer import (
    BYTES_IN,
    RACK,
    bounds,
    broker_loads,
    plan,
)
from deltabus.cluster.replica_placement import assign_replicas

pytestmark = pytest.mark.timeout(120)


def topic(name: str, brokers: list[int], partitions: int, rf: int,
          racks: dict[int, str] | None = None) -> dict[tuple[str, int], list[int]]:
    return {(name, p): rs for p, rs in enumerate(assign_replicas(brokers, partitions, rf, racks))}


def applied(assignment: dict, moves: dict) -> dict:
    return {**assignment, **moves}


def test_three_new_brokers_take_their_share_of_replicas_and_leaders() -> None:
    assignment = topic("t", [0, 1, 2], 60, 3)
    result = plan(assignment, {b: "" for b in range(6)})
    after = {load.broker_id: load for load in result.after}
    assert all(27 <= after[b].replicas <= 33 for b in range(6)), result.after
    assert all(9 <= after[b].leaders <= 11 for b in range(6)), result.after
    assert result.unmet == []
    # each new broker needs 27 replicas at least: no more than a fair share is copied
    assert 81 <= result.copies <= 90
    for replicas in result.moves.values():
        assert len(set(replicas)) == 3 and len(replicas) == 3


def test_leaving_brokers_hold_nothing_and_the_rest_stay_balanced() -> None:
    assignment = topic("t", list(range(6)), 60, 3)
    result = plan(assignment, {b: "" for b in range(3)})
    target = applied(assignment, result.moves)
    assert all(set(rs) <= {0, 1, 2} and len(set(rs)) == 3 for rs in target.values())
    staying = [load for load in result.after if load.broker_id < 3]
    assert [load.replicas for load in staying] == [60] * 3
    assert all(18 <= load.leaders <= 22 for load in staying), staying
    assert result.unmet == []


def test_a_balanced_cluster_gets_an_empty_plan() -> None:
    assignment = topic("t", list(range(4)), 40, 2)
    assert plan(assignment, {b: "" for b in range(4)}).moves == {}


def test_replicas_sharing_a_rack_move_to_a_rack_without_one() -> None:
    racks = {0: "a", 1: "a", 2: "b", 3: "b"}
    assignment = {("t", p): [0, 1] if p % 2 else [2, 3] for p in range(8)}
    result = plan(assignment, racks)
    target = applied(assignment, result.moves)
    assert all(len({racks[b] for b in rs}) == 2 for rs in target.values()), target
    assert RACK not in result.unmet


def test_a_move_for_balance_never_puts_two_replicas_on_one_rack() -> None:
    racks = {0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c"}
    assignment = topic("t", [0, 1, 2], 30, 3, racks)
    result = plan(assignment, racks)
    target = applied(assignment, result.moves)
    assert all(len({racks[b] for b in rs}) == 3 for rs in target.values())
    assert result.unmet == []


def test_hot_partitions_are_spread_by_swapping_with_cold_ones() -> None:
    assignment = topic("t", list(range(4)), 16, 1)
    hot = {tp: (1000.0 if rs[0] == 0 else 10.0) for tp, rs in assignment.items()}
    before = {load.broker_id: load for load in broker_loads(assignment, {b: "" for b in range(4)},
                                                            hot)}
    assert before[0].bytes_in_per_s == 4000.0
    result = plan(assignment, {b: "" for b in range(4)}, hot)
    after = {load.broker_id: load for load in result.after}
    mean = sum(hot.values()) / 4
    assert BYTES_IN not in result.unmet
    assert all(abs(after[b].bytes_in_per_s - mean) <= 0.1 * mean for b in range(4)), after
    # swaps keep each broker's replica and leader counts
    assert all(after[b].replicas == 4 and after[b].leaders == 4 for b in range(4))


def test_what_cannot_be_met_is_said() -> None:
    assignment = {("t", 0): [0], ("t", 1): [1]}
    result = plan(assignment, {0: "", 1: ""}, {("t", 0): 1000.0, ("t", 1): 1.0})
    assert result.unmet == [BYTES_IN] and result.moves == {}


def test_more_replicas_than_brokers_left_is_refused() -> None:
    with pytest.raises(errors.InvalidReplicationFactorError, match="t-0 has 3 replicas"):
        plan({("t", 0): [0, 1, 2]}, {0: "", 1: ""})


def test_the_plan_reads_as_kafkas_reassignment_json() -> None:
    result = plan({("t", 0): [0, 1]}, {1: "", 2: ""})
    # the leaving leader's place goes to the replica already in sync, the new copy follows
    assert result.reassignment_json() == {"version": 1, "partitions": [
        {"topic": "t", "partition": 0, "replicas": [1, 2], "log_dirs": ["any", "any"]}]}


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict, dict[int, str]]:
    before = draw(st.integers(1, 8))
    after = draw(st.integers(1, 8))
    rf = draw(st.integers(1, min(before, after)))
    partitions = draw(st.integers(1, 40))
    assignment = {("t", p): draw(st.permutations(range(before)))[:rf] for p in range(partitions)}
    racks = {b: draw(st.sampled_from(["", "a", "b"])) for b in range(after)}
    return assignment, racks


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_every_plan_keeps_replicas_distinct_on_staying_brokers(case: tuple) -> None:
    assignment, racks = case
    result = plan(assignment, racks)
    target = applied(assignment, result.moves)
    for tp, replicas in target.items():
        assert len(replicas) == len(assignment[tp])
        assert len(set(replicas)) == len(replicas)
        assert set(replicas) <= set(racks)
    if len(set(racks.values())) == 1:  # without racks in the way, the count always balances
        lo, hi = bounds(sum(len(rs) for rs in target.values()), len(racks))
        assert all(lo <= load.replicas <= hi for load in result.after if load.broker_id in racks)
        # and a second plan finds nothing more to copy
        assert plan(target, racks).copies == 0


def test_leadership_moves_along_a_chain_where_no_replica_is_shared() -> None:
    """Broker 2 leads two partitions and broker 0 none, but they share no partition: broker 2
    hands t-0 to broker 1, which hands t-1 to broker 0 (each broker between gives one and
    takes one). No replica is copied."""
    assignment = {("t", 0): [2, 1], ("t", 1): [1, 0], ("t", 2): [3, 0], ("t", 3): [2, 3]}
    result = plan(assignment, {b: "" for b in range(4)})
    assert result.copies == 0 and result.unmet == []
    assert [load.leaders for load in result.after] == [1, 1, 1, 1]


@pytest.mark.parametrize(("total", "brokers", "expected"), [
    (4, 2, (2, 2)), (15, 2, (7, 8)), (60, 2, (27, 33)), (36, 6, (6, 6)), (7, 3, (2, 3))])
def test_bounds_keep_to_the_whole_numbers_around_the_mean_at_small_counts(
        total: int, brokers: int, expected: tuple[int, int]) -> None:
    assert bounds(total, brokers) == expected
