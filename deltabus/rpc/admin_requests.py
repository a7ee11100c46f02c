"""The request layer's admin operations, for both doors: topics (CreateTopics, DeleteTopics,
CreatePartitions), configs (DescribeConfigs, IncrementalAlterConfigs), and the ACL each
cluster-wide operation needs (`CLUSTER_ACTIONS`: elections, reassignments, SCRAM credentials,
ACLs, client quotas, DescribeCluster, DescribeLogDirs).

ACLs as Kafka's: CREATE on the cluster or the topic to create it, DELETE on a topic to delete
it, ALTER to add partitions, DESCRIBE_CONFIGS and ALTER_CONFIGS on a topic for its configs; a
refused topic is answered with its refusal and the others go ahead. Only topics have dynamic
configs here: any other config resource is answered INVALID_REQUEST. The cluster-wide
operations need their CLUSTER_ACTIONS operation on the cluster, then go to the handler as asked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import DeltaBusHandler
from deltabus.metadata import (
    BalancePlan,
    MetadataImage,
    NewTopic,
    ScaleStatus,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
    ScramDescriptions,
    TopicResult,
)
from deltabus.quotas import QuotaAlteration, QuotaEntity, QuotaFilterComponent
from deltabus.rpc.access import Access, merge_refusals
from deltabus.security.acls import AclBinding, AclBindingFilter, AclCreation, Operation

TOPIC_RESOURCE, BROKER_RESOURCE, GROUP_RESOURCE = 2, 4, 32  # Kafka's ConfigResource.Type

# The operation on the cluster each cluster-wide request needs (Kafka's KafkaApis checks).
CLUSTER_ACTIONS: dict[str, Operation] = {
    "ElectLeaders": Operation.ALTER,
    "AlterPartitionReassignments": Operation.ALTER,
    "ListPartitionReassignments": Operation.DESCRIBE,
    "ScaleCluster": Operation.ALTER,
    "ScaleClusterStatus": Operation.DESCRIBE,
    "BalanceCluster": Operation.ALTER,
    "BalanceClusterPlan": Operation.DESCRIBE,
    "AlterUserScramCredentials": Operation.ALTER,
    "DescribeUserScramCredentials": Operation.DESCRIBE,
    "CreateAcls": Operation.ALTER,
    "DeleteAcls": Operation.ALTER,
    "DescribeAcls": Operation.DESCRIBE,
    "AlterClientQuotas": Operation.ALTER_CONFIGS,
    "DescribeClientQuotas": Operation.DESCRIBE_CONFIGS,
    "DescribeCluster": Operation.DESCRIBE,
    "DescribeLogDirs": Operation.DESCRIBE,
}

ConfigKey = tuple[int, str]  # resource type, resource name
PartitionResults = dict[tuple[str, int], errors.DeltaBusError | None]
DescribedConfigs = dict[ConfigKey, list[cfg.ConfigEntry] | errors.DeltaBusError]


@dataclass(frozen=True)
class ConfigChange:
    """One resource of an IncrementalAlterConfigs."""

    resource_type: int
    name: str
    ops: Sequence[cfg.AlterConfigOp]


def not_a_topic(resource_type: int) -> errors.DeltaBusError:
    """What a config request about anything but a topic is answered."""
    return errors.InvalidRequestError(
        "deltabus brokers take their configs when the cluster starts (deltabus cluster "
        "start); only topics and groups have dynamic configs" if resource_type == BROKER_RESOURCE
        else f"unsupported config resource type {resource_type}: only topics and groups have "
        "dynamic configs in deltabus")


class AdminRequests:
    """Validates, authorizes and carries out the admin calls of both doors."""

    def __init__(self, handler: DeltaBusHandler) -> None:
        self._handler = handler

    @staticmethod
    def cluster_refusal(access: Access, api: str) -> errors.DeltaBusError | None:
        """The refusal of a cluster-wide request (`api`: a key of CLUSTER_ACTIONS), or None."""
        return access.cluster(CLUSTER_ACTIONS[api])

    def create_topics(self, access: Access, topics: Sequence[NewTopic], timeout_ms: int,
                      validate_only: bool = False) -> list[TopicResult]:
        """Each topic's result in request order: TOPIC_AUTHORIZATION_FAILED without CREATE on
        the cluster or the topic; the controller's answer for the others."""
        denied = {t.name: errors.TopicAuthorizationFailedError(
            f"Not authorized to create topic: {t.name}")
            for t in topics if not access.may_create_topic(t.name)}
        allowed = [t for t in topics if t.name not in denied]
        return merge_refusals([t.name for t in topics], self._handler.create_topics(
            allowed, timeout_ms=timeout_ms, validate_only=validate_only) if allowed else [],
            denied)

    def delete_topics(self, access: Access, names: Sequence[str],
                      timeout_ms: int) -> list[TopicResult]:
        denied = {n: e for n in names if (e := access.topic(Operation.DELETE, n))}
        allowed = [n for n in names if n not in denied]
        return merge_refusals(list(names), self._handler.delete_topics(
            allowed, timeout_ms=timeout_ms) if allowed else [], denied)

    def create_partitions(self, access: Access, counts: Sequence[tuple[str, int]],
                          timeout_ms: int, validate_only: bool = False) -> list[TopicResult]:
        """Each topic grows to its new partition count, for a principal allowed ALTER on it."""
        denied = {n: e for n, _ in counts if (e := access.topic(Operation.ALTER, n))}
        allowed = {n: c for n, c in counts if n not in denied}
        return merge_refusals([n for n, _ in counts], self._handler.create_partitions(
            allowed, timeout_ms=timeout_ms, validate_only=validate_only) if allowed else [],
            denied)

    def describe_configs(self, access: Access,
                         resources: Sequence[ConfigKey]) -> DescribedConfigs:
        """Each topic's or group's config entries, or why not (TOPIC_AUTHORIZATION_FAILED or
        GROUP_AUTHORIZATION_FAILED without DESCRIBE_CONFIGS on it, UNKNOWN_TOPIC_OR_PARTITION
        for no topic)."""
        out: DescribedConfigs = {}
        named: dict[int, list[str]] = {TOPIC_RESOURCE: [], GROUP_RESOURCE: []}
        for resource_type, name in resources:
            refusal = (access.topic(Operation.DESCRIBE_CONFIGS, name)
                       if resource_type == TOPIC_RESOURCE else
                       access.group(Operation.DESCRIBE_CONFIGS, name)
                       if resource_type == GROUP_RESOURCE else not_a_topic(resource_type))
            if refusal is not None:
                out[(resource_type, name)] = refusal
            else:
                named[resource_type].append(name)
        topics, groups = named[TOPIC_RESOURCE], named[GROUP_RESOURCE]
        found = self._handler.describe_configs(topics) if topics else {}
        for name in topics:
            out[(TOPIC_RESOURCE, name)] = found.get(name) or errors.UnknownTopicOrPartitionError(
                f"unknown topic {name}")
        if groups:
            out.update({(GROUP_RESOURCE, g): entries for g, entries in
                        self._handler.describe_group_configs(groups).items()})
        return {key: out[key] for key in resources}  # in request order

    def alter_configs(self, access: Access, changes: Sequence[ConfigChange],
                      validate_only: bool = False
                      ) -> dict[ConfigKey, errors.DeltaBusError | None]:
        """Each resource's answer, in Kafka's order: a resource named twice or a key named
        twice in one resource is INVALID_REQUEST, anything but a topic or a group cannot be
        altered, then ALTER_CONFIGS on it, then the controller's checks and change."""
        seen = Counter((c.resource_type, c.name) for c in changes)
        results: dict[ConfigKey, errors.DeltaBusError | None] = {}
        allowed: dict[int, dict[str, list[cfg.AlterConfigOp]]] = {TOPIC_RESOURCE: {},
                                                                  GROUP_RESOURCE: {}}
        for c in changes:
            key = (c.resource_type, c.name)
            if seen[key] > 1:
                results[key] = errors.InvalidRequestError(
                    f"Error due to duplicate config resource: {c.name}")
            elif len({op.name for op in c.ops}) < len(c.ops):
                results[key] = errors.InvalidRequestError(
                    f"Error due to duplicate config keys for resource {c.name}")
            elif c.resource_type not in allowed:
                results[key] = not_a_topic(c.resource_type)
            else:
                results[key] = (access.topic if c.resource_type == TOPIC_RESOURCE
                                else access.group)(Operation.ALTER_CONFIGS, c.name)
                if results[key] is None:
                    allowed[c.resource_type][c.name] = list(c.ops)
        if allowed[TOPIC_RESOURCE]:
            answered = self._handler.alter_configs(allowed[TOPIC_RESOURCE],
                                                   validate_only=validate_only)
            results.update({(TOPIC_RESOURCE, t): e for t, e in answered.items()})
        if allowed[GROUP_RESOURCE]:
            answered = self._handler.alter_group_configs(allowed[GROUP_RESOURCE],
                                                         validate_only=validate_only)
            results.update({(GROUP_RESOURCE, g): e for g, e in answered.items()})
        return results

    # ---- cluster-wide operations: the refusal (CLUSTER_ACTIONS), then the handler ----------
    # A door that answers a refusal in its own shape (each entry with it) asks cluster_refusal
    # first; these raise it.

    def elect_leaders(self, access: Access, election_type: str,
                      partitions: list[tuple[str, int]] | None) -> PartitionResults:
        Access.raise_if(self.cluster_refusal(access, "ElectLeaders"))
        return self._handler.elect_leaders(election_type, partitions)

    def reassign_partitions(self, access: Access,
                            targets: dict[tuple[str, int], list[int] | None]) -> PartitionResults:
        Access.raise_if(self.cluster_refusal(access, "AlterPartitionReassignments"))
        return self._handler.reassign_partitions(targets)

    def scale_cluster(self, access: Access, brokers: int | None) -> ScaleStatus:
        """ALTER on the cluster to scale it, DESCRIBE to see how the last scale went."""
        Access.raise_if(self.cluster_refusal(
            access, "ScaleClusterStatus" if brokers is None else "ScaleCluster"))
        return self._handler.scale_cluster(brokers)

    def balance_cluster(self, access: Access, execute: bool) -> BalancePlan:
        """DESCRIBE on the cluster for the plan, ALTER to carry it out."""
        Access.raise_if(self.cluster_refusal(
            access, "BalanceCluster" if execute else "BalanceClusterPlan"))
        return self._handler.balance_cluster(execute)

    def reassignment_image(self, access: Access, topics: list[str]) -> MetadataImage:
        Access.raise_if(self.cluster_refusal(access, "ListPartitionReassignments"))
        return self._handler.reassignment_image(topics)

    def alter_user_scram_credentials(self, access: Access,
                                     deletions: list[ScramCredentialDeletion],
                                     upsertions: list[ScramCredentialUpsertion]
                                     ) -> dict[str, errors.DeltaBusError | None]:
        Access.raise_if(self.cluster_refusal(access, "AlterUserScramCredentials"))
        return self._handler.alter_user_scram_credentials(deletions, upsertions)

    def describe_user_scram_credentials(self, access: Access,
                                        users: list[str] | None) -> ScramDescriptions:
        Access.raise_if(self.cluster_refusal(access, "DescribeUserScramCredentials"))
        return self._handler.describe_user_scram_credentials(users)

    def create_acls(self, access: Access,
                    creations: list[AclCreation]) -> list[errors.DeltaBusError | None]:
        Access.raise_if(self.cluster_refusal(access, "CreateAcls"))
        return self._handler.create_acls(creations)

    def delete_acls(self, access: Access, filters: list[AclBindingFilter]
                    ) -> list[list[AclBinding] | errors.DeltaBusError]:
        Access.raise_if(self.cluster_refusal(access, "DeleteAcls"))
        return self._handler.delete_acls(filters)

    def describe_acls(self, access: Access, acl_filter: AclBindingFilter) -> list[AclBinding]:
        Access.raise_if(self.cluster_refusal(access, "DescribeAcls"))
        return self._handler.describe_acls(acl_filter)

    def alter_client_quotas(self, access: Access, alterations: list[QuotaAlteration],
                            validate_only: bool) -> list[errors.DeltaBusError | None]:
        Access.raise_if(self.cluster_refusal(access, "AlterClientQuotas"))
        return self._handler.alter_client_quotas(alterations, validate_only=validate_only)

    def describe_client_quotas(self, access: Access, components: list[QuotaFilterComponent],
                               strict: bool) -> dict[QuotaEntity, dict[str, float]]:
        Access.raise_if(self.cluster_refusal(access, "DescribeClientQuotas"))
        return self._handler.describe_client_quotas(components, strict)
