"""Topic configs (KRaft's ConfigurationControlManager). Runs in the driver, inside the controller.

A topic's configs are its overrides of the cluster defaults, held as config records: a record
sets one key, or removes it (value None). `alter_configs` is a handler: it checks a topic's changes
as a whole and returns the records (or raises, and nothing changes); it changes nothing itself.

Invariant: the overrides in the metadata always parse (`cfg.topic_config` accepts them).
Not thread-safe: the controller holds its lock around every call.
"""

from __future__ import annotations

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.metadata_records import ConfigRecord, ControllerResult, MetadataRecord
from deltabus.cluster.metadata_state import MetadataState


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
