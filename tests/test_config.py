"""Topic configs: Kafka's dotted names are accepted; anything else is INVALID_CONFIG naming
the key."""

from __future__ import annotations

import re
import time

import pytest

from deltabus import errors
from deltabus.config import (
    APPEND,
    DELETE,
    MESSAGE_MAX_BYTES,
    SET,
    SUBTRACT,
    TOPIC_CONFIGS,
    AlterConfigOp,
    ClusterConfig,
    LogConfig,
    SocketServerConfig,
    TopicConfig,
    altered_overrides,
    broker_settings,
    topic_config,
)


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


def test_the_kafka_listeners_limits_are_kafkas_and_checked() -> None:
    limits = SocketServerConfig()
    assert (limits.num_io_threads, limits.queued_max_requests,
            limits.connections_max_idle_ms) == (8, 500, 600_000)  # Kafka's defaults
    assert ClusterConfig(root="/tmp/x").socket_server == limits
    with pytest.raises(ValueError, match="max.connections.per.ip must be at least 1"):
        SocketServerConfig(max_connections_per_ip=0)
    with pytest.raises(ValueError, match="queued.max.request.bytes"):
        SocketServerConfig(queued_max_request_bytes=10, socket_request_max_bytes=11)
    with pytest.raises(ValueError, match="num.io.threads"):
        SocketServerConfig(num_io_threads=8, queued_max_requests=4)


def test_every_broker_log_gets_the_clusters_log_settings() -> None:
    config = ClusterConfig(root="/tmp/x", group_commit_linger_ms=7, checkpoint_interval=12,
                           group_commit_bytes_max=1 << 20, log_cache_bytes_max=1 << 21)
    log = config.log_config()
    assert (log.group_commit_linger_ms, log.checkpoint_interval, log.group_commit_bytes_max,
            log.log_cache_bytes_max) == (7, 12, 1 << 20, 1 << 21)
    assert ClusterConfig(root="/tmp/x").log_config() == LogConfig()  # one set of defaults


def test_each_cluster_gets_its_own_broker_credential_and_repr_never_shows_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELTABUS_INTER_BROKER_SECRET", raising=False)
    one, two = ClusterConfig(root="/tmp/x"), ClusterConfig(root="/tmp/x")
    assert len(one.inter_broker_secret) >= 32 and one.inter_broker_secret != two.inter_broker_secret
    assert one.inter_broker_secret not in repr(one)
    assert one.with_(brokers=5).inter_broker_secret == one.inter_broker_secret  # its brokers'
    monkeypatch.setenv("DELTABUS_INTER_BROKER_SECRET", "from-the-environment")
    assert ClusterConfig(root="/tmp/x").inter_broker_secret == "from-the-environment"


def test_an_open_listener_beyond_loopback_is_warned_of() -> None:
    from deltabus.cluster.cluster import open_listener_warning

    for host in ("127.0.0.1", "127.0.0.3", "localhost", "::1"):
        assert open_listener_warning(ClusterConfig(root="/tmp/x", host=host)) is None
    warning = open_listener_warning(ClusterConfig(root="/tmp/x", host="10.1.2.3"))
    assert warning is not None and "ANYONE" in warning and "10.1.2.3" in warning
    assert open_listener_warning(ClusterConfig(root="/tmp/x", host="10.1.2.3",
                                               authorizer=True)) is None
    with pytest.raises(ValueError, match="super.users"):
        ClusterConfig(root="/tmp/x", super_users=("alice",))


def test_invalid_values_get_kafkas_messages() -> None:
    cases = {
        ("retention.ms", "abc"):
            "Invalid value abc for configuration retention.ms: Not a number of type LONG",
        ("retention.ms", "-2"):
            "Invalid value -2 for configuration retention.ms: Value must be at least -1",
        ("segment.bytes", "1000"):
            "Invalid value 1000 for configuration segment.bytes: Value must be at least 1048576",
        ("segment.bytes", str(2**31)):
            f"Invalid value {2**31} for configuration segment.bytes: Not a number of type INT",
        ("unclean.leader.election.enable", "yes"):
            "Invalid value yes for configuration unclean.leader.election.enable: Expected value "
            "to be either true or false",
        ("min.cleanable.dirty.ratio", "half"):
            "Invalid value half for configuration min.cleanable.dirty.ratio: Not a number of "
            "type DOUBLE",
        ("min.cleanable.dirty.ratio", "1.5"):
            "Invalid value 1.5 for configuration min.cleanable.dirty.ratio: Value must be no "
            "more than 1",
        ("cleanup.policy", "compact,forever"):
            "Invalid value compact,forever for configuration cleanup.policy: String must be one "
            "of: compact, delete",
    }
    for (key, value), message in cases.items():
        with pytest.raises(errors.InvalidConfigError) as info:
            topic_config({key: value})
        assert str(info.value).endswith(message), str(info.value)


