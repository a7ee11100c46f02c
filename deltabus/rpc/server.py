"""gRPC servicers: decode a request, call the domain object, encode the answer. Nothing else.

`DeltaBusServicer` wraps any `DeltaBusHandler` (the controller's or a broker's); per-partition
failures become Kafka error codes in the response, a request that cannot be read at all becomes a
gRPC status with the Kafka code in trailing metadata (`deltabus-error-code`). An `optional` field
the client left out gets Kafka's default here (`codec.present_or`), as deltabus.proto documents
field by field.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from typing import Any

import grpc

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import (
    DeltaBusHandler,
    FetchResult,
    FetchSpec,
    LifecycleHandler,
    TransactionHandler,
    TxnMarkerHandler,
)
from deltabus.listeners import ListenerBindError
from deltabus.log_tables.partition_log import LATEST_TIMESTAMP
from deltabus.log_tables.transactions import consumed_rows
from deltabus.metrics import RequestMeters
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.records import ProducerState, UnpackBudget
from deltabus.rpc import admin_requests, codec, request_layer, status, throttling, txn_requests
from deltabus.rpc.access import (
    Access,
    grpc_client_id,
    peer_host,
)
from deltabus.rpc.acl_servicer import AclServicerMixin
from deltabus.rpc.authentication import Authenticator, CredentialLookup
from deltabus.rpc.call_authentication import CallAuthenticator, current_principal
from deltabus.rpc.codec import present_or
from deltabus.rpc.fetch_size import FetchBudget
from deltabus.rpc.group_servicer import GroupServicerMixin
from deltabus.rpc.inter_broker import InterBrokerAuthorizer
from deltabus.rpc.internal_servicer import (
    BrokerLifecycleServicer,
    ForwardedKafkaRequests,
    KafkaForwardServicer,
    ReplicaFetchServicer,
    TxnMarkersServicer,
)
from deltabus.rpc.schema_servicer import SchemaServicerMixin
from deltabus.rpc.share_servicer import ShareServicerMixin
from deltabus.rpc.share_state_rpc import ShareGroupStateServicer
from deltabus.rpc.tls import grpc_server_credentials
from deltabus.rpc.txn_servicer import TxnServicerMixin
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from deltabus.rpc.v1 import internal_pb2_grpc as ipb_grpc

log = logging.getLogger(__name__)

PLAINTEXT = cfg.ListenerSecurity()

def _guard(method: Callable) -> Callable:
    """Request-level DeltaBusErrors become a gRPC status; anything else is a server bug."""
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except errors.DeltaBusError as e:
            status.abort(context, e)
    wrapper.__name__ = method.__name__
    return wrapper


def _admin_timeout_ms(request: Any) -> int:
    """An admin request's timeout_ms; absent: the default, 0: do not wait for the brokers."""
    return max(0, present_or(request, "timeout_ms", cfg.ADMIN_TIMEOUT_MS_DEFAULT))


def _code(error: errors.DeltaBusError | None) -> tuple[int, str]:
    return (error.code, error.message) if error else (0, "")


def _produced_batches(data: pb.PartitionProduceData, transactional: bool,
                      budget: UnpackBudget) -> list[request_layer.RequestBatch]:
    """A partition entry's one batch, for the request layer (which calls this only once the
    partition is allowed)."""
    batch = codec.produce_batch_from_proto(data, budget)
    producer = (ProducerState(data.producer_id, data.producer_epoch, data.base_sequence,
                              transactional)
                if data.HasField("producer_id") and data.producer_id >= 0 else ProducerState())
    return [request_layer.RequestBatch(batch, producer, transactional)]


