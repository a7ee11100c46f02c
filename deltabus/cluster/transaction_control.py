"""Producer ids and transactions as the controller runs them: the transaction coordinator's
handlers (`transaction_coordinator`, Kafka's TransactionCoordinator: InitProducerId,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, the timeout of open transactions,
ListTransactions, DescribeTransactions) and the producer ids' (`producer_id_control`) called
under the controller's lock, their records committed through it. Runs in the driver, inside
the controller.

Separate from `transaction_coordinator`, whose functions are handlers that change nothing: this
is the part that commits, waits (for brokers to apply a transaction's partitions, for the
markers of a producer's previous transaction) and starts the ending of a transaction in
PrepareCommit or PrepareAbort (`txn_marker_channel` writes its markers, then calls
`complete_transaction` to record CompleteX). Kept apart so that module stays pure handlers, as
`replication_control` is beside `topic_tables` and `reassignment_control`.

Invariants: a transaction's ending is started once its PrepareX record is committed, never
before; the next producer id only grows (`ProducerIdControlManager.issued`); a request whose
write the storage refuses changes nothing and answers as Kafka's coordinator would
(`_write`: NOT_COORDINATOR).

Thread-safe: every public method takes the controller's lock; those named "lock held" expect
the caller to hold it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster import producer_id_control, transaction_coordinator
from deltabus.cluster.metadata_records import CommitRecords, MetadataRecord
from deltabus.cluster.metadata_state import MetadataState
from deltabus.cluster.producer_id_control import ProducerIdControlManager
from deltabus.metadata import PREPARE_ABORT, PREPARE_COMMIT, TransactionMetadata
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal

log = logging.getLogger(__name__)

TXN_ADD_PARTITIONS_WAIT_MS = 5_000  # for brokers to apply a transaction's new partitions
# A transactional call that finds the producer's previous transaction ending waits this long
# for its markers (`_await_ended`) before it answers CONCURRENT_TRANSACTIONS.
TXN_ENDING_WAIT_MS = 5_000


class TransactionControlManager:
    """Hands out producer ids and runs transactions for the controller. Thread-safe."""

    def __init__(self, config: cfg.ClusterConfig, lock: threading.Condition,
                 state: MetadataState, commit: CommitRecords, *,
                 producer_ids: ProducerIdControlManager, version: Callable[[], int],
                 shutting_down: Callable[[], bool], await_brokers: Callable[[int, int], None],
                 start_ending: Callable[[str], None]) -> None:
        """`lock`, `state`, `commit`: the controller's; `version`: its current metadata
        version; `await_brokers(version, timeout_ms)`: returns once the live brokers applied
        `version`; `start_ending(transactional_id)`, lock held: write the markers of a
        transaction in PrepareX (`TxnMarkerChannel.start`)."""
        self._config = config
        self._lock = lock
        self._state = state
        self._commit = commit
        self._producer_ids = producer_ids
        self._version = version
        self._shutting_down = shutting_down
        self._await_brokers = await_brokers
        self._start_ending = start_ending

    def init_producer_id(self, transactional_id: str = "",
                         principal: KafkaPrincipal = ANONYMOUS) -> tuple[int, int]:
        """A new producer id (epoch 0), or for a transactional id the one it always has. Ids are
        reserved in blocks in the metadata log, so a restarted controller never hands out an id
        twice. With an authorizer the id is bound to `principal` (producer_id_control.bind).

        A block (or a transactional id's mapping) the storage refuses to record is
        COORDINATOR_LOAD_IN_PROGRESS, what Kafka's broker answers while it has no block of ids
        to hand out (RPCProducerIdManager: "Producer ID block is full"), chosen there because
        clients retry it. Not NOT_COORDINATOR: an idempotent producer has no transaction
        coordinator to look up again; nor KAFKA_STORAGE_ERROR, fatal to Java's producer."""
        bound = self._config.authorizer
        with self._lock:
            result = producer_id_control.init_producer_id(
                self._state, self._producer_ids.next_producer_id, transactional_id,
                principal=principal, bound=bound)
            try:  # not cluster metadata brokers need: no new version
                self._commit(result.records)
            except errors.KafkaStorageError as e:
                raise errors.CoordinatorLoadInProgressError(
                    f"no producer id could be reserved: {e.message}") from e
            producer_id, _ = result.response
            self._producer_ids.issued(producer_id)
            # The gRPC door never bumps the epoch: an exactly-once pipeline (the Spark sink)
            # restarts with its id and sequences so leaders drop its rewrites, which a new
            # epoch (sequences from 0) would break. It gets the id's current epoch: 0 unless
            # a Kafka transactional producer of the same id fenced it.
            return producer_id, transaction_coordinator.current_epoch(self._state,
                                                                      transactional_id)

    def init_transactional_producer(self, transactional_id: str, timeout_ms: int,
                                    principal: KafkaPrincipal = ANONYMOUS,
                                    expected: tuple[int, int] = (-1, -1)) -> tuple[int, int]:
        """Kafka's InitProducerId with a transactional id: (producer id, epoch), the epoch
        bumped. An open transaction is aborted first: CONCURRENT_TRANSACTIONS until done."""
        with self._lock:
            self._await_ended(transactional_id)
            result = transaction_coordinator.init_producer_id(
                self._state, self._producer_ids.next_producer_id, transactional_id, timeout_ms,
                now_ms=_now_ms(), principal=principal, bound=self._config.authorizer,
                expected=expected)
            self._write(result.records)
            if isinstance(result.response, errors.DeltaBusError):
                self._start_ending(transactional_id)
                raise result.response
            self._producer_ids.issued(result.response[0])
            return result.response

    def add_partitions_to_txn(self, transactional_id: str, producer_id: int,
                              producer_epoch: int, partitions: list[tuple[str, int]]
                              ) -> transaction_coordinator.PartitionErrors:
        """AddPartitionsToTxn. Answers once the live brokers applied it (or after a while),
        since a leader takes a transactional batch only from a producer its image says has
        the partition in its transaction."""
        with self._lock:
            self._await_ended(transactional_id)
            result = transaction_coordinator.add_partitions(
                self._state, transactional_id, producer_id, producer_epoch, partitions,
                now_ms=_now_ms())
            self._write(result.records)
            target = self._version()
        if result.records:
            self._await_brokers(target, TXN_ADD_PARTITIONS_WAIT_MS)
        return result.response

    def add_offsets_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                           group_id: str) -> None:
        with self._lock:
            self._await_ended(transactional_id)
            result = transaction_coordinator.add_offsets(
                self._state, transactional_id, producer_id, producer_epoch, group_id,
                now_ms=_now_ms())
            self._write(result.records)

    def txn_offset_commit(self, transactional_id: str, group_id: str, producer_id: int,
                          producer_epoch: int,
                          offsets: dict[tuple[str, int], tuple[int, int, str]]
                          ) -> transaction_coordinator.PartitionErrors:
        """TxnOffsetCommit: the offsets held with the transaction (in the metadata log) until
        it commits. A write the storage refuses is NOT_COORDINATOR (`_write`), as Kafka's group
        coordinator answers a TxnOffsetCommit whose append fails with KAFKA_STORAGE_ERROR."""
        with self._lock:
            result = transaction_coordinator.txn_offset_commit(
                self._state, transactional_id, group_id, producer_id, producer_epoch, offsets)
            self._write(result.records)
            return result.response

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                committed: bool) -> None:
        """EndTxn: returns once PrepareCommit/PrepareAbort is durable; a thread then writes
        the markers and records the completion."""
        with self._lock:
            result = transaction_coordinator.end_txn(
                self._state, transactional_id, producer_id, producer_epoch, committed,
                now_ms=_now_ms())
            self._write(result.records)
            if result.records:
                self._start_ending(transactional_id)

    def abort_timed_out_transactions(self) -> list[str]:
        """Abort (under a new epoch: the producer is fenced) every transaction open longer
        than its transaction.timeout.ms, as Kafka's coordinator does; their ids."""
        aborted = []
        with self._lock:
            now_ms = _now_ms()
            for transactional_id in transaction_coordinator.timed_out(self._state, now_ms):
                result = transaction_coordinator.abort_timed_out(
                    self._state, transactional_id, now_ms=now_ms)
                self._commit(result.records)
                if result.records:
                    log.info("transaction of %r timed out: aborting it", transactional_id)
                    self._start_ending(transactional_id)
                    aborted.append(transactional_id)
        return aborted

    def list_transactions(self, states: list[str], producer_ids: list[int],
                          duration_ms: int = -1) -> list[TransactionMetadata]:
        with self._lock:
            return transaction_coordinator.list_transactions(
                self._state, states, producer_ids, duration_ms, _now_ms())

    def pending_txn_offsets(self, group_id: str) -> set[tuple[str, int]]:
        with self._lock:
            return {tp for pending in self._state.txn_offsets.values()
                    for tp in pending.get(group_id, {})}

    def describe_transactions(self, transactional_ids: list[str]
                              ) -> dict[str, TransactionMetadata | None]:
        with self._lock:
            return {t: self._state.transactions.get(t) for t in transactional_ids}

    def _write(self, records: Sequence[MetadataRecord]) -> None:
        """Lock held. Commit a transaction request's records: every request of a transactional
        producer writes through here. A write the storage refuses (a full disk, a failing
        object store: KafkaStorageError) keeps nothing and is NOT_COORDINATOR, as Kafka's
        coordinators answer a state append that fails with KAFKA_STORAGE_ERROR
        (TransactionStateManager.appendTransactionToLog, GroupMetadataManager for
        TxnOffsetCommit). Kafka's transactional producers look the coordinator up again and
        retry NOT_COORDINATOR, while KAFKA_STORAGE_ERROR is fatal to Java's on InitProducerId,
        AddOffsetsToTxn, EndTxn and TxnOffsetCommit, and makes its transaction abortable on
        AddPartitionsToTxn. The writes no request waits for go to `_commit` and keep
        KafkaStorageError, and their threads try them again: CompleteX the marker channel's,
        after its backoff; a timed-out transaction's abort the next check (it stays Ongoing
        and past its timeout)."""
        try:
            self._commit(records)
        except errors.KafkaStorageError as e:
            raise errors.NotCoordinatorError(
                f"the transaction coordinator could not write its state: {e.message}") from e

    def _await_ended(self, transactional_id: str) -> None:
        """Lock held. While the producer's previous transaction is being ended (PrepareCommit,
        PrepareAbort: its markers are being written), wait for it, at most TXN_ENDING_WAIT_MS.
        Kafka answers CONCURRENT_TRANSACTIONS at once and the client tries again after a
        backoff (librdkafka: 20 ms for AddPartitionsToTxn, 500 ms for InitProducerId); its
        markers take a millisecond there and a Delta commit each here, so a producer that
        begins its next transaction right after a commit would pay several backoffs for each.
        Past the wait the handler answers CONCURRENT_TRANSACTIONS, as before."""
        deadline = time.monotonic() + TXN_ENDING_WAIT_MS / 1000
        while not self._shutting_down():
            txn = self._state.transactions.get(transactional_id)
            remaining_s = deadline - time.monotonic()
            if txn is None or txn.state not in (PREPARE_COMMIT, PREPARE_ABORT) or \
                    remaining_s <= 0:
                return
            self._lock.wait(remaining_s)

    def complete_transaction(self, txn: TransactionMetadata) -> None:
        """Lock held. Record CompleteCommit or CompleteAbort once every marker is written. A
        write the storage refuses raises KafkaStorageError and changes nothing: the marker
        channel records it again after its backoff."""
        self._commit(transaction_coordinator.complete(
            self._state, txn.transactional_id, txn.producer_id, txn.producer_epoch,
            now_ms=_now_ms()).records)


def _now_ms() -> int:
    return int(time.time() * 1000)
