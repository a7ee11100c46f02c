"""Brokers joining and leaving a running cluster (`Cluster.scale`, `deltabus cluster scale`).
Runs in the driver, beside the controller.

Scaling out starts new broker tasks (Spark finds them executors), waits until they register,
and then, with auto.balance.enable, balances: replicas and leaders move onto the new brokers.
Scaling in drains first: the balancer moves every replica off the leaving brokers (the highest
ids), and only once none holds a replica are they stopped by controlled shutdown, so no
partition is ever left with fewer replicas than its replication factor; their task slots go
back to Spark.

Invariants: one scale at a time; a broker leaves the cluster's members only after it is
stopped, and joins them before its task starts (the controller refuses registrations of
others); a scale-in that cannot place every replica on the brokers that stay (a topic's
replication factor above the new count) is refused before anything moves.

Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.autoscaler import AutoscalePolicy, Autoscaler
from deltabus.cluster.controller import Controller
from deltabus.metadata import ScaleStatus

log = logging.getLogger(__name__)

IDLE, SCALING, DONE, FAILED = "idle", "scaling", "done", "failed"
POLL_S = 0.2
AUTOSCALE_TICK_S = 5.0  # the autoscaler's samples (a quarter of its window, if shorter)
DRAIN_ROUNDS_MAX = 10  # balance rounds of a scale-in (topics created meanwhile need another)


class Scaler:
    """Carries out scales, one at a time, each on a thread of its own. Thread-safe."""

    def __init__(self, controller: Controller, config: cfg.ClusterConfig, *,
                 add_broker: Callable[[int], None], remove_broker: Callable[[int], None],
                 task_slots: Callable[[], int | None], stopping: threading.Event) -> None:
        """`add_broker(id)`: start a broker task (and its supervisor) for a new member;
        `remove_broker(id)`: stop it by controlled shutdown and keep it down; `task_slots()`:
        how many tasks Spark runs at once where that is fixed (local mode), else None."""
        self._controller = controller
        self._config = config
        self._add_broker = add_broker
        self._remove_broker = remove_broker
        self._task_slots = task_slots
        self._stopping = stopping
        self._lock = threading.Lock()
        self._status = ScaleStatus(IDLE, len(controller.members()), "")
        self._error: Exception | None = None  # why the last scale failed
        self._done = threading.Event()
        self._done.set()

    def status(self) -> ScaleStatus:
        """The last scale's status, with the cluster's brokers now."""
        with self._lock:
            status = self._status
        return ScaleStatus(status.state, status.brokers, status.step,
                           tuple(self._controller.members()))

    def _set(self, state: str, step: str) -> None:
        with self._lock:
            self._status = ScaleStatus(state, self._status.brokers, step)
        if state == FAILED:
            log.error("scaling to %d brokers failed: %s", self._status.brokers, step)
        else:
            log.info("scaling to %d brokers: %s", self._status.brokers, step)

    def start(self, brokers: int) -> ScaleStatus:
        """Check a scale to `brokers` and start it; it goes on on a thread of its own
        (`status`, `wait`). Raises, moving nothing, where it cannot be done."""
        members = self._controller.members()
        self._check(brokers, members)
        with self._lock:
            if not self._done.is_set():
                raise errors.ReassignmentInProgressError(
                    f"a scale to {self._status.brokers} brokers is in progress")
            self._done.clear()
            self._status = ScaleStatus(SCALING, brokers, "starting")
            self._error = None
        threading.Thread(target=self._run, args=(brokers, members), daemon=True,
                         name=f"deltabus-scale-to-{brokers}").start()
        return self.status()

    def scale(self, brokers: int) -> ScaleStatus:
        """A scale to `brokers`, start to end; raises the reason of one that fails."""
        self.start(brokers)
        status = self.wait()
        if status.state == FAILED and self._error is not None:
            raise self._error
        return status

    def wait(self, timeout_s: float | None = None) -> ScaleStatus:
        self._done.wait(timeout_s)
        return self.status()

    def _check(self, brokers: int, members: list[int]) -> None:
        if not 1 <= brokers <= cfg.BROKERS_MAX:
            raise errors.InvalidRequestError(
                f"a cluster runs 1 to {cfg.BROKERS_MAX} brokers, not {brokers}")
        slots = self._task_slots()
        if brokers > len(members) and slots is not None and slots <= brokers:
            raise errors.InvalidRequestError(
                f"Spark offers {slots} task slots but {brokers} brokers each hold one for "
                f"life and other jobs need one more: start Spark with local[{brokers + 2}] "
                "or more")
        if brokers < len(members):
            widest = max(((t.replication_factor, name) for name, t in
                          self._controller.image().topics.items()), default=None)
            if widest is not None and widest[0] > brokers:
                raise errors.InvalidReplicationFactorError(
                    f"topic {widest[1]} has replication factor {widest[0]}: at least "
                    f"{widest[0]} brokers must stay")

    def _run(self, brokers: int, members: list[int]) -> None:
        try:
            if brokers > len(members):
                self._scale_out(brokers, members)
            elif brokers < len(members):
                self._scale_in(members[:brokers], members[brokers:])
            self._set(DONE, f"{brokers} brokers: {sorted(self._controller.members())}")
        except Exception as e:  # the reason goes to whoever asks for the status
            self._error = e
            self._set(FAILED, str(e) or type(e).__name__)
        finally:
            self._done.set()

    def _scale_out(self, brokers: int, members: list[int]) -> None:
        new = [b for b in range(cfg.BROKERS_MAX) if b not in members][:brokers - len(members)]
        self._controller.set_members(members + new)
        for broker_id in new:
            self._add_broker(broker_id)
        self._set(SCALING, f"starting brokers {new}")
        deadline = time.monotonic() + self._config.startup_timeout_ms / 1000
        up: list[int] = []
        while len(up) < len(new):
            if self._stopping.wait(POLL_S):
                raise errors.BrokerNotAvailableError("the cluster is stopping")
            now_up = [b for b in new if b in self._controller.live_brokers()]
            if now_up != up:
                up = now_up
                self._set(SCALING, f"{len(up)} of {len(new)} new brokers up")
                deadline = time.monotonic() + self._config.startup_timeout_ms / 1000
            if time.monotonic() > deadline:
                for broker_id in new:
                    self._remove_broker(broker_id)
                self._controller.set_members(members)
                raise errors.BrokerNotAvailableError(
                    f"only {len(up)} of {len(new)} new brokers started in "
                    f"{self._config.startup_timeout_ms / 1000:.0f} s: is Spark short of task "
                    "slots or executors? They were stopped again")
        if self._config.auto_balance_enable:
            self._balance(leaving=[])

    def _scale_in(self, staying: list[int], leaving: list[int]) -> None:
        for _ in range(DRAIN_ROUNDS_MAX):
            holding = self._controller.replicas_on(leaving)
            if not holding:
                break
            self._set(SCALING, f"moving {len(holding)} partitions off brokers {leaving}")
            self._balance(leaving)
        else:
            raise errors.ReassignmentInProgressError(
                f"brokers {leaving} still hold replicas of "
                f"{len(self._controller.replicas_on(leaving))} partitions after "
                f"{DRAIN_ROUNDS_MAX} balances")
        for broker_id in leaving:
            self._set(SCALING, f"stopping broker {broker_id} (controlled shutdown)")
            self._remove_broker(broker_id)
        self._controller.set_members(staying)
        if self._config.auto_balance_enable:  # leaders spread over those that stay
            self._balance(leaving=[])

    def _balance(self, leaving: list[int]) -> None:
        """One balance, carried out: returns once every partition it moves has moved."""
        plan = self._controller.balance(execute=True, leaving=leaving)
        moving = set(plan.moves)
        last = -1
        while moving:
            if self._stopping.wait(POLL_S):
                raise errors.BrokerNotAvailableError("the cluster is stopping")
            moving &= set(self._controller.reassignments_in_progress())
            if len(moving) != last:
                last = len(moving)
                self._set(SCALING, f"balancing: {len(plan.moves) - last} of "
                                   f"{len(plan.moves)} partition moves done")


def autoscale(config: cfg.ClusterConfig, controller: Controller, scaler: Scaler,
              stopping: threading.Event) -> None:
    """broker.autoscale.*, until `stopping`: now and then, scale to what the load asks for
    (autoscaler.py). A scale anyone started starts the cool-down when it ends; a refused scale
    (too few task slots) too; a round that fails is logged and the next one runs."""
    autoscaler = Autoscaler(AutoscalePolicy(
        config.broker_autoscale_min, config.broker_autoscale_max,
        config.broker_autoscale_target_bytes_in_per_sec,
        config.broker_autoscale_window_ms / 1000, config.broker_autoscale_cooldown_ms / 1000))
    tick_s = min(AUTOSCALE_TICK_S, config.broker_autoscale_window_ms / 1000 / 4)
    was_scaling = False
    while not stopping.wait(tick_s):
        try:
            scaling = scaler.status().state == SCALING
            if was_scaling and not scaling:
                autoscaler.scaled(time.monotonic())
            was_scaling = scaling
            if scaling:
                continue
            brokers, load = len(controller.members()), controller.bytes_in_per_s()
            target = autoscaler.decide(time.monotonic(), brokers, load)
            if target is None:
                continue
            log.info("autoscaler: %.0f bytes in per second over %d brokers; scaling to %d",
                     load, brokers, target)
            try:
                scaler.start(target)
                was_scaling = True
            except errors.DeltaBusError as e:
                log.warning("autoscaler: scaling to %d refused: %s", target, e)
                autoscaler.scaled(time.monotonic())
        except Exception:  # the next round decides again
            log.exception("an autoscaling round failed")
