"""Fault injection in the shape of issue 14's run: producers at acks=all, a consumer group that
commits after processing, and a nemesis that SIGKILLs brokers for a bounded time; then a drain
and a checker that compares what was acknowledged, read and processed.

Why a harness of our own: single-kill tests (tests/cluster/test_replication.py) prove that one
failover loses nothing, but issue 14's defect (a member's position reset to 0, or silently to the
log end with "latest", after a leader change with no rebalance) showed only under a steady load
with kills again and again. This module is that run, small enough for `make test`
(tests/cluster/test_fault_injection.py) and long behind `make soak`
(tests/soak/soak_fault_injection.py).

What must hold, and what the checker counts (after the drain, a consumer of its own reads the
whole log back, so what the log holds is judged apart from what the members made of it):
- every acknowledged record is processed once the run drains (`lost` counts the others), and
  the log holds it at the offset its producer was told (`misplaced` counts the others);
- within one assignment (no rebalance in between) a member's position only moves forward, one
  record at a time: an offset below the next expected one is `backwards` (a reset to earliest,
  or to "latest" while a new leader's high watermark still lags), one above it is `skipped`
  (a reset to "latest" past records never handed to the application);
- the consumers never reset a position (`resets_logged` counts their own log lines saying so):
  elections are clean and nothing is deleted, so no position is ever out of range or truncated.
  A reset to "latest" can land on the very offset it left (the new leader's high watermark had
  just caught up, and the producers were still waiting for it), which no position check sees;
- a record processed twice is allowed (at-least-once after a rebalance) and only counted;
- a value stored at two offsets (`written_twice`) breaks producer idempotence.
With `transactions`, a transactional consume-transform-produce loop reads the topic beside the
group, and its own checker (tests/faults/transactions.py) adds exactly-once to the list.

Everything runs in the test's process except the brokers (Spark tasks the nemesis kills); all
threads are daemons and `run` stops every one of them before it returns, failing or not, so the
shared cluster is quiet for the next test. Waits are on progress, never on fixed sleeps.
"""

from __future__ import annotations

import abc
import collections
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import Producer as KafkaProducer

from deltabus import (
    AdminClient,
    CommitFailedError,
    Consumer,
    ConsumerRebalanceListener,
    NewTopic,
    Producer,
    TopicPartition,
    errors,
)
from tests.faults.history import History
from tests.faults.invariants import diverged_replicas, two_leaders_in_one_epoch
from tests.faults.nemesis import Fault, KillLeader

if TYPE_CHECKING:  # transactions.py builds on this module's Worker
    from tests.faults.transactions import Transactions, TxnReport

log = logging.getLogger(__name__)

POLL_MS = 200
PROGRESS_POLL_S = 0.5
EXAMPLES_MAX = 5  # violations shown in the summary


@dataclass(frozen=True)
class FaultPlan:
    """One run's shape. Rates are per producer; times are seconds of wall clock."""

    topic: str
    partitions: int = 4
    replication_factor: int = 3
    min_insync_replicas: int = 2
    deltabus_producers: int = 2
    kafka_producer: bool = True
    records_per_s: float = 150.0
    members: int = 2
    auto_offset_reset: str = "latest"
    nemesis_s: float = 75.0
    fault_every_s: float = 10.0  # from the cluster whole again to the next fault
    fault_jitter_s: float = 5.0  # each pause is fault_every_s plus up to this much
    fault_rounds: int | None = None  # the nemesis ends after each fault ran this often
    mixed: bool = False  # each round of faults in a random order (the seed's)
    every_fault_once: bool = False  # past nemesis_s until each fault ran once (a soak's)
    acked_before_nemesis: int = 500  # the load is flowing before the first kill
    ready_timeout_s: float = 120.0  # for the group to form, brokers to return
    drain_idle_s: float = 90.0  # the drain ends after this long without progress
    flush_s: float = 150.0  # > the producers' delivery timeouts
    seed: int = 14
    history: str | None = None  # where the run's history goes (tests/faults/history.py)
    transactions: bool = False  # a transactional loop beside the group (faults/transactions.py)
    diskless: bool = False  # a diskless topic (diskless.enable): one table, leaders take turns


