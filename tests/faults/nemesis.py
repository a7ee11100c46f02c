"""The faults a nemesis injects into a running cluster, each aimed at one partition's replicas
(its leader, a follower) or at the controller, and each healed by `stop`. The run in
tests/soak/fault_injection.py picks them in turn, holds each for `hold_s`, heals it and waits
for the cluster to be whole again before the next.

Where the processes are: the controller in the driver, which is the test's own process (so the
clients share its network fate: network.py's docstring); each broker in the Python worker
`cluster.broker_pids()` names. A broker relaunched while a fault holds (a kill, a fenced broker
restarting) is a new process, outside the fault."""

from __future__ import annotations

import os
import random
from typing import Any, ClassVar

from deltabus.log_tables.layout import topic_path
from tests.faults.full_disk import FullDisk
from tests.faults.network import Host, LoopbackNetwork
from tests.faults.pause import Pause
from tests.faults.s3_fault_proxy import (
    ANSWER_LOST,
    COMMIT_FILES,
    DELAY,
    INTERNAL_ERROR,
    SLOW_DOWN,
    Rule,
    S3FaultProxy,
)


def _leader(cluster, topic: str, partition: int) -> tuple[int, int, list[int]] | None:
    """(leader, leader epoch, the other in-sync replicas) of a partition with a leader."""
    state = cluster.controller.image().partition(topic, partition)
    if state is None or state.leader < 0:
        return None
    return state.leader, state.leader_epoch, [b for b in state.isr if b != state.leader]


def _broker(cluster, broker_id: int) -> Host | None:
    pid = cluster.broker_pids().get(broker_id)
    return None if pid is None else Host(f"broker-{broker_id}", pid)


def _leader_host(cluster, topic: str, partition: int
                 ) -> tuple[tuple[int, int, list[int]] | None, Host | None]:
    """The partition's leader (as `_leader` gives it) and its process, each None if absent."""
    found = _leader(cluster, topic, partition)
    return found, (None if found is None else _broker(cluster, found[0]))


CONTROLLER = Host("controller", os.getpid())


class Fault:
    """One kind of fault. `prepare` readies it before the run's topic exists; `start` injects
    it (or returns None when the cluster offers no target now: no leader, a broker not
    running) and says what it hit, for the history; `stop` heals it; `close` undoes `prepare`
    once the run is over, whatever happened."""

    kind: ClassVar[str]
    hold_s: float = 0.0  # how long it lasts before `stop`

    def prepare(self, cluster, topic: str) -> None:
        """Nothing to ready, unless the fault says otherwise."""

    def start(self, cluster, topic: str, partition: int) -> dict[str, Any] | None:
        raise NotImplementedError

    def stop(self) -> None:
        """Heal: nothing to heal, unless the fault says otherwise (a kill heals itself)."""

    def close(self) -> None:
        """Nothing to undo, unless the fault says otherwise."""


class KillLeader(Fault):
    """SIGKILL the partition's leader; its supervisor relaunches it (issue 14's nemesis)."""

    kind = "kill"

    def start(self, cluster, topic: str, partition: int) -> dict[str, Any] | None:
        found = _leader(cluster, topic, partition)
        if found is None:
            return None
        try:
            cluster.kill_broker(found[0])
        except (KeyError, ProcessLookupError):  # it died or was fenced meanwhile
            return None
        return {"broker": found[0], "leader_epoch": found[1]}


class NetworkFault(Fault):
    """A fault of `network` (shared by every network fault of one nemesis), healed by
    healing the network."""

    def __init__(self, network: LoopbackNetwork, hold_s: float) -> None:
        self.network, self.hold_s = network, hold_s

    def stop(self) -> None:
        self.network.heal()


class LeaderFromController(NetworkFault):
    """The leader cannot reach the controller, nor it the leader; clients and followers still
    reach it. The controller fences it after its session timeout and elects another leader
    from the ISR, while the old one, told nothing, may go on taking produce requests: with
    acks=all it must acknowledge none, its followers having left it."""

    kind = "partition-leader-controller"

    def start(self, cluster, topic: str, partition: int) -> dict[str, Any] | None:
        found, leader = _leader_host(cluster, topic, partition)
        if found is None or leader is None:
            return None
        self.network.cut(leader, CONTROLLER)
        return {"leader": found[0], "leader_epoch": found[1]}


class FollowerFromLeader(NetworkFault):
    """One in-sync follower cannot reach the leader: it leaves the ISR after
    replica.lag.time.max.ms, and the leader goes on with the others (min.insync.replicas)."""

    kind = "partition-follower-leader"

    def start(self, cluster, topic: str, partition: int) -> dict[str, Any] | None:
        found = _leader(cluster, topic, partition)
        if found is None or not found[2]:
            return None
        leader, follower = _broker(cluster, found[0]), _broker(cluster, found[2][0])
        if leader is None or follower is None:
            return None
        self.network.cut(follower, leader)
        return {"leader": found[0], "follower": found[2][0], "leader_epoch": found[1]}


