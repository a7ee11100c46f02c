"""The transaction coordinator's handlers (Kafka's TransactionCoordinator, KIP-98). Runs in the
driver, inside the controller.

A transactional id's state is a `TransactionMetadata` in `MetadataState.transactions`, replayed
from `TransactionRecord`s in the metadata log (Kafka keeps it in __transaction_state), so a
restarted controller knows every open transaction and every one it was ending. The states and
their moves are Kafka's:

    Empty/CompleteCommit/CompleteAbort --AddPartitions/AddOffsets--> Ongoing
    Ongoing --EndTxn(commit)--> PrepareCommit --markers written--> CompleteCommit
    Ongoing --EndTxn(abort), InitProducerId, timeout--> PrepareAbort --markers--> CompleteAbort
    Empty/Complete* --InitProducerId--> Empty (epoch + 1: the previous producer is fenced)

An InitProducerId or a timeout that finds a transaction Ongoing aborts it under a new epoch
(the old producer's batches and calls are fenced), and the producer retries its InitProducerId
on CONCURRENT_TRANSACTIONS until the abort completes. A transactional id keeps the producer id
`producer_id_control` gave it until its epoch runs out (`cfg.PRODUCER_EPOCH_MAX`), then gets a
new one with epoch 0, as Kafka does.

Every function here is a handler: it reads the state and returns the records to write and the
answer (or raises the Kafka error, changing nothing); the controller commits the records, then
sends the markers of a transaction in PrepareCommit/PrepareAbort and records its completion
(`complete`). Invariants: a transaction holds partitions and groups only while open (Ongoing,
PrepareCommit, PrepareAbort); its epoch only grows for a given producer id; it never moves out
of a Prepare state but to its Complete state. Not thread-safe: the controller holds its lock.
"""

from __future__ import annotations

import dataclasses

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster import producer_id_control
from deltabus.cluster.metadata_records import (
    ControllerResult,
    MetadataRecord,
    ProducerIdsRecord,
    TransactionalIdRecord,
    TransactionRecord,
    TxnOffsetCommitRecord,
)
from deltabus.cluster.metadata_state import MetadataState
from deltabus.log_tables.control_records import TxnMarker
from deltabus.metadata import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    TransactionMetadata,
)
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal

# What InitProducerId answers: (producer id, epoch), or the error to answer once its records
# (an open transaction's abort) are committed.
InitResult = tuple[int, int] | errors.DeltaBusError
PartitionErrors = dict[tuple[str, int], errors.DeltaBusError | None]
COORDINATOR_EPOCH = 0  # one coordinator, in the driver: no older one to fence


def _check_timeout(timeout_ms: int) -> None:
    if not 0 < timeout_ms <= cfg.TRANSACTION_MAX_TIMEOUT_MS:
        raise errors.InvalidTransactionTimeoutError(
            f"transaction.timeout.ms must be above 0 and at most transaction.max.timeout.ms "
            f"({cfg.TRANSACTION_MAX_TIMEOUT_MS}), not {timeout_ms}")


def _new_counter(state: MetadataState, next_producer_id: int, transactional_id: str
                 ) -> tuple[int, list[MetadataRecord]]:
    """A new producer id counter for `transactional_id`, and the records that keep it."""
    records: list[MetadataRecord] = []
    if next_producer_id >= state.producer_ids_end:
        records.append(ProducerIdsRecord(next_producer_id + producer_id_control.PRODUCER_ID_BLOCK))
    records.append(TransactionalIdRecord(transactional_id, next_producer_id))
    return next_producer_id, records


