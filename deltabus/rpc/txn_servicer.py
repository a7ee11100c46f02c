"""gRPC servicer methods of the transaction calls: the admin view (ListTransactions,
DescribeTransactions) and a transactional producer's (InitProducerId with a transaction timeout,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn): decode, call the transaction
coordinator, encode; errors travel as Kafka codes in the response. A server without one (a
broker) lists nothing and answers NOT_COORDINATOR, as a Kafka broker answers for transactional ids
it does not coordinate; clients find the coordinator with FindCoordinator (key type 1). ACLs as
Kafka's: DESCRIBE on each transactional id (ListTransactions leaves the others out); WRITE on it
for the producer's calls, WRITE on each topic added, READ on the group and each topic committed
(as the Kafka door, rpc/kafka/txn_apis.py).
"""

from __future__ import annotations

from typing import Any

from deltabus import errors
from deltabus.cluster.handler import TransactionHandler
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.rpc.access import Access
from deltabus.rpc.codec import present_or
from deltabus.rpc.txn_offsets import PartitionAnswers, commit_txn_offsets
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.security.acls import Operation, ResourceType


def _results(answers: PartitionAnswers) -> list[pb.PartitionResult]:
    return [pb.PartitionResult(topic=t, partition=p, error_code=e.code if e else 0,
                               error_message=e.message if e else "")
            for (t, p), e in answers.items()]