def test_the_dirty_ratio_is_a_double() -> None:
    assert topic_config({"min.cleanable.dirty.ratio": "0.1"}).min_cleanable_dirty_ratio == 0.1
    assert topic_config({}).min_cleanable_dirty_ratio == 0.5  # Kafka's default


def test_cleanup_policy_is_a_list() -> None:
    both = topic_config({"cleanup.policy": "compact, delete"})
    assert both.cleanup_policy == "compact,delete" and both.compacts and both.deletes
    compact = topic_config({"cleanup.policy": "compact"})
    assert compact.compacts and not compact.deletes
    assert TopicConfig().deletes and not TopicConfig().compacts


def test_incremental_alter_sets_deletes_appends_and_subtracts() -> None:
    overrides = {"retention.ms": "1000", "min.insync.replicas": "2"}
    out = altered_overrides(overrides, [
        AlterConfigOp("retention.ms", DELETE),
        AlterConfigOp("retention.bytes", SET, "4096"),
        AlterConfigOp("cleanup.policy", APPEND, "compact"),  # onto the default, delete
    ])
    assert out == {"min.insync.replicas": "2", "retention.bytes": "4096",
                   "cleanup.policy": "delete,compact"}
    assert overrides == {"retention.ms": "1000", "min.insync.replicas": "2"}  # not modified
    out = altered_overrides(out, [AlterConfigOp("cleanup.policy", SUBTRACT, "delete")])
    assert out["cleanup.policy"] == "compact"
    assert altered_overrides({}, [AlterConfigOp("retention.ms", DELETE)]) == {}


def test_incremental_alter_refuses_the_whole_change_naming_the_key() -> None:
    with pytest.raises(errors.InvalidConfigError, match="Unknown topic config name: retention"):
        altered_overrides({}, [AlterConfigOp("retention", SET, "1")])
    with pytest.raises(errors.InvalidConfigError, match="retention.ms: Not a number"):
        altered_overrides({}, [AlterConfigOp("retention.bytes", SET, "1"),
                               AlterConfigOp("retention.ms", SET, "soon")])
    with pytest.raises(errors.InvalidConfigError,
                       match="append is not allowed for config key: retention.ms"):
        altered_overrides({}, [AlterConfigOp("retention.ms", APPEND, "1")])
    with pytest.raises(errors.InvalidRequestError, match="Null value"):
        altered_overrides({}, [AlterConfigOp("retention.ms", SET, None)])


def test_describe_shows_value_source_and_synonyms() -> None:
    cluster = ClusterConfig(root="unused", min_insync_replicas=2)
    entries = {e.name: e for e in cluster.describe_topic_config({"retention.ms": "1000"})}
    assert set(entries) == set(TOPIC_CONFIGS)
    retention = entries["retention.ms"]
    assert (retention.value, retention.source) == ("1000", "DYNAMIC_TOPIC_CONFIG")
    assert retention.synonyms == (("DYNAMIC_TOPIC_CONFIG", "retention.ms", "1000"),
                                  ("DEFAULT_CONFIG", "log.retention.ms", "604800000"))
    isr = entries["min.insync.replicas"]
    assert (isr.value, isr.source) == ("2", "STATIC_BROKER_CONFIG")
    unclean = entries["unclean.leader.election.enable"]
    assert (unclean.value, unclean.source, unclean.type) == ("false", "DEFAULT_CONFIG", "BOOLEAN")
    assert cluster.topic_config({}).min_insync_replicas == 2
    assert cluster.topic_config({"min.insync.replicas": "3"}).min_insync_replicas == 3


def test_a_delay_the_cleaner_adds_to_the_clock_cannot_overflow_it() -> None:
    """file.delete.delay.ms is added to the current time (the stamp vacuum reads): a value near
    2^63 would overflow it, so it is refused as Kafka refuses a value out of range, and one
    stored before the bound existed counts as the bound."""
    with pytest.raises(errors.InvalidConfigError) as info:
        topic_config({"file.delete.delay.ms": str(2**63 - 1)})
    assert re.search(r"Invalid value 9223372036854775807 for configuration file\.delete\.delay"
                     r"\.ms: Value must be no more than (\d+)$", str(info.value))
    bound = int(str(info.value).rsplit(" ", 1)[1])
    assert topic_config({"file.delete.delay.ms": str(bound)}).file_delete_delay_ms == bound
    assert int(time.time() * 1000) + bound < 2**63 // 1000  # microseconds fit too
    stored = ClusterConfig(root="/tmp/x").topic_config({"file.delete.delay.ms": str(2**63 - 1)})
    assert stored.file_delete_delay_ms == bound


def test_flush_messages_defaults_to_never_as_kafka_and_takes_its_broker_synonym() -> None:
    assert topic_config({}).flush_messages == 2**63 - 1
    assert topic_config({"flush.messages": "1"}).flush_messages == 1
    with pytest.raises(errors.InvalidConfigError, match="flush.messages: Value must be at least 1"):
        topic_config({"flush.messages": "0"})
    cluster = ClusterConfig(root="/tmp/x", topic_config_defaults={"flush.messages": "100"})
    assert cluster.topic_config({}).flush_messages == 100
    entry = {e.name: e for e in cluster.describe_topic_config({})}["flush.messages"]
    assert (entry.value, entry.source) == ("100", "STATIC_BROKER_CONFIG")
    assert entry.synonyms[0] == ("STATIC_BROKER_CONFIG", "log.flush.interval.messages", "100")


