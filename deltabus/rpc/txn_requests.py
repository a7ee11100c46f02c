"""The request layer's transaction operations (KIP-98, KIP-664): InitProducerId,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, ListTransactions and
DescribeTransactions, for both doors (rpc/txn_servicer.py and rpc/kafka/txn_apis.py are their
codecs).

ACLs as Kafka's: WRITE on the transactional id for a producer's calls (checked first, once per
request), WRITE on each topic added, READ on the group and on each topic committed; DESCRIBE on
each transactional id described or listed (ListTransactions leaves the others out). An
idempotent producer's InitProducerId needs IDEMPOTENT_WRITE on the cluster or WRITE on some
topic (KIP-679). The transaction coordinator lives in the driver; a server without it (a broker)
answers NOT_COORDINATOR, as a Kafka broker does for an id it does not coordinate.

Versions and wire shapes (PRODUCER_FENCED for old Kafka clients, a gRPC status) stay with the
doors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import DeltaBusHandler, TransactionHandler
from deltabus.metadata import TransactionMetadata
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.rpc.access import Access
from deltabus.security.acls import Operation, ResourceType

PartitionAnswers = dict[tuple[str, int], errors.DeltaBusError | None]
# (topic, partition, offset, leader epoch, metadata), as a request names them
TxnOffset = tuple[str, int, int, int, str]


@dataclass(frozen=True)
class InitProducerIdRequest:
    transactional_id: str | None = None
    # None: an idempotent producer's id (on the gRPC door a transactional id then names a
    # stable id, the same for each call: the Spark sink's); set: Kafka's transactional
    # InitProducerId, the epoch bumped by the transaction coordinator.
    transaction_timeout_ms: int | None = None
    producer_id: int = -1  # KIP-360: the id and epoch the producer had
    producer_epoch: int = -1


@dataclass(frozen=True)
class TxnProducer:
    """Who a transaction call comes from."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True)
class DescribedTransaction:
    transactional_id: str
    transaction: TransactionMetadata | None = None
    error: errors.DeltaBusError | None = None


