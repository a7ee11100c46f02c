"""Kafka transactions under the run's faults (issue 40): a consume-transform-produce loop with
confluent-kafka's transactions beside the run's load, and the checker of what it must show.

The loop (`TransformLoop`, on the Kafka door, as an application would write it): a
read_committed consumer of the run's topic (whose acknowledged records are the inputs), with
auto-commit off, and a transactional producer. Per batch it begins a transaction, produces one
output record per input to the output topic, adds the consumed positions with
send_offsets_to_transaction and commits. Every ABORT_EVERY-th transaction it aborts on purpose,
so the output holds aborted records to look for. An abortable or retriable error aborts the
transaction; a fatal one (fenced) makes a new producer, whose init_transactions fences the old
one and aborts what it left open; either way the consumer rewinds to the group's committed
offsets and the batch comes again. An output value is "<input>|<transaction>|<commit|abort>":
the checker knows each output's transaction from its value, and how the transaction ended from
the loop.

What must hold (`TxnChecker`), of what a read_committed consumer of the output (`OutputReader`)
returns from the start and through the faults, and of the group's committed offsets, read with
`committed()` every WATCH_EVERY_S and at the end (`OffsetWatcher`):
- once the run drains, every input is in the output exactly once (`missing`, `duplicates`):
  the committed offsets moved with the outputs, never without them;
- no record of an aborted transaction is ever returned (`aborted_seen`): one aborted on purpose
  (its values say "abort") or by a fault (the loop's abort_transaction succeeded, or the loop
  gave its producer up before it asked to commit);
- the group's committed offsets never go backwards (`offset_regressions`).
A transaction whose commit ended in a fatal error has an unknown outcome: its records may be
read or not, and only the count of each input's copies judges it.

Threads: the three workers feed one `TxnChecker` (locked); the run stops them in order, the
loop first, so no transaction is open when the reader reads the last of the output.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer

from deltabus import AdminClient, Consumer, NewTopic
from deltabus import TopicPartition as DeltabusTopicPartition
from tests.faults.history import History
from tests.soak.fault_injection import Worker

log = logging.getLogger(__name__)

ABORT_EVERY = 7  # every 7th transaction is aborted on purpose
# Inputs per transaction at most. A transaction costs about the same whatever it holds (on
# moto's S3 here, 5-20 s of coordinator, marker and offset commits), and with 1,000 the S3
# soak's loop fell behind its 150 records a second (12,000 of 228,000 done after 760 s).
BATCH_MAX = 10_000
POLL_S = 0.2
CALL_TIMEOUT_S = 20.0  # each transactional call; a retriable failure is tried again
HUNG_S = CALL_TIMEOUT_S + 10.0  # a call not back by then ignored its timeout (librdkafka #5511)
CALL_ATTEMPTS_MAX = 10  # of one call that keeps failing retriably, before giving the producer up
TRANSACTION_TIMEOUT_MS = 60_000  # the coordinator aborts a transaction left open this long
WATCH_EVERY_S = 0.5
EXAMPLES_MAX = 5
COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"
ABORT_MARK, COMMIT_MARK = "abort", "commit"


def output_value(input_value: bytes, transaction: int, mark: str) -> bytes:
    return b"|".join([input_value, str(transaction).encode(), mark.encode()])


def parse_output(value: bytes) -> tuple[bytes, int, str]:
    """(input, transaction, mark) of an output value."""
    input_value, transaction, mark = value.rsplit(b"|", 2)
    return input_value, int(transaction), mark.decode()


@dataclass
class TxnReport:
    """What the transactions checker found; `summary()` is its line in the run's report."""

    committed: int = 0  # transactions
    aborted_deliberately: int = 0
    aborted_by_faults: int = 0
    unknown: int = 0  # commits that ended in a fatal error
    producers: int = 0  # transactional producers made (the first, then one per fatal error)
    inputs: int = 0  # acknowledged records of the run's topic
    outputs: int = 0  # distinct output records returned to read_committed
    duplicates: int = 0  # extra copies of an input in the output
    missing: int = 0  # inputs never in the output
    aborted_seen: int = 0  # records of aborted transactions returned to read_committed
    offset_regressions: int = 0  # committed offsets seen lower than before
    offset_reads: int = 0  # committed() answers watched
    hung: dict[str, int] = field(default_factory=dict)  # producer calls given up (ClientHung)
    errors: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"transactions: {self.committed} committed, {self.aborted_deliberately} aborted "
                f"on purpose, {self.aborted_by_faults} aborted by faults, {self.unknown} with "
                f"an unknown outcome, {self.producers} producers ({self.hung or 'no'} calls "
                f"hung in librdkafka); {self.inputs} inputs, "
                f"{self.outputs} outputs read committed; {self.duplicates} duplicates, "
                f"{self.missing} missing, {self.aborted_seen} aborted records returned; "
                f"committed offsets went backwards {self.offset_regressions} times in "
                f"{self.offset_reads} reads.")

    def assert_exactly_once(self, context: str) -> None:
        """Each input once in the output, nothing aborted read, no offset backwards; and the
        run had committed and aborted transactions, so each check had something to judge."""
        assert not self.errors, context
        assert self.duplicates == 0, context
        assert self.missing == 0, context
        assert self.aborted_seen == 0, context
        assert self.offset_regressions == 0, context
        assert self.committed > 0 and self.aborted_deliberately > 0, context
        assert self.inputs > 0 and self.offset_reads > 0, context