class TxnServicerMixin:
    """The transaction calls of `DeltaBusServicer`; `_transactions` is the coordinator, or
    None."""

    _transactions: TransactionHandler | None
    _groups: GroupCoordinator | None

    def _access(self, context: Any) -> Access:  # DeltaBusServicer's
        raise NotImplementedError

    def _txn_coordinator(self) -> TransactionHandler:
        if self._transactions is None:
            raise errors.NotCoordinatorError(
                "this server is not the transaction coordinator: ask FindCoordinator")
        return self._transactions

    def _init_transactions(self, request: pb.InitProducerIdRequest,
                                    context: Any) -> pb.InitProducerIdResponse:
        """InitProducerId with a transaction timeout: the epoch bumped (the server's
        InitProducerId calls this when transaction_timeout_ms is present)."""
        try:
            access = self._access(context)
            Access.raise_if(access.transactional_id(Operation.WRITE, request.transactional_id))
            producer_id, epoch = self._txn_coordinator().init_transactional_producer(
                request.transactional_id, request.transaction_timeout_ms, access.principal,
                (present_or(request, "producer_id", -1), present_or(request, "producer_epoch", -1)))
        except errors.DeltaBusError as e:
            return pb.InitProducerIdResponse(error_code=e.code, error_message=e.message,
                                             producer_id=-1, producer_epoch=-1)
        return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)

    def AddPartitionsToTxn(self, request: pb.AddPartitionsToTxnRequest,
                           context: Any) -> pb.AddPartitionsToTxnResponse:
        asked = [(tp.topic, p) for tp in request.topic_partitions for p in tp.partitions]
        access = self._access(context)
        refused = access.transactional_id(Operation.WRITE, request.transactional_id)
        denied = {t: e for t, _ in asked if (e := access.topic(Operation.WRITE, t)) is not None}
        answers: PartitionAnswers
        if refused is None and denied:  # as Kafka: the others are not attempted
            answers = {tp: denied.get(tp[0]) or errors.OperationNotAttemptedError(
                "another topic of the request is not authorized") for tp in asked}
        else:
            try:
                Access.raise_if(refused)
                answers = self._txn_coordinator().add_partitions_to_txn(
                    request.transactional_id, request.producer_id, request.producer_epoch,
                    asked)
            except errors.DeltaBusError as e:
                answers = dict.fromkeys(asked, e)
        return pb.AddPartitionsToTxnResponse(results=_results(answers))

    def AddOffsetsToTxn(self, request: pb.AddOffsetsToTxnRequest,
                        context: Any) -> pb.AddOffsetsToTxnResponse:
        try:
            access = self._access(context)
            Access.raise_if(access.transactional_id(Operation.WRITE, request.transactional_id)
                            or access.group(Operation.READ, request.group_id))
            self._txn_coordinator().add_offsets_to_txn(
                request.transactional_id, request.producer_id, request.producer_epoch,
                request.group_id)
        except errors.DeltaBusError as e:
            return pb.AddOffsetsToTxnResponse(error_code=e.code, error_message=e.message)
        return pb.AddOffsetsToTxnResponse()

    def TxnOffsetCommit(self, request: pb.TxnOffsetCommitRequest,
                        context: Any) -> pb.TxnOffsetCommitResponse:
        access = self._access(context)
        refused = (access.transactional_id(Operation.WRITE, request.transactional_id)
                   or access.group(Operation.READ, request.group_id))
        answers = commit_txn_offsets(
            self._txn_coordinator(), self._groups, access, refused, request,
            (request.member_id, present_or(request, "generation_id", -1),
             request.group_instance_id if request.HasField("group_instance_id") else None),
            ((p.topic, p.partition, p.committed_offset,
              present_or(p, "committed_leader_epoch", -1), p.metadata)
             for p in request.partitions))
        return pb.TxnOffsetCommitResponse(results=_results(answers))

    def EndTxn(self, request: pb.EndTxnRequest, context: Any) -> pb.EndTxnResponse:
        try:
            Access.raise_if(self._access(context).transactional_id(
                Operation.WRITE, request.transactional_id))
            self._txn_coordinator().end_txn(request.transactional_id, request.producer_id,
                                             request.producer_epoch, request.committed)
        except errors.DeltaBusError as e:
            return pb.EndTxnResponse(error_code=e.code, error_message=e.message)
        return pb.EndTxnResponse()

    def ListTransactions(self, request: pb.ListTransactionsRequest,
                         context: Any) -> pb.ListTransactionsResponse:
        if self._transactions is None:
            return pb.ListTransactionsResponse()
        access = self._access(context)
        duration_ms = (request.duration_filter_ms if request.HasField("duration_filter_ms")
                       else -1)
        listed = self._transactions.list_transactions(
            list(request.state_filters), list(request.producer_id_filters), duration_ms)
        return pb.ListTransactionsResponse(transactions=[
            pb.ListedTransaction(transactional_id=t.transactional_id, producer_id=t.producer_id,
                                 state=t.state) for t in listed
            if access.allows(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                             t.transactional_id)])

    def DescribeTransactions(self, request: pb.DescribeTransactionsRequest,
                             context: Any) -> pb.DescribeTransactionsResponse:
        access = self._access(context)
        response = pb.DescribeTransactionsResponse()
        for txn_id in request.transactional_ids:
            try:
                Access.raise_if(access.transactional_id(Operation.DESCRIBE, txn_id))
                if self._transactions is None:
                    raise errors.NotCoordinatorError(
                        "this server is not the transaction coordinator: ask FindCoordinator")
                txn = self._transactions.describe_transactions([txn_id]).get(txn_id)
                if txn is None:
                    raise errors.TransactionalIdNotFoundError(f"no transactional id {txn_id!r}")
            except errors.DeltaBusError as e:
                response.transactions.append(pb.DescribedTransaction(
                    transactional_id=txn_id, error_code=e.code, error_message=e.message))
                continue
            response.transactions.append(pb.DescribedTransaction(
                transactional_id=txn_id, state=txn.state, producer_id=txn.producer_id,
                producer_epoch=txn.producer_epoch, transaction_timeout_ms=txn.timeout_ms,
                transaction_start_time_ms=txn.start_ms, partitions=[
                    pb.TransactionPartition(topic=t, partition=p)
                    for t, p in sorted(txn.partitions)]))
        return response
