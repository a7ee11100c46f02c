"""The autoscaler's policy: how many brokers the load asks for, the way WarpStream scales its
agents. Pure: the driver's autoscaling loop (cluster.py) feeds it the bytes in per second the
leaders report and carries out what it decides with a scale.

A broker is added when the bytes in per broker stay above `broker.autoscale.target.bytes.in.per.s`
for `broker.autoscale.window.ms`, and one removed when they stay below half of it as long; the
half is the hysteresis that keeps a load near the target from adding and removing brokers in
turn. Invariants: a decision stays within [min, max]; after a scale, nothing is decided for
`broker.autoscale.cooldown.ms` (the moves of the last one settle first); a load must hold for a
whole window since the last scale before it counts.
"""

from __future__ import annotations

from dataclasses import dataclass

SCALE_IN_FRACTION = 0.5  # below half the target per broker: one broker fewer would do


@dataclass(frozen=True)
class AutoscalePolicy:
    """broker.autoscale.* (min and max brokers, the target bytes in per broker per second,
    how long a load must hold, and the quiet time after a scale)."""

    min_brokers: int
    max_brokers: int
    target_bytes_in_per_s: float
    window_s: float
    cooldown_s: float


class Autoscaler:
    """Decides, from one load sample at a time, when the broker count should change. Not
    thread-safe: one loop calls it."""

    def __init__(self, policy: AutoscalePolicy) -> None:
        self.policy = policy
        self._above_since: float | None = None
        self._below_since: float | None = None
        self._last_scale_s: float | None = None

    def scaled(self, now_s: float) -> None:
        """A scale ended at `now_s` (whoever asked for it): the cool-down starts, and the load
        is watched afresh."""
        self._last_scale_s = now_s
        self._above_since = self._below_since = None

    def decide(self, now_s: float, brokers: int, bytes_in_per_s: float) -> int | None:
        """The broker count to scale to now, or None to stay. `bytes_in_per_s`: the cluster's
        (the sum of its partitions' as their leaders report them)."""
        p = self.policy
        if brokers < p.min_brokers or brokers > p.max_brokers:
            return min(max(brokers, p.min_brokers), p.max_brokers)
        per_broker = bytes_in_per_s / brokers
        if per_broker > p.target_bytes_in_per_s:
            self._above_since = self._above_since if self._above_since is not None else now_s
            self._below_since = None
        elif per_broker < p.target_bytes_in_per_s * SCALE_IN_FRACTION:
            self._below_since = self._below_since if self._below_since is not None else now_s
            self._above_since = None
        else:
            self._above_since = self._below_since = None
        if self._last_scale_s is not None and now_s - self._last_scale_s < p.cooldown_s:
            return None
        if self._held(self._above_since, now_s) and brokers < p.max_brokers:
            return brokers + 1
        if self._held(self._below_since, now_s) and brokers > p.min_brokers:
            return brokers - 1
        return None

    def _held(self, since: float | None, now_s: float) -> bool:
        return since is not None and now_s - since >= self.policy.window_s
