"""A transactional producer's side of KIP-98, over gRPC: its state and its calls to the
transaction coordinator (found with FindCoordinator key type 1, as groups find theirs).

Runs in the user's process; thread-safe (the sender thread adds partitions while the user's
thread begins, commits or aborts). What must stay true: a batch goes to a partition only after
the coordinator added the partition to the open transaction (as librdkafka does, the leader
refuses it otherwise with INVALID_TXN_STATE); a fencing error (PRODUCER_FENCED,
INVALID_PRODUCER_EPOCH, TRANSACTIONAL_ID_AUTHORIZATION_FAILED) is fatal: every later call raises
it; any other failed batch makes the transaction abortable: commit raises, abort works.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from deltabus import errors
from deltabus.client.cluster_client import ClusterClient
from deltabus.rpc.v1 import deltabus_pb2 as pb

FATAL = (errors.ProducerFencedError, errors.InvalidProducerEpochError,
         errors.TransactionalIdAuthorizationFailedError, errors.InvalidProducerIdMappingError)
_COORDINATOR_MOVED = (errors.NotCoordinatorError, errors.CoordinatorNotAvailableError,
                      errors.CoordinatorLoadInProgressError, errors.NetworkError)


class TransactionManager:
    """One transactional id's producer id, epoch and open transaction."""

    def __init__(self, client: ClusterClient, transactional_id: str,
                 transaction_timeout_ms: int) -> None:
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.producer_id = -1
        self.producer_epoch = -1
        self.in_transaction = False
        self._client = client
        self._coordinator: str | None = None
        self._lock = threading.Lock()
        self._partitions: set[tuple[str, int]] = set()  # added to the open transaction
        self._offsets_added = False  # AddOffsetsToTxn in the open transaction
        self._fatal: errors.DeltaBusError | None = None
        self._abortable: BaseException | None = None  # a batch of the transaction failed

    # ---- calls to the coordinator ------------------------------------------------------------

    def _call(self, method: str, request: Any) -> Any:
        if self._coordinator is None:
            found = self._client.call_any("FindCoordinator", pb.FindCoordinatorRequest(
                key=self.transactional_id, key_type=1))
            errors.check(found.error_code, found.error_message)
            self._coordinator = f"{found.host}:{found.port}"
        try:
            return self._client.call(self._coordinator, method, request)
        except _COORDINATOR_MOVED:
            self._coordinator = None
            raise

    def _retrying(self, call: Callable[[], None], timeout_s: float) -> None:
        """`call` again while it fails retriably (the coordinator moved, or the previous
        transaction is still writing its markers: CONCURRENT_TRANSACTIONS), until timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                call()
                return
            except errors.DeltaBusError as e:
                if isinstance(e, FATAL):
                    self._fatal = e
                    raise
                if not e.retriable or time.monotonic() >= deadline:
                    raise
                if isinstance(e, _COORDINATOR_MOVED):
                    self._coordinator = None
            time.sleep(self._client.retry_backoff_ms / 1000)

    def _checked(self, code: int, message: str) -> None:
        if code in (errors.NotCoordinatorError.code, errors.CoordinatorNotAvailableError.code):
            self._coordinator = None
        errors.check(code, message)

    # ---- the producer's steps ----------------------------------------------------------------

    def init(self, timeout_s: float) -> None:
        """InitProducerId with the transaction timeout: a new epoch, fencing earlier producers
        of this transactional id (and aborting what they left open)."""
        def call() -> None:
            response = self._call("InitProducerId", pb.InitProducerIdRequest(
                transactional_id=self.transactional_id,
                transaction_timeout_ms=self.transaction_timeout_ms,
                producer_id=self.producer_id, producer_epoch=self.producer_epoch))
            self._checked(response.error_code, response.error_message)
            self.producer_id, self.producer_epoch = response.producer_id, response.producer_epoch
        self._retrying(call, timeout_s)
        self._fatal = self._abortable = None

    def raise_if_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self.producer_id < 0:
            raise errors.InvalidTxnStateError("init_transactions() first")

    def begin(self) -> None:
        self.raise_if_fatal()
        if self.in_transaction:
            raise errors.InvalidTxnStateError("a transaction is already open")
        with self._lock:
            self._partitions.clear()
            self._abortable = None
            self._offsets_added = False
        self.in_transaction = True

    def check_sending(self) -> None:
        """A record may be sent only inside a transaction."""
        self.raise_if_fatal()
        if not self.in_transaction:
            raise errors.InvalidTxnStateError(
                "a transactional producer sends inside a transaction: begin_transaction() first")

    def add_partitions(self, partitions: set[tuple[str, int]], timeout_s: float) -> None:
        """Add the partitions not yet in the transaction, before their first batch."""
        with self._lock:
            new = sorted(partitions - self._partitions)
        if not new:
            return
        by_topic: dict[str, list[int]] = {}
        for topic, partition in new:
            by_topic.setdefault(topic, []).append(partition)

        def call() -> None:
            response = self._call("AddPartitionsToTxn", pb.AddPartitionsToTxnRequest(
                transactional_id=self.transactional_id, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch, topic_partitions=[
                    pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]))
            for r in response.results:
                self._checked(r.error_code, r.error_message)
        self._retrying(call, timeout_s)
        with self._lock:
            self._partitions.update(new)

    def batch_failed(self, error: BaseException) -> None:
        """A batch of the open transaction failed: it can only be aborted now."""
        if isinstance(error, FATAL):
            self._fatal = error
        with self._lock:
            self._abortable = self._abortable or error

    def send_offsets(self, group_id: str, generation_id: int, member_id: str,
                     offsets: list[pb.OffsetCommitPartition], timeout_s: float) -> None:
        """AddOffsetsToTxn, then TxnOffsetCommit (both served by the coordinator, which holds
        the offsets until the transaction commits)."""
        self.check_sending()
        def add() -> None:
            response = self._call("AddOffsetsToTxn", pb.AddOffsetsToTxnRequest(
                transactional_id=self.transactional_id, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch, group_id=group_id))
            self._checked(response.error_code, response.error_message)

        def commit() -> None:
            response = self._call("TxnOffsetCommit", pb.TxnOffsetCommitRequest(
                transactional_id=self.transactional_id, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch, group_id=group_id,
                generation_id=generation_id, member_id=member_id, partitions=offsets))
            for r in response.results:
                self._checked(r.error_code, r.error_message)
        self._retrying(add, timeout_s)
        self._offsets_added = True
        self._retrying(commit, timeout_s)

    def end(self, committed: bool, timeout_s: float) -> None:
        """EndTxn; a commit of a transaction with a failed batch raises that failure."""
        self.raise_if_fatal()
        if not self.in_transaction:
            raise errors.InvalidTxnStateError("no transaction is open")
        if committed and self._abortable is not None:
            raise errors.InvalidTxnStateError(
                f"a batch of the transaction failed, abort it: {self._abortable}")

        def call() -> None:
            response = self._call("EndTxn", pb.EndTxnRequest(
                committed=committed, transactional_id=self.transactional_id,
                producer_id=self.producer_id, producer_epoch=self.producer_epoch))
            self._checked(response.error_code, response.error_message)
        with self._lock:
            empty = not self._partitions and not self._offsets_added
        if not empty:  # as Kafka's producer: a transaction that touched nothing has no EndTxn
            self._retrying(call, timeout_s)
        self.in_transaction = False