@dataclass(frozen=True)
class FaultEvent:
    at_s: float  # since the nemesis started
    kind: str
    partition: int  # the partition it was aimed at
    target: dict[str, Any]  # what it hit (the fault's own description)


@dataclass(frozen=True)
class Violation:
    kind: str  # "backwards" or "skipped"
    member: str
    partition: int
    expected: int  # the next offset the member was due to process
    got: int  # the record's offset, or the position the consumer reported


@dataclass
class Report:
    """What the checker found; `summary()` is the paragraph a reader of the run wants."""

    acknowledged: int = 0
    processed: int = 0  # distinct records processed
    lost: int = 0  # acknowledged, never processed
    read: int = 0  # records in the log, read back from the start after the drain
    misplaced: int = 0  # acknowledged at an offset that holds another value
    no_offset: int = 0  # acknowledged without an offset (librdkafka, for some retried batches)
    duplicates_processed: int = 0  # extra processings of the same value
    written_twice: int = 0  # values the log holds at more than one offset
    backwards: int = 0
    skipped: int = 0  # records jumped over without a rebalance
    faults: list[FaultEvent] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)  # replicas unlike the leader under the HW
    two_leaders: list[str] = field(default_factory=list)  # (partition, epoch)s with two leaders
    failed_sends: int = 0
    rebalances: int = 0
    commit_failures: int = 0
    resets_logged: int = 0  # the consumer's own "resetting" / truncation warnings
    errors: list[str] = field(default_factory=list)  # threads that died, waits that timed out
    examples: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    transactions: TxnReport | None = None  # with FaultPlan.transactions

    def summary(self) -> str:
        lines = [
            f"fault injection: {len(self.faults)} faults ({self.fault_counts()}) in "
            f"{self.wall_s:.0f} s wall; "
            f"{self.acknowledged} records acknowledged, {self.read} in the log, "
            f"{self.processed} processed; {self.lost} lost (acknowledged, never processed), "
            f"{self.misplaced} not at their acknowledged offset ({self.no_offset} acknowledged "
            f"with no offset), {self.duplicates_processed} "
            f"processed again, {self.written_twice} written twice (at two offsets); "
            f"positions moved backwards {self.backwards} times and skipped records "
            f"{self.skipped} times without a rebalance ({self.resets_logged} resets logged by "
            f"the consumers); {self.rebalances} assignments, {self.commit_failures} failed "
            f"commits, {self.failed_sends} failed sends; {len(self.diverged)} replicas "
            f"diverged under the high watermark, {len(self.two_leaders)} leader epochs with "
            "two leaders.",
            "faults (s, kind, partition: target): " + "; ".join(
                f"{f.at_s:.0f}/{f.kind}/{f.partition}: {f.target}" for f in self.faults)]
        if self.transactions is not None:
            lines.insert(1, self.transactions.summary())
            lines += [f"  {e}" for e in self.transactions.errors]
            lines += [f"  e.g. {e}" for e in self.transactions.examples]
        lines += [f"  {d}" for d in self.diverged[:EXAMPLES_MAX]]
        lines += [f"  {t}" for t in self.two_leaders[:EXAMPLES_MAX]]
        lines += [f"  {e}" for e in self.errors]
        lines += [f"  e.g. {e}" for e in self.examples]
        return "\n".join(lines)

    def fault_counts(self) -> str:
        counts = collections.Counter(f.kind for f in self.faults)
        return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))

    def assert_nothing_lost_or_reset(self) -> None:
        """What every run must show: faults were injected, yet every acknowledged record was
        processed, stored once at its acknowledged offset, no position was reset, the replicas
        agree under the high watermark and no leader epoch had two leaders."""
        assert self.faults, "the nemesis injected no fault"
        assert not self.diverged, self.summary()
        assert not self.two_leaders, self.summary()
        assert not self.errors, self.summary()
        assert self.lost == 0, self.summary()
        assert self.backwards == 0, self.summary()
        assert self.skipped == 0, self.summary()
        assert self.resets_logged == 0, self.summary()
        assert self.misplaced == 0, self.summary()
        assert self.written_twice == 0, self.summary()
        assert self.processed >= self.acknowledged > 0, self.summary()
        if self.transactions is not None:
            self.transactions.assert_exactly_once(self.summary())