def _repeated_field_bytes(message_bytes: int) -> int:
    """What one message of a repeated field adds to its parent: tag, length varint, message."""
    return 1 + max(1, (message_bytes.bit_length() + 6) // 7) + message_bytes


def _put_records(entry: pb.FetchPartitionResponse, result: FetchResult, budget: FetchBudget,
                 partition_max_bytes: int, record_format: int) -> None:
    """A partition's records into its answer, within the budget: never a transaction marker,
    nor (read_committed) a record of an aborted transaction. When every record read goes,
    `next_offset` says where the next fetch starts (past trailing markers: the consumer's
    position moves past what it never gets, as a Kafka consumer moves past control batches)."""
    assert result.records is not None
    read_end = result.records.column("offset")[-1].as_py() + 1
    rows = consumed_rows(result.records, result.aborted_transactions or ())
    carried = 0
    if rows.num_rows and record_format == pb.PROTO:
        records = codec.table_to_records(rows)
        sizes = [_repeated_field_bytes(record.ByteSize()) for record in records]
        carried = budget.fit_sized(sizes, partition_max_bytes)
        entry.records.extend(records[:carried])
    elif rows.num_rows:
        prefix, entry.arrow_records = budget.fit(rows, partition_max_bytes,
                                                 codec.table_to_arrow_records)
        carried = prefix.num_rows
    if carried == rows.num_rows:
        entry.next_offset = read_end


class DeltaBusServicer(GroupServicerMixin, ShareServicerMixin, AclServicerMixin,
                       TxnServicerMixin, SchemaServicerMixin, pb_grpc.DeltaBusServicer):
    def __init__(self, handler: DeltaBusHandler, groups: GroupCoordinator | None = None,
                 listener: str = "", long_polls_max: int = 32,
                 transactions: TransactionHandler | None = None) -> None:
        """`listener`: the name of the listener this servicer answers on; Metadata and
        FindCoordinator name nodes by their endpoints of it ("": as registered).
        `long_polls_max`: how many Fetches may wait for records at once, each on a server
        thread (`Fetch`)."""
        self._handler = handler
        self._groups = groups
        self._transactions = transactions
        self._listener = listener
        self._long_polls = threading.BoundedSemaphore(max(1, long_polls_max))
        self._requests = request_layer.RequestLayer(handler, groups, transactions)

    def _access(self, context: Any) -> Access:
        """Who is calling (rpc.call_authentication) and what the cluster's ACLs let them do."""
        return Access(self._handler.authorizer(), current_principal(), peer_host(context),
                      grpc_client_id(context))

    def _hold(self, access: Access) -> None:
        """A caller still within the throttle time it was given (a client that did not wait)
        waits the rest of it here (`rpc.throttling`)."""
        held = throttling.held_ms(self._handler, access)
        if held:
            time.sleep(held / 1000)

    def FindCoordinator(self, request: pb.FindCoordinatorRequest,
                        context: Any) -> pb.FindCoordinatorResponse:
        try:
            self._requests.groups.check_find_coordinator(self._access(context), request.key,
                                                         request.key_type)
            node = self._handler.find_coordinator(request.key)
        except errors.DeltaBusError as e:
            return pb.FindCoordinatorResponse(error_code=e.code, error_message=e.message)
        seen = node.on_listener(self._listener)
        if seen is None:
            error = errors.CoordinatorNotAvailableError(
                f"the group coordinator has no listener {self._listener}")
            return pb.FindCoordinatorResponse(error_code=error.code, error_message=error.message)
        return pb.FindCoordinatorResponse(node_id=seen.broker_id, host=seen.host, port=seen.port)

    @_guard
    def Metadata(self, request: pb.MetadataRequest, context: Any) -> pb.MetadataResponse:
        topics = list(request.topics)
        image, refused = self._requests.metadata(
            self._access(context), topics, present_or(request, "allow_auto_topic_creation", True))
        return codec.image_to_proto(image.on_listener(self._listener), topics, refused)

    @_guard
    def CreateTopics(self, request: pb.CreateTopicsRequest,
                     context: Any) -> pb.CreateTopicsResponse:
        results = self._requests.admin.create_topics(
            self._access(context), [codec.new_topic_from_proto(t) for t in request.topics],
            _admin_timeout_ms(request), request.validate_only)
        return pb.CreateTopicsResponse(topics=[codec.topic_result_to_proto(r) for r in results])

    @_guard
    def DeleteTopics(self, request: pb.DeleteTopicsRequest,
                     context: Any) -> pb.DeleteTopicsResponse:
        results = self._requests.admin.delete_topics(self._access(context), list(request.topics),
                                                     _admin_timeout_ms(request))
        return pb.DeleteTopicsResponse(topics=[codec.topic_result_to_proto(r) for r in results])

    @_guard
    def DescribeTopics(self, request: pb.DescribeTopicsRequest,
                       context: Any) -> pb.DescribeTopicsResponse:
        topics = list(request.topics)
        image, refused = self._requests.metadata(self._access(context), topics, False)
        return pb.DescribeTopicsResponse(
            topics=codec.image_to_proto(image, topics, refused).topics)

    @_guard
    def CreatePartitions(self, request: pb.CreatePartitionsRequest,
                         context: Any) -> pb.CreatePartitionsResponse:
        results = self._requests.admin.create_partitions(
            self._access(context), [(t.name, t.count) for t in request.topics],
            _admin_timeout_ms(request), request.validate_only)
        return pb.CreatePartitionsResponse(topics=[codec.topic_result_to_proto(r)
                                                   for r in results])

    @_guard
    def DescribeConfigs(self, request: pb.DescribeConfigsRequest,
                        context: Any) -> pb.DescribeConfigsResponse:
        found = self._requests.admin.describe_configs(
            self._access(context), [(r.resource_type, r.resource_name) for r in request.resources])
        response = pb.DescribeConfigsResponse()
        for r in request.resources:
            result = found.get((r.resource_type, r.resource_name))
            if result is None:
                continue  # named twice: answered once
            keys = set(r.configuration_keys)
            one = codec.describe_configs_response({r.resource_name: result if isinstance(
                result, errors.DeltaBusError) else [e for e in result
                                                     if not keys or e.name in keys]}).results[0]
            one.resource_type = r.resource_type
            response.results.append(one)
            del found[(r.resource_type, r.resource_name)]
        return response

    @_guard
    def IncrementalAlterConfigs(self, request: pb.IncrementalAlterConfigsRequest,
                                context: Any) -> pb.IncrementalAlterConfigsResponse:
        results = self._requests.admin.alter_configs(self._access(context), [
            admin_requests.ConfigChange(r.resource_type, r.resource_name,
                                        codec.alter_configs_changes(r))
            for r in request.resources], request.validate_only)
        return pb.IncrementalAlterConfigsResponse(responses=[
            pb.AlterConfigsResourceResponse(
                error_code=e.code if e else 0, error_message=e.message if e else "",
                resource_type=resource_type, resource_name=name)
            for (resource_type, name), e in results.items()])

    @_guard
    def Produce(self, request: pb.ProduceRequest, context: Any) -> pb.ProduceResponse:
        """Decodes each partition's batch (Arrow IPC or records) for the request layer, and
        waits here, on this server thread, for the acks it answers."""
        access = self._access(context)
        self._hold(access)
        started_s = time.thread_time()
        transactional_id = (request.transactional_id if request.HasField("transactional_id")
                            else None)
        acks = int(present_or(request, "acks", pb.ACKS_ALL))
        answer = self._requests.produce(access, request_layer.ProduceRequest(
            acks=acks,
            timeout_ms=max(0, present_or(request, "timeout_ms", cfg.PRODUCE_TIMEOUT_MS_DEFAULT)),
            partitions=[request_layer.ProducePartition(
                data.topic, data.partition, functools.partial(_produced_batches, data,
                                                              transactional_id is not None))
                for data in request.partitions],
            transactional_id=transactional_id, transactional=transactional_id is not None,
            size_bytes=request.ByteSize()))
        response = pb.ProduceResponse(throttle_time_ms=max(
            answer.throttle_ms, throttling.record_thread_time(self._handler, access, started_s)))
        for entry in answer.partitions:
            result, error = (entry.outcome(answer.deadline_s, answer.timeout_ms) if acks != 0
                             else (None, entry.error))
            code, message = _code(error)
            response.partitions.append(pb.PartitionProduceResponse(
                topic=entry.topic, partition=entry.partition, error_code=code,
                error_message=message,
                base_offset=result.base_offset if result else -1,
                log_append_time_ms=-1,
                log_start_offset=result.log_start_offset if result else -1))
        return response

    @_guard
    def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        access = self._access(context)
        self._hold(access)
        started_s = time.thread_time()
        max_wait_ms = present_or(request, "max_wait_ms", cfg.FETCH_MAX_WAIT_MS)
        # A long poll holds this server thread while it waits (grpcio's sync server): past
        # long_polls_max of them, a Fetch answers at once with what there is (issue 17's
        # interim; the Kafka door's fetches wait with no thread).
        waits = max_wait_ms > 0 and self._long_polls.acquire(blocking=False)
        try:
            answer = self._requests.fetch(access, request_layer.FetchRequest(
                partitions=[FetchSpec(p.topic, p.partition, p.fetch_offset,
                                      max(0, present_or(p, "partition_max_bytes",
                                                        cfg.FETCH_PARTITION_MAX_BYTES)),
                                      present_or(p, "current_leader_epoch", -1))
                            for p in request.partitions],
                max_wait_ms=max_wait_ms if waits else 0, min_bytes=request.min_bytes,
                max_bytes=present_or(request, "max_bytes", cfg.FETCH_MAX_BYTES),
                isolation_level=request.isolation_level))
            results = answer.results()
        finally:
            if waits:
                self._long_polls.release()
        record_format = present_or(request, "format", pb.PROTO)
        response = pb.FetchResponse()
        budget = FetchBudget(answer.max_bytes)  # Kafka's limits, on the bytes this answer carries
        for spec, r in zip(answer.partitions, results, strict=True):
            code, message = _code(r.error)
            entry = pb.FetchPartitionResponse(
                topic=r.topic, partition=r.partition, error_code=code, error_message=message,
                high_watermark=r.high_watermark, log_start_offset=r.log_start_offset,
                log_end_offset=r.log_end_offset, last_stable_offset=r.last_stable_offset)
            if r.records is not None and r.records.num_rows:
                _put_records(entry, r, budget, spec.max_bytes, record_format)
            response.partitions.append(entry)
        return self._throttled_fetch(response, access, started_s)

    def _throttled_fetch(self, response: pb.FetchResponse, access: Access,
                         started_s: float) -> pb.FetchResponse:
        """The answer with its throttle time; over consumer_byte_rate, without its records
        (they do not count), as Kafka answers a throttled fetch."""
        fetched = sum(len(p.arrow_records) + sum(r.ByteSize() for r in p.records)
                      for p in response.partitions)
        throttle_ms = self._requests.fetch_throttle_ms(access, fetched)
        if throttle_ms:
            for p in response.partitions:
                del p.records[:]
                p.arrow_records = b""
                p.next_offset = 0  # the records withheld are fetched again, not skipped
        response.throttle_time_ms = max(
            throttle_ms, throttling.record_thread_time(self._handler, access, started_s))
        return response

    @_guard
    def ListOffsets(self, request: pb.ListOffsetsRequest, context: Any) -> pb.ListOffsetsResponse:
        response = pb.ListOffsetsResponse()
        for entry in self._requests.list_offsets(self._access(context), request_layer.
                                                 ListOffsetsRequest(
                [(p.topic, p.partition, present_or(p, "timestamp", LATEST_TIMESTAMP))
                 for p in request.partitions], request.isolation_level)):
            code, message = _code(entry.error)
            response.partitions.append(pb.ListOffsetsPartitionResponse(
                topic=entry.topic, partition=entry.partition, offset=entry.offset,
                timestamp=entry.timestamp, leader_epoch=entry.leader_epoch, error_code=code,
                error_message=message))
        return response

    @_guard
    def DeleteRecords(self, request: pb.DeleteRecordsRequest,
                      context: Any) -> pb.DeleteRecordsResponse:
        """Kafka's DeleteRecords through the request layer; this server thread waits for the
        ISR, at most `timeout_ms` (absent: 30 s; 0: answered at once)."""
        answer = self._requests.delete_records(
            self._access(context), request_layer.DeleteRecordsRequest(
                [(p.topic, p.partition, p.offset) for p in request.partitions],
                present_or(request, "timeout_ms",
                           request_layer.DELETE_RECORDS_TIMEOUT_MS_DEFAULT)))
        response = pb.DeleteRecordsResponse()
        for entry in answer.partitions:
            low_watermark, error = entry.outcome(answer.deadline_s, answer.timeout_ms)
            code, message = _code(error)
            response.partitions.append(pb.DeleteRecordsPartitionResult(
                topic=entry.topic, partition=entry.partition, low_watermark=low_watermark,
                error_code=code, error_message=message))
        return response

    @_guard
    def OffsetForLeaderEpoch(self, request: pb.OffsetForLeaderEpochRequest,
                             context: Any) -> pb.OffsetForLeaderEpochResponse:
        response = pb.OffsetForLeaderEpochResponse()
        for entry in self._requests.offset_for_leader_epoch(self._access(context), [
                request_layer.EpochRequest(p.topic, p.partition, p.leader_epoch,
                                           present_or(p, "current_leader_epoch", -1))
                for p in request.partitions]):
            code, message = _code(entry.error)
            response.partitions.append(pb.EpochEndOffsetResult(
                topic=entry.topic, partition=entry.partition, leader_epoch=entry.leader_epoch,
                end_offset=entry.end_offset, error_code=code, error_message=message))
        return response

    @_guard
    def InitProducerId(self, request: pb.InitProducerIdRequest,
                       context: Any) -> pb.InitProducerIdResponse:
        if request.HasField("transaction_timeout_ms"):
            return self._init_transactions(request, context)
        producer_id, epoch = self._requests.txn.init_producer_id(
            self._access(context), txn_requests.InitProducerIdRequest(request.transactional_id))
        return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)

    @_guard
    def ElectLeaders(self, request: pb.ElectLeadersRequest,
                     context: Any) -> pb.ElectLeadersResponse:
        election_type = "unclean" if request.election_type == pb.UNCLEAN else "preferred"
        partitions = [(tp.topic, p) for tp in request.topic_partitions for p in tp.partitions]
        results = self._requests.admin.elect_leaders(self._access(context), election_type,
                                                     partitions or None)
        return pb.ElectLeadersResponse(results=codec.partition_results(results))

    @_guard
    def AlterPartitionReassignments(self, request: pb.AlterPartitionReassignmentsRequest,
                                    context: Any) -> pb.AlterPartitionReassignmentsResponse:
        results = self._requests.admin.reassign_partitions(
            self._access(context), codec.reassignment_targets(request))
        return pb.AlterPartitionReassignmentsResponse(results=codec.partition_results(results))

    @_guard
    def ScaleCluster(self, request: pb.ScaleClusterRequest,
                     context: Any) -> pb.ScaleClusterResponse:
        brokers = request.brokers if request.HasField("brokers") else None
        return codec.scale_status_to_proto(
            self._requests.admin.scale_cluster(self._access(context), brokers))

    @_guard
    def BalanceCluster(self, request: pb.BalanceClusterRequest,
                       context: Any) -> pb.BalanceClusterResponse:
        return codec.balance_plan_to_proto(
            self._requests.admin.balance_cluster(self._access(context), request.execute))

    @_guard
    def AlterUserScramCredentials(self, request: pb.AlterUserScramCredentialsRequest,
                                  context: Any) -> pb.AlterUserScramCredentialsResponse:
        deletions, upsertions = codec.scram_alterations(request)
        return codec.alter_scram_response(self._requests.admin.alter_user_scram_credentials(
            self._access(context), deletions, upsertions))

    @_guard
    def DescribeUserScramCredentials(self, request: pb.DescribeUserScramCredentialsRequest,
                                     context: Any) -> pb.DescribeUserScramCredentialsResponse:
        return codec.describe_scram_response(self._requests.admin.describe_user_scram_credentials(
            self._access(context), list(request.users) or None))

    @_guard
    def AlterClientQuotas(self, request: pb.AlterClientQuotasRequest,
                          context: Any) -> pb.AlterClientQuotasResponse:
        alterations = codec.quota_alterations(request)
        access = self._access(context)
        refused = self._requests.admin.cluster_refusal(access, "AlterClientQuotas")
        results = ([refused for _ in alterations] if refused is not None
                   else self._requests.admin.alter_client_quotas(
                       access, alterations, request.validate_only))
        return codec.alter_client_quotas_response(alterations, results)

    @_guard
    def DescribeClientQuotas(self, request: pb.DescribeClientQuotasRequest,
                             context: Any) -> pb.DescribeClientQuotasResponse:
        access = self._access(context)
        Access.raise_if(self._requests.admin.cluster_refusal(access, "DescribeClientQuotas"))
        try:
            found = self._requests.admin.describe_client_quotas(
                access, [codec.quota_filter_from_proto(c) for c in request.components],
                request.strict)
        except errors.InvalidRequestError as e:
            return codec.describe_client_quotas_response(e)
        return codec.describe_client_quotas_response(found)


