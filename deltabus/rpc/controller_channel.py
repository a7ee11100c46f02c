"""A broker's line to the controller (Kafka's BrokerToControllerChannelManager): registration,
heartbeats and ISR changes on the internal API, and the admin calls a broker forwards, all taking
and returning domain types so `deltabus.cluster` never sees grpc or protobuf.

The two go to different listeners of the driver: lifecycle calls to the controller's listener,
a server of their own that nothing else uses, so no client traffic can starve them; forwarded
admin calls, which are client traffic (a CreateTopics waits for the brokers to learn of its
topics, through those very heartbeats), to the driver's inter-broker listener.

Failures are deltabus errors: the controller's answer raises its Kafka code; no answer at all
(the controller is down, restarting or slow) raises NETWORK_EXCEPTION, which for a write such as
AlterPartition means the outcome is unknown. Thread-safe (one gRPC channel, shared).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import grpc

from deltabus import config as cfg
from deltabus import errors
from deltabus.config import ListenerSecurity
from deltabus.metadata import (
    BalancePlan,
    BrokerEndpoint,
    LogReport,
    MetadataBatch,
    MetadataImage,
    MetadataPosition,
    NewTopic,
    ScaleStatus,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
    TopicResult,
)
from deltabus.quotas import QuotaAlteration
from deltabus.rpc import codec
from deltabus.rpc.access import requester
from deltabus.rpc.channel import open_channel
from deltabus.rpc.inter_broker import credential_metadata, forwarded_for
from deltabus.rpc.schema_codec import RegistryOverGrpc
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.tls import grpc_peer_credentials
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from deltabus.rpc.v1 import internal_pb2 as ipb
from deltabus.rpc.v1 import internal_pb2_grpc as ipb_grpc
from deltabus.security.acls import AclBinding, AclBindingFilter, AclCreation
from deltabus.security.principal import KafkaPrincipal

PLAINTEXT = ListenerSecurity()
ADMIN_TIMEOUT_SLACK_MS = 5_000  # a forwarded admin call waits its own timeout and this much
FORWARD_TIMEOUT_SLACK_S = 60  # a forwarded Kafka request waits the longest rebalance and this


@dataclass(frozen=True)
class HeartbeatAnswer:
    should_shut_down: bool
    # Set when there are metadata records past the broker's position: the broker replays them
    # (`cluster.metadata_loader`).
    metadata: MetadataBatch | None
    refresh_logs: list[tuple[str, int]]  # partitions whose tables the log cleaner changed


class ControllerChannel:
    """Calls from one broker to the controller: lifecycle calls at `address` (its controller
    listener), forwarded admin calls at `admin_address` (default: the same)."""

    def __init__(self, address: str, broker_id: int, *, broker_secret: str,
                 security: ListenerSecurity = PLAINTEXT, admin_address: str = "",
                 admin_security: ListenerSecurity | None = None,
                 request_timeout_ms: int = 30_000,
                 rebalance_timeout_ms_max: int = cfg.GroupConfig.group_max_rebalance_timeout_ms
                 ) -> None:
        """`broker_secret`: the cluster's broker credential, which every call carries
        (`rpc.inter_broker`); `security`, `admin_security`: the two listeners', TLS where they
        use it; `rebalance_timeout_ms_max`: the longest a forwarded JoinGroup may wait."""
        self.address = address
        self.request_timeout_ms = request_timeout_ms
        self._forward_timeout_s = rebalance_timeout_ms_max / 1000 + FORWARD_TIMEOUT_SLACK_S
        self._credential = credential_metadata(broker_secret)
        agent = f"deltabus-broker-{broker_id}"
        self._channel = open_channel(address, agent, credentials=grpc_peer_credentials(security))
        self._lifecycle = ipb_grpc.BrokerLifecycleStub(self._channel)
        self._admin_channel = self._channel
        if admin_address and admin_address != address:
            self._admin_channel = open_channel(admin_address, agent, credentials=(
                grpc_peer_credentials(admin_security or security)))
        self._admin = pb_grpc.DeltaBusStub(self._admin_channel)
        self._forward = ipb_grpc.KafkaForwardStub(self._admin_channel)
        self._broker_id = broker_id

    def close(self) -> None:
        self._channel.close()
        if self._admin_channel is not self._channel:
            self._admin_channel.close()

    # ---- lifecycle (internal API) --------------------------------------------------------------

    def register(self, endpoint: BrokerEndpoint, *, pid: int, incarnation_id: str,
                 timeout_s: float = 10) -> int:
        """Register this broker; returns its new broker epoch."""
        response = self._lifecycle_call("RegisterBroker", ipb.RegisterBrokerRequest(
            broker_id=endpoint.broker_id, host=endpoint.host, port=endpoint.port,
            rack=endpoint.rack, pid=pid, incarnation_id=incarnation_id,
            kafka_port=endpoint.kafka_port,
            listeners=codec.listeners_to_proto(endpoint.listeners)), timeout_s)
        return int(response.broker_epoch)

    def heartbeat(self, broker_id: int, broker_epoch: int, metadata_version: int, *,
                  max_wait_ms: int, position: MetadataPosition | None = None,
                  offline_replicas: Iterable[tuple[str, int]] = (),
                  partition_loads: Mapping[tuple[str, int], float] | None = None,
                  log_reports: Mapping[tuple[str, int], LogReport] | None = None
                  ) -> HeartbeatAnswer:
        """A long poll: answers as soon as there are metadata records past `position` (by
        default the end of `metadata_version`, the version of the image the broker serves),
        else after `max_wait_ms`. A fenced broker gets STALE_BROKER_EPOCH. `offline_replicas`:
        the (topic, partition) replicas this broker cannot serve (their tables are lost);
        `partition_loads`: bytes in per second of the partitions it leads;
        `log_reports`: the logs of the partitions it leads that moved."""
        position = position or MetadataPosition(metadata_version)
        response = self._lifecycle_call("BrokerHeartbeat", ipb.BrokerHeartbeatRequest(
            broker_id=broker_id, broker_epoch=broker_epoch, metadata_version=metadata_version,
            max_wait_ms=max_wait_ms, metadata_position=codec.position_to_proto(position),
            offline_replicas=codec.topic_partitions_to_proto(offline_replicas),
            partition_loads=[ipb.PartitionLoad(topic=t, partition=p, bytes_in_per_s=rate)
                             for (t, p), rate in (partition_loads or {}).items()],
            partition_reports=[ipb.PartitionReport(topic=t, partition=p, high_watermark=r[0],
                                                   size_bytes=r[1], files=r[2])
                               for (t, p), r in (log_reports or {}).items()]),
            max_wait_ms / 500 + 5)
        batch = None
        if response.HasField("metadata_records"):
            batch = codec.metadata_batch_from_proto(response.metadata_records)
        refresh = codec.topic_partitions_from_proto(response.refresh_logs)
        return HeartbeatAnswer(response.should_shut_down, batch, refresh)

    def alter_partition(self, broker_id: int, broker_epoch: int, topic: str, partition: int, *,
                        leader_epoch: int, isr: list[int], new_isr: list[int],
                        timeout_s: float = 10) -> tuple[tuple[int, ...], int]:
        """Ask for an ISR change; returns the ISR now committed and the metadata version."""
        response = self._lifecycle_call("AlterPartition", ipb.AlterPartitionRequest(
            broker_id=broker_id, broker_epoch=broker_epoch, topic=topic, partition=partition,
            leader_epoch=leader_epoch, isr=isr, new_isr=new_isr), timeout_s)
        return tuple(response.isr), int(response.metadata_version)

    def _lifecycle_call(self, method: str, request: Any, timeout_s: float) -> Any:
        try:
            response = getattr(self._lifecycle, method)(request, timeout=timeout_s,
                                                        metadata=self._credential)
        except grpc.RpcError as e:  # no answer: whatever the status, the outcome is unknown
            refusal = error_from_rpc(e)
            if isinstance(refusal, errors.ClusterAuthorizationFailedError):
                raise refusal from None  # but for a refused credential
            raise errors.NetworkError(f"{method} to the controller at {self.address} got no "
                                      f"answer: {e.code() if hasattr(e, 'code') else e}") from None
        errors.check(response.error_code, response.error_message)
        return response

    # ---- admin calls a broker forwards (public API) -------------------------------------------

    def metadata(self, topics: list[str], allow_auto_create: bool) -> MetadataImage:
        """The controller's image; an auto-creation it refused (POLICY_VIOLATION on the topics
        it would have created) raises here too, so the broker's client hears of it."""
        response = self._admin_call("Metadata", pb.MetadataRequest(
            topics=topics, allow_auto_topic_creation=allow_auto_create))
        for topic in response.topics:
            if topic.error_code == errors.PolicyViolationError.code:
                raise errors.PolicyViolationError(topic.error_message)
        return codec.image_from_proto(response)

    def create_topics(self, topics: list[NewTopic], *, timeout_ms: int,
                      validate_only: bool) -> list[TopicResult]:
        response = self._admin_call("CreateTopics", codec.create_topics_request(
            topics, timeout_ms, validate_only), timeout_ms + ADMIN_TIMEOUT_SLACK_MS)
        return [codec.topic_result_from_proto(r) for r in response.topics]

    def create_partitions(self, counts: dict[str, int], *, timeout_ms: int,
                          validate_only: bool) -> list[TopicResult]:
        response = self._admin_call("CreatePartitions", pb.CreatePartitionsRequest(
            topics=[pb.CreatePartitionsTopic(name=t, count=n) for t, n in counts.items()],
            timeout_ms=timeout_ms, validate_only=validate_only),
            timeout_ms + ADMIN_TIMEOUT_SLACK_MS)
        return [codec.topic_result_from_proto(r) for r in response.topics]

    def delete_topics(self, names: list[str], *, timeout_ms: int) -> list[TopicResult]:
        response = self._admin_call("DeleteTopics", pb.DeleteTopicsRequest(
            topics=names, timeout_ms=timeout_ms), timeout_ms + ADMIN_TIMEOUT_SLACK_MS)
        return [codec.topic_result_from_proto(r) for r in response.topics]

    def describe_configs(self, topics: list[str],
                         resource_type: int = codec.TOPIC_RESOURCE) -> cfg.ConfigResults:
        """Topics' configs (or groups', with GROUP_RESOURCE)."""
        return codec.describe_configs_results(self._admin_call(
            "DescribeConfigs", codec.describe_configs_request(topics, resource_type)))

    def alter_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                      validate_only: bool, resource_type: int = codec.TOPIC_RESOURCE
                      ) -> dict[str, errors.DeltaBusError | None]:
        """Topics' configs changed (or groups', with GROUP_RESOURCE)."""
        return codec.alter_configs_results(self._admin_call(
            "IncrementalAlterConfigs", codec.alter_configs_request(changes, validate_only,
                                                                   resource_type)))

    def describe_group_configs(self, groups: list[str]) -> cfg.ConfigResults:
        return self.describe_configs(groups, codec.GROUP_RESOURCE)

    def alter_group_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                            validate_only: bool) -> dict[str, errors.DeltaBusError | None]:
        return self.alter_configs(changes, validate_only=validate_only,
                                  resource_type=codec.GROUP_RESOURCE)

    def init_producer_id(self, transactional_id: str) -> tuple[int, int]:
        response = self._admin_call("InitProducerId", pb.InitProducerIdRequest(
            transactional_id=transactional_id))
        errors.check(response.error_code, response.error_message)
        return response.producer_id, response.producer_epoch

    def elect_leaders(self, election_type: str, partitions: list[tuple[str, int]] | None
                      ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        return codec.election_results(self._admin_call(
            "ElectLeaders", codec.elect_leaders_request(election_type, partitions)))

    def reassign_partitions(self, targets: dict[tuple[str, int], list[int] | None]
                            ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        return codec.election_results(self._admin_call(
            "AlterPartitionReassignments", codec.reassignments_request(targets)))

    def scale_cluster(self, brokers: int | None) -> ScaleStatus:
        return codec.scale_status_from_proto(self._admin_call(
            "ScaleCluster", pb.ScaleClusterRequest(brokers=brokers)))

    def balance_cluster(self, execute: bool) -> BalancePlan:
        return codec.balance_plan_from_proto(self._admin_call(
            "BalanceCluster", pb.BalanceClusterRequest(execute=execute)))

    def alter_user_scram_credentials(self, deletions: list[ScramCredentialDeletion],
                                     upsertions: list[ScramCredentialUpsertion]
                                     ) -> dict[str, errors.DeltaBusError | None]:
        """Forwarded as Kafka's brokers forward it; the controller answers once the brokers
        applied the change (at most its admin timeout)."""
        return codec.alter_scram_results(self._admin_call(
            "AlterUserScramCredentials", codec.alter_scram_request(deletions, upsertions),
            cfg.ADMIN_TIMEOUT_MS_DEFAULT + ADMIN_TIMEOUT_SLACK_MS))

    def create_acls(self, creations: list[AclCreation]) -> list[errors.DeltaBusError | None]:
        """Forwarded as Kafka's brokers forward it; the controller checks each creation and
        answers once the brokers hold the new ACLs (at most its admin timeout)."""
        return codec.create_acls_results(self._admin_call(
            "CreateAcls", pb.CreateAclsRequest(creations=[codec.acl_to_proto(c)
                                                          for c in creations]),
            cfg.ADMIN_TIMEOUT_MS_DEFAULT + ADMIN_TIMEOUT_SLACK_MS))

    def delete_acls(self, filters: list[AclBindingFilter]
                    ) -> list[list[AclBinding] | errors.DeltaBusError]:
        return codec.delete_acls_results(self._admin_call(
            "DeleteAcls", pb.DeleteAclsRequest(filters=[codec.acl_filter_to_proto(f)
                                                        for f in filters]),
            cfg.ADMIN_TIMEOUT_MS_DEFAULT + ADMIN_TIMEOUT_SLACK_MS))

    def alter_client_quotas(self, alterations: list[QuotaAlteration], *,
                            validate_only: bool) -> list[errors.DeltaBusError | None]:
        """Forwarded as Kafka's brokers forward it; the controller answers once the brokers
        throttle by the change (at most its admin timeout)."""
        return codec.alter_client_quotas_results(self._admin_call(
            "AlterClientQuotas", codec.alter_client_quotas_request(alterations, validate_only),
            cfg.ADMIN_TIMEOUT_MS_DEFAULT + ADMIN_TIMEOUT_SLACK_MS))

    def forward_kafka(self, listener: str, frame: bytes, client_host: str,
                      principal: KafkaPrincipal) -> Future[tuple[bytes, int]]:
        """Pass a Kafka client's request for the group or transaction coordinator on to the
        driver's Kafka listener `listener` (Kafka's Envelope, KIP-590): a future of the
        driver's answer frame and throttle time, or of NETWORK_EXCEPTION where the driver did
        not answer. Waits at most as long as a rebalance may (a JoinGroup's wait)."""
        answer: Future[tuple[bytes, int]] = Future()
        call = self._forward.Forward.future(
            ipb.ForwardKafkaRequest(listener=listener, frame=frame, client_host=client_host,
                                    broker_id=self._broker_id),
            timeout=self._forward_timeout_s, metadata=self._credential + forwarded_for(principal))

        def done(call: Any) -> None:
            try:
                response = call.result()
            except grpc.RpcError as e:
                answer.set_exception(errors.NetworkError(
                    f"{e.code() if hasattr(e, 'code') else e}"))
                return
            answer.set_result((response.frame, response.throttle_ms))

        call.add_done_callback(done)
        return answer

    @property
    def schema_registry(self) -> RegistryOverGrpc:
        """The controller's schema registry, each call forwarded on the caller's behalf."""
        return RegistryOverGrpc(self._admin_call)

    def _admin_call(self, method: str, request: Any, timeout_ms: int | None = None) -> Any:
        """One forwarded call, on behalf of the client whose request this broker is answering
        (Kafka's envelope, KIP-590: the broker credential vouches for the principal it names);
        a failed call raises the controller's error (its Kafka code)."""
        try:
            return getattr(self._admin, method)(
                request, timeout=(timeout_ms or self.request_timeout_ms) / 1000,
                metadata=self._credential + forwarded_for(requester()))
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None
