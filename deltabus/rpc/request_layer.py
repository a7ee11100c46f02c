"""The one request layer behind both doors, as Kafka's KafkaApis: a request decoded into domain
types comes in, is validated and authorized, reaches the broker or controller, and a domain
answer goes back. The gRPC servicers and the Kafka API handlers are codecs around it: they
decode, call the layer, and encode what it answers, each in its own wire's shape (a gRPC status
or a Kafka error code, an answer built at once or a delayed response).

Why one layer: two doors that each made their own checks drifted apart (a transactional id
checked once per request on one and once per batch on the other; a DeleteRecords with a timeout
of 0 that waited 30 s on one and answered at once on the other), and two copies of an
authorization matrix are how one door gets a rule the other lacks. Every rule of the
operations served here lives once, in Kafka's order; tests/rpc/test_door_equivalence.py sends
each through both doors and checks that a principal gets the same answer from each.

Served here so far: Metadata, Produce, Fetch, DeleteRecords, ListOffsets and OffsetForLeaderEpoch;
the admin calls in `admin` (rpc/admin_requests.py), the transaction calls in `txn`
(rpc/txn_requests.py), the group calls in `groups` (rpc/group_requests.py), the share group
calls in `shares` (rpc/share_requests.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import pyarrow as pa

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import (
    DeltaBusHandler,
    FetchResult,
    FetchSpec,
    TransactionHandler,
)
from deltabus.log_tables.partition_log import AppendResult
from deltabus.log_tables.transactions import READ_COMMITTED, READ_UNCOMMITTED
from deltabus.metadata import MetadataImage
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE
from deltabus.records import ProducerState, UnpackBudget
from deltabus.rpc import throttling
from deltabus.rpc.access import Access
from deltabus.rpc.admin_requests import AdminRequests
from deltabus.rpc.group_requests import GroupRequests
from deltabus.rpc.request_limits import (
    check_distinct,
    check_partition_count,
    duplicate_error,
    duplicates,
)
from deltabus.rpc.share_requests import ShareRequests
from deltabus.rpc.txn_requests import TxnRequests
from deltabus.security.acls import Operation
from deltabus.topics import illegal_topic_name

log = logging.getLogger(__name__)

ACKS = (0, 1, -1)
DELETE_RECORDS_TIMEOUT_MS_DEFAULT = 30_000  # what kafka-delete-records.sh waits


def _left_ms(deadline_s: float) -> int:
    """What is left until `deadline_s` (time.monotonic()), in whole ms, never below 0."""
    return max(0, int((deadline_s - time.monotonic()) * 1000))


def _outcome_of(future: Future, deadline_s: float, timeout_ms: int, what: str) -> object:
    """The result of a future its answer waited for until `deadline_s`, the error it raised, or
    REQUEST_TIMED_OUT naming `what` when it is not done by then (a caller that blocks waits
    for it; a delayed answer is built at the deadline, when the wait is over anyway)."""
    try:
        return future.result(max(0.0, deadline_s - time.monotonic()))
    except TimeoutError:
        raise errors.RequestTimedOutError(
            f"{what} did not complete in {timeout_ms} ms") from None


# ---- Produce ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class RequestBatch:
    """One batch of records of a produce request, as a door decoded it."""

    records: pa.Table  # any subset of PRODUCE_SCHEMA's columns
    producer: ProducerState
    transactional: bool = False  # a transaction's batch (Kafka's attribute bit 4)
    size_bytes: int | None = None  # on the wire, where the client sent a Kafka record batch


@dataclass(frozen=True)
class ProducePartition:
    """A partition's produce data: `batches` decodes it (against the request's unpack budget),
    called only once the partition is allowed, so nothing is unpacked for a refused one."""

    topic: str
    partition: int
    batches: Callable[[UnpackBudget], Sequence[RequestBatch]]


@dataclass(frozen=True)
class ProduceRequest:
    acks: int
    timeout_ms: int
    partitions: Sequence[ProducePartition]
    transactional_id: str | None = None
    transactional: bool = False  # the request carries a transaction's batches
    size_bytes: int = 0  # what the producer byte-rate quota counts
    # The door serves a connection's requests one after another (Kafka's): a batch ahead of
    # its sequence is answered at once, not held waiting for a predecessor queued behind it.
    in_order: bool = False


@dataclass
class PartitionAppends:
    """A partition's appends in request order, or why none was made (after the first that
    failed to decode or was refused, the partition's later batches are not appended)."""

    topic: str
    partition: int
    appends: list[Future[AppendResult]] = field(default_factory=list)
    error: errors.DeltaBusError | None = None

    def outcome(self, deadline_s: float, timeout_ms: int) -> tuple[
            AppendResult | None, errors.DeltaBusError | None]:
        """The first batch's result and the partition's first error, once the appends are
        done or `deadline_s` passed (REQUEST_TIMED_OUT for one still running)."""
        first: AppendResult | None = None
        error = self.error
        for i, future in enumerate(self.appends):
            try:
                result = _outcome_of(future, deadline_s, timeout_ms,
                                    f"the append to {self.topic}-{self.partition}")
            except errors.DeltaBusError as e:
                error = error or e
                continue
            if i == 0:
                first = result  # type: ignore[assignment]
        return (first if error is None else None), error


