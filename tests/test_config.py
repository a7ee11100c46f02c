"""Topic configs: Kafka's dotted names are accepted; anything else is INVALID_CONFIG naming
the key."""

from __future__ import annotations

import pytest

from deltabus import errors
from deltabus.config import MESSAGE_MAX_BYTES, ClusterConfig, TopicConfig, topic_config


def test_defaults_are_kafkas() -> None:
    config = topic_config({})
    assert config == TopicConfig()
    assert config.max_message_bytes == MESSAGE_MAX_BYTES == 1_048_588
    assert config.message_timestamp_type == "CreateTime"
    assert config.cleanup_policy == "delete"


def test_known_keys_are_parsed() -> None:
    config = topic_config({
        "max.message.bytes": "2048",
        "message.timestamp.type": "LogAppendTime",
        "retention.ms": "60000",
        "retention.bytes": "-1",
        "cleanup.policy": "compact,delete",
        "min.insync.replicas": "2",
    })
    assert config.max_message_bytes == 2048
    assert config.message_timestamp_type == "LogAppendTime"
    assert config.retention_ms == 60_000
    assert config.retention_bytes == -1
    assert config.cleanup_policy == "compact,delete"
    assert config.min_insync_replicas == 2


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"no.such.config": "1"}, "no.such.config"),
        ({"max_message_bytes": "1"}, "max_message_bytes"),  # the field name is not the config name
        ({"max.message.bytes": "lots"}, "max.message.bytes"),
        ({"retention.ms": "1.5"}, "retention.ms"),
        ({"min.insync.replicas": ""}, "min.insync.replicas"),
        ({"message.timestamp.type": "WallClock"}, "message.timestamp.type"),
        ({"cleanup.policy": "forever"}, "cleanup.policy"),
        ({"max.message.bytes": "0"}, "max.message.bytes"),
        ({"max.message.bytes": "-5"}, "max.message.bytes"),
        ({"min.insync.replicas": "0"}, "min.insync.replicas"),
    ],
)
def test_bad_config_raises_invalid_config_naming_the_key(overrides: dict, key: str) -> None:
    with pytest.raises(errors.InvalidConfigError) as info:
        topic_config(overrides)
    assert info.value.code == 40
    assert key in str(info.value)


def test_one_bad_key_among_good_ones_still_fails() -> None:
    with pytest.raises(errors.InvalidConfigError, match="bogus"):
        topic_config({"retention.ms": "1000", "bogus": "x"})


def test_cluster_config_checks_relations() -> None:
    with pytest.raises(ValueError):
        ClusterConfig(root="/tmp/x", brokers=0)
    with pytest.raises(ValueError):
        ClusterConfig(root="/tmp/x", broker_heartbeat_interval_ms=5_000,
                      broker_session_timeout_ms=6_000)
    with pytest.raises(ValueError):
        ClusterConfig(root="/tmp/x", group_commit_bytes_max=2, log_cache_bytes_max=1)