class ControllerFromBrokers(NetworkFault):
    """No broker reaches the controller: it fences them all and no election can help; the
    brokers, told nothing, keep their roles. Nothing they acknowledge meanwhile may be lost
    when they return."""

    kind = "partition-controller-brokers"

    def start(self, cluster, topic: str, partition: int) -> dict[str, Any] | None:
        brokers = [h for b in sorted(cluster.broker_pids()) if (h := _broker(cluster, b))]
        if not brokers:
            return None
        self.network.partition([CONTROLLER], brokers)
        return {"brokers": [h.name for h in brokers]}


class LeaderInMinority(NetworkFault):
    """The leader alone on one side; the other brokers and the controller on the other: the
    majority elects a new leader, the minority's old one can acknowledge nothing."""

    kind = "partition-minority-majority"

    def start(self, cluster, topic: str, partition: int) -> dict[str, Any] | None:
        found, leader = _leader_host(cluster, topic, partition)
        if found is None or leader is None:
            return None
        others = [h for b in sorted(cluster.broker_pids()) if b != found[0]
                  and (h := _broker(cluster, b))]
        self.network.partition([leader], [CONTROLLER, *others])
        return {"minority": [found[0]], "leader_epoch": found[1]}


class SlowLeader(NetworkFault):
    """Everything to and from the leader's ports is delayed (and some of it lost)."""

    kind = "slow-leader"

    def __init__(self, network: LoopbackNetwork, hold_s: float, *, seed: int = 40,
                 delay_ms: tuple[int, int] = (100, 500), loss_percent: tuple[float, float] = (
                     1.0, 10.0)) -> None:
        super().__init__(network, hold_s)
        self._random = random.Random(seed)
        self.delay_ms, self.loss_percent = delay_ms, loss_percent

    def start(self, cluster, topic: str, partition: int) -> dict[str, Any] | None:
        found, leader = _leader_host(cluster, topic, partition)
        if found is None or leader is None:
            return None
        delay = self._random.randint(*self.delay_ms)
        loss = round(self._random.uniform(*self.loss_percent), 1)
        self.network.slow([leader], delay_ms=delay, jitter_ms=delay // 5, loss_percent=loss)
        return {"leader": found[0], "delay_ms": delay, "loss_percent": loss}


class DiskFull(Fault):
    """The disk under the topic's tables fills (every replica's: the brokers share the
    cluster's root) and is freed again: produce requests fail with KAFKA_STORAGE_ERROR, which
    the producers retry, and nothing is acknowledged that was not written. The topic's folder
    is a tmpfs of `size_bytes` from `prepare` on (a local root only)."""

    kind = "full-disk"

    def __init__(self, hold_s: float, size_bytes: int = 1 << 30) -> None:
        self.hold_s, self.size_bytes = hold_s, size_bytes
        self.disk: FullDisk | None = None

    def prepare(self, cluster, topic: str) -> None:
        self.disk = FullDisk(topic_path(cluster.config.root, topic), self.size_bytes)
        self.disk.mount()

    def start(self, cluster, topic: str, partition: int) -> dict[str, Any] | None:
        assert self.disk is not None, "prepare first"
        return {"path": str(self.disk.path), "ballast_bytes": self.disk.fill()}

    def stop(self) -> None:
        if self.disk is not None:
            self.disk.free()

    def close(self) -> None:
        if self.disk is not None:
            self.disk.unmount()


class PauseLeader(Fault):
    """SIGSTOP the partition's leader for `hold_s` (past its session timeout: the controller
    elects another leader), then SIGCONT it: the zombie must acknowledge nothing it did not
    durably commit as leader (tests/faults/pause.py; Spark may kill the stopped worker of the
    fenced broker's cancelled task first, which is a kill)."""

    kind = "pause-leader"

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.pause: Pause | None = None

    def start(self, cluster, topic: str, partition: int) -> dict[str, Any] | None:
        found = _leader(cluster, topic, partition)
        if found is None:
            return None
        self.pause = Pause(cluster)
        try:
            pid = self.pause.pause(found[0])
        except (KeyError, ProcessLookupError):  # not running now
            self.pause = None
            return None
        return {"leader": found[0], "pid": pid, "leader_epoch": found[1]}

    def stop(self) -> None:
        if self.pause is not None:
            self.pause.resume()
            self.pause = None


class SlowFailingStorage(Fault):
    """The object store misbehaves for `hold_s`, through the fault proxy the cluster reaches it
    by (tests/faults/s3_fault_proxy.py): a third of the commit files' puts get 503 SlowDown,
    a tenth lose their answer after they landed, a twentieth of all requests get 500, and a
    fifth of the puts wait half a second. Retried by the storage layer; a commit whose answer
    was lost is recognised as its writer's."""

    kind = "slow-failing-storage"

    def __init__(self, proxy: S3FaultProxy, hold_s: float) -> None:
        self.proxy, self.hold_s = proxy, hold_s

    def start(self, cluster, topic: str, partition: int) -> dict[str, Any] | None:
        rules = [Rule(SLOW_DOWN, key=COMMIT_FILES, method="PUT", probability=0.3),
                 Rule(ANSWER_LOST, key=COMMIT_FILES, method="PUT", probability=0.1),
                 Rule(INTERNAL_ERROR, probability=0.05),
                 Rule(DELAY, method="PUT", probability=0.2, seconds=0.5)]
        for rule in rules:
            self.proxy.add(rule)
        return {"rules": [r.describe() for r in rules]}

    def stop(self) -> None:
        self.proxy.clear()