@pytest.mark.parametrize("version", ["0.10.2", "0.11.0-IV2", "2.8", "2.8-IV1", "3.0-IV1"])
def test_a_kafka_3_deprecated_message_format_version_is_taken_and_changes_nothing(
        version: str) -> None:
    """message.format.version and message.downconversion.enable (deprecated in Kafka 3, gone in
    4.0) are taken as Kafka 3 takes them, so tools written for 3.x clusters work; deltabus
    writes one record format and never down-converts, so they change nothing but themselves."""
    config = topic_config({"message.format.version": version,
                           "message.downconversion.enable": "false"})
    assert config == TopicConfig(message_format_version=version,
                                 message_downconversion_enable=False)
    assert TOPIC_CONFIGS["message.format.version"].broker_name == "log.message.format.version"
    assert TopicConfig().message_format_version == "3.0-IV1"  # Kafka 3's default
    with pytest.raises(errors.InvalidConfigError, match="message.format.version"):
        topic_config({"message.format.version": "soon"})


def test_broker_configs_by_their_server_properties_names_set_the_cluster() -> None:
    """Kafka's broker configs deltabus implements, by their server.properties names, become
    ClusterConfig keyword arguments: its own fields, the group coordinator's and the Kafka
    listeners' limits, and the cluster defaults of topic configs (log.retention.ms for
    retention.ms, in Kafka's coarser units too, the finest given winning as in Kafka)."""
    settings = broker_settings({
        "num.partitions": "3", "default.replication.factor": "2",
        "auto.create.topics.enable": "FALSE", "min.insync.replicas": "2",
        "leader.imbalance.check.interval.seconds": "30", "group.max.size": "50",
        "offsets.retention.minutes": "60", "num.io.threads": "4",
        "log.retention.hours": "24", "log.cleanup.policy": "compact",
        "message.max.bytes": "2000000", "log.message.format.version": "2.8"})
    config = ClusterConfig(root="unused", **settings)
    assert (config.num_partitions, config.default_replication_factor) == (3, 2)
    assert (config.auto_create_topics_enable, config.min_insync_replicas) == (False, 2)
    assert config.leader_imbalance_check_interval_ms == 30_000
    assert (config.group.group_max_size, config.group.offsets_retention_minutes) == (50, 60)
    assert config.socket_server == SocketServerConfig(num_io_threads=4)
    defaults = config.topic_defaults()
    assert (defaults.retention_ms, defaults.cleanup_policy) == (24 * 3_600_000, "compact")
    assert (defaults.max_message_bytes, defaults.min_insync_replicas) == (2_000_000, 2)
    assert config.topic_config({"retention.ms": "5"}).retention_ms == 5  # a topic's own wins
    retention = {e.name: e for e in config.describe_topic_config({})}["retention.ms"]
    assert (retention.value, retention.source) == ("86400000", "STATIC_BROKER_CONFIG")
    assert retention.synonyms[0] == ("STATIC_BROKER_CONFIG", "log.retention.ms", "86400000")
    finest = broker_settings({"log.retention.hours": "1", "log.retention.minutes": "2",
                              "log.retention.ms": "3"})
    assert finest == {"topic_config_defaults": {"retention.ms": "3"}}
    assert broker_settings({"log.retention.hours": "1", "log.retention.minutes": "2"}) == {
        "topic_config_defaults": {"retention.ms": "120000"}}


@pytest.mark.parametrize(("properties", "says"), [
    ({"num.network.threads": "3", "log.dirs": "/tmp", "num.partitions": "1"},
     "log.dirs, num.network.threads are not broker configs deltabus takes"),
    ({"compression.type": "zstd"}, "compression.type is not a broker config deltabus takes"),
    ({"num.partitions": "three"},
     "Invalid value three for configuration num.partitions: Not a number of type INT"),
    ({"log.retention.ms": "soon"},
     "Invalid value soon for configuration log.retention.ms: Not a number of type LONG"),
    ({"auto.create.topics.enable": "no"},
     "Invalid value no for configuration auto.create.topics.enable: Expected value to be "
     "either true or false"),
    ({"num.partitions": "0"}, "num.partitions must be at least 1, not 0"),
    ({"default.replication.factor": "0"}, "default.replication.factor must be at least 1"),
])
def test_a_broker_config_deltabus_does_not_take_is_one_line_naming_it(
        properties: dict[str, str], says: str) -> None:
    with pytest.raises((errors.InvalidConfigError, ValueError)) as refused:
        ClusterConfig(root="unused", **broker_settings(properties))
    message = str(refused.value)
    assert says in message and "\n" not in message, message