def init_producer_id(state: MetadataState, next_producer_id: int, transactional_id: str,
                     timeout_ms: int, *, now_ms: int, principal: KafkaPrincipal = ANONYMOUS,
                     bound: bool = False, expected: tuple[int, int] = (-1, -1)
                     ) -> ControllerResult[InitResult]:
    """InitProducerId with a transactional id: the id's producer id with its epoch bumped,
    fencing every earlier producer of it. An Ongoing transaction is aborted first (under a new
    epoch: PrepareAbort) and the answer is CONCURRENT_TRANSACTIONS, as Kafka answers; one being
    ended answers it too. `expected` (v3+: the producer's own id and epoch, KIP-360): PRODUCER_
    FENCED when another producer took the id over since."""
    cfg.check_transactional_id(transactional_id)
    _check_timeout(timeout_ms)
    counter = state.transactional_ids.get(transactional_id)
    records: list[MetadataRecord] = []
    if counter is None:
        counter, records = _new_counter(state, next_producer_id, transactional_id)

    def answer(c: int) -> int:
        return producer_id_control.bind(c, principal, state.producer_id_key) if bound else c

    txn = state.transactions.get(transactional_id)
    if txn is not None and expected[0] >= 0 and expected != (txn.producer_id,
                                                             txn.producer_epoch):
        raise errors.ProducerFencedError(
            f"producer {expected[0]} epoch {expected[1]} of {transactional_id!r} was fenced: "
            f"the id has producer {txn.producer_id} epoch {txn.producer_epoch} now")
    if txn is not None and txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
        raise errors.ConcurrentTransactionsError(
            f"the transaction of {transactional_id!r} is being ended ({txn.state}): retry")
    if txn is not None and txn.state == ONGOING:
        fenced = _fence(txn, PREPARE_ABORT, now_ms)
        return ControllerResult(
            records + [TransactionRecord.of(fenced)], errors.ConcurrentTransactionsError(
                f"the open transaction of {transactional_id!r} is being aborted: retry"))
    # A mapping made by an earlier (gRPC, exactly-once) producer at epoch 0: fence it too.
    epoch = 0 if txn is None and records else (txn.producer_epoch + 1 if txn else 1)
    producer_id = answer(counter)
    if epoch >= cfg.PRODUCER_EPOCH_MAX:  # the epoch ran out: a new producer id
        counter, more = _new_counter(state, max(next_producer_id, counter + 1),
                                     transactional_id)
        records += more
        producer_id, epoch = answer(counter), 0
    new = TransactionMetadata(transactional_id, producer_id, epoch, EMPTY, timeout_ms,
                              update_ms=now_ms)
    return ControllerResult(records + [TransactionRecord.of(new)], (producer_id, epoch))


def _fence(txn: TransactionMetadata, to: str, now_ms: int) -> TransactionMetadata:
    """`txn` moving to `to` under the next epoch (Kafka's prepareFenceProducerEpoch): the
    producer that opened it is fenced, and its markers carry the new epoch."""
    epoch = min(txn.producer_epoch + 1, cfg.PRODUCER_EPOCH_MAX - 1)
    return dataclasses.replace(txn, producer_epoch=epoch, state=to, update_ms=now_ms)


def current_epoch(state: MetadataState, transactional_id: str) -> int:
    """The epoch a transactional id's producer has now (0 before any transaction): what the
    gRPC InitProducerId answers, which never bumps it."""
    txn = state.transactions.get(transactional_id)
    return 0 if txn is None else txn.producer_epoch


def _producer(state: MetadataState, transactional_id: str, producer_id: int,
              producer_epoch: int) -> TransactionMetadata:
    """The transaction of a request's producer; INVALID_PRODUCER_ID_MAPPING when the id has
    another producer id (or none), PRODUCER_FENCED when another epoch."""
    txn = state.transactions.get(transactional_id)
    if txn is None or txn.producer_id != producer_id:
        raise errors.InvalidProducerIdMappingError(
            f"producer {producer_id} is not the producer of transactional id "
            f"{transactional_id!r}")
    if txn.producer_epoch != producer_epoch:
        raise errors.ProducerFencedError(
            f"producer {producer_id} epoch {producer_epoch} of {transactional_id!r} was fenced "
            f"by epoch {txn.producer_epoch}")
    if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
        raise errors.ConcurrentTransactionsError(
            f"the previous transaction of {transactional_id!r} is being ended: retry")
    return txn


def _joined(txn: TransactionMetadata, now_ms: int, partitions: frozenset[tuple[str, int]],
            groups: frozenset[str]) -> TransactionMetadata:
    """`txn` Ongoing with these partitions and groups added (a new transaction if it was not
    open)."""
    if txn.state != ONGOING:
        txn = dataclasses.replace(txn, state=ONGOING, partitions=frozenset(),
                                  groups=frozenset(), start_ms=now_ms)
    return dataclasses.replace(txn, partitions=txn.partitions | partitions,
                               groups=txn.groups | groups, update_ms=now_ms)


