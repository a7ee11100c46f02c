"""The internal API's servicers: the controller's `BrokerLifecycle` (registration, heartbeats, ISR
changes) and `KafkaForward` (the coordinators' Kafka requests brokers pass on), and a broker's
`ReplicaFetch` (what it answers its followers). Clients never reach these
through deltabus's own code; decode, call the domain object, encode, as the public servicers do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import grpc

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import (
    DeltaBusHandler,
    FetchResult,
    FetchSpec,
    LifecycleHandler,
    TxnMarkerHandler,
)
from deltabus.log_tables.control_records import TxnMarker
from deltabus.metadata import BrokerEndpoint, LogReport
from deltabus.records import to_ipc
from deltabus.rpc import codec
from deltabus.rpc.fetch_size import FetchBudget
from deltabus.rpc.inter_broker import vouched_principal
from deltabus.rpc.status import abort
from deltabus.rpc.v1 import internal_pb2 as ipb
from deltabus.rpc.v1 import internal_pb2_grpc as ipb_grpc
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal


class ForwardedKafkaRequests(Protocol):
    """The driver's Kafka listener of one name, answering what brokers forward to it."""

    def answer_forwarded(self, frame: bytes, principal: KafkaPrincipal, host: str,
                         node: int) -> tuple[bytes, int]: ...


class KafkaForwardServicer(ipb_grpc.KafkaForwardServicer):
    """On the driver: a broker's client's request for the coordinators, answered by the
    driver's Kafka listener of the name the client came in on, as the broker's principal
    for it (vouched for by the broker credential the interceptor checked). Thread-safe;
    a JoinGroup holds its gRPC thread until its group is ready."""

    def __init__(self, listeners: Mapping[str, ForwardedKafkaRequests], secret: str) -> None:
        self._listeners = listeners  # filled once the driver's Kafka listeners are open
        self._secret = secret

    def Forward(self, request: ipb.ForwardKafkaRequest,
                context: Any) -> ipb.ForwardKafkaResponse:
        listener = self._listeners.get(request.listener)
        if listener is None:
            abort(context, errors.InvalidRequestError(
                f"the driver has no Kafka listener {request.listener!r}"))
        principal = vouched_principal(context.invocation_metadata(), self._secret) or ANONYMOUS
        try:
            frame, throttle_ms = listener.answer_forwarded(
                request.frame, principal, request.client_host, request.broker_id)
        except errors.DeltaBusError as e:
            abort(context, e)
        return ipb.ForwardKafkaResponse(frame=frame, throttle_ms=throttle_ms)


class BrokerLifecycleServicer(ipb_grpc.BrokerLifecycleServicer):
    def __init__(self, handler: LifecycleHandler) -> None:
        self._handler = handler

    def RegisterBroker(self, request: ipb.RegisterBrokerRequest,
                       context: Any) -> ipb.RegisterBrokerResponse:
        endpoint = BrokerEndpoint(request.broker_id, request.host, request.port, request.rack,
                                  request.kafka_port,
                                  codec.listeners_from_proto(request.listeners))
        try:
            epoch = self._handler.register_broker(endpoint, request.pid)
        except errors.DeltaBusError as e:
            return ipb.RegisterBrokerResponse(error_code=e.code, error_message=e.message)
        return ipb.RegisterBrokerResponse(broker_epoch=epoch)

    def BrokerHeartbeat(self, request: ipb.BrokerHeartbeatRequest,
                        context: Any) -> ipb.BrokerHeartbeatResponse:
        try:
            stop, batch, refresh = self._handler.heartbeat(
                request.broker_id, request.broker_epoch, request.metadata_version,
                request.max_wait_ms, codec.topic_partitions_from_proto(request.offline_replicas),
                position=codec.position_from_proto(request.metadata_position),
                partition_loads={(load.topic, load.partition): load.bytes_in_per_s
                                 for load in request.partition_loads},
                log_reports={(r.topic, r.partition): LogReport(r.high_watermark, r.size_bytes,
                                                               r.files)
                             for r in request.partition_reports})
        except errors.DeltaBusError as e:
            return ipb.BrokerHeartbeatResponse(error_code=e.code, error_message=e.message)
        response = ipb.BrokerHeartbeatResponse(should_shut_down=stop)
        response.refresh_logs.extend(codec.topic_partitions_to_proto(refresh))
        if batch is not None:
            response.metadata_records.CopyFrom(codec.metadata_batch_to_proto(batch))
            if (context is not None and sum(map(len, batch.records))
                    >= cfg.METADATA_FETCH_COMPRESS_BYTES_MIN):
                context.set_compression(grpc.Compression.Gzip)
        return response

    def AlterPartition(self, request: ipb.AlterPartitionRequest,
                       context: Any) -> ipb.AlterPartitionResponse:
        try:
            state, version = self._handler.alter_partition(
                request.broker_id, request.broker_epoch, request.topic, request.partition,
                request.leader_epoch, list(request.isr), list(request.new_isr))
        except errors.DeltaBusError as e:
            return ipb.AlterPartitionResponse(error_code=e.code, error_message=e.message)
        return ipb.AlterPartitionResponse(leader_epoch=state.leader_epoch, isr=state.isr,
                                         metadata_version=version)