class TxnRequests:
    """Validates, authorizes and carries out the transaction calls of both doors."""

    def __init__(self, handler: DeltaBusHandler, transactions: TransactionHandler | None,
                 groups: GroupCoordinator | None) -> None:
        """`transactions` and `groups`: the coordinators, where this server has them (the
        driver's); `groups` checks TxnOffsetCommit's member (KIP-447)."""
        self._handler = handler
        self._transactions = transactions
        self._groups = groups

    def _coordinator(self) -> TransactionHandler:
        if self._transactions is None:
            raise errors.NotCoordinatorError(
                "this server is not the transaction coordinator: ask FindCoordinator")
        return self._transactions

    def init_producer_id(self, access: Access,
                         request: InitProducerIdRequest) -> tuple[int, int]:
        """(producer id, epoch). A transactional id no coordinator would keep is
        INVALID_REQUEST wherever it is sent, before NOT_COORDINATOR."""
        transactional_id = request.transactional_id or ""
        if request.transaction_timeout_ms is None:
            Access.raise_if(access.init_producer_id(transactional_id))
            return self._handler.init_producer_id(transactional_id, access.principal)
        Access.raise_if(access.transactional_id(Operation.WRITE, transactional_id))
        cfg.check_transactional_id(transactional_id)
        return self._coordinator().init_transactional_producer(
            transactional_id, request.transaction_timeout_ms, access.principal,
            (request.producer_id, request.producer_epoch))

    def add_partitions_to_txn(self, access: Access, producer: TxnProducer,
                              partitions: Sequence[tuple[str, int]]) -> PartitionAnswers:
        """Each partition's answer: a topic the producer may not WRITE fails the request
        (TOPIC_AUTHORIZATION_FAILED for it, OPERATION_NOT_ATTEMPTED for the rest), as Kafka."""
        asked = list(partitions)
        try:
            Access.raise_if(access.transactional_id(Operation.WRITE, producer.transactional_id))
            denied = {t: e for t, _ in asked if (e := access.topic(Operation.WRITE, t))}
            if denied:
                return {tp: denied.get(tp[0]) or errors.OperationNotAttemptedError(
                    "another topic of the request is not authorized") for tp in asked}
            return self._coordinator().add_partitions_to_txn(
                producer.transactional_id, producer.producer_id, producer.producer_epoch, asked)
        except errors.DeltaBusError as e:
            return dict.fromkeys(asked, e)

    def add_offsets_to_txn(self, access: Access, producer: TxnProducer, group_id: str) -> None:
        Access.raise_if(access.transactional_id(Operation.WRITE, producer.transactional_id)
                        or access.group(Operation.READ, group_id))
        self._coordinator().add_offsets_to_txn(
            producer.transactional_id, producer.producer_id, producer.producer_epoch, group_id)

    def txn_offset_commit(self, access: Access, producer: TxnProducer, group_id: str,
                          member: tuple[str, int, str | None],
                          offsets: Iterable[TxnOffset]) -> PartitionAnswers:
        """Each partition's answer. The consumer named (`member`: member id, generation, group
        instance id) must be the group's (KIP-447: UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
        FENCED_INSTANCE_ID), each topic READ-able by the caller; the offsets that pass are held
        by the transaction coordinator until the transaction commits."""
        refused = (access.transactional_id(Operation.WRITE, producer.transactional_id)
                   or access.group(Operation.READ, group_id))
        if refused is None and self._groups is not None:
            try:
                self._groups.check_txn_offset_commit(group_id, *member)
            except errors.DeltaBusError as e:
                refused = e
        answers: PartitionAnswers = {}
        held: dict[tuple[str, int], tuple[int, int, str]] = {}
        for topic, partition, offset, leader_epoch, metadata in offsets:
            denied = refused or access.topic(Operation.READ, topic)
            answers[(topic, partition)] = denied
            if denied is None:
                held[(topic, partition)] = (offset, leader_epoch, metadata)
        if held:
            try:
                answers.update(self._coordinator().txn_offset_commit(
                    producer.transactional_id, group_id, producer.producer_id,
                    producer.producer_epoch, held))
            except errors.DeltaBusError as e:
                answers.update(dict.fromkeys(held, e))
        return answers

    def end_txn(self, access: Access, producer: TxnProducer, committed: bool) -> None:
        """Returns once PrepareCommit/PrepareAbort is durable (the markers follow)."""
        Access.raise_if(access.transactional_id(Operation.WRITE, producer.transactional_id))
        self._coordinator().end_txn(producer.transactional_id, producer.producer_id,
                                    producer.producer_epoch, committed)

    def list_transactions(self, access: Access, states: list[str], producer_ids: list[int],
                          duration_ms: int = -1,
                          shown: Callable[[str], bool] = lambda transactional_id: True
                          ) -> list[TransactionMetadata]:
        """The transactions the caller may DESCRIBE (and `shown` keeps: a broker lists those
        FindCoordinator sends to it); none on a server without the coordinator."""
        if self._transactions is None:
            return []
        return [t for t in self._transactions.list_transactions(states, producer_ids,
                                                                 duration_ms)
                if access.allows(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                                 t.transactional_id) and shown(t.transactional_id)]

    def describe_transactions(self, access: Access,
                              transactional_ids: Sequence[str]) -> list[DescribedTransaction]:
        """Each id's transaction, in request order: TRANSACTIONAL_ID_AUTHORIZATION_FAILED for
        one the caller may not DESCRIBE, TRANSACTIONAL_ID_NOT_FOUND for one not known."""
        refusals = {i: access.transactional_id(Operation.DESCRIBE, i) for i in transactional_ids}
        allowed = [i for i in transactional_ids if refusals[i] is None]
        found: dict[str, TransactionMetadata | None] = {}
        failed: errors.DeltaBusError | None = None
        try:
            if allowed:
                found = self._coordinator().describe_transactions(allowed)
        except errors.DeltaBusError as e:
            failed = e
        out = []
        for i in transactional_ids:
            txn = found.get(i)
            error = refusals[i] or failed or (None if txn is not None else
                                              errors.TransactionalIdNotFoundError(
                                                  f"no transactional id {i!r}"))
            out.append(DescribedTransaction(i, txn if error is None else None, error))
        return out
