"""gRPC servicer methods of the transaction calls: the admin view (ListTransactions,
DescribeTransactions) and a transactional producer's (InitProducerId with a transaction timeout,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn): decode, call the request layer
(rpc/txn_requests.py, where the rules and ACLs live), encode; errors travel as Kafka codes in
the response.
"""

from __future__ import annotations

from typing import Any

from deltabus import errors
from deltabus.rpc.access import Access
from deltabus.rpc.codec import present_or
from deltabus.rpc.request_layer import RequestLayer
from deltabus.rpc.txn_requests import InitProducerIdRequest, PartitionAnswers, TxnProducer
from deltabus.rpc.v1 import deltabus_pb2 as pb


def _results(answers: PartitionAnswers) -> list[pb.PartitionResult]:
    return [pb.PartitionResult(topic=t, partition=p, error_code=e.code if e else 0,
                               error_message=e.message if e else "")
            for (t, p), e in answers.items()]


def _producer(request: Any) -> TxnProducer:
    return TxnProducer(request.transactional_id, request.producer_id, request.producer_epoch)


class TxnServicerMixin:
    """The transaction calls of `DeltaBusServicer`."""

    _requests: RequestLayer

    def _access(self, context: Any) -> Access:  # DeltaBusServicer's
        raise NotImplementedError

    def _init_transactions(self, request: pb.InitProducerIdRequest,
                           context: Any) -> pb.InitProducerIdResponse:
        """InitProducerId with a transaction timeout: the epoch bumped (the server's
        InitProducerId calls this when transaction_timeout_ms is present)."""
        try:
            producer_id, epoch = self._requests.txn.init_producer_id(
                self._access(context), InitProducerIdRequest(
                    request.transactional_id,
                    request.transaction_timeout_ms,
                    present_or(request, "producer_id", -1),
                    present_or(request, "producer_epoch", -1)))
        except errors.DeltaBusError as e:
            return pb.InitProducerIdResponse(error_code=e.code, error_message=e.message,
                                             producer_id=-1, producer_epoch=-1)
        return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)

    def AddPartitionsToTxn(self, request: pb.AddPartitionsToTxnRequest,
                           context: Any) -> pb.AddPartitionsToTxnResponse:
        return pb.AddPartitionsToTxnResponse(results=_results(
            self._requests.txn.add_partitions_to_txn(
                self._access(context), _producer(request),
                [(tp.topic, p) for tp in request.topic_partitions for p in tp.partitions])))

    def AddOffsetsToTxn(self, request: pb.AddOffsetsToTxnRequest,
                        context: Any) -> pb.AddOffsetsToTxnResponse:
        try:
            self._requests.txn.add_offsets_to_txn(self._access(context), _producer(request),
                                                  request.group_id)
        except errors.DeltaBusError as e:
            return pb.AddOffsetsToTxnResponse(error_code=e.code, error_message=e.message)
        return pb.AddOffsetsToTxnResponse()

    def TxnOffsetCommit(self, request: pb.TxnOffsetCommitRequest,
                        context: Any) -> pb.TxnOffsetCommitResponse:
        return pb.TxnOffsetCommitResponse(results=_results(self._requests.txn.txn_offset_commit(
            self._access(context), _producer(request), request.group_id,
            (request.member_id, present_or(request, "generation_id", -1),
             request.group_instance_id if request.HasField("group_instance_id") else None),
            [(p.topic, p.partition, p.committed_offset,
              present_or(p, "committed_leader_epoch", -1), p.metadata)
             for p in request.partitions])))

    def EndTxn(self, request: pb.EndTxnRequest, context: Any) -> pb.EndTxnResponse:
        try:
            self._requests.txn.end_txn(self._access(context), _producer(request),
                                       request.committed)
        except errors.DeltaBusError as e:
            return pb.EndTxnResponse(error_code=e.code, error_message=e.message)
        return pb.EndTxnResponse()

    def ListTransactions(self, request: pb.ListTransactionsRequest,
                         context: Any) -> pb.ListTransactionsResponse:
        listed = self._requests.txn.list_transactions(
            self._access(context), list(request.state_filters),
            list(request.producer_id_filters),
            request.duration_filter_ms if request.HasField("duration_filter_ms") else -1)
        return pb.ListTransactionsResponse(transactions=[
            pb.ListedTransaction(transactional_id=t.transactional_id, producer_id=t.producer_id,
                                 state=t.state) for t in listed])

    def DescribeTransactions(self, request: pb.DescribeTransactionsRequest,
                             context: Any) -> pb.DescribeTransactionsResponse:
        response = pb.DescribeTransactionsResponse()
        for d in self._requests.txn.describe_transactions(self._access(context),
                                                          list(request.transactional_ids)):
            txn = d.transaction
            if txn is None:
                error = d.error or errors.UnknownServerError("no transaction")
                response.transactions.append(pb.DescribedTransaction(
                    transactional_id=d.transactional_id, error_code=error.code,
                    error_message=error.message))
                continue
            response.transactions.append(pb.DescribedTransaction(
                transactional_id=d.transactional_id, state=txn.state,
                producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
                transaction_timeout_ms=txn.timeout_ms, transaction_start_time_ms=txn.start_ms,
                partitions=[pb.TransactionPartition(topic=t, partition=p)
                            for t, p in sorted(txn.partitions)]))
        return response