@dataclass
class ProduceAnswer:
    partitions: list[PartitionAppends]
    deadline_s: float
    timeout_ms: int
    throttle_ms: int

    @property
    def waiting_on(self) -> list[Future[AppendResult]]:
        return [f for p in self.partitions for f in p.appends]


# ---- Fetch -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class FetchRequest:
    partitions: Sequence[FetchSpec]  # in request order, each within its own max bytes
    max_wait_ms: int
    min_bytes: int
    max_bytes: int  # what the answer may carry (negative: INVALID_FETCH_SIZE)
    isolation_level: int = READ_UNCOMMITTED
    # Reads go this far past the limits, for a door that cuts its answer on the bytes it
    # encodes (a Kafka record batch is smaller than the Arrow rows it is made of).
    read_over: float = 1.0


@dataclass
class FetchAnswer:
    """Every partition's read, once `reading` is done (Kafka's DelayedFetch, on which no thread
    waits): the answer's limits are the door's to apply, on the bytes it encodes."""

    partitions: list[FetchSpec]  # as asked, at the request's isolation level
    denied: dict[str, errors.DeltaBusError]  # topic -> why it is not read
    max_bytes: int  # the answer's byte limit, within the broker's
    deadline_s: float  # when the read is due (its max wait and a grace)
    reading: Future[list[FetchResult]] | None  # the allowed partitions' reads
    read_now: Callable[[], Future[list[FetchResult]]] | None = None

    @property
    def waiting_on(self) -> list[Future[list[FetchResult]]]:
        return [self.reading] if self.reading is not None and not self.reading.done() else []

    def results(self) -> list[FetchResult]:
        """Every partition's result in request order, waiting for the reads until the
        deadline: the broker completes a fetch at its max wait; should it not have (a bug, or
        reads stuck in storage), what is there now is the answer."""
        fetched: list[FetchResult] = []
        if self.reading is not None:
            try:
                fetched = self.reading.result(max(0.0, self.deadline_s - time.monotonic()))
            except TimeoutError:
                log.error("a delayed fetch was not completed %d ms past its max wait; "
                          "reading at once", cfg.DELAYED_FETCH_GRACE_MS)
                assert self.read_now is not None
                fetched = self.read_now().result()
        reads = iter(fetched)
        return [FetchResult(s.topic, s.partition, error=self.denied[s.topic])
                if s.topic in self.denied else next(reads) for s in self.partitions]


# ---- DeleteRecords ---------------------------------------------------------------------------

@dataclass(frozen=True)
class DeleteRecordsRequest:
    partitions: Sequence[tuple[str, int, int]]  # topic, partition, offset (-1: the high watermark)
    timeout_ms: int = DELETE_RECORDS_TIMEOUT_MS_DEFAULT  # 0: answer at once