class TxnChecker:
    """What the loop, the reader and the watcher saw (thread-safe), judged by `result`."""

    def __init__(self, history: History) -> None:
        self.history = history
        self._lock = threading.Lock()
        self.outcomes: dict[int, str] = {}  # transaction -> how it ended
        self.sizes: dict[int, int] = {}  # transaction -> records it produced
        self.deliberate: set[int] = set()  # transactions aborted on purpose
        self.producers = 0
        self.hung: collections.Counter[str] = collections.Counter()  # calls that hung, by name
        self.read: dict[tuple[int, int], bytes] = {}  # (partition, offset) -> value
        self.rewritten: list[str] = []  # an offset read again with another value
        self.committed_max: dict[int, int] = {}  # partition -> highest committed offset seen
        self.regressions: list[str] = []
        self.offset_reads = 0

    def ended(self, transaction: int, outcome: str, records: int,
              deliberate: bool = False) -> None:
        with self._lock:
            self.outcomes[transaction] = outcome
            self.sizes[transaction] = records
            if deliberate:
                self.deliberate.add(transaction)

    def call_hung(self, what: str) -> None:
        with self._lock:
            self.hung[what] += 1

    def producer_made(self) -> None:
        with self._lock:
            self.producers += 1

    def returned(self, partition: int, offset: int, value: bytes) -> None:
        """A record the read_committed reader got."""
        with self._lock:
            before = self.read.setdefault((partition, offset), value)
            if before != value:
                self.rewritten.append(f"output partition {partition} offset {offset} read as "
                                      f"{before!r}, then {value!r}")

    def committed(self, offsets: dict[int, int]) -> None:
        """The group's committed offsets, as committed() answered (negative: none)."""
        with self._lock:
            self.offset_reads += 1
            for partition, offset in sorted(offsets.items()):
                highest = self.committed_max.get(partition)
                if highest is not None and offset < highest:
                    self.regressions.append(f"partition {partition}: committed offset {offset} "
                                            f"after {highest}")
                    self.history.info("txn-watcher", "offset-regression",
                                      {"partition": partition, "offset": offset,
                                       "before": highest})
                self.committed_max[partition] = max(offset, highest if highest is not None
                                                    else offset)

    def committed_unread(self) -> int:
        """Records of committed transactions the reader has not returned yet (the drain waits
        for them)."""
        with self._lock:
            committed = {t for t, o in self.outcomes.items() if o == COMMITTED}
            read = sum(1 for v in self.read.values() if parse_output(v)[1] in committed)
            return sum(self.sizes[t] for t in committed) - read

    def result(self, inputs: Iterable[bytes]) -> TxnReport:
        with self._lock:
            report = TxnReport(producers=self.producers, offset_reads=self.offset_reads,
                               hung=dict(self.hung))
            counts = collections.Counter(self.outcomes.values())
            report.committed, report.unknown = counts[COMMITTED], counts[UNKNOWN]
            report.aborted_deliberately = len(self.deliberate)
            report.aborted_by_faults = counts[ABORTED] - len(self.deliberate)
            copies: collections.Counter[bytes] = collections.Counter()
            aborted = []
            for (partition, offset), value in sorted(self.read.items()):
                input_value, transaction, mark = parse_output(value)
                copies[input_value] += 1
                if mark == ABORT_MARK or self.outcomes.get(transaction) == ABORTED:
                    aborted.append(f"aborted record returned: {value!r} at output partition "
                                   f"{partition} offset {offset}")
            wanted = set(inputs)
            missing = sorted(v for v in wanted if v not in copies)
            doubled = sorted((v, n) for v, n in copies.items() if n > 1)
            report.inputs, report.outputs = len(wanted), len(self.read)
            report.missing, report.aborted_seen = len(missing), len(aborted)
            report.duplicates = sum(n - 1 for _, n in doubled)
            report.offset_regressions = len(self.regressions)
            report.errors += self.rewritten
            report.examples += aborted[:EXAMPLES_MAX]
            report.examples += [f"missing from the output: {v!r}" for v in missing[:EXAMPLES_MAX]]
            report.examples += [f"in the output {n} times: {v!r}"
                                for v, n in doubled[:EXAMPLES_MAX]]
            report.examples += self.regressions[:EXAMPLES_MAX]
            return report