class Ledger:
    """What producers were told and what members processed, shared by every thread (locked),
    and the run's history, where each of those lands too."""

    def __init__(self, history: History) -> None:
        self.history = history
        self._lock = threading.Lock()
        self.acked: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        self.failed_sends = 0
        self.processed: collections.Counter[bytes] = collections.Counter()
        self.violations: list[Violation] = []

    def send(self, value: bytes) -> None:
        self.history.invoke(_process(value), "send", value.decode())

    def ack(self, value: bytes, partition: int, offset: int) -> None:
        with self._lock:
            self.acked[value] = (partition, offset)
        self.history.ok(_process(value), "send", [value.decode(), partition, offset])

    def fail(self, value: bytes, error: object) -> None:
        with self._lock:
            self.failed_sends += 1
        self.history.fail(_process(value), "send", [value.decode(), str(error)])

    def process(self, value: bytes) -> None:
        with self._lock:
            self.processed[value] += 1

    def violate(self, violation: Violation) -> None:
        with self._lock:
            self.violations.append(violation)
        log.warning("position violation: %s", violation)

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def progress(self) -> tuple[int, int]:
        """(acknowledged records not processed yet, processings so far)."""
        with self._lock:
            missing = sum(1 for v in self.acked if v not in self.processed)
            return missing, sum(self.processed.values())


def _process(value: bytes) -> str:
    """The sender of a value "<sender>-<seq>"."""
    return value.decode().rsplit("-", 1)[0]


class Worker(threading.Thread, abc.ABC):
    """A daemon thread that keeps the exception that ended it, for the report."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as e:  # reported by the checker, never swallowed
            log.exception("%s died", self.name)
            self.error = e

    @abc.abstractmethod
    def work(self) -> None:
        """The thread's job; it returns once `stop_event` is set (or it fails)."""

    def stop(self, timeout_s: float) -> None:
        self.stop_event.set()
        if self.ident is not None:  # started
            self.join(timeout_s)


class Pacer:
    """Spreads `records_per_s` sends evenly (a burst every 20 ms), so the load is steady."""

    TICK_S = 0.02

    def __init__(self, records_per_s: float) -> None:
        self.per_tick = max(1, round(records_per_s * self.TICK_S))
        self.next_s = time.monotonic()

    def wait(self, stop: threading.Event) -> bool:
        """Wait for the next burst; False once stopped."""
        self.next_s += self.TICK_S
        return not stop.wait(max(0.0, self.next_s - time.monotonic()))


class Sender(Worker):
    """A producer thread sending unique values "<name>-<seq>" to the plan's topic."""

    def __init__(self, name: str, bootstrap: str, plan: FaultPlan, ledger: Ledger) -> None:
        super().__init__(name)
        self.bootstrap, self.plan, self.ledger = bootstrap, plan, ledger
        self.sent = 0


class DeltabusSender(Sender):
    """An idempotent deltabus Producer at acks=all."""

    def work(self) -> None:
        pacer = Pacer(self.plan.records_per_s)
        with Producer(self.bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
                      delivery_timeout_ms=120_000) as producer:
            while pacer.wait(self.stop_event):
                for _ in range(pacer.per_tick):
                    value = f"{self.name}-{self.sent:08d}".encode()
                    self.ledger.send(value)
                    future = producer.send(self.plan.topic, value,
                                           key=f"{self.name}-{self.sent % 64}".encode())
                    future.add_done_callback(lambda f, v=value: self._delivered(f, v))
                    self.sent += 1
            producer.flush(self.plan.flush_s)

    def _delivered(self, future, value: bytes) -> None:
        if future.exception() is None:
            meta = future.get(0)
            self.ledger.ack(value, meta.partition, meta.offset)
        else:
            self.ledger.fail(value, future.exception())