@dataclass
class DeletedRecords:
    topic: str
    partition: int
    moving: Future[int] | None = None  # the new low watermark, once the ISR holds it
    error: errors.DeltaBusError | None = None

    def outcome(self, deadline_s: float,
                timeout_ms: int) -> tuple[int, errors.DeltaBusError | None]:
        """(the low watermark, None), or (-1, the error): REQUEST_TIMED_OUT where the ISR did
        not hold the new log start by `deadline_s`."""
        if self.moving is None:
            return -1, self.error
        try:
            return _outcome_of(self.moving, deadline_s, timeout_ms,  # type: ignore[return-value]
                              f"the ISR of {self.topic}-{self.partition} holding the new log "
                              "start offset"), None
        except errors.DeltaBusError as e:
            return -1, e


@dataclass
class DeleteRecordsAnswer:
    partitions: list[DeletedRecords]
    deadline_s: float
    timeout_ms: int

    @property
    def waiting_on(self) -> list[Future[int]]:
        return [p.moving for p in self.partitions if p.moving is not None]


# ---- ListOffsets, OffsetForLeaderEpoch -------------------------------------------------------

@dataclass(frozen=True)
class ListOffsetsRequest:
    partitions: Sequence[tuple[str, int, int]]  # topic, partition, timestamp (an OffsetSpec)
    isolation_level: int = READ_UNCOMMITTED


@dataclass
class ListedOffset:
    topic: str
    partition: int
    offset: int = -1
    timestamp: int = -1
    leader_epoch: int = -1
    error: errors.DeltaBusError | None = None


@dataclass(frozen=True)
class EpochRequest:
    topic: str
    partition: int
    leader_epoch: int  # the epoch whose end is asked
    current_leader_epoch: int = -1  # the asker's idea of the leader's epoch (-1: none)


@dataclass
class EpochEndOffset:
    topic: str
    partition: int
    leader_epoch: int = -1
    end_offset: int = -1
    error: errors.DeltaBusError | None = None