def add_partitions(state: MetadataState, transactional_id: str, producer_id: int,
                   producer_epoch: int, partitions: list[tuple[str, int]], *, now_ms: int
                   ) -> ControllerResult[PartitionErrors]:
    """AddPartitionsToTxn: the partitions join the producer's transaction (which opens, if it
    was not). One the cluster does not have gets UNKNOWN_TOPIC_OR_PARTITION and the others
    OPERATION_NOT_ATTEMPTED, as Kafka answers; nothing is added then."""
    txn = _producer(state, transactional_id, producer_id, producer_epoch)
    unknown = {tp for tp in partitions if state.partition(*tp) is None}
    if unknown:
        return ControllerResult([], {tp: errors.UnknownTopicOrPartitionError(
            f"unknown partition {tp[0]}-{tp[1]}") if tp in unknown
            else errors.OperationNotAttemptedError("another partition is unknown")
            for tp in partitions})
    joined = _joined(txn, now_ms, frozenset(partitions), frozenset())
    if len(joined.partitions) > cfg.TRANSACTION_PARTITIONS_MAX:
        raise errors.InvalidRequestError(
            f"a transaction holds at most {cfg.TRANSACTION_PARTITIONS_MAX} partitions")
    answers: PartitionErrors = dict.fromkeys(partitions)
    if txn.state == ONGOING and joined.partitions == txn.partitions:
        return ControllerResult([], answers)  # a retry: nothing new
    return ControllerResult([TransactionRecord.of(joined)], answers)


def add_offsets(state: MetadataState, transactional_id: str, producer_id: int,
                producer_epoch: int, group_id: str, *, now_ms: int) -> ControllerResult[None]:
    """AddOffsetsToTxn: the group's offsets join the transaction (Kafka adds the group's
    __consumer_offsets partition); TxnOffsetCommit may then commit them."""
    txn = _producer(state, transactional_id, producer_id, producer_epoch)
    if txn.state == ONGOING and group_id in txn.groups:
        return ControllerResult([], None)
    joined = _joined(txn, now_ms, frozenset(), frozenset({group_id}))
    return ControllerResult([TransactionRecord.of(joined)], None)


def txn_offset_commit(state: MetadataState, transactional_id: str, group_id: str,
                      producer_id: int, producer_epoch: int,
                      offsets: dict[tuple[str, int], tuple[int, int, str]]
                      ) -> ControllerResult[PartitionErrors]:
    """TxnOffsetCommit: offsets held with the transaction, written to the group only if it
    commits. The group must have joined it (AddOffsetsToTxn): INVALID_TXN_STATE otherwise.
    Partitions the cluster does not have get UNKNOWN_TOPIC_OR_PARTITION, as OffsetCommit."""
    txn = _producer(state, transactional_id, producer_id, producer_epoch)
    if txn.state != ONGOING or group_id not in txn.groups:
        raise errors.InvalidTxnStateError(
            f"group {group_id!r} is not in the transaction of {transactional_id!r}: "
            "AddOffsetsToTxn first")
    answers: PartitionErrors = {}
    known: dict[tuple[str, int], tuple[int, int, str]] = {}
    for tp, value in offsets.items():
        if state.partition(*tp) is None:
            answers[tp] = errors.UnknownTopicOrPartitionError(f"unknown partition {tp[0]}-{tp[1]}")
        elif value[0] < 0:
            answers[tp] = errors.InvalidCommitOffsetSizeError(f"cannot commit offset {value[0]}")
        else:
            answers[tp], known[tp] = None, value
    if not known:
        return ControllerResult([], answers)
    items = sorted(known.items())
    return ControllerResult([TxnOffsetCommitRecord(
        transactional_id, group_id, tuple(t for (t, _), _ in items),
        tuple(p for (_, p), _ in items), tuple(v[0] for _, v in items),
        tuple(v[1] for _, v in items), tuple(v[2] for _, v in items))], answers)