# Kafka's request names where a gRPC method's differs: a fetch is a consumer's or a follower's.
GRPC_REQUEST_NAMES = {"/deltabus.v1.DeltaBus/Fetch": "FetchConsumer",
                      "/deltabus.internal.v1.ReplicaFetch/Fetch": "FetchFollower"}


class RequestTimer(grpc.ServerInterceptor):
    """Counts and times every call of a gRPC server (RequestMetrics, door "grpc"), with the
    throttle time its answer carries. The outermost interceptor: refused calls count too."""

    def __init__(self, meters: RequestMeters) -> None:
        self._meters = meters

    def intercept_service(self, continuation: Callable[..., Any],
                          handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method
        name = GRPC_REQUEST_NAMES.get(method) or method.rsplit("/", 1)[-1]
        inner, meters = handler.unary_unary, self._meters

        def timed(request: Any, context: grpc.ServicerContext) -> Any:
            start = time.monotonic()
            throttle_ms = 0
            try:
                response = inner(request, context)
                throttle_ms = getattr(response, "throttle_time_ms", 0)
                return response
            finally:
                meters.answered(name, "grpc", time.monotonic() - start, throttle_ms)

        return grpc.unary_unary_rpc_method_handler(
            timed, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


def start_server(host: str, port: int, handler: DeltaBusHandler,
                 lifecycle: LifecycleHandler | None = None, *,
                 threads: int = 32, groups: GroupCoordinator | None = None,
                 replica_fetch: bool = False,
                 broker_secret: str | None = None,
                 security: cfg.ListenerSecurity = PLAINTEXT,
                 credentials: CredentialLookup | None = None,
                 listener: str = "", brokers_only: bool = False,
                 long_polls_max: int | None = None,
                 transactions: TransactionHandler | None = None,
                 kafka_forwarded: Mapping[str, ForwardedKafkaRequests] | None = None,
                 meters: RequestMeters | None = None) -> tuple[grpc.Server, int]:
    """Start a gRPC server for one listener on host:port (0 picks a free port); returns it
    and the bound port. The server is one thread pool of `threads`: what it serves shares
    them. The controller passes `lifecycle` on its controller listeners (brokers register
    there); brokers pass `replica_fetch` on the inter-broker listener (followers fetch there).
    Either serves the internal API, which answers only calls carrying `broker_secret`, the
    cluster's broker credential (`rpc.inter_broker`); `brokers_only` (a controller-only
    listener) serves the lifecycle API alone, on threads no client call can take, and
    answers nothing else. A call carrying `broker_secret` on the public API is a broker
    forwarding its client's admin call (`rpc.call_authentication`). `security` says whether
    the port speaks TLS and how callers authenticate (against the users' SCRAM
    `credentials`); `listener` is its name (`DeltaBusServicer`). At most `long_polls_max`
    (at most `threads`; all of them when not given) Fetches wait for records at once.
    `kafka_forwarded` (the driver's inter-broker listener): the driver's Kafka listeners by
    name, which answer the coordinators' requests brokers forward (internal API). `meters`:
    the node's request metrics, which count and time every call.

    Raises ListenerBindError when the port cannot be bound (already in use).
    """
    options = [
        ("grpc.max_receive_message_length", cfg.REQUEST_MAX_BYTES),
        ("grpc.max_send_message_length", cfg.REQUEST_MAX_BYTES),
        ("grpc.so_reuseport", 0),
    ]
    internal = (lifecycle is not None or replica_fetch or brokers_only
                or kafka_forwarded is not None)
    if internal and not broker_secret:
        raise ValueError("a server of the internal API needs the cluster's broker credential")
    interceptors: list[grpc.ServerInterceptor] = []
    if meters is not None:
        interceptors.append(RequestTimer(meters))
        meters.add_handler_threads(threads)
    if internal and broker_secret:
        interceptors.append(InterBrokerAuthorizer(broker_secret, every_method=brokers_only))
    if security.uses_sasl or security.uses_tls or broker_secret:
        authenticator = (Authenticator(credentials, security.sasl_enabled_mechanisms)
                         if security.uses_sasl and credentials is not None else None)
        interceptors.append(CallAuthenticator(security, authenticator, broker_secret))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=options,
                         interceptors=interceptors or None)
    if not brokers_only:
        long_polls = threads if long_polls_max is None else min(long_polls_max, threads)
        pb_grpc.add_DeltaBusServicer_to_server(
            DeltaBusServicer(handler, groups, listener, long_polls, transactions), server)
    if lifecycle is not None:
        ipb_grpc.add_BrokerLifecycleServicer_to_server(BrokerLifecycleServicer(lifecycle), server)
    if kafka_forwarded is not None and broker_secret:
        ipb_grpc.add_KafkaForwardServicer_to_server(
            KafkaForwardServicer(kafka_forwarded, broker_secret), server)
        if groups is not None and groups.share_state is not None:
            ipb_grpc.add_ShareGroupStateServicer_to_server(
                ShareGroupStateServicer(groups.share_state), server)
    if replica_fetch:
        ipb_grpc.add_ReplicaFetchServicer_to_server(ReplicaFetchServicer(handler), server)
        if isinstance(handler, TxnMarkerHandler):  # brokers (a test's handler may not be)
            ipb_grpc.add_TxnMarkersServicer_to_server(TxnMarkersServicer(handler), server)
    try:
        bound = (server.add_secure_port(f"{host}:{port}", grpc_server_credentials(security))
                 if security.uses_tls else server.add_insecure_port(f"{host}:{port}"))
    except RuntimeError:
        bound = 0
    if bound == 0:  # gRPC says only "failed to bind"; a taken port is by far the likeliest
        raise ListenerBindError(f"cannot listen on {host}:{port}: address already in use?")
    server.start()
    return server, bound
