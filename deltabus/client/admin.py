"""`AdminClient`: create, delete, list and describe topics, describe and alter their configs,
elect leaders, reassign partitions, delete records below an offset, manage consumer groups and
their offsets, users' SCRAM credentials and ACLs (Kafka's Admin API).

Thread-safe. Admin calls go to any server; brokers forward them to the controller. DeleteRecords
goes to each partition's leader, as Kafka's does.
"""

from __future__ import annotations

import collections
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Unpack

from deltabus import config as cfg
from deltabus import errors
from deltabus.client.cluster_client import ClusterClient
from deltabus.client.consumer_coordinator import TopicPartition
from deltabus.client.security import ClientSecurity, SecuritySettings
from deltabus.metadata import (
    BalancePlan,
    GroupDescription,
    MemberDescription,
    NewTopic,
    ScaleStatus,
    ScramCredentialDeletion,
    ScramCredentialInfo,
    ScramCredentialUpsertion,
    ScramDescriptions,
    ShareGroupDescription,
    ShareGroupOffset,
    ShareMemberDescription,
    TopicState,
    TransactionMetadata,
    UserScramCredentialsDescription,
)
from deltabus.quotas import QuotaAlteration, QuotaEntity, QuotaFilterComponent
from deltabus.rpc import codec
from deltabus.rpc.schema_codec import RegistryOverGrpc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.security import scram
from deltabus.security.acls import AclBinding, AclBindingFilter, AclCreation

__all__ = ["AclBinding", "AclBindingFilter", "AdminClient", "DeletedRecords", "NewTopic",
           "QuotaAlteration", "QuotaEntity", "QuotaFilterComponent", "ScramCredentialInfo",
           "UserScramCredentialDeletion", "UserScramCredentialUpsertion",
           "UserScramCredentialsDescription"]
SHARE_PROTOCOL = "share"  # ListGroups' protocol type of a share group

SALT_BYTES = 32  # a new credential's random salt


@dataclass(frozen=True)
class UserScramCredentialUpsertion:
    """Set (or replace) a user's SCRAM credential for one mechanism (confluent-kafka's and
    Kafka's UserScramCredentialUpsertion). The password is salted and hashed in this process
    (`AdminClient.alter_user_scram_credentials`) and never sent; `salt` None: a random one."""

    user: str
    scram_credential_info: ScramCredentialInfo  # mechanism ("SCRAM-SHA-256") and iterations
    password: str | bytes = field(repr=False)
    salt: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class UserScramCredentialDeletion:
    """Remove a user's SCRAM credential for one mechanism."""

    user: str
    mechanism: str


@dataclass(frozen=True)
class DeletedRecords:
    """One partition's DeleteRecords answer (Kafka's DeletedRecords): its low watermark, the
    log start offset every in-sync replica now has, or the error (low watermark -1)."""

    low_watermark: int
    error: errors.DeltaBusError | None = None