class TxnMarkersServicer(ipb_grpc.TxnMarkersServicer):
    """A broker's answers to the transaction coordinator's markers (Kafka's WriteTxnMarkers)."""

    def __init__(self, handler: TxnMarkerHandler) -> None:
        self._handler = handler

    def WriteTxnMarkers(self, request: ipb.WriteTxnMarkersRequest,
                        context: Any) -> ipb.WriteTxnMarkersResponse:
        markers = [TxnMarker(m.producer_id, m.producer_epoch, m.committed, m.coordinator_epoch,
                             tuple((p.topic, p.partition) for p in m.partitions))
                   for m in request.markers]
        outcomes = self._handler.write_txn_markers(
            markers, timeout_ms=request.timeout_ms or cfg.PRODUCE_TIMEOUT_MS_DEFAULT)
        return ipb.WriteTxnMarkersResponse(results=[
            ipb.TxnMarkerResult(producer_id=pid, topic=topic, partition=partition,
                                error_code=error.code if error else 0,
                                error_message=error.message if error else "")
            for (pid, topic, partition), error in outcomes.items()])


class ReplicaFetchServicer(ipb_grpc.ReplicaFetchServicer):
    """A leader's answers to its followers' fetches."""

    def __init__(self, handler: DeltaBusHandler) -> None:
        self._handler = handler

    def Fetch(self, request: ipb.ReplicaFetchRequest, context: Any) -> ipb.ReplicaFetchResponse:
        max_bytes = min(request.max_bytes or cfg.FETCH_MAX_BYTES, cfg.FETCH_RESPONSE_MAX_BYTES)
        specs = [FetchSpec(p.topic, p.partition, p.fetch_offset,
                           p.partition_max_bytes or cfg.FETCH_PARTITION_MAX_BYTES,
                           p.current_leader_epoch, p.last_fetched_epoch, p.log_start_offset)
                 for p in request.partitions]
        results = self._handler.fetch(
            specs, max_wait_ms=min(max(request.max_wait_ms, 0), cfg.FETCH_WAIT_MS_MAX),
            min_bytes=request.min_bytes, max_bytes=max_bytes, replica_id=request.replica_id)
        budget = FetchBudget(max_bytes)  # the same limits as a consumer's answer
        return ipb.ReplicaFetchResponse(partitions=[
            _result_to_proto(spec, r, budget) for spec, r in zip(specs, results, strict=True)])


def _result_to_proto(spec: FetchSpec, r: FetchResult,
                     budget: FetchBudget) -> ipb.ReplicaFetchPartitionResponse:
    out = ipb.ReplicaFetchPartitionResponse(
        topic=r.topic, partition=r.partition, high_watermark=r.high_watermark,
        log_start_offset=r.log_start_offset, log_end_offset=r.log_end_offset)
    if r.error is not None:
        out.error_code, out.error_message = r.error.code, r.error.message
    if r.diverging_epoch is not None:
        out.diverging_epoch.epoch, out.diverging_epoch.end_offset = r.diverging_epoch
    out.files.extend(ipb.LogFile(uri=f.uri, size_bytes=f.size_bytes, stats=f.stats,
                                 base_offset=f.base_offset, last_offset=f.last_offset)
                     for f in r.files or ())
    budget.spend(sum(f.size_bytes for f in r.files or ()))
    if r.records is not None and r.records.num_rows:
        _, out.arrow_records = budget.fit(r.records, spec.max_bytes, to_ipc)
    return out