class KafkaSender(Sender):
    """confluent-kafka (librdkafka) on the Kafka door, acks=all and idempotent, as in issue 14."""

    def work(self) -> None:
        producer = KafkaProducer({
            "bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": 120_000})
        pacer = Pacer(self.plan.records_per_s)
        while pacer.wait(self.stop_event):
            for _ in range(pacer.per_tick):
                value = f"{self.name}-{self.sent:08d}".encode()
                self.ledger.send(value)
                self._produce(producer, value, f"{self.name}-{self.sent % 64}".encode())
                self.sent += 1
            producer.poll(0)
        left = producer.flush(self.plan.flush_s)
        if left:
            raise AssertionError(f"{left} records still unacknowledged after the flush")

    def _produce(self, producer: KafkaProducer, value: bytes, key: bytes) -> None:
        while True:
            try:
                producer.produce(self.plan.topic, value, key, on_delivery=self._delivered)
                return
            except BufferError:  # librdkafka's queue is full: serve callbacks, then retry
                producer.poll(0.1)

    def _delivered(self, error, message) -> None:
        if error is None:
            self.ledger.ack(message.value(), message.partition(), message.offset())
        else:
            self.ledger.fail(message.value(), error)


class Member(Worker, ConsumerRebalanceListener):
    """One group member: processes every record poll returns, then commits (at-least-once).

    It keeps, per partition it holds, the next offset it is due to process. The rebalance
    listener sets it from the consumer's position when a partition arrives (the group's
    committed offset, else auto_offset_reset) and drops it when the partition goes; in between,
    each record and each position the consumer reports must be exactly that offset."""

    def __init__(self, name: str, bootstrap: str, group: str, plan: FaultPlan,
                 ledger: Ledger) -> None:
        super().__init__(name)
        self.plan, self.ledger = plan, ledger
        self.consumer = Consumer(bootstrap, group_id=group, enable_auto_commit=False,
                                 auto_offset_reset=plan.auto_offset_reset,
                                 session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
        self._lock = threading.Lock()
        self.expected: dict[int, int | None] = {}  # partition -> next offset due
        self._uncommitted = False  # assigned positions not committed yet
        self.rebalances = 0
        self.commit_failures = 0

    # ---- the rebalance listener (on this member's thread, inside poll) ----------------------

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self._commit()  # what was processed, so the next owner starts there
        with self._lock:
            for tp in revoked:
                self.expected.pop(tp.partition, None)

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """Resolve positions now (committed offsets, else "latest"), so that a member that
        started before any record was written still reads the first one."""
        positions: dict[int, int | None] = {}
        for tp in assigned:
            try:
                positions[tp.partition] = self.consumer.position(tp)
            except errors.DeltaBusError as e:
                log.warning("%s: no position for %s yet: %s", self.name, tp, e)
                positions[tp.partition] = None
        with self._lock:
            self.expected.update(positions)
            self.rebalances += 1
            self._uncommitted = True

    # ---- polling -----------------------------------------------------------------------------

    def ready(self) -> set[int] | None:
        """The partitions held, once every one has a position and it is committed."""
        with self._lock:
            if self._uncommitted or not self.expected or None in self.expected.values():
                return None
            return set(self.expected)

    def work(self) -> None:
        try:
            self.consumer.subscribe([self.plan.topic], listener=self)
            while not self.stop_event.is_set():
                try:
                    self._poll_once()
                except errors.DeltaBusError as e:
                    if not e.retriable:
                        raise
                    log.info("%s: retriable error: %s", self.name, e)
        finally:
            self.consumer.close(autocommit=False)

    def stop(self, timeout_s: float) -> None:
        super().stop(timeout_s)
        if self.ident is None:  # never started: its consumer still holds connections
            self.consumer.close(autocommit=False)

    def _poll_once(self) -> None:
        records = self.consumer.poll(POLL_MS, max_records=500)
        if records:
            spans: dict[int, list[int]] = {}
            for r in records:
                spans.setdefault(r.partition, [r.offset, r.offset])[1] = r.offset
            self.ledger.history.ok(self.name, "poll", spans)
        for record in records:
            self._check(record.partition, record.offset)
            self.ledger.process(record.value)
            with self._lock:
                self.expected[record.partition] = record.offset + 1
        for tp in self.consumer.assignment():  # a reset shows here before any record does
            self._check(tp.partition, self.consumer.position(tp))
        if records or self._uncommitted:
            self._commit()

    def _check(self, partition: int, offset: int) -> None:
        """A record's offset, or the position the consumer reports, must be the one due."""
        with self._lock:
            due = self.expected.get(partition)
            if due is None:  # no position known at assignment: the first one sets it
                self.expected[partition] = offset
                return
        if offset != due:
            self.ledger.violate(Violation("backwards" if offset < due else "skipped",
                                          self.name, partition, due, offset))
            with self._lock:  # count each jump once
                self.expected[partition] = offset

    def _commit(self) -> None:
        try:
            self.consumer.commit()
            self.ledger.history.ok(self.name, "commit", {tp.partition: self.consumer.position(tp)
                                                          for tp in self.consumer.assignment()})
            with self._lock:  # a partition with no position yet was not in that commit
                self._uncommitted = None in self.expected.values()
        except CommitFailedError as e:  # the group rebalanced: the records come again, allowed
            self.commit_failures += 1
            self.ledger.history.fail(self.name, "commit", str(e))
        except errors.DeltaBusError as e:
            if not e.retriable:
                raise
            self.commit_failures += 1
            self.ledger.history.fail(self.name, "commit", str(e))


class Nemesis(Worker):
    """Injects its faults in turn (tests/faults/nemesis.py), each aimed at the partitions the
    members read in turn, every fault_every_s (plus jitter) for nemesis_s: it holds each for
    the fault's hold_s, heals it, and waits for every broker to be back before the next, so
    acks=all with min.insync.replicas=2 is writable again between faults."""

    def __init__(self, cluster, plan: FaultPlan, faults: list[Fault], history: History) -> None:
        super().__init__("nemesis")
        self.cluster, self.plan, self.faults, self.history = cluster, plan, faults, history
        self.injected: list[FaultEvent] = []
        self.problems: list[str] = []
        self._random = random.Random(plan.seed)
        self._round: list[Fault] = []  # the faults left in this round, next first

    def work(self) -> None:
        started = time.monotonic()
        attempts = 0
        while not self.stop_event.wait(self._pause_s()):
            if self._done() or (time.monotonic() - started >= self.plan.nemesis_s
                                and self._each_fault_ran()):
                return
            if not brokers_back(self.cluster, self.plan.ready_timeout_s):
                self.problems.append(f"brokers not all back {time.monotonic() - started:.0f} s "
                                     "into the nemesis")
                continue
            if not self._in_sync():
                continue
            fault = self._next_fault()
            partition = attempts % self.plan.partitions  # each partition in turn
            attempts += 1
            target = fault.start(self.cluster, self.plan.topic, partition)
            if target is None:  # no target now: the same fault next time
                self._round.insert(0, fault)
                continue
            self.injected.append(FaultEvent(time.monotonic() - started, fault.kind, partition,
                                            target))
            self.history.fault(fault.kind, {"partition": partition, **target})
            log.warning("nemesis: %s on %s-%d: %s", fault.kind, self.plan.topic, partition,
                        target)
            try:
                self.stop_event.wait(fault.hold_s)
            finally:
                fault.stop()
                self.history.heal(fault.kind, {"partition": partition})

    def _in_sync(self) -> bool:
        """Wait until every replica of the topic is in sync again, so the next fault meets a
        whole cluster, not the last one's aftermath; False (and a problem) if that takes
        longer than ready_timeout_s with all brokers back."""
        def in_sync() -> bool:
            image = self.cluster.controller.image()
            states = [image.partition(self.plan.topic, p) for p in range(self.plan.partitions)]
            return all(s is not None and s.leader >= 0 and set(s.isr) == set(s.replicas)
                       for s in states)
        try:
            wait_for(in_sync, "every replica back in sync", self.plan.ready_timeout_s)
        except AssertionError as e:
            self.problems.append(str(e))
            return False
        return True

    def _next_fault(self) -> Fault:
        """Each fault once a round: in the order given, or shuffled each round (`mixed`)."""
        if not self._round:
            self._round = list(self.faults)
            if self.plan.mixed:
                self._random.shuffle(self._round)
        return self._round.pop(0)

    def _done(self) -> bool:
        rounds = self.plan.fault_rounds
        return rounds is not None and len(self.injected) >= rounds * len(self.faults)

    def _each_fault_ran(self) -> bool:
        """True unless the plan wants every fault once and one has not run yet: on a slow
        store, waiting for the cluster to be whole again between faults can take minutes."""
        ran = {event.kind for event in self.injected}
        return not self.plan.every_fault_once or all(f.kind in ran for f in self.faults)

    def longest_s(self) -> float:
        """How long the nemesis may take: nemesis_s, then (every_fault_once) a full round of
        faults, each with its pause, hold and waits for brokers and replicas."""
        per_fault = (self.plan.fault_every_s + self.plan.fault_jitter_s
                     + max(f.hold_s for f in self.faults) + 2 * self.plan.ready_timeout_s)
        return (self.plan.nemesis_s + per_fault
                + (len(self.faults) * per_fault if self.plan.every_fault_once else 0) + 60)

    def _pause_s(self) -> float:
        return self.plan.fault_every_s + self._random.uniform(0, self.plan.fault_jitter_s)


class ResetCounter(logging.Handler):
    """Counts the consumer's own log lines about moving a position (resets, truncation)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage().lower()
        if "resetting" in message or "truncation detected" in message:
            self.count += 1


def brokers_back(cluster, timeout_s: float) -> bool:
    """Whether every broker of `cluster` is live again, waiting while the cluster makes
    progress towards it: fails only after `timeout_s` with no broker registering, fenced or
    relaunched. On a loaded machine a relaunch can take a catch-up job's whole timeout and
    then meet another fence (missed heartbeats), which slows the run but is no failure."""
    brokers = cluster.config.brokers
    seen, deadline = None, time.monotonic() + timeout_s
    while not cluster.controller.wait_for_brokers(brokers, 1.0):
        state = (sorted(cluster.controller.live_brokers()), dict(cluster.relaunches),
                 cluster.broker_pids())
        if state != seen:
            seen, deadline = state, time.monotonic() + timeout_s
        elif time.monotonic() > deadline:
            return False
    return True


def wait_for(condition, what: str, timeout_s: float) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def create_topic(cluster, plan: FaultPlan) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(plan.topic, plan.partitions, plan.replication_factor, {
            "min.insync.replicas": str(plan.min_insync_replicas),
            **({"diskless.enable": "true"} if plan.diskless else {})})])

    def led() -> bool:
        image = cluster.controller.image()
        states = [image.partition(plan.topic, p) for p in range(plan.partitions)]
        return all(s is not None and s.leader >= 0 for s in states)
    wait_for(led, f"leaders for every partition of {plan.topic}", plan.ready_timeout_s)


def group_ready(members: list[Member], partitions: int) -> bool:
    """Every member holds partitions, together all of them once, each with a committed
    position: from here on a reassigned partition starts at a committed offset, never at
    "latest", and records produced now are read."""
    held = [m.ready() for m in members]
    if any(h is None for h in held):
        return False
    owned = [p for h in held for p in h or ()]
    return sorted(owned) == list(range(partitions))


def drain(ledger: Ledger, plan: FaultPlan) -> None:
    """Wait until every acknowledged record is processed, or nothing moved for drain_idle_s."""
    last = ledger.progress()
    idle_since = time.monotonic()
    while last[0] and time.monotonic() - idle_since < plan.drain_idle_s:
        time.sleep(PROGRESS_POLL_S)
        now = ledger.progress()
        if now != last:
            last, idle_since = now, time.monotonic()


def read_log(bootstrap: str, plan: FaultPlan, problems: list[str] | None = None
             ) -> tuple[dict[tuple[int, int], bytes], dict[int, int]]:
    """Every record of the topic, (partition, offset) -> value, read from the start by a
    consumer of its own: what the log holds, apart from what the members made of it; and each
    partition's high watermark when the read began. A read that stops making progress before
    the high watermarks is told in `problems` with where it stood: the checker would otherwise
    report the records it never reached as misplaced."""
    tps = [TopicPartition(plan.topic, p) for p in range(plan.partitions)]
    stored: dict[tuple[int, int], bytes] = {}
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        ends = _end_offsets(consumer, tps, plan.drain_idle_s, problems)
        idle_since = time.monotonic()
        while (any(consumer.position(tp) < ends[tp] for tp in tps)
               and time.monotonic() - idle_since < plan.drain_idle_s):
            records = consumer.poll(POLL_MS, max_records=100_000)
            if records:
                idle_since = time.monotonic()
            stored.update(((r.partition, r.offset), r.value) for r in records)
        behind = {tp.partition: (consumer.position(tp), ends[tp]) for tp in tps
                  if consumer.position(tp) < ends[tp]}
    if behind and problems is not None:
        problems.append(f"the read-back stopped after {plan.drain_idle_s:.0f} s without "
                        "progress; (position, high watermark) by partition: "
                        f"{dict(sorted(behind.items()))}")
    return stored, {tp.partition: ends[tp] for tp in tps}


def _end_offsets(consumer: Consumer, tps: list[TopicPartition], wait_s: float,
                 problems: list[str] | None) -> dict[TopicPartition, int]:
    """The partitions' high watermarks, asked again for up to `wait_s` while their leaders do
    not answer (after the last fault brokers may still be relaunching): that wait is told in
    `problems` as unavailability, not taken for lost records."""
    started = time.monotonic()
    while True:
        try:
            ends = consumer.end_offsets(tps)
        except errors.KafkaTimeoutError:
            if time.monotonic() - started > wait_s:
                raise
            continue
        waited_s = time.monotonic() - started
        if waited_s > 30 and problems is not None:
            problems.append(f"the read-back waited {waited_s:.0f} s for every partition's "
                            "leader to answer ListOffsets")
        return ends


def check(ledger: Ledger, stored: dict[tuple[int, int], bytes], report: Report) -> Report:
    """Acknowledged versus read versus processed, and the members' position violations."""
    report.acknowledged = len(ledger.acked)
    report.read = len(stored)
    report.processed = len(ledger.processed)
    lost = [(v, where) for v, where in ledger.acked.items() if v not in ledger.processed]
    report.lost = len(lost)
    # librdkafka may deliver a record with no offset (a retried idempotent batch), which says
    # nothing about where it is: such records are only counted (and checked by value above).
    told = {v: where for v, where in ledger.acked.items() if where[1] is not None}
    report.no_offset = len(ledger.acked) - len(told)
    misplaced = [(v, where) for v, where in told.items() if stored.get(where) != v]
    report.misplaced = len(misplaced)
    report.duplicates_processed = sum(n - 1 for n in ledger.processed.values())
    offsets: dict[bytes, list[tuple[int, int]]] = collections.defaultdict(list)
    for where, value in stored.items():
        offsets[value].append(where)
    twice = sorted((sorted(places), v) for v, places in offsets.items() if len(places) > 1)
    report.written_twice = len(twice)
    report.backwards = sum(1 for v in ledger.violations if v.kind == "backwards")
    report.skipped = sum(1 for v in ledger.violations if v.kind == "skipped")
    report.failed_sends = ledger.failed_sends
    report.examples += [f"{v.kind}: {v.member} partition {v.partition} due {v.expected}, "
                        f"got {v.got}" for v in ledger.violations[:EXAMPLES_MAX]]
    report.examples += [f"lost: {v.decode()} acknowledged at partition {p} offset {o}"
                        for v, (p, o) in sorted(lost, key=lambda x: x[1])[:EXAMPLES_MAX]]
    report.examples += [f"misplaced: {v.decode()} acknowledged at partition {p} offset {o}, "
                        f"which holds {stored.get((p, o))!r}"
                        for v, (p, o) in sorted(misplaced, key=lambda x: x[1])[:EXAMPLES_MAX]]
    report.examples += [f"written twice: {v.decode()} at (partition, offset) {places}"
                        for places, v in twice[:EXAMPLES_MAX]]
    return report


def run(cluster, plan: FaultPlan, faults: list[Fault] | None = None) -> Report:
    """The whole run: topic, group, load, nemesis (`faults`, by default issue 14's leader
    kills), drain, check. Stops every thread it started before returning, whatever happened;
    the history file (plan.history) holds every send, poll, commit and fault."""
    started = time.monotonic()
    faults = faults or [KillLeader()]
    report = Report()
    with History(plan.history or os.devnull) as history:
        ledger = Ledger(history)
        try:
            for fault in faults:
                fault.prepare(cluster, plan.topic)
            create_topic(cluster, plan)
            transactions = _transactions(cluster, plan, history)
            nemesis = Nemesis(cluster, plan, faults, history)
            workers = _load(cluster, plan, ledger, nemesis, report, transactions)
            stored, high_watermarks = read_log(cluster.bootstrap_servers, plan, report.errors)
        finally:
            for fault in faults:
                fault.close()
        report.faults = list(nemesis.injected)
        report.errors += nemesis.problems
        report.errors += [f"{w.name} died: {w.error!r}" for w in workers if w.error is not None]
        report.errors += [f"{w.name} did not stop" for w in workers if w.is_alive()]
        report.diverged = diverged_replicas(cluster, plan.topic, plan.partitions,
                                            high_watermarks)
        report.two_leaders = two_leaders_in_one_epoch(cluster, plan.topic)
        if transactions is not None:
            report.transactions = transactions.report(ledger.acked)
    report.wall_s = time.monotonic() - started
    return check(ledger, stored, report)


def _transactions(cluster, plan: FaultPlan, history: History) -> Transactions | None:
    """The transactional loop of FaultPlan.transactions, its output topic created."""
    if not plan.transactions:
        return None
    from tests.faults.transactions import Transactions  # it imports this module

    transactions = Transactions(cluster, plan, history)
    transactions.prepare()
    return transactions


def _load(cluster, plan: FaultPlan, ledger: Ledger, nemesis: Nemesis, report: Report,
          transactions: Transactions | None = None) -> list[Worker]:
    """The group, the producers, the nemesis and the transactional loop, from start to drain;
    every thread stopped before it returns (the threads, for the report)."""
    members = [Member(f"m{i}", cluster.bootstrap_servers, f"{plan.topic}-group", plan, ledger)
               for i in range(plan.members)]
    extra = [] if transactions is None else transactions.workers
    senders: list[Worker] = [
        DeltabusSender(f"p{i}", cluster.bootstrap_servers, plan, ledger)
        for i in range(plan.deltabus_producers)]
    if plan.kafka_producer:
        senders.append(KafkaSender("k0", cluster.kafka_bootstrap_servers, plan, ledger))
    resets = ResetCounter()
    consumer_log = logging.getLogger("deltabus.client.consumer")
    level = consumer_log.level
    consumer_log.addHandler(resets)
    consumer_log.setLevel(logging.INFO)
    try:
        for m in members:
            m.start()
        wait_for(lambda: group_ready(members, plan.partitions), "the group to form with "
                 "committed positions", plan.ready_timeout_s)
        if transactions is not None:
            transactions.start()
        for s in senders:
            s.start()
        wait_for(lambda: ledger.acked_count() >= plan.acked_before_nemesis,
                 "acknowledged records before the nemesis", plan.ready_timeout_s)
        nemesis.start()
        nemesis.join(nemesis.longest_s())
        report.errors += _drain_phase(cluster, plan, ledger, nemesis, senders)
        if transactions is not None:
            report.errors += transactions.drain(plan.drain_idle_s)
    finally:
        for worker in (nemesis, *senders, *members, *extra):
            worker.stop(plan.flush_s + 30)
        consumer_log.removeHandler(resets)
        consumer_log.setLevel(level)
    report.rebalances = sum(m.rebalances for m in members)
    report.commit_failures = sum(m.commit_failures for m in members)
    report.resets_logged = resets.count
    return [nemesis, *senders, *members, *extra]


def _drain_phase(cluster, plan: FaultPlan, ledger: Ledger, nemesis: Nemesis,
                 senders: list[Worker]) -> list[str]:
    """Stop the nemesis, let the brokers return, stop and flush the producers, then let the
    members catch up with everything acknowledged."""
    problems = []
    nemesis.stop(plan.ready_timeout_s)
    if not brokers_back(cluster, plan.ready_timeout_s):
        problems.append("brokers not all back after the nemesis")
    for s in senders:
        s.stop(plan.flush_s + 30)
    drain(ledger, plan)
    return problems
