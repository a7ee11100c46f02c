"""The autoscaler's policy (deltabus/cluster/autoscaler.py) against a synthetic load that rises
and falls: it adds and removes brokers within its bounds, never faster than its cool-down, and
a load near the target does not make it add and remove brokers in turn."""

from __future__ import annotations

import math
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from deltabus.cluster.autoscaler import AutoscalePolicy, Autoscaler

POLICY = AutoscalePolicy(min_brokers=2, max_brokers=6, target_bytes_in_per_s=1000.0,
                         window_s=60.0, cooldown_s=300.0)
STEP_S = 10.0


def run(load: list[float], brokers: int = 2, policy: AutoscalePolicy = POLICY
        ) -> list[tuple[float, int]]:
    """Feed one sample every STEP_S; a decision is carried out at once. Returns the scales
    as (time, broker count)."""
    autoscaler = Autoscaler(policy)
    scales = []
    for i, bytes_in in enumerate(load):
        now = i * STEP_S
        target = autoscaler.decide(now, brokers, bytes_in)
        if target is not None:
            brokers = target
            autoscaler.scaled(now)
            scales.append((now, brokers))
    return scales


def test_a_load_that_rises_and_falls_adds_then_removes_brokers() -> None:
    # 10 minutes quiet, an hour at 5,000 B/s (5 brokers' worth), then quiet again for an hour
    load = [500.0] * 60 + [5000.0] * 360 + [500.0] * 360
    scales = run(load)
    counts = [n for _, n in scales]
    assert counts[:3] == [3, 4, 5] and max(counts) == 5, scales  # 5,000 / 5 is the target
    assert counts[-1] == 2 and min(counts) == 2, scales
    times = [t for t, _ in scales]
    assert all(b - a >= POLICY.cooldown_s for a, b in pairwise(times)), scales
    # the first broker comes after the load held for a whole window
    assert times[0] == 600.0 + POLICY.window_s


def test_a_load_near_the_target_does_not_oscillate() -> None:
    # per broker between half the target and the target, whatever the count it settles on
    load = [2600.0 + 300 * math.sin(i / 7) for i in range(720)]
    scales = run(load, brokers=3)
    assert scales == []


def test_a_short_burst_changes_nothing() -> None:
    load = [500.0] * 30 + [50_000.0] * 5 + [500.0] * 30  # 50 s above: less than the window
    assert run(load) == []


def test_a_count_outside_the_bounds_is_brought_back_at_once() -> None:
    assert Autoscaler(POLICY).decide(0.0, 1, 0.0) == 2
    assert Autoscaler(POLICY).decide(0.0, 9, 1e9) == 6


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 20_000), min_size=1, max_size=400), st.integers(2, 6))
def test_every_decision_is_within_bounds_and_the_cooldown(load: list[float],
                                                           brokers: int) -> None:
    scales = run(load, brokers)
    assert all(POLICY.min_brokers <= n <= POLICY.max_brokers for _, n in scales)
    times = [t for t, _ in scales]
    assert all(b - a >= POLICY.cooldown_s for a, b in pairwise(times))
    counts = [brokers] + [n for _, n in scales]
    assert all(abs(b - a) == 1 for a, b in pairwise(counts))