def _error(e: KafkaException) -> KafkaError:
    return e.args[0]


class ClientHung(Exception):
    """A producer call that did not return long after its own timeout. librdkafka 2.16's
    send_offsets_to_transaction can wait for ever for a group coordinator that left the
    metadata (a fenced broker) and was decommissioned (confluentinc/librdkafka#5511); an
    application must give such a producer up, as the loop does (docs/kafka-compatibility.md)."""


def _bounded(call: Callable[[], object], what: str) -> None:
    """`call` on a thread of its own, waited for HUNG_S at most (ClientHung after that: the
    thread is left blocked in librdkafka, a daemon)."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as e:  # raised on the caller's thread
            outcome.append(e)
    thread = threading.Thread(target=target, name=f"txn-{what}", daemon=True)
    thread.start()
    thread.join(HUNG_S)
    if not outcome:
        raise ClientHung(f"{what} did not return in {HUNG_S:.0f} s")
    if outcome[0] is not None:
        raise outcome[0]


class TransformLoop(Worker):
    """The consume-transform-produce loop; `positions` holds, per input partition, the offset
    its last committed transaction committed."""

    def __init__(self, bootstrap: str, topic: str, output: str, group: str,
                 checker: TxnChecker) -> None:
        super().__init__("txn-loop")
        self.bootstrap, self.topic, self.output, self.group = bootstrap, topic, output, group
        self.checker, self.history = checker, checker.history
        self.transaction = 0
        self.size = 0  # records of the current transaction
        self.positions: dict[int, int] = {}
        self._lock = threading.Lock()
        self.consumer: KafkaConsumer | None = None
        self.producer: KafkaProducer | None = None
        self.abandoned: list[KafkaProducer] = []  # producers given up (fatal error, hung)
        self.abandoned_consumers: list[KafkaConsumer] = []  # consumers whose close hung

    def work(self) -> None:
        self.consumer = self._new_consumer()
        try:
            self.producer = self._new_producer()
            while not self.stop_event.is_set():
                messages = [m for m in self.consumer.consume(BATCH_MAX, POLL_S)
                            if self._usable(m)]
                if messages:
                    self._transaction(messages)
        finally:
            self._close_consumer()

    def _new_consumer(self) -> KafkaConsumer:
        """The group's read_committed member, subscribed: its assignment starts at the
        group's committed offsets."""
        consumer = KafkaConsumer({
            "bootstrap.servers": self.bootstrap, "group.id": self.group,
            "isolation.level": "read_committed", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": 10_000})
        consumer.subscribe([self.topic])
        return consumer

    def _close_consumer(self) -> None:
        """Close the consumer, bounded: one stuck on a coordinator that left is given up."""
        consumer = self.consumer
        try:
            _bounded(consumer.close, "close")
        except (KafkaException, ClientHung) as e:
            self.history.info(self.name, "close", str(e))
            self.abandoned_consumers.append(consumer)

    def committed_positions(self) -> dict[int, int]:
        with self._lock:
            return dict(self.positions)

    def _usable(self, message: Message) -> bool:
        error = message.error()
        if error is None:
            return True
        self.history.fail(self.name, "consume", str(error))
        if error.fatal():
            raise KafkaException(error)
        return False

    def _new_producer(self) -> KafkaProducer:
        """A transactional producer, initialised (which fences any before it and aborts the
        transaction it left open)."""
        producer = KafkaProducer({
            "bootstrap.servers": self.bootstrap, "transactional.id": f"{self.group}-loop",
            "linger.ms": 5, "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS})
        self._call(lambda: producer.init_transactions(CALL_TIMEOUT_S), "init")
        self.checker.producer_made()
        return producer

    def _call(self, call: Callable[[], object], what: str) -> None:
        """`call` (bounded: `_bounded`) again while it fails retriably (the same call may be
        retried, librdkafka says), up to CALL_ATTEMPTS_MAX times; its last error raised."""
        for attempt in range(1, CALL_ATTEMPTS_MAX + 1):
            self.history.invoke(self.name, what, self.transaction)
            try:
                _bounded(call, what)
                self.history.ok(self.name, what, self.transaction)
                return
            except ClientHung as e:
                self.history.info(self.name, what, str(e))
                self.checker.call_hung(what)
                raise
            except KafkaException as e:
                self.history.fail(self.name, what, str(e))
                if not _error(e).retriable() or attempt == CALL_ATTEMPTS_MAX:
                    raise

    def _transaction(self, messages: list[Message]) -> None:
        assert self.producer is not None and self.consumer is not None
        self.transaction += 1
        n, deliberate = self.transaction, self.transaction % ABORT_EVERY == 0
        self.size = len(messages)
        mark = ABORT_MARK if deliberate else COMMIT_MARK
        offsets: dict[int, int] = {}
        for m in messages:
            offsets[m.partition()] = max(offsets.get(m.partition(), 0), m.offset() + 1)
        self.history.invoke(self.name, "txn", {"txn": n, "mark": mark, "offsets": offsets})
        producer, consumer = self.producer, self.consumer
        try:
            producer.begin_transaction()
            for m in messages:
                producer.produce(self.output, output_value(m.value(), n, mark), m.key())
            self._call(lambda: producer.send_offsets_to_transaction(
                [TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                consumer.consumer_group_metadata(), CALL_TIMEOUT_S), "send-offsets")
            if deliberate:
                self._call(lambda: producer.abort_transaction(CALL_TIMEOUT_S), "abort")
                self._ended(n, ABORTED, deliberate=True)
                return
        except (KafkaException, ClientHung) as e:
            self._abandon(n, e, committing=False)
            return
        try:
            self._call(lambda: producer.commit_transaction(CALL_TIMEOUT_S), "commit")
        except (KafkaException, ClientHung) as e:
            self._abandon(n, e, committing=True)
            return
        with self._lock:
            self.positions.update(offsets)
        self._ended(n, COMMITTED)

    def _abandon(self, n: int, e: Exception, committing: bool) -> None:
        """A transaction that failed: aborted if the error allows; otherwise a new producer,
        and the outcome unknown if a commit was asked for. Then the batch comes again."""
        assert self.producer is not None
        producer = self.producer
        if isinstance(e, KafkaException) and not _error(e).fatal():
            try:
                self._call(lambda: producer.abort_transaction(CALL_TIMEOUT_S), "abort")
                self._ended(n, ABORTED, error=e)
                return
            except (KafkaException, ClientHung) as abort_failed:
                e = abort_failed
        log.warning("%s: transaction %d: %s; a new producer", self.name, n, e)
        self.abandoned.append(producer)  # destroying a hung one could hang too
        self.producer = self._new_producer()
        self._ended(n, UNKNOWN if committing else ABORTED, error=e)

    def _ended(self, n: int, outcome: str, deliberate: bool = False,
               error: Exception | None = None) -> None:
        """Record the outcome, and rewind after an abort."""
        self.checker.ended(n, outcome, self.size, deliberate)
        value = {"txn": n, "outcome": outcome, "deliberate": deliberate,
                 "error": None if error is None else str(error)}
        (self.history.ok if outcome == COMMITTED else self.history.fail)(self.name, "txn", value)
        if outcome != COMMITTED:
            self._rewind()

    def _rewind(self) -> None:
        """Every assigned partition back to the group's committed offset (the beginning if
        none), so an aborted batch is consumed again, and nothing committed is."""
        assert self.consumer is not None
        consumer = self.consumer
        assignment = consumer.assignment()
        if not assignment:  # the next assignment starts at the committed offsets
            return
        found: list[TopicPartition] = []
        try:
            self._call(lambda: found.extend(consumer.committed(assignment, CALL_TIMEOUT_S)),
                       "rewind")
        except KafkaException as e:
            # librdkafka's consumer can keep asking a coordinator that left, as its producer
            # does in #5511 (a local soak saw committed() time out for 10 minutes): a new
            # member's assignment starts at the committed offsets, which is the rewind.
            if _error(e).fatal() or self.stop_event.is_set():
                raise
            self._close_consumer()
            self.consumer = self._new_consumer()
            self.history.info(self.name, "rewind", "a new consumer")
            return
        for tp in found:
            tp.offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            consumer.seek(tp)
        self.history.ok(self.name, "rewind", {tp.partition: tp.offset for tp in found})


class OutputReader(Worker):
    """A read_committed consumer of the output from its beginning, through the faults."""

    def __init__(self, bootstrap: str, output: str, partitions: int,
                 checker: TxnChecker) -> None:
        super().__init__("txn-reader")
        self.bootstrap, self.output, self.partitions = bootstrap, output, partitions
        self.checker = checker

    def work(self) -> None:
        consumer = KafkaConsumer({
            "bootstrap.servers": self.bootstrap, "group.id": f"{self.output}-reader",
            "isolation.level": "read_committed", "enable.auto.commit": False,
            "auto.offset.reset": "earliest"})
        try:
            consumer.assign([TopicPartition(self.output, p, OFFSET_BEGINNING)
                             for p in range(self.partitions)])
            while not self.stop_event.is_set():
                spans: dict[int, list[int]] = {}
                for m in consumer.consume(500, POLL_S):
                    if m.error() is not None:
                        self.checker.history.fail(self.name, "read", str(m.error()))
                        continue
                    self.checker.returned(m.partition(), m.offset(), m.value())
                    spans.setdefault(m.partition(), [m.offset(), m.offset()])[1] = m.offset()
                if spans:
                    self.checker.history.ok(self.name, "read", spans)
        finally:
            consumer.close()


class OffsetWatcher(Worker):
    """Reads the loop's group's committed offsets every WATCH_EVERY_S and once more when
    stopped, with a consumer of the group that never joins it."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, group: str,
                 checker: TxnChecker) -> None:
        super().__init__("txn-watcher")
        self.bootstrap, self.group = bootstrap, group
        self.topic, self.partitions, self.checker = topic, partitions, checker

    def work(self) -> None:
        consumer = KafkaConsumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                                  "enable.auto.commit": False})
        try:
            while not self.stop_event.wait(WATCH_EVERY_S):
                self.watch(consumer)
            self.watch(consumer)
        finally:
            consumer.close()

    def watch(self, consumer: KafkaConsumer) -> None:
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        try:
            found = consumer.committed(tps, CALL_TIMEOUT_S)
        except KafkaException as e:  # a fault: the next read tells
            self.checker.history.fail(self.name, "committed", str(e))
            return
        offsets = {tp.partition: tp.offset for tp in found if tp.error is None}
        self.checker.history.ok(self.name, "committed", offsets)
        self.checker.committed(offsets)


class Transactions:
    """The loop, its reader and its watcher as one workload of a fault-injection run (the
    run's topic is the input; FaultPlan.transactions starts it)."""

    def __init__(self, cluster, plan, history: History) -> None:
        self.cluster, self.plan = cluster, plan
        self.output, group = f"{plan.topic}-txn-out", f"{plan.topic}-txn"
        self.checker = TxnChecker(history)
        kafka = cluster.kafka_bootstrap_servers
        self.loop = TransformLoop(kafka, plan.topic, self.output, group, self.checker)
        self.reader = OutputReader(kafka, self.output, plan.partitions, self.checker)
        self.watcher = OffsetWatcher(kafka, plan.topic, plan.partitions, group, self.checker)
        self.workers: list[Worker] = [self.loop, self.reader, self.watcher]  # in stop order

    def prepare(self) -> None:
        with AdminClient(self.cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(self.output, self.plan.partitions,
                                          self.plan.replication_factor, {
                "min.insync.replicas": str(self.plan.min_insync_replicas)})])

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    def drain(self, idle_s: float) -> list[str]:
        """Once the run's producers stopped: wait until the loop committed every input and the
        reader returned every committed transaction, or nothing moved for `idle_s`."""
        tps = [DeltabusTopicPartition(self.plan.topic, p) for p in range(self.plan.partitions)]
        with Consumer(self.cluster.bootstrap_servers) as consumer:
            ends = {tp.partition: end for tp, end in consumer.end_offsets(tps).items()}

        def left() -> tuple[int, int]:
            positions = self.loop.committed_positions()
            behind = sum(max(0, end - positions.get(p, 0)) for p, end in ends.items())
            return behind, self.checker.committed_unread()
        last, idle_since = left(), time.monotonic()
        while any(last) and time.monotonic() - idle_since < idle_s:
            if self.loop.stop_event.wait(POLL_S) or not self.loop.is_alive():
                break
            now = left()
            if now != last:
                last, idle_since = now, time.monotonic()
        if any(last):
            return [f"transactions: {last[0]} inputs not committed, {last[1]} records of "
                    "committed transactions not read after the drain"]
        return []

    def report(self, inputs: Iterable[bytes]) -> TxnReport:
        return self.checker.result(inputs)
