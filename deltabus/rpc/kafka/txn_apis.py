"""Kafka's transaction APIs (KIP-98, KIP-664) over the transaction coordinator, which lives in
the driver beside the group coordinator: FindCoordinator (key type 1) names a live broker,
whose listener passes these APIs on to the driver's, whose `transactions` is the controller
(`listener`, Kafka's Envelope). A broker's ListTransactions lists the transactional ids
FindCoordinator sends to it, so admin clients that ask every broker list each once.

The rules and ACLs are the request layer's (rpc/txn_requests.py); this module decodes, calls it
and encodes. PRODUCER_FENCED is answered as INVALID_PRODUCER_EPOCH to versions older than
KIP-588's.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from deltabus import errors
from deltabus.metadata import TXN_STATES, TransactionMetadata
from deltabus.rpc import txn_requests
from deltabus.rpc.access import current_access
from deltabus.rpc.kafka.frames import NO_TIME, error_code, load_response_schema, make, nested
from deltabus.rpc.txn_requests import InitProducerIdRequest, TxnProducer, TxnRequests

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


class KafkaTxnApis:
    """The transaction APIs; `transactions` None on a broker."""

    def __init__(self, requests: TxnRequests) -> None:
        self._requests = requests
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

    def init_producer_id(self, version: int, request: Any) -> tuple[int, int, Any]:
        """InitProducerId: (producer id, epoch, error)."""
        try:
            producer_id, epoch = self._requests.init_producer_id(
                current_access(), InitProducerIdRequest(
                    request.transactional_id,
                    None if request.transactional_id is None
                    else int(request.transaction_timeout.total_seconds() * 1000),
                    getattr(request, "producer_id", -1), getattr(request, "producer_epoch", -1)))
        except errors.DeltaBusError as e:
            return -1, -1, _answered(INIT_PRODUCER_ID, version, e)
        return producer_id, epoch, None

    def add_partitions_to_txn(self, version: int, request: Any,
                              refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(ADD_PARTITIONS_TO_TXN, version)
        topic_cls, partition_cls = (nested(cls, n) for n in (
            "AddPartitionsToTxnTopicResult", "AddPartitionsToTxnPartitionResult"))
        asked = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
        answers = (dict.fromkeys(asked, refused) if refused is not None
                   else self._requests.add_partitions_to_txn(current_access(), TxnProducer(
                       request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
                       request.v3_and_below_producer_epoch), asked))
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), error in answers.items():
            by_topic.setdefault(topic, []).append(make(
                partition_cls, partition_index=partition,
                partition_error_code=error_code(_answered(ADD_PARTITIONS_TO_TXN, version,
                                                          error))))
        return make(cls, throttle_time=NO_TIME, results_by_topic_v3_and_below=tuple(
            make(topic_cls, name=name, results_by_partition=tuple(parts))
            for name, parts in by_topic.items()))

    def add_offsets_to_txn(self, version: int, request: Any,
                           refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(ADD_OFFSETS_TO_TXN, version)
        error = refused
        if error is None:
            try:
                self._requests.add_offsets_to_txn(current_access(), _producer(request),
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
                self._requests.end_txn(current_access(), _producer(request), request.committed)
            except errors.DeltaBusError as e:
                error = e
        return make(cls, throttle_time=NO_TIME,
                    error_code=error_code(_answered(END_TXN, version, error)))

    def txn_offset_commit(self, version: int, request: Any,
                          refused: errors.DeltaBusError | None = None) -> Any:
        cls = load_response_schema(TXN_OFFSET_COMMIT, version)
        topic_cls, partition_cls = (nested(cls, n) for n in (
            "TxnOffsetCommitResponseTopic", "TxnOffsetCommitResponsePartition"))
        offsets = [(t.name, p.partition_index, p.committed_offset,
                    getattr(p, "committed_leader_epoch", -1), p.committed_metadata or "")
                   for t in request.topics for p in t.partitions]
        answers = (dict.fromkeys(((t, p) for t, p, *_ in offsets), refused)
                   if refused is not None else self._requests.txn_offset_commit(
                       current_access(), _producer(request), request.group_id,
                       (getattr(request, "member_id", ""), getattr(request, "generation_id", -1),
                        getattr(request, "group_instance_id", None)), offsets))
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
        if refused is None:
            listed = self._requests.list_transactions(
                current_access(), states, list(request.producer_id_filters),
                getattr(request, "duration_filter", -1),
                shown=lambda key: node is None or self.coordinated_by(key, node))
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
        described = ([txn_requests.DescribedTransaction(i, None, refused) for i in ids]
                     if refused is not None
                     else self._requests.describe_transactions(current_access(), ids))
        return make(cls, throttle_time=NO_TIME, transaction_states=tuple(
            _described(state_cls, topic_cls, d.transactional_id, d.transaction, d.error)
            for d in described))


def _producer(request: Any) -> TxnProducer:
    return TxnProducer(request.transactional_id, request.producer_id, request.producer_epoch)


def _described(state_cls: Any, topic_cls: Any, transactional_id: str,
               txn: TransactionMetadata | None, error: errors.DeltaBusError | None) -> Any:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(txn.partitions if txn else ()):
        by_topic.setdefault(topic, []).append(partition)
    start_ms = txn.start_ms if txn else 0  # Kafka's default where the entry is an error
    return make(state_cls, error_code=error_code(error), transactional_id=transactional_id,
                transaction_state=txn.state if txn else "",
                transaction_timeout=timedelta(milliseconds=txn.timeout_ms if txn else 0),
                transaction_start_time=datetime.fromtimestamp(start_ms / 1000, tz=UTC),
                producer_id=txn.producer_id if txn else -1,
                producer_epoch=txn.producer_epoch if txn else -1,
                topics=tuple(make(topic_cls, topic=t, partitions=tuple(ps))
                             for t, ps in by_topic.items()))
