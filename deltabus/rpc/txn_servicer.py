"""gRPC servicer methods of the transaction admin calls (ListTransactions, DescribeTransactions):
decode, call the transaction coordinator, encode. A server without one (a broker) lists nothing
and describes with NOT_COORDINATOR, as a Kafka broker answers for transactional ids it does not
coordinate; clients find the coordinator with FindCoordinator (key type 1). ACLs as Kafka's:
DESCRIBE on each transactional id (ListTransactions leaves the others out).
"""

from __future__ import annotations

from typing import Any

from deltabus import errors
from deltabus.acls import Operation, ResourceType
from deltabus.cluster.handler import TransactionHandler
from deltabus.rpc.access import Access
from deltabus.rpc.v1 import deltabus_pb2 as pb


class TxnServicerMixin:
    """The transaction calls of `DeltaBusServicer`; `_transactions` is the coordinator, or
    None."""

    _transactions: TransactionHandler | None

    def _access(self, context: Any) -> Access:  # DeltaBusServicer's
        raise NotImplementedError

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
