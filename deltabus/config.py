"""Limits and defaults, in one place, named as Kafka names them.

Every queue, batch, wait and buffer in deltabus has a limit here. Topic-level configs use Kafka's
dotted names (`max.message.bytes`) because users type them on the CLI; the relations between the
limits are checked at import, so a bad edit fails at once rather than in production.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from deltabus import errors

# Ports and addresses. Every server binds loopback unless told otherwise.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_BOOTSTRAP_PORT = 9192  # the controller's gRPC port: the cluster's bootstrap address

# Records and requests.
MESSAGE_MAX_BYTES = 1_048_588  # Kafka's message.max.bytes / topic max.message.bytes default
REQUEST_MAX_BYTES = 104_857_600  # Kafka's socket.request.max.bytes: the largest gRPC message
FETCH_MAX_BYTES = 52_428_800  # Kafka's fetch.max.bytes
FETCH_PARTITION_MAX_BYTES = 1_048_576  # Kafka's max.partition.fetch.bytes
FETCH_MAX_WAIT_MS = 500  # Kafka's fetch.max.wait.ms
# A broker answers a partition with at most this much, whatever a consumer allows: one gRPC message
# of tens of MB moves slower per byte than several of a few MB (measured: 8 MB 1.4M records/s,
# 32 MB 0.9M). Kafka's broker caps responses the same way (replica.fetch.response.max.bytes).
FETCH_RESPONSE_PARTITION_BYTES_MAX = 8 * 1024 * 1024
FETCH_WAIT_MS_MAX = 60_000  # no long poll waits longer than this
PARTITIONS_MAX = 10_000  # per topic
TOPIC_NAME_LENGTH_MAX = 249  # Kafka's limit


@dataclass(frozen=True, kw_only=True)
class TopicConfig:
    """A topic's effective configuration: Kafka's topic configs that deltabus honours."""

    max_message_bytes: int = MESSAGE_MAX_BYTES
    message_timestamp_type: str = "CreateTime"  # or LogAppendTime
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    cleanup_policy: str = "delete"
    # With acks=all, a produce needs this many in-sync replicas or fails NOT_ENOUGH_REPLICAS.
    min_insync_replicas: int = 1
    # Elect a replica outside the ISR when no in-sync one is alive (may lose acknowledged data).
    unclean_leader_election_enable: bool = False


def _parse_bool(raw: str) -> bool:
    if raw.strip().lower() not in ("true", "false"):
        raise ValueError(raw)
    return raw.strip().lower() == "true"


# Kafka's dotted name -> (TopicConfig field, parser). Only these may be set on a topic.
TOPIC_CONFIG_KEYS: dict[str, tuple[str, Any]] = {
    "max.message.bytes": ("max_message_bytes", int),
    "message.timestamp.type": ("message_timestamp_type", str),
    "retention.ms": ("retention_ms", int),
    "retention.bytes": ("retention_bytes", int),
    "cleanup.policy": ("cleanup_policy", str),
    "min.insync.replicas": ("min_insync_replicas", int),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", _parse_bool),
}

_CHOICES = {
    "message.timestamp.type": {"CreateTime", "LogAppendTime"},
    "cleanup.policy": {"delete", "compact", "compact,delete", "delete,compact"},
}


def topic_config(overrides: dict[str, str]) -> TopicConfig:
    """The effective config of a topic from its overrides; raises InvalidConfigError on a bad one.

    Kafka refuses unknown keys and unparsable values with INVALID_CONFIG naming the key; so do we.
    """
    values: dict[str, Any] = {}
    for key, raw in overrides.items():
        if key not in TOPIC_CONFIG_KEYS:
            raise errors.InvalidConfigError(f"Unknown topic config name: {key}")
        attr, parse = TOPIC_CONFIG_KEYS[key]
        try:
            value = parse(raw)
        except ValueError:
            raise errors.InvalidConfigError(
                f"Invalid value {raw} for configuration {key}"
            ) from None
        if key in _CHOICES and value not in _CHOICES[key]:
            raise errors.InvalidConfigError(
                f"Invalid value {raw} for configuration {key}: must be one of "
                f"{sorted(_CHOICES[key])}"
            )
        if attr == "max_message_bytes" and not 0 < value <= REQUEST_MAX_BYTES:
            raise errors.InvalidConfigError(
                f"Invalid value {raw} for configuration {key}: must be in [1, {REQUEST_MAX_BYTES}]"
            )
        if attr == "min_insync_replicas" and value < 1:
            raise errors.InvalidConfigError(
                f"Invalid value {raw} for configuration {key}: must be at least 1"
            )
        values[attr] = value
    return TopicConfig(**values)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


@dataclass(frozen=True, kw_only=True)
class GroupConfig:
    """The group coordinator's limits, as Kafka's broker configs of the same names."""

    # A member's session.timeout.ms must lie in [min, max] (group.min/max.session.timeout.ms).
    group_min_session_timeout_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_GROUP_MIN_SESSION_TIMEOUT_MS", 6_000))
    group_max_session_timeout_ms: int = 1_800_000
    # A new (empty) group waits this long for more members before its first generation, so a
    # fleet of consumers starting together gets one rebalance, not one per member.
    group_initial_rebalance_delay_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_GROUP_INITIAL_REBALANCE_DELAY_MS", 3_000))
    group_max_size: int = 10_000
    # Offsets of a group empty for this long (or of a standalone consumer not committing for
    # this long) expire; checked this often.
    offsets_retention_minutes: int = 7 * 24 * 60
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4096
    # Commits queued within this long share one Delta commit of __consumer_offsets.
    offsets_commit_linger_ms: int = 5
    # The coordinator answers joins and syncs of this many members at once (server threads).
    coordinator_threads: int = 512

    def __post_init__(self) -> None:
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ValueError("group.min.session.timeout.ms exceeds group.max.session.timeout.ms")


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """Settings of one deltabus cluster: controller, brokers and their logs.

    Runs on the driver; a copy travels to every broker task. Timeouts are short-able from the
    environment (DELTABUS_*_MS) so tests run fast without code changes.
    """

    root: str
    brokers: int = 3
    host: str = field(default_factory=lambda: os.environ.get("DELTABUS_HOST")
                      or os.environ.get("SPARK_LOCAL_IP") or DEFAULT_HOST)
    port: int = DEFAULT_BOOTSTRAP_PORT
    num_partitions: int = 1  # Kafka's num.partitions
    default_replication_factor: int = 1
    # A broker heartbeats at least this often; one silent for the session timeout is fenced.
    broker_heartbeat_interval_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_BROKER_HEARTBEAT_INTERVAL_MS", 500))
    broker_session_timeout_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_BROKER_SESSION_TIMEOUT_MS", 9_000))
    # How long starting or stopping the cluster may take before it gives up.
    startup_timeout_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_STARTUP_TIMEOUT_MS", 120_000))
    shutdown_timeout_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_SHUTDOWN_TIMEOUT_MS", 30_000))
    # Group commit: produce requests for one partition gathered into one Delta commit.
    group_commit_bytes_max: int = 32 * 1024 * 1024
    group_commit_linger_ms: int = 1
    # Recently committed batches kept in broker memory, so tail fetches never read Parquet.
    log_cache_bytes_max: int = 64 * 1024 * 1024  # per partition
    # Delta checkpoint every N commits keeps table open time flat however long the log grows.
    checkpoint_interval: int = 100
    grpc_threads: int = 32
    # Replication. A follower that has not caught up with the leader's log end for this long
    # leaves the ISR (Kafka's replica.lag.time.max.ms).
    replica_lag_time_max_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_REPLICA_LAG_TIME_MAX_MS", 30_000))
    replica_fetch_wait_max_ms: int = 500  # a follower's fetch long-polls this long
    replica_fetch_max_bytes: int = FETCH_RESPONSE_PARTITION_BYTES_MAX  # per partition
    replica_fetch_response_max_bytes: int = 32 * 1024 * 1024
    replica_fetch_backoff_ms: int = 100  # after an error, before the partition is fetched again
    # Followers copy the leader's committed Parquet files whole (no decoding or encoding) where
    # their log ends at a file boundary, up to this many bytes a round; else they copy records.
    replica_copy_files: bool = True
    replica_files_max_bytes: int = 256 * 1024 * 1024
    # Before a lost broker is relaunched, a Spark job copies what its follower replicas missed,
    # one task per partition in parallel; past this long it is cancelled and the broker starts
    # anyway (its fetchers copy the rest), so a busy cluster never keeps a broker down.
    catch_up_timeout_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_CATCH_UP_TIMEOUT_MS", 60_000))
    # Kafka's auto.leader.rebalance.enable: leadership goes back to each partition's preferred
    # (first) replica once it is in sync again, checked this often.
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_LEADER_IMBALANCE_CHECK_INTERVAL_MS", 300_000))
    # Cluster defaults for the topic configs of the same name.
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    # Consumer groups (Kafka's group.* and offsets.* broker configs).
    group: GroupConfig = field(default_factory=lambda: GroupConfig())

    def with_(self, **changes: Any) -> ClusterConfig:
        return replace(self, **changes)

    def __post_init__(self) -> None:
        if self.brokers < 1:
            raise ValueError(f"brokers must be at least 1, not {self.brokers}")
        if self.broker_heartbeat_interval_ms * 2 > self.broker_session_timeout_ms:
            raise ValueError("broker session timeout must cover at least two heartbeats")
        if self.group_commit_bytes_max > self.log_cache_bytes_max:
            raise ValueError("the log cache must hold at least one group commit")
        if self.replica_lag_time_max_ms < 2 * self.replica_fetch_wait_max_ms:
            raise ValueError("replica.lag.time.max.ms must cover at least two follower fetches")

    def topic_config(self, overrides: dict[str, str]) -> TopicConfig:
        """A topic's effective config: its overrides over the cluster defaults."""
        config = topic_config(overrides)
        defaults: dict[str, Any] = {}
        if "min.insync.replicas" not in overrides:
            defaults["min_insync_replicas"] = self.min_insync_replicas
        if "unclean.leader.election.enable" not in overrides:
            defaults["unclean_leader_election_enable"] = self.unclean_leader_election_enable
        return replace(config, **defaults) if defaults else config


def _check_relations() -> None:
    assert FETCH_PARTITION_MAX_BYTES <= FETCH_MAX_BYTES <= REQUEST_MAX_BYTES
    assert FETCH_PARTITION_MAX_BYTES <= FETCH_RESPONSE_PARTITION_BYTES_MAX
    assert MESSAGE_MAX_BYTES < REQUEST_MAX_BYTES
    assert FETCH_MAX_WAIT_MS <= FETCH_WAIT_MS_MAX


_check_relations()
