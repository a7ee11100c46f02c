"""Topic and group configs (KRaft's ConfigurationControlManager). Runs in the driver, inside
the controller.

A topic's configs are its overrides of the cluster defaults, held as config records: a record
sets one key, or removes it (value None). `alter_configs` is a handler: it checks a topic's changes
as a whole and returns the records (or raises, and nothing changes); it changes nothing itself.

Invariant: the overrides in the metadata always parse (`cfg.topic_config` accepts them).
Not thread-safe: the controller holds its lock around every call.
"""

from __future__ import annotations

from deltabus import config as cfg
from deltabus import errors, group_configs
from deltabus.cluster.metadata_records import (
    ConfigRecord,
    ControllerResult,
    GroupConfigRecord,
    MetadataRecord,
)
from deltabus.cluster.metadata_state import MetadataState
from deltabus.offsets.group_limits import check_group_id


def alter_configs(state: MetadataState, config: cfg.ClusterConfig, name: str,
                  ops: list[cfg.AlterConfigOp]) -> ControllerResult[None]:
    """Kafka's IncrementalAlterConfigs for one topic: a config record per key that changes."""
    topic = state.topics.get(name)
    if topic is None:
        raise errors.UnknownTopicOrPartitionError(f"Topic '{name}' does not exist.")
    old = topic.configs
    new = cfg.altered_overrides(old, ops, config.topic_defaults())
    records: list[MetadataRecord] = [
        ConfigRecord(name, key, new.get(key))
        for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    return ControllerResult(records, None)


def describe_configs(state: MetadataState, config: cfg.ClusterConfig,
                     topics: list[str]) -> cfg.ConfigResults:
    """Every config of each topic, with its value and source (Kafka's DescribeConfigs)."""
    results: cfg.ConfigResults = {}
    for name in topics:
        topic = state.topics.get(name)
        results[name] = (
            config.describe_topic_config(topic.configs) if topic is not None
            else errors.UnknownTopicOrPartitionError(f"Topic '{name}' does not exist."))
    return results


def alter_group_configs(state: MetadataState, config: cfg.ClusterConfig, group: str,
                        ops: list[cfg.AlterConfigOp]) -> ControllerResult[None]:
    """Kafka's IncrementalAlterConfigs for one group (kafka-configs.sh --entity-type groups):
    a group config record per key that changes. A group needs no members to have configs."""
    check_group_id(group)
    old = state.group_configs.get(group, {})
    new = group_configs.altered(config.group, old, ops)
    records: list[MetadataRecord] = [
        GroupConfigRecord(group, key, new.get(key))
        for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    return ControllerResult(records, None)


def describe_group_configs(state: MetadataState, config: cfg.ClusterConfig,
                           groups: list[str]) -> cfg.ConfigResults:
    """Every group config of each group: its own value, else the brokers' default."""
    return {group: group_configs.describe(config.group, state.group_configs.get(group))
            for group in groups}
