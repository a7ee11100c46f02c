"""Ending transactions: the markers of a transaction in PrepareCommit or PrepareAbort written on
every partition's leader, a commit's offsets written into its groups, then CompleteCommit or
CompleteAbort recorded (Kafka's TransactionMarkerChannelManager). Runs in the driver, beside the
controller, which decides the transaction's states; this only carries them out.

One thread per transaction being ended, at most one per transactional id. Leaders move: each
round resolves them again from the controller's image, and a round that leaves partitions
without a marker is tried again after a backoff, until every one has it or the controller shuts
down (a later controller ends the transaction from the log: `Controller.__init__`). Recording
CompleteX is retried the same way when the storage refuses it (a full disk): the transaction
must not stay in PrepareX, answering CONCURRENT_TRANSACTIONS to its producer, until a restart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster import transaction_coordinator
from deltabus.cluster.metadata_state import MetadataState
from deltabus.log_tables.control_records import TxnMarker
from deltabus.metadata import PREPARE_ABORT, PREPARE_COMMIT, MetadataImage, TransactionMetadata
from deltabus.offsets.offset_store import OffsetAndMetadata
from deltabus.rpc.txn_markers import TxnMarkerClient

log = logging.getLogger(__name__)

TXN_MARKER_BACKOFF_S = (0.05, 1.0)  # first and longest wait before markers are sent again
TXN_MARKER_TIMEOUT_MS = 30_000  # for a leader to have a marker in its ISR's tables

MarkerAnswers = dict[tuple[int, str, int], errors.DeltaBusError | None]
# Write markers through one broker: (broker id, markers) -> the answer for each (producer id,
# topic, partition) of them (None: written). Raising, or leaving one out, means "try again".
SendMarkers = Callable[[int, list[TxnMarker]], MarkerAnswers]
# Write a committed transaction's offsets into a group's: resolves once durable.
TxnOffsetsWriter = Callable[[str, dict[tuple[str, int], OffsetAndMetadata]], Future[None]]


class TxnMarkerChannel:
    """Writes the markers of the transactions the controller ends. Thread-safe."""

    def __init__(self, config: cfg.ClusterConfig, lock: threading.Condition,
                 state: MetadataState, image: Callable[[], MetadataImage],
                 complete: Callable[[TransactionMetadata], None],
                 shutting_down: Callable[[], bool],
                 send_markers: SendMarkers | None = None) -> None:
        """`lock`: the controller's, held while reading `state` and by `complete` (which
        records CompleteX); `send_markers`: how markers reach a broker (tests give a fake),
        by default WriteTxnMarkers to the leader (`send_to_leader`)."""
        self._config = config
        self._lock = lock
        self._state = state
        self._image = image
        self._complete = complete
        self._shutting_down = shutting_down
        self.send: SendMarkers = send_markers or self.send_to_leader
        self._client: TxnMarkerClient | None = None  # made on the first markers
        # Set by Cluster once the group coordinator runs: where a committed transaction's
        # offsets go. Until then, a commit's completion waits.
        self.offsets_writer: TxnOffsetsWriter | None = None
        self._ending: set[str] = set()  # transactional ids whose markers are being written

    def start(self, transactional_id: str) -> None:
        """Lock held. Write the markers of a transaction in PrepareX, in a thread (one per
        transactional id at a time)."""
        if transactional_id not in self._ending:
            self._ending.add(transactional_id)
            threading.Thread(target=self._end_transaction, args=(transactional_id,),
                             daemon=True, name=f"deltabus-txn-end-{transactional_id}").start()

    def _end_transaction(self, transactional_id: str) -> None:
        """Thread: send the markers until every partition has one, write a commit's offsets,
        then record CompleteX; each step tried again after the backoff until done or the
        controller shuts down. A step done is not done again: a marker once per partition, the
        offsets once (a retry could roll back a group's later commit)."""
        try:
            with self._lock:
                txn = self._state.transactions.get(transactional_id)
                if txn is None or txn.state not in (PREPARE_COMMIT, PREPARE_ABORT):
                    return
                pending = (self._state.txn_offsets.get(transactional_id, {})
                           if txn.state == PREPARE_COMMIT else {})
            remaining = set(txn.partitions)
            wait_s, wait_max_s = TXN_MARKER_BACKOFF_S
            while not self._shutting_down():
                if remaining:
                    remaining = self._send_once(txn, remaining)
                if not remaining and self._write_offsets(pending):
                    pending = {}
                    if self._record_completion(txn):
                        return  # at once: the producer's next call waits for this
                with self._lock:
                    self._lock.wait(wait_s)
                wait_s = min(wait_s * 2, wait_max_s)
        except Exception:
            log.exception("ending the transaction of %r failed", transactional_id)
        finally:
            with self._lock:
                self._ending.discard(transactional_id)

    def _record_completion(self, txn: TransactionMetadata) -> bool:
        """Record CompleteX; False when the storage refused the write (KafkaStorageError: a full
        disk, a failing object store), to be tried again after the backoff. Kafka never gives
        the write up either: TransactionMarkerChannelManager queues a completion append that
        failed for want of replicas (COORDINATOR_NOT_AVAILABLE) again, and one that failed in
        storage (NOT_COORDINATOR: the log dir goes offline, the partition moves) is left to the
        coordinator that loads the log next, which ends every PrepareX transaction it finds.
        Here the coordinator never moves, so giving up would leave the transaction in PrepareX
        (every InitProducerId of its id answering CONCURRENT_TRANSACTIONS) until a restart."""
        with self._lock:
            try:
                self._complete(txn)
            except errors.KafkaStorageError as e:
                log.warning("recording the end of the transaction of %r failed; trying again: "
                            "%s", txn.transactional_id, e.message)
                return False
        return True

    def _send_once(self, txn: TransactionMetadata, remaining: set[tuple[str, int]]
                   ) -> set[tuple[str, int]]:
        """One round of markers to the current leaders; the partitions still without one."""
        image = self._image()
        by_leader: dict[int, set[tuple[str, int]]] = {}
        for tp in remaining:
            state = image.partition(*tp)
            if state is not None:  # a deleted topic needs no marker
                by_leader.setdefault(state.leader, set()).add(tp)
        left: set[tuple[str, int]] = set()
        for leader, partitions in by_leader.items():
            try:
                answers = self.send(leader, [transaction_coordinator.marker(txn, partitions)])
            except Exception as e:
                log.warning("markers of %r to broker %d failed: %r", txn.transactional_id,
                            leader, e)
                left |= partitions
                continue
            for t, p in partitions:
                error = answers.get((txn.producer_id, t, p), errors.RequestTimedOutError())
                if isinstance(error, errors.InvalidProducerEpochError | errors.ProducerFencedError
                              | errors.UnknownTopicOrPartitionError):
                    log.warning("marker of %r on %s-%d dropped: %s", txn.transactional_id, t,
                                p, error)
                elif error is not None:
                    left.add((t, p))
        return left

    def _write_offsets(self, pending: dict[str, dict[tuple[str, int],
                                                     tuple[int, int, str]]]) -> bool:
        """Write a committed transaction's offsets into its groups; False to try again."""
        if not pending:
            return True
        writer = self.offsets_writer
        if writer is None:
            return False
        try:
            for group_id, offsets in pending.items():
                writer(group_id, {tp: OffsetAndMetadata(o, e, m)
                                  for tp, (o, e, m) in offsets.items()}).result(30)
        except Exception:
            log.exception("writing committed transaction offsets failed; trying again")
            return False
        return True

    def send_to_leader(self, broker_id: int, markers: list[TxnMarker]) -> MarkerAnswers:
        """Kafka's WriteTxnMarkers to the partitions' leader, on its inter-broker listener
        with the broker credential (rpc.txn_markers); a leader not live: NOT_LEADER (the
        caller re-resolves the leader and sends again)."""
        broker = self._image().broker(broker_id)
        if broker is None:
            error = errors.NotLeaderOrFollowerError(f"broker {broker_id} is not live")
            return {(m.producer_id, t, p): error for m in markers for t, p in m.partitions}
        with self._lock:
            if self._client is None:
                listeners = self._config.listener_config()
                self._client = TxnMarkerClient(
                    broker_secret=self._config.inter_broker_secret,
                    security=self._config.listener_security(
                        listeners.inter_broker.security_protocol))
            client = self._client
        return client.write_txn_markers(broker.address, markers,
                                        timeout_ms=TXN_MARKER_TIMEOUT_MS)
