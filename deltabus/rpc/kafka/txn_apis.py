"""Kafka's transaction APIs (KIP-98, KIP-664) over the transaction coordinator, which lives in
the driver beside the group coordinator: FindCoordinator (key type 1) names a live broker,
whose listener passes these APIs on to the driver's, whose `transactions` is the controller
(`listener`, Kafka's Envelope). A broker's ListTransactions lists the transactional ids
FindCoordinator sends to it, so admin clients that ask every broker list each once.

ACLs as Kafka checks them (`KafkaApis._refusal` for the whole request): WRITE on the
transactional id for InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and
TxnOffsetCommit; WRITE on each topic added; READ on the group of AddOffsetsToTxn and
TxnOffsetCommit, READ on each topic committed; DESCRIBE on each transactional id described or
listed (ListTransactions leaves the others out). PRODUCER_FENCED is answered as
INVALID_PRODUCER_EPOCH to versions older than KIP-588's.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import TransactionHandler
from deltabus.metadata import TXN_STATES, TransactionMetadata
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.rpc.access import current_access
from deltabus.rpc.kafka.frames import NO_TIME, error_code, load_response_schema, make, nested
from deltabus.rpc.txn_offsets import commit_txn_offsets
from deltabus.security.acls import Operation, ResourceType

INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN = 22, 24, 25, 26
TXN_OFFSET_COMMIT, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 28, 65, 66
SUPPORTED: dict[int, tuple[int, int]] = {
    ADD_PARTITIONS_TO_TXN: (0, 3),  # v4+ is the brokers' own verification (KIP-890)
    ADD_OFFSETS_TO_TXN: (0, 3),
    END_TXN: (0, 3),
    TXN_OFFSET_COMMIT: (0, 3),
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 1),
}
# The first version of each API that knows PRODUCER_FENCED (KIP-588).
_FENCED_SINCE = {INIT_PRODUCER_ID: 4, ADD_PARTITIONS_TO_TXN: 2, ADD_OFFSETS_TO_TXN: 2,
                 END_TXN: 2, TXN_OFFSET_COMMIT: 3}


def _answered(api_key: int, version: int,
              error: errors.DeltaBusError | None) -> errors.DeltaBusError | None:
    if isinstance(error, errors.ProducerFencedError) and version < _FENCED_SINCE[api_key]:
        return errors.InvalidProducerEpochError(error.message)
    return error


def refusal(api_key: int, request: Any) -> errors.DeltaBusError | None:
    """The check of a whole transaction request: WRITE on its transactional id."""
    access = current_access()
    if api_key == ADD_PARTITIONS_TO_TXN:
        return access.transactional_id(Operation.WRITE, request.v3_and_below_transactional_id)
    if api_key in (ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT):
        return access.transactional_id(Operation.WRITE, request.transactional_id)
    return None


class KafkaTxnApis:
    """The transaction APIs; `transactions` None on a broker."""

    def __init__(self, transactions: TransactionHandler | None,
                 groups: GroupCoordinator | None = None) -> None:
        """`groups`: the group coordinator, which checks TxnOffsetCommit's member."""
        self._transactions = transactions
        self._groups = groups
        # Whether broker `node` coordinates a transactional id, for a broker's
        # ListTransactions (admin clients ask every broker and join the answers).
        self.coordinated_by: Callable[[str, int], bool] = lambda key, node: True
        self.apis = {
            ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn, END_TXN: self.end_txn,
            TXN_OFFSET_COMMIT: self.txn_offset_commit,
            DESCRIBE_TRANSACTIONS: self.describe_transactions,
            LIST_TRANSACTIONS: self.list_transactions,
        }

    def _coordinator(self) -> TransactionHandler:
        if self._transactions is None:
            raise errors.NotCoordinatorError(
                "this broker is not the transaction coordinator: ask FindCoordinator")
        return self._transactions

    def init_producer_id(self, version: int, request: Any) -> tuple[int, int, Any]:
        """InitProducerId of a transactional producer: (producer id, epoch, error). An id no
        coordinator would keep is INVALID_REQUEST wherever it is sent, before NOT_COORDINATOR."""
        try:
            cfg.check_transactional_id(request.transactional_id)
            producer_id, epoch = self._coordinator().init_transactional_producer(
                request.transactional_id,
                int(request.transaction_timeout.total_seconds() * 1000),
                current_access().principal,
                (getattr(request, "producer_id", -1), getattr(request, "producer_epoch", -1)))
        except errors.DeltaBusError as e:
            return -1, -1, _answered(INIT_PRODUCER_ID, version, e)
        return producer_id, epoch, None

    def add_partitions_to_txn(self, version: int, request: Any,
                              refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(ADD_PARTITIONS_TO_TXN, version)
        topic_cls, partition_cls = (nested(cls, n) for n in (
            "AddPartitionsToTxnTopicResult", "AddPartitionsToTxnPartitionResult"))
        asked = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
        answers = self._add_partitions(request, asked, refused)
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), error in answers.items():
            by_topic.setdefault(topic, []).append(make(
                partition_cls, partition_index=partition,
                partition_error_code=error_code(_answered(ADD_PARTITIONS_TO_TXN, version,
                                                          error))))
        return make(cls, throttle_time=NO_TIME, results_by_topic_v3_and_below=tuple(
            make(topic_cls, name=name, results_by_partition=tuple(parts))
            for name, parts in by_topic.items()))

    def _add_partitions(self, request: Any, asked: list[tuple[str, int]],
                        refused: errors.DeltaBusError | None
                        ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        """Each partition's answer: a topic the producer may not WRITE fails the request
        (TOPIC_AUTHORIZATION_FAILED for it, OPERATION_NOT_ATTEMPTED for the rest), as Kafka."""
        access = current_access()
        denied = {t: e for t, _ in asked if (e := access.topic(Operation.WRITE, t)) is not None}
        if refused is None and denied:
            return {tp: denied.get(tp[0]) or errors.OperationNotAttemptedError(
                "another topic of the request is not authorized") for tp in asked}
        try:
            if refused is not None:
                raise refused
            return self._coordinator().add_partitions_to_txn(
                request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
                request.v3_and_below_producer_epoch, asked)
        except errors.DeltaBusError as e:
            return dict.fromkeys(asked, e)

    def add_offsets_to_txn(self, version: int, request: Any,
                           refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(ADD_OFFSETS_TO_TXN, version)
        error = refused or current_access().group(Operation.READ, request.group_id)
        if error is None:
            try:
                self._coordinator().add_offsets_to_txn(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    request.group_id)
            except errors.DeltaBusError as e:
                error = e
        return make(cls, throttle_time=NO_TIME,
                    error_code=error_code(_answered(ADD_OFFSETS_TO_TXN, version, error)))

    def end_txn(self, version: int, request: Any,
                refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(END_TXN, version)
        error = refused
        if error is None:
            try:
                self._coordinator().end_txn(request.transactional_id, request.producer_id,
                                            request.producer_epoch, request.committed)
            except errors.DeltaBusError as e:
                error = e
        return make(cls, throttle_time=NO_TIME,
                    error_code=error_code(_answered(END_TXN, version, error)))

    def txn_offset_commit(self, version: int, request: Any,
                          refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(TXN_OFFSET_COMMIT, version)
        topic_cls, partition_cls = (nested(cls, n) for n in (
            "TxnOffsetCommitResponseTopic", "TxnOffsetCommitResponsePartition"))
        access = current_access()
        refused = refused or access.group(Operation.READ, request.group_id)
        answers = commit_txn_offsets(
            self._coordinator(), self._groups, access, refused, request,
            (getattr(request, "member_id", ""), getattr(request, "generation_id", -1),
             getattr(request, "group_instance_id", None)),
            ((t.name, p.partition_index, p.committed_offset,
              getattr(p, "committed_leader_epoch", -1), p.committed_metadata or "")
             for t in request.topics for p in t.partitions))
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), error in answers.items():
            by_topic.setdefault(topic, []).append(make(
                partition_cls, partition_index=partition,
                error_code=error_code(_answered(TXN_OFFSET_COMMIT, version, error))))
        return make(cls, throttle_time=NO_TIME, topics=tuple(
            make(topic_cls, name=name, partitions=tuple(parts))
            for name, parts in by_topic.items()))

    def list_transactions(self, version: int, request: Any,
                          refused: errors.DeltaBusError | None = None, node: int | None = None
                          ) -> Any:
        """The transactions the asked broker coordinates (`node`: a broker's forwarded
        request); every one where the request came to the driver itself."""
        cls = load_response_schema(LIST_TRANSACTIONS, version)
        state_cls = nested(cls, "TransactionState")
        states = list(request.state_filters)
        unknown = tuple(s for s in states if s not in TXN_STATES)
        listed: list[TransactionMetadata] = []
        if refused is None and self._transactions is not None:
            access = current_access()
            listed = [t for t in self._transactions.list_transactions(
                states, list(request.producer_id_filters),
                getattr(request, "duration_filter", -1))
                if access.allows(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                                 t.transactional_id)
                and (node is None or self.coordinated_by(t.transactional_id, node))]
        return make(cls, throttle_time=NO_TIME, error_code=error_code(refused),
                    unknown_state_filters=unknown, transaction_states=tuple(
                        make(state_cls, transactional_id=t.transactional_id,
                             producer_id=t.producer_id, transaction_state=t.state)
                        for t in listed))

    def describe_transactions(self, version: int, request: Any,
                              refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(DESCRIBE_TRANSACTIONS, version)
        state_cls, topic_cls = nested(cls, "TransactionState"), nested(cls, "TopicData")
        ids = list(request.transactional_ids)
        access = current_access()
        allowed = [i for i in ids if refused is None
                   and access.transactional_id(Operation.DESCRIBE, i) is None]
        found: dict[str, TransactionMetadata | None] = {}
        coordinator_error: errors.DeltaBusError | None = refused
        try:
            if allowed:
                found = self._coordinator().describe_transactions(allowed)
        except errors.DeltaBusError as e:
            coordinator_error = e
        out = []
        for i in ids:
            txn = found.get(i)
            error = (coordinator_error or access.transactional_id(Operation.DESCRIBE, i) or (
                None if txn is not None else errors.TransactionalIdNotFoundError(
                    f"no transactional id {i!r}")))
            out.append(_described(state_cls, topic_cls, i, txn if error is None else None,
                                  error))
        return make(cls, throttle_time=NO_TIME, transaction_states=tuple(out))


def _described(state_cls: Any, topic_cls: Any, transactional_id: str,
               txn: TransactionMetadata | None, error: errors.DeltaBusError | None) -> Any:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(txn.partitions if txn else ()):
        by_topic.setdefault(topic, []).append(partition)
    start_ms = txn.start_ms if txn else -1
    return make(state_cls, error_code=error_code(error), transactional_id=transactional_id,
                transaction_state=txn.state if txn else "",
                transaction_timeout=timedelta(milliseconds=txn.timeout_ms if txn else 0),
                transaction_start_time=datetime.fromtimestamp(start_ms / 1000, tz=UTC),
                producer_id=txn.producer_id if txn else -1,
                producer_epoch=txn.producer_epoch if txn else -1,
                topics=tuple(make(topic_cls, topic=t, partitions=tuple(ps))
                             for t, ps in by_topic.items()))