class AdminClient:
    """Manage topics. Errors are raised per topic, as Kafka's admin futures do."""

    def __init__(self, bootstrap_servers: str | Iterable[str], *,
                 request_timeout_ms: int = 30_000, client_id: str = "deltabus-admin",
                 **security: Unpack[SecuritySettings]) -> None:
        """`security`: Kafka's client security configs (deltabus.client.security)."""
        self._client = ClusterClient(bootstrap_servers, request_timeout_ms=request_timeout_ms,
                                     client_id=client_id,
                                     security=ClientSecurity.from_settings(**security))

    def create_topics(self, new_topics: Iterable[NewTopic], *, timeout_ms: int = 30_000,
                      validate_only: bool = False) -> dict[str, str]:
        """Create topics; returns {name: topic_id}. Raises the first topic's error, if any
        (after every topic was tried: the others are created)."""
        request = codec.create_topics_request(new_topics, timeout_ms, validate_only)
        response = self._client.call_any("CreateTopics", request, timeout_ms + 5000)
        return self._results(response.topics)

    def delete_topics(self, topics: Iterable[str], *, timeout_ms: int = 30_000) -> dict[str, str]:
        request = pb.DeleteTopicsRequest(topics=list(topics), timeout_ms=timeout_ms)
        response = self._client.call_any("DeleteTopics", request, timeout_ms + 5000)
        return self._results(response.topics)

    def create_partitions(self, new_totals: dict[str, int], *, timeout_ms: int = 30_000,
                          validate_only: bool = False) -> None:
        """Kafka's createPartitions: {topic: new total partition count}. Keyed records may go
        to other partitions afterwards (the partition is the key's hash modulo the count)."""
        request = pb.CreatePartitionsRequest(
            topics=[pb.CreatePartitionsTopic(name=t, count=n) for t, n in new_totals.items()],
            timeout_ms=timeout_ms, validate_only=validate_only)
        response = self._client.call_any("CreatePartitions", request, timeout_ms + 5000)
        self._results(response.topics)

    def describe_configs(self, topics: Iterable[str], *, groups: bool = False
                         ) -> dict[str, list[cfg.ConfigEntry]]:
        """Every config of each topic: value, source (DYNAMIC_TOPIC_CONFIG for an override,
        STATIC_BROKER_CONFIG or DEFAULT_CONFIG) and synonyms, as Kafka's describeConfigs; with
        `groups`, of each group (GROUP_CONFIG for its own). Raises the first one's error."""
        response = self._client.call_any("DescribeConfigs", codec.describe_configs_request(
            topics, codec.GROUP_RESOURCE if groups else codec.TOPIC_RESOURCE))
        results = codec.describe_configs_results(response)
        for result in results.values():
            if isinstance(result, errors.DeltaBusError):
                raise result
        return {name: list(entries) for name, entries in results.items()
                if not isinstance(entries, errors.DeltaBusError)}

    def incremental_alter_configs(self, changes: dict[str, list[cfg.AlterConfigOp]], *,
                                  validate_only: bool = False, groups: bool = False) -> None:
        """Kafka's incrementalAlterConfigs for topics: {topic: [AlterConfigOp(name, SET or
        DELETE or APPEND or SUBTRACT, value)]}; with `groups`, for groups (SET or DELETE of
        share.auto.offset.reset, ...). Each one's changes apply together or not at all; raises
        the first one's error (INVALID_CONFIG names the key and the reason)."""
        response = self._client.call_any("IncrementalAlterConfigs", codec.alter_configs_request(
            changes, validate_only, codec.GROUP_RESOURCE if groups else codec.TOPIC_RESOURCE))
        for error in codec.alter_configs_results(response).values():
            if error is not None:
                raise error

    @staticmethod
    def _results(results: Iterable[pb.TopicResult]) -> dict[str, str]:
        out = {}
        first_error = None
        for r in results:
            if r.error_code and first_error is None:
                first_error = errors.error_for_code(r.error_code, r.error_message)
            elif not r.error_code:
                out[r.name] = r.topic_id
        if first_error is not None:
            raise first_error
        return out

    def list_topics(self, *, include_internal: bool = False) -> list[str]:
        image = self._client.refresh_metadata()
        return sorted(t for t in image.topics if include_internal or not t.startswith("__"))

    def describe_topics(self, topics: Iterable[str] | None = None) -> list[TopicState]:
        """Describe topics (all when None); UnknownTopicOrPartitionError for a missing one."""
        names = list(topics or [])
        response = self._client.call_any("DescribeTopics", pb.DescribeTopicsRequest(topics=names))
        for t in response.topics:
            if t.error_code:
                raise errors.error_for_code(t.error_code, t.error_message)
        image = codec.image_from_proto(pb.MetadataResponse(topics=response.topics))
        return [image.topics[t.name] for t in response.topics]

    def elect_leaders(self, election_type: str = "preferred",
                      partitions: Iterable[tuple[str, int]] | None = None
                      ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        """Kafka's electLeaders: "preferred" moves leadership back to each partition's first
        replica; "unclean" gives a leaderless partition any live replica (may lose data).
        `partitions` (topic, partition) pairs, None for all. Returns None (elected) or the error
        per partition: ELECTION_NOT_NEEDED when the leader already is the one asked for."""
        request = codec.elect_leaders_request(election_type, partitions)
        return codec.election_results(self._client.call_any("ElectLeaders", request))

    def alter_partition_reassignments(self, targets: Mapping[tuple[str, int], list[int] | None]
                                      ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        """Kafka's alterPartitionReassignments: {(topic, partition): [brokers]}, the first the
        preferred leader, or None to cancel the reassignment in progress. Returns per partition
        None (started, or cancelled) or the error; describe_topics shows adding/removing
        replicas until each completes."""
        response = self._client.call_any("AlterPartitionReassignments",
                                         codec.reassignments_request(targets))
        return codec.election_results(response)

    # ---- brokers joining and leaving ----------------------------------------------------------

    def scale_cluster(self, brokers: int | None = None) -> ScaleStatus:
        """Start a scale of the cluster to `brokers` brokers (None: only ask how the last
        one is going); answers at once. New brokers start and take their share of replicas
        and leaders; leaving ones (the highest ids) are drained, then stopped. Poll with
        `scale_cluster()` until the state is done or failed."""
        return codec.scale_status_from_proto(self._client.call_any(
            "ScaleCluster", pb.ScaleClusterRequest(brokers=brokers)))

    def balance_cluster(self, *, execute: bool = False) -> BalancePlan:
        """The balancer's plan (rack, replica count, leader count, bytes in), with the spread
        by broker before and after it; `execute` starts its moves."""
        return codec.balance_plan_from_proto(self._client.call_any(
            "BalanceCluster", pb.BalanceClusterRequest(execute=execute)))

    # ---- users' SCRAM credentials -------------------------------------------------------------

    def alter_user_scram_credentials(
            self, alterations: Iterable[UserScramCredentialUpsertion | UserScramCredentialDeletion]
    ) -> dict[str, errors.DeltaBusError | None]:
        """Kafka's alterUserScramCredentials: set or remove users' credentials. Each password is
        salted here (RFC 5802's Hi, as Kafka's clients do), so only the salt and the salted
        password travel. Returns per user None (done: every broker authenticates with it) or
        the error; a user's alterations apply together or not at all, and each mechanism of a
        user may be altered once per call (DUPLICATE_RESOURCE)."""
        deletions: list[ScramCredentialDeletion] = []
        upsertions: list[ScramCredentialUpsertion] = []
        for a in alterations:
            if isinstance(a, UserScramCredentialDeletion):
                deletions.append(ScramCredentialDeletion(a.user, a.mechanism))
            else:
                upsertions.append(_salted(a))
        response = self._client.call_any(
            "AlterUserScramCredentials", codec.alter_scram_request(deletions, upsertions),
            cfg.ADMIN_TIMEOUT_MS_DEFAULT + 10_000)  # past a forwarding broker's own timeout
        return codec.alter_scram_results(response)

    def describe_user_scram_credentials(self, users: Iterable[str] | None = None
                                        ) -> ScramDescriptions:
        """Kafka's describeUserScramCredentials: per user (all with a credential when `users`
        is None) the mechanisms and iteration counts, never salts or keys, or the error:
        RESOURCE_NOT_FOUND for a named user without a credential."""
        response = self._client.call_any("DescribeUserScramCredentials",
                                         pb.DescribeUserScramCredentialsRequest(
                                             users=list(users or ())))
        return codec.describe_scram_results(response)

    # ---- ACLs ---------------------------------------------------------------------------------

    def create_acls(self, acls: Iterable[AclBinding]
                    ) -> dict[AclBinding, errors.DeltaBusError | None]:
        """Kafka's createAcls (confluent-kafka's create_acls): per ACL None (created, or there
        already; every broker authorizes with it) or the error, INVALID_REQUEST for one the
        controller refuses (a principal that is not User:NAME, say). Sent to any server; a
        broker forwards it to the controller."""
        wanted = list(dict.fromkeys(acls))
        response = self._client.call_any(
            "CreateAcls", pb.CreateAclsRequest(
                creations=[codec.acl_to_proto(AclCreation.of(a)) for a in wanted]),
            cfg.ADMIN_TIMEOUT_MS_DEFAULT + 5000)
        return dict(zip(wanted, codec.create_acls_results(response), strict=True))

    def describe_acls(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        """Kafka's describeAcls: the ACLs the filter matches (every ACL without one), from the
        metadata of the server asked, grouped by resource. Raises the server's error
        (CLUSTER_AUTHORIZATION_FAILED without DESCRIBE on the cluster)."""
        response = self._client.call_any("DescribeAcls", pb.DescribeAclsRequest(
            filter=codec.acl_filter_to_proto(acl_filter or AclBindingFilter())))
        return codec.describe_acls_result(response)

    def delete_acls(self, filters: Iterable[AclBindingFilter]
                    ) -> dict[AclBindingFilter, list[AclBinding] | errors.DeltaBusError]:
        """Kafka's deleteAcls (confluent-kafka's delete_acls): per filter the ACLs it matched,
        all removed once this returns (every broker dropped them), or the error. A filter with
        ANY and MATCH values removes every ACL it matches: `AclBindingFilter()` removes all."""
        wanted = list(dict.fromkeys(filters))
        response = self._client.call_any(
            "DeleteAcls", pb.DeleteAclsRequest(filters=[codec.acl_filter_to_proto(f)
                                                        for f in wanted]),
            cfg.ADMIN_TIMEOUT_MS_DEFAULT + 5000)
        return dict(zip(wanted, codec.delete_acls_results(response), strict=True))

    # ---- client quotas ------------------------------------------------------------------------

    def alter_client_quotas(self, alterations: Iterable[QuotaAlteration], *,
                            validate_only: bool = False
                            ) -> dict[QuotaEntity, errors.DeltaBusError | None]:
        """Kafka's alterClientQuotas: per entity None (done: every broker throttles by it) or
        the error (INVALID_REQUEST for a bad entity, key or value). An entity's ops apply
        together or not at all; an op's value None removes that quota."""
        wanted = list(alterations)
        response = self._client.call_any(
            "AlterClientQuotas", codec.alter_client_quotas_request(wanted, validate_only),
            cfg.ADMIN_TIMEOUT_MS_DEFAULT + 10_000)  # past a forwarding broker's own timeout
        return dict(zip((a.entity for a in wanted), codec.alter_client_quotas_results(response),
                        strict=True))

    def describe_client_quotas(self, components: Iterable[QuotaFilterComponent] = (), *,
                               strict: bool = False) -> dict[QuotaEntity, dict[str, float]]:
        """Kafka's describeClientQuotas: the quotas of every entity the filter matches (every
        entity with none), from the metadata of the server asked."""
        response = self._client.call_any("DescribeClientQuotas", pb.DescribeClientQuotasRequest(
            components=[codec.quota_filter_to_proto(c) for c in components], strict=strict))
        return codec.describe_client_quotas_result(response)

    # ---- schema registry ----------------------------------------------------------------------

    @property
    def schema_registry(self) -> RegistryOverGrpc:
        """The cluster's schema registry over gRPC (the calls of Confluent's REST API, by the
        registry's own names): `register_schema`, `schema_by_id`, `subjects`,
        `subject_versions`, `subject_version`, `test_compatibility`, `compatibility_level`,
        `set_compatibility_level`, `delete_schema_version`, `delete_subject`. Refusals raise
        `deltabus.schemas.SchemaRegistryError` with Confluent's error code."""
        return RegistryOverGrpc(lambda method, request: self._client.call_any(method, request))

    # ---- records ------------------------------------------------------------------------------

    def delete_records(self, offsets: dict[TopicPartition, int] | dict[tuple[str, int], int], *,
                       timeout_ms: int = 30_000) -> dict[TopicPartition, DeletedRecords]:
        """Delete every record below the given offset of each partition (-1: up to the high
        watermark), as kafka-delete-records.sh: each leader moves its log start offset up and
        answers once the in-sync replicas have it too, within `timeout_ms`. Partitions whose
        leader moves are asked again at the new one until then."""
        pending = {TopicPartition(*tp): offset for tp, offset in offsets.items()}
        out: dict[TopicPartition, DeletedRecords] = {}
        deadline = time.monotonic() + timeout_ms / 1000
        self._client.refresh_metadata()
        while pending:
            retry: dict[TopicPartition, int] = {}
            for address, group in self._by_leader(pending, out, retry).items():
                left_ms = max(1, int((deadline - time.monotonic()) * 1000))
                try:
                    response = self._client.call(
                        address, "DeleteRecords", pb.DeleteRecordsRequest(timeout_ms=left_ms,
                            partitions=[pb.DeleteRecordsPartition(
                                topic=tp.topic, partition=tp.partition, offset=offset)
                                for tp, offset in group.items()]),
                        timeout_ms=left_ms + self._client.request_timeout_ms)
                except errors.DeltaBusError as e:
                    _answer_or_retry(group, e, out, retry)
                    continue
                for p in response.partitions:
                    tp = TopicPartition(p.topic, p.partition)
                    if p.error_code:
                        _answer_or_retry({tp: group[tp]}, errors.error_for_code(
                            p.error_code, p.error_message), out, retry)
                    else:
                        out[tp] = DeletedRecords(p.low_watermark)
            if retry and time.monotonic() >= deadline:
                out.update({tp: DeletedRecords(-1, errors.RequestTimedOutError(
                    f"no leader of {tp.topic}-{tp.partition} answered in {timeout_ms} ms"))
                    for tp in retry})
                break
            if retry:
                time.sleep(self._client.retry_backoff_ms / 1000)
                self._client.refresh_metadata()
            pending = retry
        return out

    def _by_leader(self, pending: dict[TopicPartition, int], out: dict[TopicPartition, Any],
                   retry: dict[TopicPartition, int]) -> dict[str, dict[TopicPartition, int]]:
        """`pending` by the address of each partition's leader; an unknown partition's answer
        goes to `out`, one without a leader now to `retry`."""
        groups: dict[str, dict[TopicPartition, int]] = collections.defaultdict(dict)
        for tp, offset in pending.items():
            try:
                broker, _ = self._client.leader(tp.topic, tp.partition)
            except errors.DeltaBusError as e:
                _answer_or_retry({tp: offset}, e, out, retry)
                continue
            groups[broker.address][tp] = offset
        return groups

    # ---- transactions -------------------------------------------------------------------------

    def _txn_call(self, transactional_id: str, method: str, request: Any) -> Any:
        """A call to the transaction coordinator (FindCoordinator, key type 1)."""
        found = self._client.call_any("FindCoordinator", pb.FindCoordinatorRequest(
            key=transactional_id, key_type=1))
        errors.check(found.error_code, found.error_message)
        return self._client.call(f"{found.host}:{found.port}", method, request)

    def list_transactions(self, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                          duration_ms: int | None = None) -> list[tuple[str, int, str]]:
        """(transactional id, producer id, state) of every transactional id the caller may
        describe, or those in `states`, of `producer_ids`, open longer than `duration_ms`
        (kafka-transactions.sh list)."""
        request = pb.ListTransactionsRequest(state_filters=list(states),
                                             producer_id_filters=list(producer_ids))
        if duration_ms is not None:
            request.duration_filter_ms = duration_ms
        response = self._txn_call("", "ListTransactions", request)
        errors.check(response.error_code, response.error_message)
        return [(t.transactional_id, t.producer_id, t.state) for t in response.transactions]

    def describe_transactions(self, transactional_ids: Iterable[str]
                              ) -> dict[str, TransactionMetadata]:
        """Each transactional id's state, producer, timeout and open partitions
        (kafka-transactions.sh describe); raises the first id's error (TRANSACTIONAL_ID_NOT_
        FOUND for one never used)."""
        ids = list(transactional_ids)
        response = self._txn_call(ids[0] if ids else "", "DescribeTransactions",
                                  pb.DescribeTransactionsRequest(transactional_ids=ids))
        out = {}
        for t in response.transactions:
            errors.check(t.error_code, t.error_message)
            out[t.transactional_id] = TransactionMetadata(
                t.transactional_id, t.producer_id, t.producer_epoch, t.state,
                t.transaction_timeout_ms,
                frozenset((p.topic, p.partition) for p in t.partitions),
                start_ms=t.transaction_start_time_ms)
        return out

    # ---- consumer groups ----------------------------------------------------------------------

    def _group_call(self, group_id: str, method: str, request: Any) -> Any:
        """A group call, sent to the group's coordinator (found with FindCoordinator)."""
        found = self._client.call_any("FindCoordinator", pb.FindCoordinatorRequest(key=group_id))
        errors.check(found.error_code, found.error_message)
        return self._client.call(f"{found.host}:{found.port}", method, request)

    def list_consumer_groups(self, states: Iterable[str] = ()) -> list[tuple[str, str]]:
        """(group id, state) of every consumer group, with members or committed offsets (share
        groups are `list_share_groups`')."""
        return [(g, s) for g, t, s in self._list_groups(states) if t != SHARE_PROTOCOL]

    def _list_groups(self, states: Iterable[str]) -> list[tuple[str, str, str]]:
        response = self._group_call("", "ListGroups",
                                    pb.ListGroupsRequest(states_filter=list(states)))
        errors.check(response.error_code, response.error_message)
        return [(g.group_id, g.protocol_type, g.group_state) for g in response.groups]

    # ---- share groups (KIP-932) ----------------------------------------------------------------

    def list_share_groups(self, states: Iterable[str] = ()) -> list[tuple[str, str]]:
        """(group id, state) of every share group, with members or state in partitions."""
        return [(g, s) for g, t, s in self._list_groups(states) if t == SHARE_PROTOCOL]

    def describe_share_groups(self, group_ids: Iterable[str]) -> list[ShareGroupDescription]:
        """Each share group's state, epochs and members (GROUP_ID_NOT_FOUND raised for one the
        coordinator does not have)."""
        ids = list(group_ids)
        response = self._group_call(ids[0] if ids else "", "ShareGroupDescribe",
                                    pb.ShareGroupDescribeRequest(group_ids=ids))
        out = []
        for g in response.groups:
            errors.check(g.error_code, g.error_message)
            out.append(ShareGroupDescription(
                g.group_id, g.group_state, g.group_epoch, g.assignment_epoch, g.assignor_name, [
                    ShareMemberDescription(
                        m.member_id, m.client_id, m.client_host, m.member_epoch,
                        tuple(m.subscribed_topic_names),
                        {tp.topic: tuple(tp.partitions) for tp in m.assignment}, m.rack_id)
                    for m in g.members]))
        return out

    def list_share_group_offsets(self, group_id: str,
                                 partitions: Iterable[tuple[str, int]] | None = None
                                 ) -> dict[tuple[str, int], ShareGroupOffset]:
        """Where the group is in each partition it started (or in these)."""
        by_topic: dict[str, list[int]] = collections.defaultdict(list)
        for t, p in partitions or ():
            by_topic[t].append(p)
        response = self._group_call(group_id, "DescribeShareGroupOffsets",
                                    pb.DescribeShareGroupOffsetsRequest(
                                        group_id=group_id, topic_partitions=[
                                            pb.TopicPartitions(topic=t, partitions=ps)
                                            for t, ps in by_topic.items()]))
        errors.check(response.error_code, response.error_message)
        out = {}
        for o in response.offsets:
            errors.check(o.error_code, o.error_message)
            out[(o.topic, o.partition)] = ShareGroupOffset(o.start_offset, o.leader_epoch, o.lag)
        return out

    def alter_share_group_offsets(self, group_id: str, offsets: dict[tuple[str, int], int]
                                  ) -> dict[tuple[str, int], errors.DeltaBusError | None]:
        """Start the group over at these offsets (kafka-share-groups --reset-offsets
        --execute): refused whole (NON_EMPTY_GROUP) while it has members."""
        response = self._group_call(group_id, "AlterShareGroupOffsets",
                                    pb.AlterShareGroupOffsetsRequest(group_id=group_id, offsets=[
                                        pb.ShareGroupOffset(topic=t, partition=p,
                                                            start_offset=o)
                                        for (t, p), o in offsets.items()]))
        errors.check(response.error_code, response.error_message)
        return {(r.topic, r.partition): errors.error_for_code(r.error_code, r.error_message)
                if r.error_code else None for r in response.results}

    def delete_share_group_offsets(self, group_id: str, topics: Iterable[str]
                                   ) -> dict[str, errors.DeltaBusError | None]:
        """The group's state in these topics goes; it starts them again by
        share.auto.offset.reset (refused whole while it has members)."""
        response = self._group_call(group_id, "DeleteShareGroupOffsets",
                                    pb.DeleteShareGroupOffsetsRequest(group_id=group_id,
                                                                      topics=list(topics)))
        errors.check(response.error_code, response.error_message)
        return {r.name: errors.error_for_code(r.error_code, r.error_message)
                if r.error_code else None for r in response.results}

    # ---- consumer groups, continued -------------------------------------------------------------

    def describe_consumer_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        """Each group's state, assignor and members (with their assigned partitions)."""
        ids = list(group_ids)
        response = self._group_call(ids[0] if ids else "", "DescribeGroups",
                                    pb.DescribeGroupsRequest(group_ids=ids))
        out = []
        for g in response.groups:
            errors.check(g.error_code, g.error_message)
            out.append(GroupDescription(g.group_id, g.group_state, g.protocol_type,
                                        g.protocol_data, g.generation_id, g.leader, [
                MemberDescription(m.member_id, m.client_id, m.client_host, m.member_metadata,
                                  m.member_assignment) for m in g.members]))
        return out

    def list_consumer_group_offsets(self, group_id: str) -> dict[tuple[str, int], int]:
        """The group's committed offset of every partition it committed."""
        response = self._group_call(group_id, "OffsetFetch",
                                    pb.OffsetFetchRequest(group_id=group_id))
        errors.check(response.error_code, response.error_message)
        return {(p.topic, p.partition): p.committed_offset for p in response.partitions
                if p.committed_offset >= 0}

    def alter_consumer_group_offsets(self, group_id: str,
                                     offsets: dict[tuple[str, int], int]) -> None:
        """Set a group's committed offsets (kafka-consumer-groups --reset-offsets --execute).
        Refused (UNKNOWN_MEMBER_ID) while the group has active members, as in Kafka."""
        response = self._group_call(group_id, "OffsetCommit", pb.OffsetCommitRequest(
            group_id=group_id, generation_id=-1, member_id="", partitions=[
                pb.OffsetCommitPartition(topic=t, partition=p, committed_offset=o,
                                         committed_leader_epoch=-1)
                for (t, p), o in offsets.items()]))
        for r in response.results:
            errors.check(r.error_code, r.error_message)

    def delete_consumer_groups(self, group_ids: Iterable[str]
                               ) -> dict[str, errors.DeltaBusError | None]:
        """Delete empty groups and their offsets; per group None or the error (NON_EMPTY_GROUP,
        GROUP_ID_NOT_FOUND)."""
        ids = list(group_ids)
        response = self._group_call(ids[0] if ids else "", "DeleteGroups",
                                    pb.DeleteGroupsRequest(group_ids=ids))
        return {r.group_id: errors.error_for_code(r.error_code, r.error_message)
                if r.error_code else None for r in response.results}

    def describe_cluster(self) -> dict:
        image = self._client.refresh_metadata()
        return {"cluster_id": image.cluster_id, "controller_id": image.controller_id,
                "brokers": list(image.brokers)}

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _answer_or_retry(group: dict[TopicPartition, int], error: errors.DeltaBusError,
                     out: dict[TopicPartition, DeletedRecords],
                     retry: dict[TopicPartition, int]) -> None:
    """A leader that moved or cannot be reached is asked again (after a metadata refresh);
    any other error is the partitions' answer (an unknown partition at once: the metadata was
    just refreshed)."""
    if isinstance(error, (errors.NotLeaderOrFollowerError, errors.LeaderNotAvailableError,
                          errors.NetworkError)):
        retry.update(group)
    else:
        out.update({tp: DeletedRecords(-1, error) for tp in group})


def _salted(upsertion: UserScramCredentialUpsertion) -> ScramCredentialUpsertion:
    """What the wire carries of an upsertion. A mechanism or iteration count the controller
    refuses is sent unhashed (an empty salted password): it answers with Kafka's error, and no
    client spends a second hashing a billion iterations."""
    info = upsertion.scram_credential_info
    salt = secrets.token_bytes(SALT_BYTES) if upsertion.salt is None else upsertion.salt
    salted = b""
    if (info.mechanism in scram.MECHANISMS
            and scram.MIN_ITERATIONS <= info.iterations <= scram.MAX_ITERATIONS):
        password = upsertion.password
        if isinstance(password, bytes):
            try:
                password = password.decode("utf-8")
            except UnicodeDecodeError:
                raise errors.ClientError(
                    f"the password of user {upsertion.user!r} is not UTF-8") from None
        salted = scram.salted_password(info.mechanism, password, salt, info.iterations)
    return ScramCredentialUpsertion(upsertion.user, info.mechanism, info.iterations, salt, salted)