class RequestLayer:
    """Validates, authorizes and carries out the requests of both doors for one node's
    handler (a broker, or the controller behind the bootstrap listener). Thread-safe."""

    def __init__(self, handler: DeltaBusHandler, groups: GroupCoordinator | None = None,
                 transactions: TransactionHandler | None = None) -> None:
        """`groups` and `transactions`: the group and transaction coordinators, where this
        server has them (the driver's)."""
        self._handler = handler
        self.admin = AdminRequests(handler)
        self.txn = TxnRequests(handler, transactions, groups)
        self.groups = GroupRequests(groups, transactions)
        self.shares = ShareRequests(handler, groups)

    def metadata(self, access: Access, topics: Sequence[str],
                 allow_auto_create: bool) -> tuple[MetadataImage, dict[str, errors.DeltaBusError]]:
        """Kafka's Metadata under ACLs: a named topic the caller may not DESCRIBE is refused
        (TOPIC_AUTHORIZATION_FAILED), a missing one is created only if the caller may CREATE it,
        and a listing of every topic (`topics` empty) shows only those the caller may DESCRIBE.
        A name no topic may have is INVALID_TOPIC_EXCEPTION, as in Kafka, and never
        auto-created. An auto-creation the controller refuses whole (POLICY_VIOLATION) is each
        missing topic's answer."""
        handler = self._handler
        refused = {t: e for t in topics if (e := access.topic(Operation.DESCRIBE, t))}
        refused.update({t: e for t in topics
                        if t not in refused and (e := illegal_topic_name(t))})
        named = [t for t in topics if t not in refused]
        if topics and not named:
            image = handler.metadata([], False)
            return dataclasses.replace(image, topics={}), refused
        creatable = allow_auto_create and all(access.may_create_topic(t) for t in named)
        image = self._metadata(named, creatable, refused)
        if allow_auto_create and not creatable:  # create those it may, leave the rest unknown
            missing = [t for t in named if t not in image.topics and access.may_create_topic(t)]
            if missing:
                self._metadata(missing, True, refused)
                image = handler.metadata(named, False)
        if not topics:
            shown = set(access.describable_topics(image.topics))
            image = dataclasses.replace(
                image, topics={n: t for n, t in image.topics.items() if n in shown})
        return image, refused

    def _metadata(self, topics: list[str], allow_auto_create: bool,
                  refused: dict[str, errors.DeltaBusError]) -> MetadataImage:
        """The handler's metadata; when it refuses the auto-creation (POLICY_VIOLATION: nothing
        was created), the image as it is, and the refusal in `refused` for each topic still
        missing."""
        try:
            return self._handler.metadata(topics, allow_auto_create)
        except errors.PolicyViolationError as e:
            image = self._handler.metadata(topics, False)
            refused.update({t: e for t in topics if t not in image.topics})
            return image

    def produce(self, access: Access, request: ProduceRequest) -> ProduceAnswer:
        """Kafka's handleProduceRequest: acks must be 0, 1 or -1 (else INVALID_REQUIRED_ACKS
        for the whole request); a request carrying a transaction's batches needs WRITE on its
        transactional id, checked once (a refusal answers every partition with it); then per
        partition WRITE on the topic, and per batch that its producer id was issued to the
        caller. Each allowed batch is appended in order; the answer waits at most
        `timeout_ms` for the acks."""
        if request.acks not in ACKS:
            raise errors.InvalidRequiredAcksError(
                f"acks must be 0, 1 or -1 (all), not {request.acks}")
        deadline_s = time.monotonic() + request.timeout_ms / 1000
        whole = self._transactional_refusal(access, request)
        budget = UnpackBudget()  # what the request's compressed batches unpack to, together
        answers = []
        for data in request.partitions:
            entry = PartitionAppends(data.topic, data.partition)
            answers.append(entry)
            entry.error = whole or access.topic(Operation.WRITE, data.topic)
            if entry.error is not None:
                continue  # nothing of it is decoded or written
            try:
                for batch in data.batches(budget):
                    if batch.transactional and batch.producer.producer_id < 0:
                        raise errors.InvalidRequestError(
                            "a transaction's batches need their producer id and epoch")
                    Access.raise_if(access.producer_id(self._handler,
                                                       batch.producer.producer_id))
                    entry.appends.append(self._handler.produce(
                        data.topic, data.partition, batch.records, acks=request.acks,
                        producer=batch.producer, batch_bytes=batch.size_bytes,
                        timeout_ms=_left_ms(deadline_s), in_order=request.in_order))
            except errors.DeltaBusError as e:
                entry.error = e
        throttle_ms = (throttling.record(self._handler, PRODUCER_BYTE_RATE, access,
                                         request.size_bytes) if whole is None else 0)
        return ProduceAnswer(answers, deadline_s, request.timeout_ms, throttle_ms)

    @staticmethod
    def _transactional_refusal(access: Access,
                               request: ProduceRequest) -> errors.DeltaBusError | None:
        if not request.transactional:
            return None
        if request.transactional_id is None:
            return errors.TransactionalIdAuthorizationFailedError(
                "a transaction's batches need the request's transactional id")
        return access.transactional_id(Operation.WRITE, request.transactional_id)

    @staticmethod
    def check_fetch(partitions: Sequence[tuple[str, int]], max_bytes: int = 0) -> None:
        """A Fetch refused whole (nothing is read for it): a negative max bytes
        (INVALID_FETCH_SIZE), more partitions than the limit, or one named twice
        (INVALID_REQUEST)."""
        if max_bytes < 0:
            raise errors.InvalidFetchSizeError(f"max_bytes must not be negative: {max_bytes}")
        check_distinct("Fetch", partitions)
        check_partition_count("Fetch", len(partitions))

    def fetch(self, access: Access, request: FetchRequest) -> FetchAnswer:
        """Kafka's handleFetchRequest for a consumer: READ on each topic (a refused one is
        answered with the refusal and not read), then the long poll of the allowed partitions
        (up to the high watermark, or the last stable offset under read_committed), waiting up
        to the max wait for min_bytes."""
        self.check_fetch([(s.topic, s.partition) for s in request.partitions],
                         request.max_bytes)
        isolation = (READ_COMMITTED if request.isolation_level == READ_COMMITTED
                     else READ_UNCOMMITTED)
        specs = [s if s.isolation_level == isolation
                 else dataclasses.replace(s, isolation_level=isolation)
                 for s in request.partitions]
        denied = {s.topic: e for s in specs if (e := access.topic(Operation.READ, s.topic))}
        max_bytes = min(request.max_bytes, cfg.FETCH_RESPONSE_MAX_BYTES)
        max_wait_ms = min(max(request.max_wait_ms, 0), cfg.FETCH_WAIT_MS_MAX)
        answer = FetchAnswer(specs, denied, max_bytes, time.monotonic() + (
            max_wait_ms + cfg.DELAYED_FETCH_GRACE_MS) / 1000, reading=None)
        allowed = [s for s in specs if s.topic not in denied]
        if not allowed:
            return answer
        if request.read_over != 1.0:
            allowed = [dataclasses.replace(s, max_bytes=int(s.max_bytes * request.read_over))
                       for s in allowed]
        read_bytes = int(max_bytes * request.read_over)

        def read(wait_ms: int, min_bytes: int) -> Future[list[FetchResult]]:
            return self._handler.fetch_delayed(allowed, max_wait_ms=wait_ms, min_bytes=min_bytes,
                                               max_bytes=read_bytes, replica_id=-1)

        answer.reading = read(max_wait_ms, request.min_bytes)
        answer.read_now = lambda: read(0, 0)
        return answer

    def fetch_throttle_ms(self, access: Access, carried_bytes: int) -> int:
        """The consumer byte-rate quota on what a fetch's answer carries: over it, the answer
        goes without its records (they are not counted, and are fetched again), as Kafka
        answers a throttled fetch."""
        return throttling.record(self._handler, CONSUMER_BYTE_RATE, access, carried_bytes,
                                 unrecord_if_throttled=True)

    def delete_records(self, access: Access, request: DeleteRecordsRequest) -> DeleteRecordsAnswer:
        """Kafka's DeleteRecords on each partition's leader, for a principal allowed DELETE on
        the topic: the log start offset moves up to the requested one, answered once the ISR
        holds it or `timeout_ms` passed (REQUEST_TIMED_OUT); 0 answers at once, as Kafka."""
        check_partition_count("DeleteRecords", len(request.partitions))
        timeout_ms = max(0, request.timeout_ms)
        answers = []
        for topic, partition, offset in request.partitions:
            entry = DeletedRecords(topic, partition, error=access.topic(Operation.DELETE, topic))
            answers.append(entry)
            if entry.error is None:
                try:
                    entry.moving = self._handler.delete_records(topic, partition, offset)
                except errors.DeltaBusError as e:
                    entry.error = e
        return DeleteRecordsAnswer(answers, time.monotonic() + timeout_ms / 1000, timeout_ms)

    def list_offsets(self, access: Access, request: ListOffsetsRequest) -> list[ListedOffset]:
        """Kafka's ListOffsets: DESCRIBE on each topic; a partition named twice is answered
        INVALID_REQUEST in each of its entries and read in none (as Kafka)."""
        check_partition_count("ListOffsets", len(request.partitions))
        twice = duplicates((topic, partition) for topic, partition, _ in request.partitions)
        isolation = (READ_COMMITTED if request.isolation_level == READ_COMMITTED
                     else READ_UNCOMMITTED)
        answers = []
        for topic, partition, timestamp in request.partitions:
            entry = ListedOffset(topic, partition)
            answers.append(entry)
            entry.error = (duplicate_error("ListOffsets", (topic, partition))
                           if (topic, partition) in twice
                           else access.topic(Operation.DESCRIBE, topic))
            if entry.error is None:
                try:
                    entry.offset, entry.timestamp, entry.leader_epoch = (
                        self._handler.list_offsets(topic, partition, timestamp, isolation))
                except errors.DeltaBusError as e:
                    entry.error = e
        return answers

    def offset_for_leader_epoch(self, access: Access,
                                partitions: Sequence[EpochRequest]) -> list[EpochEndOffset]:
        """Where each asked epoch ends in the leader's log (KIP-320: a consumer validates its
        position after a leader change), for a principal allowed DESCRIBE on the topic."""
        answers = []
        for asked in partitions:
            entry = EpochEndOffset(asked.topic, asked.partition,
                                   error=access.topic(Operation.DESCRIBE, asked.topic))
            answers.append(entry)
            if entry.error is None:
                try:
                    entry.leader_epoch, entry.end_offset = self._handler.offset_for_leader_epoch(
                        asked.topic, asked.partition, asked.current_leader_epoch,
                        asked.leader_epoch)
                except errors.DeltaBusError as e:
                    entry.error = e
        return answers