def end_txn(state: MetadataState, transactional_id: str, producer_id: int,
            producer_epoch: int, committed: bool, *, now_ms: int) -> ControllerResult[None]:
    """EndTxn: an Ongoing transaction moves to PrepareCommit or PrepareAbort, the answer given
    once that is durable (the markers follow). A retry of an end already done answers NONE,
    of one under way CONCURRENT_TRANSACTIONS; anything else is INVALID_TXN_STATE."""
    txn = state.transactions.get(transactional_id)
    if txn is None or txn.producer_id != producer_id:
        raise errors.InvalidProducerIdMappingError(
            f"producer {producer_id} is not the producer of {transactional_id!r}")
    if txn.producer_epoch != producer_epoch:
        raise errors.ProducerFencedError(
            f"producer {producer_id} epoch {producer_epoch} was fenced by epoch "
            f"{txn.producer_epoch}")
    preparing, complete = ((PREPARE_COMMIT, COMPLETE_COMMIT) if committed
                           else (PREPARE_ABORT, COMPLETE_ABORT))
    if txn.state == ONGOING:
        prepared = dataclasses.replace(txn, state=preparing, update_ms=now_ms)
        return ControllerResult([TransactionRecord.of(prepared)], None)
    if txn.state == complete:
        return ControllerResult([], None)
    if txn.state == preparing:
        raise errors.ConcurrentTransactionsError(f"{transactional_id!r} is {txn.state}: retry")
    raise errors.InvalidTxnStateError(
        f"cannot {'commit' if committed else 'abort'} the transaction of {transactional_id!r}: "
        f"it is {txn.state}")


def marker(txn: TransactionMetadata, partitions: set[tuple[str, int]]) -> TxnMarker:
    """The marker a Prepare state's transaction writes on `partitions`."""
    return TxnMarker(txn.producer_id, txn.producer_epoch, txn.state == PREPARE_COMMIT,
                     COORDINATOR_EPOCH, tuple(sorted(partitions)))


def complete(state: MetadataState, transactional_id: str, producer_id: int,
             producer_epoch: int, *, now_ms: int) -> ControllerResult[None]:
    """Every marker of a PrepareX transaction is written (and, for a commit, its offsets):
    CompleteX, holding nothing. Moot (no records) if the transaction is not the one that was
    being ended."""
    txn = state.transactions.get(transactional_id)
    if txn is None or (txn.producer_id, txn.producer_epoch) != (producer_id, producer_epoch) or (
            txn.state not in (PREPARE_COMMIT, PREPARE_ABORT)):
        return ControllerResult([], None)
    done = COMPLETE_COMMIT if txn.state == PREPARE_COMMIT else COMPLETE_ABORT
    ended = dataclasses.replace(txn, state=done, partitions=frozenset(), groups=frozenset(),
                                start_ms=-1, update_ms=now_ms)
    return ControllerResult([TransactionRecord.of(ended)], None)


def timed_out(state: MetadataState, now_ms: int) -> list[str]:
    """The Ongoing transactions open longer than their timeout."""
    return sorted(t.transactional_id for t in state.transactions.values()
                  if t.state == ONGOING and t.start_ms + t.timeout_ms < now_ms)


def abort_timed_out(state: MetadataState, transactional_id: str, *, now_ms: int
                    ) -> ControllerResult[None]:
    """Abort a transaction past its timeout under a new epoch (Kafka's coordinator does so: the
    producer that let it time out is fenced). Moot if it is no longer Ongoing."""
    txn = state.transactions.get(transactional_id)
    if txn is None or txn.state != ONGOING or txn.start_ms + txn.timeout_ms >= now_ms:
        return ControllerResult([], None)
    return ControllerResult([TransactionRecord.of(_fence(txn, PREPARE_ABORT, now_ms))], None)


def list_transactions(state: MetadataState, states: list[str], producer_ids: list[int],
                      duration_ms: int, now_ms: int) -> list[TransactionMetadata]:
    """ListTransactions: every transaction, or those in `states`, of `producer_ids`, open for
    longer than `duration_ms` (each filter left out when empty or negative)."""
    return [t for _, t in sorted(state.transactions.items())
            if (not states or t.state in states)
            and (not producer_ids or t.producer_id in producer_ids)
            and (duration_ms < 0 or (t.start_ms >= 0 and now_ms - t.start_ms > duration_ms))]
