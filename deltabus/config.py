"""Limits and defaults, in one place, named as Kafka names them.

Every queue, batch, wait and buffer in deltabus has a limit here. Topic-level configs use Kafka's
dotted names (`max.message.bytes`) because users type them on the CLI; the relations between the
limits are checked at import, so a bad edit fails at once rather than in production.
"""

from __future__ import annotations

import math
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import Field, asdict, dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from deltabus import errors
from deltabus.listeners import SECURITY_PROTOCOLS, ListenerConfig
from deltabus.storage import Storage

# Ports and addresses. Every server binds loopback unless told otherwise.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_SCHEMA_REGISTRY_PORT = 8081  # Confluent's
DEFAULT_METRICS_PORT = 9404  # Strimzi's for Kafka's JMX exporter; broker b on 9405 + b
DEFAULT_CONSOLE_PORT = 8080  # Kafka UI's and AKHQ's
DEFAULT_KAFKA_PORT = 9092  # the Kafka protocol bootstrap, where Kafka's clients expect it
DEFAULT_BOOTSTRAP_PORT = 9192  # the controller's gRPC port: the cluster's bootstrap address
# The driver's controller listener serves only brokers' lifecycle calls, on a thread pool of its
# own (ClusterConfig.controller_threads): per broker a heartbeat long poll, an AlterPartition and
# a registration, twice over for a relaunched broker whose old incarnation still calls; plus a
# few for refusals of callers without the broker credential.
CONTROLLER_THREADS_PER_BROKER = 6
CONTROLLER_THREADS_SPARE = 4
# The most brokers a cluster runs, however it is scaled (Cluster.scale, the autoscaler): the
# controller listener's threads are sized for them (made only when used).
BROKERS_MAX = 64

# Records and requests.
DISKLESS_ENABLE = "diskless.enable"  # the topic config of diskless topics (KIP-1150)
# diskless.append.commit.interval.ms: the largest interval of bench step (w)'s sweep whose produce
# latency on moto's S3 met issue 44's targets (p50 <= 250, p99 <= 500 ms); 250 ms missed the p50
DISKLESS_COMMIT_INTERVAL_MS = 100
DISKLESS_BUFFER_MAX_BYTES = 8 * 1024 * 1024  # diskless.append.buffer.max.bytes
MESSAGE_MAX_BYTES = 1_048_588  # Kafka's message.max.bytes / topic max.message.bytes default
REQUEST_MAX_BYTES = 104_857_600  # Kafka's socket.request.max.bytes: the largest gRPC message
FETCH_MAX_BYTES = 52_428_800  # Kafka's fetch.max.bytes
FETCH_PARTITION_MAX_BYTES = 1_048_576  # Kafka's max.partition.fetch.bytes
FETCH_MAX_WAIT_MS = 500  # Kafka's fetch.max.wait.ms
# How long the consumer's blocking calls (a synchronous commit) go on retrying retriable errors
# before they raise a timeout: Kafka's consumer default.api.timeout.ms.
DEFAULT_API_TIMEOUT_MS = 60_000
# A produce batch holds at most this many records (deltabus's limit; Kafka has none, its batches
# being bounded by their bytes): an Arrow batch of all-null columns declares rows for free, and a
# broker allocates about 20 bytes a record normalising it, so 224 bytes asked for 20 GB. The
# deltabus Producer's batches hold batch_size / 36 records at most. Beyond: RECORD_LIST_TOO_LARGE.
PRODUCE_BATCH_RECORDS_MAX = 1_000_000
# A record carries at most this many headers (deltabus's limit; Kafka has none): headers are
# decoded one by one, so a batch of empty headers made millions of objects. Beyond: INVALID_RECORD.
RECORD_HEADERS_MAX = 1_000
# The record batches of one produce request unpack to at most this many bytes (Kafka batches
# compressed with gzip, snappy, lz4 or zstd; Arrow IPC with compressed buffers): what an
# uncompressed request may carry, so a few KiB cannot unpack to gigabytes (a decompression bomb).
# Beyond: RECORD_LIST_TOO_LARGE, Kafka's answer to a batch too large for its log to take.
PRODUCE_UNPACKED_BYTES_MAX = REQUEST_MAX_BYTES
# A produce that does not say how long it may wait for its acks waits this long (Kafka's producer
# request.timeout.ms default).
PRODUCE_TIMEOUT_MS_DEFAULT = 30_000
# How long a leader waits for its metadata to show a transactional producer's partition added to
# its transaction (the coordinator's record) before refusing its batch with INVALID_TXN_STATE.
TXN_VERIFY_WAIT_MS = 5_000
# A produce to a topic with schema validation that names a schema this broker's metadata does
# not hold yet, but the controller's registry does (registered a moment ago), waits this long
# for the metadata to bring it.
SCHEMA_METADATA_WAIT_MS = 10_000
# CreateTopics, DeleteTopics and CreatePartitions that do not say how long to wait for the brokers
# to learn of the change wait this long (Kafka's admin request.timeout.ms default).
ADMIN_TIMEOUT_MS_DEFAULT = 30_000
# A JoinGroup that names no session timeout gets Kafka's consumer session.timeout.ms default.
SESSION_TIMEOUT_MS_DEFAULT = 45_000
# A broker answers a partition with at most this much, whatever a consumer allows: one gRPC message
# of tens of MB moves slower per byte than several of a few MB (measured: 8 MB 1.4M records/s,
# 32 MB 0.9M). Kafka's broker caps responses the same way (replica.fetch.response.max.bytes).
FETCH_RESPONSE_PARTITION_BYTES_MAX = 8 * 1024 * 1024
# A Fetch answer holds at most this much, whatever a client asks for (the broker's fetch.max.bytes,
# KIP-541, Kafka's default), so it always fits one gRPC message.
FETCH_RESPONSE_MAX_BYTES = 57_671_680
FETCH_WAIT_MS_MAX = 60_000  # no long poll waits longer than this
# A broker's fetches waiting for appends hold no threads (cluster.delayed_fetch); the reads that
# complete them run on at most this many threads, however many fetches wait.
DELAYED_FETCH_COMPLETION_THREADS = 4
# A delayed fetch is completed at its max wait, after one more read; whoever waits for it gives
# it this much longer, then reads at once itself (and says so in the log): a bound, not a delay.
DELAYED_FETCH_GRACE_MS = 5_000
PARTITIONS_MAX = 10_000  # per topic
# A Fetch or ListOffsets names at most this many partitions (deltabus's limit, Kafka has none): a
# broker reads every partition a request names before the answer's byte limits apply, so one
# request naming a partition 100,000 times read it 100,000 times. A consumer of a whole topic
# whose partitions all live on one broker still fits (checked below). Beyond it: INVALID_REQUEST.
REQUEST_PARTITIONS_MAX = 10_000
# Incremental fetch sessions (KIP-227) a Kafka listener keeps: Kafka's
# max.incremental.fetch.session.cache.slots, and deltabus's bound on the partitions of all of
# them together (each slot may hold REQUEST_PARTITIONS_MAX). A full cache evicts only a session
# idle this long (Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS); else a new session is not
# made and its consumer fetches without one.
FETCH_SESSION_CACHE_SLOTS = 1_000
FETCH_SESSION_CACHE_PARTITIONS_MAX = 200_000
FETCH_SESSION_EVICTION_MS = 120_000
# Kafka's max.request.partition.size.limit: the most partitions one DescribeTopicPartitions
# answer holds, whatever its response_partition_limit (the rest by cursor, KIP-966).
MAX_REQUEST_PARTITION_SIZE_LIMIT = 2_000
TOPIC_NAME_LENGTH_MAX = 249  # Kafka's limit
# Kafka bounds a group id only by its protocol's string (32,767 bytes); the coordinator keeps
# every group id it accepts in driver memory and `__consumer_offsets`, so deltabus takes at most
# this many characters (INVALID_GROUP_ID beyond).
GROUP_ID_LENGTH_MAX = 255
# Likewise a transactional id: the controller keeps each one it hands a producer id for ever, in
# its metadata log and in driver memory, so it takes at most this many characters
# (INVALID_REQUEST beyond); Kafka Streams' ids (application.id, a UUID, a task) fit easily.
TRANSACTIONAL_ID_LENGTH_MAX = 1_024
# Transactions (KIP-98), as Kafka's transaction coordinator names them: the longest
# transaction.timeout.ms a producer may ask for (INVALID_TRANSACTION_TIMEOUT beyond), how often
# the coordinator looks for transactions open past their timeout (to abort them), the partitions
# one transaction may hold (every one gets a marker, and the image holds them while it is open),
# and the highest producer epoch before a transactional id moves to a new producer id.
TRANSACTION_MAX_TIMEOUT_MS = 900_000
TRANSACTION_ABORT_TIMED_OUT_INTERVAL_MS = 1_000
TRANSACTION_PARTITIONS_MAX = 10_000
PRODUCER_EPOCH_MAX = 32_767  # Short.MAX_VALUE
# file.delete.delay.ms at most: the cleaner stamps a removed file with now + the delay (the
# time vacuum may delete it, Delta's 64-bit milliseconds), so a delay near 2^63 would overflow
# it. Kafka bounds it only below; a thousand years is forever all the same.
FILE_DELETE_DELAY_MS_MAX = 1000 * 365 * 24 * 3600 * 1000
# Kafka's offset.metadata.max.bytes default: the longest metadata string an offset commit carries,
# in UTF-8 bytes. The group config sets it; the offset store enforces it.
OFFSET_METADATA_MAX_BYTES = 4096
# Metadata brokers are sent (issue 17): a heartbeat answer carries the records after the version
# the broker has (or a snapshot's, `cluster.metadata_deltas`), at most this many and, past the
# first record, at most this many bytes of them; the broker asks again for the rest. The bytes
# are KRaft's metadata fetch size (KafkaRaftClient's MAX_FETCH_SIZE_BYTES).
METADATA_FETCH_RECORDS_MAX = 10_000
METADATA_FETCH_BYTES_MAX = 8 * 1024 * 1024
# The controller keeps the records of at most this many of the latest metadata changes in
# memory (oldest dropped first); a broker further behind, or new, loads a snapshot instead.
METADATA_DELTA_RECORDS_RETAINED_MAX = 100_000
# What protobuf adds to each record of a heartbeat answer at most (its tag and length).
METADATA_RECORD_FRAMING_BYTES_MAX = 6
# A heartbeat answer with at least this many bytes of records (a snapshot, a big change) is sent
# gzip-compressed: records are JSON objects repeating their keys, which gzip takes to a tenth.
METADATA_FETCH_COMPRESS_BYTES_MIN = 16 * 1024
# One CreateAcls or DeleteAcls writes at most this many metadata records (Kafka's
# MAX_RECORDS_PER_USER_OP): a filter matching more is refused rather than committed in one piece.
ACL_RECORDS_PER_REQUEST_MAX = 10_000


@dataclass(frozen=True, kw_only=True)
class TopicConfig:
    """A topic's effective configuration: Kafka's topic configs that deltabus honours."""

    max_message_bytes: int = MESSAGE_MAX_BYTES
    # How fetch answers send the records: deltabus stores them uncompressed (the table is for
    # people and Spark), so "producer" and "uncompressed" send them so, and a codec compresses
    # each batch of an answer with it.
    compression_type: str = "producer"
    message_timestamp_type: str = "CreateTime"  # or LogAppendTime
    # Retention: whole committed files past either limit are removed (-1: no limit).
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1  # per partition
    cleanup_policy: str = "delete"  # delete, compact, or both ("compact,delete")
    # Compaction keeps a key's tombstone (null value) this long after it reached it, so
    # consumers reading the tail see the delete; records younger than the lag stay as written.
    delete_retention_ms: int = 24 * 3600 * 1000
    min_compaction_lag_ms: int = 0
    # Compaction waits until this share of the cleanable log (by bytes) was written since it
    # last ran, so a big log is not rewritten for a few new records.
    min_cleanable_dirty_ratio: float = 0.5
    # Files a clean-up removed stay on disk this long, so running readers do not break.
    file_delete_delay_ms: int = 60_000
    # A replica's files on a local disk are fsynced once this many records were appended since
    # the last fsync (1: before every acknowledgement). Kafka's default, never, leaves them to
    # the page cache and replication; object stores are durable when a write returns.
    flush_messages: int = 2**63 - 1
    # Small committed files are merged into files of up to this size.
    segment_bytes: int = 1024 * 1024 * 1024
    # With acks=all, a produce needs this many in-sync replicas or fails NOT_ENOUGH_REPLICAS.
    min_insync_replicas: int = 1
    # Elect a replica outside the ISR when no in-sync one is alive (may lose acknowledged data).
    unclean_leader_election_enable: bool = False
    # Confluent Server's broker-side schema validation (TopicNameStrategy subjects): every
    # record's key or value must carry a schema id of its subject and decode with that schema.
    key_schema_validation: bool = False
    value_schema_validation: bool = False
    # A typed topic (deltabus): its values' subject ("": untyped); implies value validation
    # against that subject, and the tables keep the decoded values (records.VALUE_FIELDS).
    value_schema_subject: str = ""
    # Likewise its keys' subject: the decoded keys in records.KEY_FIELDS (a null key passes).
    key_schema_subject: str = ""
    # Deprecated in Kafka 3 and gone in 4.0, yet taken and described as Kafka 3 does (its
    # defaults), so tools written for 3.x clusters keep working. They change nothing: deltabus
    # stores one record format and never down-converts a fetch, as Kafka 3 ignores the format
    # version once its inter.broker.protocol.version is 3.0. Kafka's CreateTopics and
    # AlterConfigs answers have no place for a warning, so none is sent.
    message_format_version: str = "3.0-IV1"
    message_downconversion_enable: bool = True
    # A diskless topic (KIP-1150): each partition is one table in the store, with no replica
    # tables; any broker may lead it, and a failover or a move changes metadata only. Set at
    # creation, never changed.
    diskless_enable: bool = False
    # A diskless partition commits at most this often, or once this many bytes wait (KIP-1163):
    # requests to the store per second stay bounded whatever the producers send.
    diskless_append_commit_interval_ms: int = DISKLESS_COMMIT_INTERVAL_MS
    diskless_append_buffer_max_bytes: int = DISKLESS_BUFFER_MAX_BYTES

    @property
    def required_isr(self) -> int:
        """In-sync replicas an acks=all produce needs: min.insync.replicas, or 1 on a diskless
        topic, whose one table in the store is the copy (acks=all: committed there)."""
        return 1 if self.diskless_enable else self.min_insync_replicas

    @property
    def deletes(self) -> bool:
        """cleanup.policy includes delete: retention applies."""
        return "delete" in self.cleanup_policy.split(",")

    @property
    def compacts(self) -> bool:
        """cleanup.policy includes compact: the latest record per key is kept."""
        return "compact" in self.cleanup_policy.split(",")


@dataclass(frozen=True)
class ConfigDef:
    """One topic config as Kafka defines it: its type (Kafka's names, for messages and
    DescribeConfigs), its bounds, and the broker config that gives its default (a synonym)."""

    name: str
    attr: str  # the TopicConfig field
    type: str  # BOOLEAN, STRING, INT, LONG, DOUBLE or LIST
    broker_name: str
    doc: str
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    kafka_version: bool = False  # a STRING naming a Kafka version ("2.8", "3.0-IV1")
    immutable: bool = False  # set when the topic is created, never altered


_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1

TOPIC_CONFIGS: dict[str, ConfigDef] = {d.name: d for d in (
    ConfigDef("cleanup.policy", "cleanup_policy", "LIST", "log.cleanup.policy",
              "delete: remove records past retention; compact: keep the latest record per key",
              choices=("compact", "delete")),
    ConfigDef("confluent.key.schema.validation", "key_schema_validation", "BOOLEAN",
              "confluent.key.schema.validation",
              "refuse (INVALID_RECORD) a record whose key is not in the registry's wire format "
              "with a schema of subject <topic>-key, or does not decode with it"),
    ConfigDef("confluent.value.schema.validation", "value_schema_validation", "BOOLEAN",
              "confluent.value.schema.validation",
              "refuse (INVALID_RECORD) a record whose value is not in the registry's wire "
              "format with a schema of subject <topic>-value, or does not decode with it"),
    ConfigDef("value.schema.subject", "value_schema_subject", "STRING", "value.schema.subject",
              "a typed topic: the schema registry subject its values are written with; every "
              "record must decode with a schema of it, and the partition tables hold the "
              "decoded values as typed columns (value_fields) beside the raw bytes"),
    ConfigDef("key.schema.subject", "key_schema_subject", "STRING", "key.schema.subject",
              "a topic with typed keys: the schema registry subject its keys are written with; "
              "every key must decode with a schema of it (a null key passes), and the "
              "partition tables hold the decoded keys as typed columns (key_fields)"),
    ConfigDef("compression.type", "compression_type", "STRING", "compression.type",
              "the codec fetch answers compress record batches with (producer, uncompressed: "
              "none, as they are stored)",
              choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
    ConfigDef("delete.retention.ms", "delete_retention_ms", "LONG",
              "log.cleaner.delete.retention.ms",
              "how long compaction keeps a tombstone after reaching it", minimum=0),
    ConfigDef("flush.messages", "flush_messages", "LONG", "log.flush.interval.messages",
              "fsync a replica's files on a local disk after this many records (default: "
              "never, as Kafka: the page cache and replication)", minimum=1),
    ConfigDef(DISKLESS_ENABLE, "diskless_enable", "BOOLEAN", DISKLESS_ENABLE,
              "one table per partition in the store, no replica tables: any broker leads it, "
              "and failovers and moves change metadata only (set at creation)",
              immutable=True),
    ConfigDef("diskless.append.commit.interval.ms", "diskless_append_commit_interval_ms",
              "INT", "diskless.append.commit.interval.ms",
              "a diskless partition commits what its producers sent at most this often",
              minimum=0, maximum=60_000),
    ConfigDef("diskless.append.buffer.max.bytes", "diskless_append_buffer_max_bytes", "INT",
              "diskless.append.buffer.max.bytes",
              "a diskless partition commits sooner once this many bytes wait", minimum=1024,
              maximum=REQUEST_MAX_BYTES),
    ConfigDef("file.delete.delay.ms", "file_delete_delay_ms", "LONG",
              "log.segment.delete.delay.ms",
              "how long removed data files stay on disk for running readers", minimum=0,
              maximum=FILE_DELETE_DELAY_MS_MAX),
    ConfigDef("max.message.bytes", "max_message_bytes", "INT", "message.max.bytes",
              "the largest record batch a produce may carry", minimum=1,
              maximum=REQUEST_MAX_BYTES),
    ConfigDef("message.downconversion.enable", "message_downconversion_enable", "BOOLEAN",
              "log.message.downconversion.enable",
              "[DEPRECATED] Kafka 3's switch for down-converting fetches to the record formats "
              "of old consumers; taken and ignored: deltabus never down-converts"),
    ConfigDef("message.format.version", "message_format_version", "STRING",
              "log.message.format.version",
              "[DEPRECATED] the record format Kafka brokers before 3.0 appended; taken and "
              "ignored, as Kafka 3 ignores it: deltabus stores one format",
              kafka_version=True),
    ConfigDef("message.timestamp.type", "message_timestamp_type", "STRING",
              "log.message.timestamp.type",
              "CreateTime: the producer's timestamp; LogAppendTime: the broker's",
              choices=("CreateTime", "LogAppendTime")),
    ConfigDef("min.cleanable.dirty.ratio", "min_cleanable_dirty_ratio", "DOUBLE",
              "log.cleaner.min.cleanable.ratio",
              "compaction waits until this share of the cleanable log is new since it last ran",
              minimum=0, maximum=1),
    ConfigDef("min.compaction.lag.ms", "min_compaction_lag_ms", "LONG",
              "log.cleaner.min.compaction.lag.ms",
              "records younger than this are never compacted", minimum=0),
    ConfigDef("min.insync.replicas", "min_insync_replicas", "INT", "min.insync.replicas",
              "in-sync replicas an acks=all produce needs", minimum=1),
    ConfigDef("retention.bytes", "retention_bytes", "LONG", "log.retention.bytes",
              "the most a partition keeps before its oldest data is removed (-1: no limit)",
              minimum=-1),
    ConfigDef("retention.ms", "retention_ms", "LONG", "log.retention.ms",
              "how long records are kept (-1: forever)", minimum=-1),
    ConfigDef("segment.bytes", "segment_bytes", "INT", "log.segment.bytes",
              "small committed files are merged into files of up to this size",
              minimum=1024 * 1024),
    ConfigDef("unclean.leader.election.enable", "unclean_leader_election_enable", "BOOLEAN",
              "unclean.leader.election.enable",
              "elect an out-of-sync replica when no in-sync one is alive (may lose data)"),
)}


# The broker configs that set the cluster's defaults of topic configs, by their
# server.properties names: each topic config's broker synonym where it has a name of its own
# (log.retention.ms sets retention.ms, message.max.bytes max.message.bytes). Of those of the
# same name, min.insync.replicas and unclean.leader.election.enable are ClusterConfig fields;
# the schema configs are per topic; a cluster-wide compression.type is not taken, as the
# Kafka door compresses fetch answers by a topic's own override only.
TOPIC_DEFAULT_CONFIGS: dict[str, str] = {
    d.broker_name: d.name for d in TOPIC_CONFIGS.values() if d.broker_name != d.name}


def _parse(definition: ConfigDef, raw: str, *, stored: bool = False) -> Any:
    """A config value from its text, or InvalidConfigError with Kafka's message. A `stored`
    number outside the bounds (written before a bound was added) is taken at the bound."""
    def invalid(reason: str) -> errors.DeltaBusError:
        return errors.InvalidConfigError(
            f"Invalid value {raw} for configuration {definition.name}: {reason}")

    text = raw.strip()
    if definition.type == "BOOLEAN":
        if text.lower() not in ("true", "false"):
            raise invalid("Expected value to be either true or false")
        return text.lower() == "true"
    if definition.type in ("INT", "LONG", "DOUBLE"):
        number: int | float
        try:
            number = float(text) if definition.type == "DOUBLE" else int(text)
        except ValueError:
            raise invalid(f"Not a number of type {definition.type}") from None
        limit = {"INT": _INT_MAX, "LONG": _LONG_MAX, "DOUBLE": math.inf}[definition.type]
        if not -limit - 1 <= number <= limit or math.isnan(number):
            raise invalid(f"Not a number of type {definition.type}")
        value = number
        if definition.minimum is not None and value < definition.minimum:
            if stored:
                return definition.minimum
            raise invalid(f"Value must be at least {definition.minimum}")
        if definition.maximum is not None and value > definition.maximum:
            if stored:
                return definition.maximum
            raise invalid(f"Value must be no more than {definition.maximum}")
        return value
    allowed = ", ".join(definition.choices)
    if definition.type == "LIST":
        items = [item.strip() for item in text.split(",")]
        if not all(item in definition.choices for item in items):
            raise invalid(f"String must be one of: {allowed}")
        return ",".join(dict.fromkeys(items))
    if definition.choices and text not in definition.choices:
        raise invalid(f"String must be one of: {allowed}")
    if definition.kafka_version and not _KAFKA_VERSION.fullmatch(text):
        raise invalid(f"Version `{text}` is not a valid version")
    return text


# A version as Kafka 3's validator of message.format.version takes it: 0.8.0 to 0.11.0 with
# three numbers, 1.0 to 3.x with two, each maybe followed by more numbers or an -IVn.
_KAFKA_VERSION = re.compile(r"(0\.(8|9|10|11)\.\d+|[1-3]\.\d+)(\.\d+)*(-IV\d+)?")


def _definition(key: str) -> ConfigDef:
    definition = TOPIC_CONFIGS.get(key)
    if definition is None:
        raise errors.InvalidConfigError(f"Unknown topic config name: {key}")
    return definition


def topic_config(overrides: dict[str, str], *, stored: bool = False) -> TopicConfig:
    """The effective config of a topic from its overrides; raises InvalidConfigError on a bad one.

    Kafka refuses unknown keys and unparsable values with INVALID_CONFIG naming the key; so do we.
    `stored` overrides come from the metadata log, checked when they were written: a number a
    later bound excludes is taken at the bound, so a topic configured before never fails to load.
    """
    values = {}
    for key, raw in overrides.items():
        definition = _definition(key)
        values[definition.attr] = _parse(definition, raw, stored=stored)
    return TopicConfig(**values)


def is_diskless(overrides: Mapping[str, str]) -> bool:
    """Whether a topic's stored overrides make it diskless (immutable, so never a default)."""
    return overrides.get(DISKLESS_ENABLE, "false").strip().lower() == "true"


def render(value: Any) -> str:
    """A config value as Kafka's tools print it."""
    return str(value).lower() if isinstance(value, bool) else str(value)


# Kafka's IncrementalAlterConfigs operations.
SET, DELETE, APPEND, SUBTRACT = "SET", "DELETE", "APPEND", "SUBTRACT"


@dataclass(frozen=True)
class AlterConfigOp:
    """One change to a topic's config (Kafka's AlterConfigOp): SET a value, DELETE the override
    (back to the default), or APPEND/SUBTRACT items of a list config."""

    name: str
    op: str = SET
    value: str | None = None


def altered_overrides(overrides: dict[str, str], ops: list[AlterConfigOp],
                      defaults: TopicConfig | None = None) -> dict[str, str]:
    """A topic's overrides after `ops`, checked as a whole (InvalidConfigError naming the key,
    and nothing changes). `defaults` are what APPEND/SUBTRACT start from without an override."""
    out = dict(overrides)
    base = defaults or TopicConfig()
    for change in ops:
        definition = _definition(change.name)
        if change.op == DELETE:
            out.pop(change.name, None)
            continue
        if change.op not in (SET, APPEND, SUBTRACT):
            raise errors.InvalidRequestError(f"Unknown config operation {change.op}")
        if change.value is None:
            raise errors.InvalidRequestError(f"Null value not supported for : {change.name}")
        if change.op == SET:
            out[change.name] = change.value
            continue
        if definition.type != "LIST":
            raise errors.InvalidConfigError(
                f"Config value {change.op.lower()} is not allowed for config key: {change.name}")
        current = out.get(change.name, render(getattr(base, definition.attr))).split(",")
        items = [item.strip() for item in change.value.split(",") if item.strip()]
        kept = ([*current, *(i for i in items if i not in current)] if change.op == APPEND
                else [i for i in current if i not in items])
        out[change.name] = ",".join(kept)
    before, after = topic_config(overrides, stored=True), topic_config(out)
    for definition in TOPIC_CONFIGS.values():
        if definition.immutable and \
                getattr(before, definition.attr) != getattr(after, definition.attr):
            raise errors.InvalidConfigError(
                f"{definition.name} is set when a topic is created and cannot be altered")
    return out


@dataclass(frozen=True)
class ConfigEntry:
    """One config of a topic as DescribeConfigs answers: its value, where the value comes from
    (Kafka's DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG or DEFAULT_CONFIG) and its synonyms,
    most specific first, as (source, name, value)."""

    name: str
    value: str
    source: str
    synonyms: tuple[tuple[str, str, str], ...]
    type: str
    doc: str
    read_only: bool = False
    sensitive: bool = False


# DescribeConfigs' answer: per topic, its entries or the error that refused it.
ConfigResults = dict[str, "list[ConfigEntry] | errors.DeltaBusError"]


def check_transactional_id(transactional_id: str) -> None:
    """INVALID_REQUEST for a transactional id past TRANSACTIONAL_ID_LENGTH_MAX; the message
    gives its length, never the id."""
    if len(transactional_id) > TRANSACTIONAL_ID_LENGTH_MAX:
        raise errors.InvalidRequestError(
            f"a transactional.id has at most {TRANSACTIONAL_ID_LENGTH_MAX} characters, not "
            f"{len(transactional_id)}")


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
    # Kafka's group.max.size (unbounded in Kafka): the members of a group, counting the member
    # ids handed out to join it (MEMBER_ID_REQUIRED) and not used yet; a JoinGroup past it gets
    # GROUP_MAX_SIZE_REACHED.
    group_max_size: int = 10_000
    # The groups the coordinator keeps (with members, member ids handed out, or committed
    # offsets), and the member ids handed out over all of them, each kept until its session
    # timeout: a new one past either is refused with GROUP_MAX_SIZE_REACHED (deltabus's limits;
    # Kafka bounds only share groups, group.share.max.groups).
    group_max_groups: int = 10_000
    group_max_pending_members: int = 100_000
    # A member's rebalance timeout (the consumer's max.poll.interval.ms) counts up to this, so a
    # JoinGroup waits at most this long, as group.max.session.timeout.ms bounds session timeouts.
    # Capped rather than refused: Java consumers send max.poll.interval.ms, often set higher;
    # such a member that rejoins late joins the next generation.
    group_max_rebalance_timeout_ms: int = 300_000
    # Offsets of a group empty for this long (or of a standalone consumer not committing for
    # this long) expire; checked this often.
    offsets_retention_minutes: int = 7 * 24 * 60
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = OFFSET_METADATA_MAX_BYTES
    # One OffsetCommit names at most this many partitions (deltabus's limit; Kafka has none):
    # more is refused whole with INVALID_REQUEST before anything is looked at or written.
    offset_commit_partitions_max: int = 10_000
    # Commits queued within this long share one Delta commit of __consumer_offsets.
    offsets_commit_linger_ms: int = 5
    # KIP-848's consumer groups (ConsumerGroupHeartbeat): how often members heartbeat, and how
    # long a silent one keeps its partitions (group.consumer.heartbeat.interval.ms and
    # group.consumer.session.timeout.ms).
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_session_timeout_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_GROUP_CONSUMER_SESSION_TIMEOUT_MS", 45_000))
    # KIP-932's share groups (Kafka's group.share.* broker configs): the coordinator's
    # heartbeat interval and session timeout, and its limit on a group's members; the leaders'
    # acquisition lock, delivery count limit, in-flight window and share sessions.
    group_share_heartbeat_interval_ms: int = 5_000
    group_share_session_timeout_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_GROUP_SHARE_SESSION_TIMEOUT_MS", 45_000))
    group_share_max_size: int = 200
    group_share_record_lock_duration_ms: int = 30_000
    group_share_delivery_count_limit: int = 5
    group_share_partition_max_record_locks: int = 2_000
    group_share_max_share_sessions: int = 2_000
    # The coordinator answers joins and syncs of this many members at once (server threads).
    coordinator_threads: int = 512

    def __post_init__(self) -> None:
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ValueError("group.min.session.timeout.ms exceeds group.max.session.timeout.ms")
        for name in ("group_max_size", "group_max_groups", "group_max_pending_members",
                     "group_max_rebalance_timeout_ms", "offset_commit_partitions_max",
                     "group_share_max_size", "group_share_max_share_sessions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name, low, high in (("group_share_record_lock_duration_ms", 1_000, 3_600_000),
                                ("group_share_delivery_count_limit", 2, 10),
                                ("group_share_partition_max_record_locks", 100, 10_000)):
            if not low <= getattr(self, name) <= high:  # Kafka's bounds
                raise ValueError(f"{name.replace('_', '.')} must lie in [{low}, {high}], "
                                 f"not {getattr(self, name)}")
        if self.group_share_heartbeat_interval_ms >= self.group_share_session_timeout_ms:
            raise ValueError("group.share.heartbeat.interval.ms must be below "
                             "group.share.session.timeout.ms")


@dataclass(frozen=True, kw_only=True)
class SocketServerConfig:
    """How a Kafka listener serves its connections (deltabus.rpc.kafka.network), with the
    names of Kafka's broker configs where Kafka has the concept.

    Each listener has one network thread for all its connections and `num_io_threads` request
    handler threads, made as requests arrive, none per connection; requests that wait (acks,
    groups, long-polling Fetches) hold none of them (deltabus.rpc.kafka.delayed).
    """

    num_io_threads: int = 8  # num.io.threads: request handler threads per listener
    # queued.max.requests: requests handed to the handler threads and not yet handled; past it
    # the network thread stops reading requests until handlers catch up.
    queued_max_requests: int = 500
    # queued.max.request.bytes: bytes of requests read and not yet handled (Kafka's default is
    # unbounded; here one largest request always fits). Past it nothing more is read.
    queued_max_request_bytes: int = REQUEST_MAX_BYTES
    socket_request_max_bytes: int = REQUEST_MAX_BYTES  # socket.request.max.bytes
    # max.connections (per listener) and max.connections.per.ip (Kafka's are unbounded): a
    # connection past either is closed as soon as it is accepted, with a log line.
    max_connections: int = 10_000
    max_connections_per_ip: int = 10_000
    connections_max_idle_ms: int = 600_000  # connections.max.idle.ms: Kafka's default
    socket_listen_backlog_size: int = 512  # socket.listen.backlog.size (Kafka's is 50)
    # A connection's requests read ahead of their answers; past it the connection is not read.
    # Kafka's broker reads one at a time, its appends taking well under a millisecond; here an
    # append waits for a Delta commit (~10 ms), and librdkafka (max.in.flight 1,000,000, one
    # request a record at linger.ms=0) sends many meanwhile: all must join the next commit, or
    # acks fall behind without end (5 read ahead: 1,500 records at 500/s acked after 6 s).
    max_in_flight_requests_per_connection: int = 100

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 1:
                raise ValueError(f"{name.replace('_', '.')} must be at least 1, not {value}")
        if self.queued_max_request_bytes < self.socket_request_max_bytes:
            raise ValueError("queued.max.request.bytes must hold one request of "
                             "socket.request.max.bytes")
        if self.queued_max_requests < self.num_io_threads:
            raise ValueError("queued.max.requests must keep every num.io.threads busy")


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SSL_CLIENT_AUTH = ("none", "required")


@dataclass(frozen=True, kw_only=True)
class ListenerSecurity:
    """How the listeners (the gRPC door and the Kafka door) secure their connections: Kafka's
    `security.protocol` with the broker's `ssl.*` and `sasl.*` settings.

    A cluster with named listeners (deltabus.listeners) gives each its own protocol from
    `listener.security.protocol.map` (`for_protocol`); the TLS material and SASL mechanisms
    here serve every listener. TLS material is held as PEM bytes, read once on the driver
    (`load`), so broker tasks on other machines need no local files. The key stays out of repr.
    """

    security_protocol: str = "PLAINTEXT"
    ssl_certificate: bytes = b""  # PEM: the listeners' certificate chain
    ssl_key: bytes = field(default=b"", repr=False)  # PEM: its private key
    # PEM: the CA that signed client certificates (ssl.client.auth) and the listeners' own,
    # which brokers and the controller trust when they call each other.
    ssl_ca: bytes = b""
    ssl_client_auth: str = "none"  # Kafka's ssl.client.auth: none or required
    sasl_enabled_mechanisms: tuple[str, ...] = SASL_MECHANISMS

    @classmethod
    def load(cls, *, security_protocol: str = "PLAINTEXT", ssl_certificate_location: str = "",
             ssl_key_location: str = "", ssl_ca_location: str = "",
             **settings: Any) -> ListenerSecurity:
        """Read the PEM files named by Kafka-style `*_location` settings."""
        def read(what: str, path: str) -> bytes:
            if not path:
                return b""
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as e:
                raise errors.InvalidConfigError(
                    f"cannot read {what} {path}: {e.strerror}") from None
        return cls(security_protocol=security_protocol,
                   ssl_certificate=read("ssl.certificate.location", ssl_certificate_location),
                   ssl_key=read("ssl.key.location", ssl_key_location),
                   ssl_ca=read("ssl.ca.location", ssl_ca_location), **settings)

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def for_protocol(self, security_protocol: str) -> ListenerSecurity:
        """This security for a listener of `security_protocol`: client certificates are asked
        for on TLS listeners only. Raises InvalidConfigError where a TLS listener lacks the
        certificate and key."""
        tls = security_protocol in ("SSL", "SASL_SSL")
        return replace(self, security_protocol=security_protocol,
                       ssl_client_auth=self.ssl_client_auth if tls else "none")

    def __post_init__(self) -> None:
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise errors.InvalidConfigError(
                f"security.protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, not "
                f"{self.security_protocol!r}")
        if self.uses_tls and not (self.ssl_certificate and self.ssl_key):
            raise errors.InvalidConfigError(
                f"security.protocol {self.security_protocol} needs the listeners' certificate "
                "and key (ssl.certificate.location, ssl.key.location)")
        if self.ssl_client_auth not in SSL_CLIENT_AUTH:
            raise errors.InvalidConfigError(
                f"ssl.client.auth must be none or required, not {self.ssl_client_auth!r}")
        if self.ssl_client_auth == "required" and not self.ssl_ca:
            raise errors.InvalidConfigError(
                "ssl.client.auth=required needs the CA of client certificates (ssl.ca.location)")
        unknown = set(self.sasl_enabled_mechanisms) - set(SASL_MECHANISMS)
        if unknown or not self.sasl_enabled_mechanisms:
            raise errors.InvalidConfigError(
                f"sasl.enabled.mechanisms takes {', '.join(SASL_MECHANISMS)}, not "
                f"{', '.join(sorted(unknown)) or 'none'}")


@dataclass(frozen=True, kw_only=True)
class LogConfig:
    """How a partition log commits and caches: a broker's come from its ClusterConfig
    (`ClusterConfig.log_config`), whose fields of the same names default to these."""

    # Group commit: produce requests for one partition gathered into one Delta commit. Requests
    # arriving while a commit runs form the next one, so commits grow with the load; a linger
    # above 0 also holds a request reaching an idle log that long, for others to join it (a
    # fixed wait on every record's latency, to save commits that cost about a millisecond).
    group_commit_bytes_max: int = 32 * 1024 * 1024
    group_commit_linger_ms: int = 0
    # A commit of produced records starts at least this long after the previous one began
    # (unless group_commit_bytes_max are waiting): a diskless partition's bound on requests
    # to the store (diskless.append.commit.interval.ms). An idle log commits at once.
    commit_interval_ms: int = 0
    # Recently committed batches kept in broker memory, so tail fetches never read Parquet.
    log_cache_bytes_max: int = 64 * 1024 * 1024  # per partition
    # ... and by all of a broker's partitions together: past it the caches appended to least
    # recently give up their oldest commits (log_tables/tail_cache.py).
    log_cache_total_bytes_max: int = 1024 * 1024 * 1024
    # Delta checkpoint every N commits keeps table open time flat however long the log grows,
    # and a commit's own time too (LogAppender.renew: delta-rs replays every commit since its
    # table object was loaded; 25 against 100 took a third off a small commit).
    checkpoint_interval: int = 25
    pending_bytes_max: int = 256 * 1024 * 1024  # produce requests waiting for a commit
    # How long a producer's batch that arrived ahead of its predecessor waits for it, at most:
    # never past its produce request's timeout (`PartitionLog.append`).
    sequence_wait_ms: int = 10_000
    # log.append.threads: the threads that commit every partition log of a process (a broker's
    # hundreds or thousands), not one per partition; commits are I/O waits, so more threads than
    # cores (append_pool.py).
    append_threads: int = 16


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """Settings of one deltabus cluster: controller, brokers and their logs.

    Runs on the driver; a copy travels to every broker task. Timeouts are short-able from the
    environment (DELTABUS_*_MS) so tests run fast without code changes.
    """

    root: str
    # How delta-rs and deltabus's own file operations reach the root (delta-rs's option names:
    # AWS_ENDPOINT_URL, AZURE_STORAGE_ACCOUNT_KEY, ...): given by the user, shipped to every
    # broker task with this config, never read from the environment by deltabus and kept out
    # of repr (they hold secrets). `storage` is both, as deltabus.storage.Storage.
    storage_options: dict[str, str] = field(default_factory=dict, repr=False, hash=False)
    brokers: int = 3
    # The driver's address (bootstrap, controller, group coordinator). Brokers bind it too in
    # local mode; on executors of other machines they bind their own (executor_process).
    host: str = field(default_factory=lambda: os.environ.get("DELTABUS_HOST")
                      or os.environ.get("SPARK_LOCAL_IP") or DEFAULT_HOST)
    port: int = DEFAULT_BOOTSTRAP_PORT
    # Kafka's wire protocol: the bootstrap listens here, broker b on kafka_port + 1 + b (0: any
    # free ports; -1: no Kafka listeners).
    kafka_port: int = field(
        default_factory=lambda: _env_int("DELTABUS_KAFKA_PORT", DEFAULT_KAFKA_PORT))
    # Confluent Schema Registry's REST API, served by the driver on `host` (0: any free port;
    # -1: not served). `deltabus cluster start` serves it on DEFAULT_SCHEMA_REGISTRY_PORT.
    schema_registry_port: int = -1
    # Prometheus' /metrics of every node: the driver's on this port (with its HTTP service
    # discovery of the others), broker b's on port + 1 + b, as the Kafka listeners (0: any
    # free ports; -1: not served).
    metrics_port: int = 0
    # The console, a read-only web page of the cluster, served by the driver (0: any free
    # port; -1: not served). `deltabus cluster start` serves it on DEFAULT_CONSOLE_PORT.
    console_port: int = 0
    num_partitions: int = 1  # Kafka's num.partitions
    default_replication_factor: int = 1
    # Kafka's auto.create.topics.enable: a Metadata request (that allows it) naming a missing
    # topic creates it with the defaults above.
    auto_create_topics_enable: bool = True
    # One Metadata request auto-creates at most this many topics, in one metadata commit; more
    # is refused whole (POLICY_VIOLATION), so no client holds the controller lock, which every
    # broker heartbeat needs, for long.
    auto_create_topics_per_request_max: int = 100
    # The cluster holds at most this many topics and partitions (partitions by KIP-578's
    # max.partitions); a creation past either is refused with POLICY_VIOLATION, as Kafka's
    # controller refuses a request too large to commit, and nothing of it is written.
    max_topics: int = 10_000
    max_partitions: int = 100_000
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
    # The brokers' partition logs (LogConfig says what each means).
    group_commit_bytes_max: int = LogConfig.group_commit_bytes_max
    group_commit_linger_ms: int = LogConfig.group_commit_linger_ms
    log_cache_bytes_max: int = LogConfig.log_cache_bytes_max
    log_cache_total_bytes_max: int = LogConfig.log_cache_total_bytes_max
    log_append_threads: int = LogConfig.append_threads
    checkpoint_interval: int = LogConfig.checkpoint_interval
    sequence_wait_ms: int = LogConfig.sequence_wait_ms
    grpc_threads: int = 32  # a broker's gRPC server (per listener); the driver's: at least this
    # At most this many of a gRPC server's threads wait in Fetch long polls at once (never more
    # than grpc_threads); a Fetch past it answers at once with what there is, so consumers
    # cannot take the threads every other call needs. grpcio's sync server holds a thread per
    # waiting call: an interim until the gRPC door waits as the Kafka door does (issue 17).
    grpc_long_polls_max: int = 16
    # TLS and SASL on the listeners (both doors); PLAINTEXT by default.
    security: ListenerSecurity = field(default_factory=ListenerSecurity)
    # Kafka's named listeners (deltabus.listeners): each with its own address, advertised
    # address and protocol, and the internal ones apart. None: the two of host, port and
    # kafka_port, with security's protocol (`listener_config`).
    listeners: ListenerConfig | None = None
    # Kafka's StandardAuthorizer (authorizer.class.name): every request is checked against the
    # ACLs. super.users may do anything; allow.everyone.if.no.acl.found lets requests on a
    # resource no ACL names through (false, as in Kafka, once an authorizer is on).
    authorizer: bool = False
    super_users: tuple[str, ...] = ()
    allow_everyone_if_no_acl_found: bool = False
    # The brokers' credential for the internal API (Kafka's ClusterAction, rpc/inter_broker.py):
    # made afresh for every cluster and handed to its broker tasks only. Kept out of repr, so
    # logs and error messages never show it; DELTABUS_INTER_BROKER_SECRET sets it.
    inter_broker_secret: str = field(
        default_factory=lambda: os.environ.get("DELTABUS_INTER_BROKER_SECRET")
        or secrets.token_urlsafe(32), repr=False, compare=False)
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
    # A tail still in the leader's tail cache goes as records below this many bytes
    # (Broker._files_to_copy): the low-latency path of acks=all.
    replica_copy_files: bool = True
    replica_files_max_bytes: int = 256 * 1024 * 1024
    replica_files_min_bytes: int = 4 * 1024 * 1024
    # Before a lost broker is relaunched, a Spark job copies what its follower replicas missed,
    # one task per partition in parallel; past this long it is cancelled and the broker starts
    # anyway (its fetchers copy the rest), so a busy cluster never keeps a broker down.
    catch_up_timeout_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_CATCH_UP_TIMEOUT_MS", 60_000))
    # Kafka's auto.leader.rebalance.enable: leadership goes back to each partition's preferred
    # (first) replica once it is in sync again, checked this often.
    auto_leader_rebalance_enable: bool = True
    # Cruise Control's self-healing, as deltabus names it: after brokers join or leave
    # (Cluster.scale), the balancer spreads replicas and leaders over them (balancer.py).
    auto_balance_enable: bool = True
    # Kafka's replication throttles, in bytes per second per broker, on the replicas a
    # reassignment adds (a balance's moves) and never on in-sync followers
    # (replication_quota.py); 2**63 - 1 (Kafka's default) turns them off.
    leader_replication_throttled_rate: int = 32 * 1024 * 1024
    follower_replication_throttled_rate: int = 32 * 1024 * 1024
    # How often a broker tells the controller the bytes in per second of the partitions it
    # leads (with a heartbeat): the balancer's bytes-in goal and the autoscaler weigh them.
    load_report_interval_ms: int = 30_000
    # How often a broker tells the driver the high watermarks of the partitions it leads that
    # moved since (with a heartbeat): the group coordinator's consumer lag is this fresh.
    offsets_report_interval_ms: int = 5_000
    # The autoscaler (autoscaler.py), on when broker.autoscale.max is set: a broker more when
    # the bytes in per broker stay above the target for the window, one fewer when they stay
    # below half of it, never beyond [min, max] and never sooner than the cool-down after a
    # scale.
    broker_autoscale_min: int = 0
    broker_autoscale_max: int = 0
    broker_autoscale_target_bytes_in_per_sec: int = 4 * 1024 * 1024
    broker_autoscale_window_ms: int = 120_000
    broker_autoscale_cooldown_ms: int = 300_000
    leader_imbalance_check_interval_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_LEADER_IMBALANCE_CHECK_INTERVAL_MS", 300_000))
    # The log cleaner's retention job runs this often (Kafka's log.retention.check.interval.ms).
    log_retention_check_interval_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_LOG_RETENTION_CHECK_INTERVAL_MS", 300_000))
    # It merges a partition table's small files once they are this old (followers and tailing
    # readers are done with them by then).
    log_cleaner_merge_min_age_ms: int = field(
        default_factory=lambda: _env_int("DELTABUS_LOG_CLEANER_MERGE_MIN_AGE_MS", 60_000))
    # Cluster defaults for the topic configs of the same name.
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    # The cluster's defaults of other topic configs, by topic config name ({"retention.ms":
    # "86400000"}): what Kafka's log.retention.ms & co. set (TOPIC_DEFAULT_CONFIGS). A topic's
    # own overrides win over them.
    topic_config_defaults: dict[str, str] = field(default_factory=dict, hash=False)
    # Consumer groups (Kafka's group.* and offsets.* broker configs).
    group: GroupConfig = field(default_factory=lambda: GroupConfig())
    # How each Kafka listener serves its connections (num.io.threads, max.connections, ...).
    socket_server: SocketServerConfig = field(default_factory=lambda: SocketServerConfig())

    def with_(self, **changes: Any) -> ClusterConfig:
        return replace(self, **changes)

    def __post_init__(self) -> None:
        if not 1 <= self.brokers <= BROKERS_MAX:
            raise ValueError(f"brokers must be 1 to {BROKERS_MAX}, not {self.brokers}")
        if self.broker_autoscale_max and not (
                1 <= max(self.broker_autoscale_min, 1) <= self.broker_autoscale_max
                <= BROKERS_MAX):
            raise ValueError("broker.autoscale.min and broker.autoscale.max must be "
                             f"1 <= min <= max <= {BROKERS_MAX}, not "
                             f"{self.broker_autoscale_min} and {self.broker_autoscale_max}")
        for name in ("num_partitions", "default_replication_factor", "min_insync_replicas",
                     "auto_create_topics_per_request_max", "max_topics", "max_partitions",
                     "log_append_threads", "grpc_threads", "grpc_long_polls_max"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '.')} must be at least 1, not "
                                 f"{getattr(self, name)}")
        for name in ("leader_replication_throttled_rate", "follower_replication_throttled_rate"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '.')} must be at least 1 byte a second, "
                                 f"not {getattr(self, name)}")
        if self.num_partitions > PARTITIONS_MAX:
            raise ValueError(f"num.partitions must be at most {PARTITIONS_MAX}, not "
                             f"{self.num_partitions}")
        self._check_topic_config_defaults()
        if self.broker_heartbeat_interval_ms * 2 > self.broker_session_timeout_ms:
            raise ValueError("broker session timeout must cover at least two heartbeats")
        if self.group_commit_bytes_max > self.log_cache_bytes_max:
            raise ValueError("the log cache must hold at least one group commit")
        if self.log_cache_total_bytes_max < 0:
            raise ValueError("log_cache_total_bytes_max must not be negative")
        for principal in self.super_users:
            kind, sep, name = principal.partition(":")
            if not (kind and sep and name):
                raise ValueError(f"super.users lists principals as User:name, not {principal!r}")
        if self.replica_lag_time_max_ms < 2 * self.replica_fetch_wait_max_ms:
            raise ValueError("replica.lag.time.max.ms must cover at least two follower fetches")
        if self.listeners is None and self.security.ssl_client_auth == "required" and \
                not self.security.uses_tls:
            raise errors.InvalidConfigError(
                "ssl.client.auth=required needs TLS: security.protocol SSL or SASL_SSL")
        listeners = self.listener_config()
        for listener in listeners.grpc + listeners.kafka:
            self.listener_security(listener.security_protocol)  # TLS listeners have their keys

    def _check_topic_config_defaults(self) -> None:
        """InvalidConfigError for a topic config default that is no config's, or that is not
        one the cluster sets (TOPIC_DEFAULT_CONFIGS), or of a bad value."""
        settable = set(TOPIC_DEFAULT_CONFIGS.values())
        for name in self.topic_config_defaults:
            if name not in settable:
                raise errors.InvalidConfigError(
                    f"{name} has no cluster default in deltabus; the cluster sets those of "
                    f"{', '.join(sorted(settable))} (and min.insync.replicas, "
                    "unclean.leader.election.enable)")
        topic_config(self.topic_config_defaults)

    @cached_property
    def storage(self) -> Storage:
        """The root and its options, made once per process (a copy of the config on an
        executor makes its own, with its own connections)."""
        return Storage(self.root, self.storage_options)

    def listener_config(self, host: str | None = None) -> ListenerConfig:
        """The cluster's listeners: the named ones, or the two of the simple settings, on
        `host` where given (a broker's own machine, `executor_process.broker_host`), else on
        the driver's `host`."""
        if self.listeners is not None:
            return self.listeners
        return ListenerConfig.simple(host=host or self.host, port=self.port,
                                     kafka_port=self.kafka_port,
                                     security_protocol=self.security.security_protocol)

    def listener_security(self, security_protocol: str) -> ListenerSecurity:
        """How a listener of `security_protocol` is secured (TLS material and SASL mechanisms
        are the cluster's)."""
        return self.security.for_protocol(security_protocol)

    def log_config(self) -> LogConfig:
        """The config of every partition log a broker of this cluster opens."""
        return LogConfig(group_commit_bytes_max=self.group_commit_bytes_max,
                         group_commit_linger_ms=self.group_commit_linger_ms,
                         log_cache_bytes_max=self.log_cache_bytes_max,
                         log_cache_total_bytes_max=self.log_cache_total_bytes_max,
                         checkpoint_interval=self.checkpoint_interval,
                         append_threads=self.log_append_threads,
                         sequence_wait_ms=self.sequence_wait_ms)

    def controller_threads(self) -> int:
        """The threads of the driver's controller listener, which serves only the brokers'
        lifecycle calls: each broker holds one heartbeat long poll, one AlterPartition and a
        registration at most, twice over while a relaunched broker's old incarnation still
        calls (CONTROLLER_THREADS_PER_BROKER), for as many brokers as the cluster may be scaled
        to (BROKERS_MAX; the pool makes threads only as calls need them); no client call takes
        any of them."""
        return CONTROLLER_THREADS_PER_BROKER * BROKERS_MAX + CONTROLLER_THREADS_SPARE

    def topic_defaults(self) -> TopicConfig:
        """What a topic without overrides gets: Kafka's defaults, and this cluster's settings
        for the configs a broker sets (min.insync.replicas, unclean.leader.election.enable,
        topic_config_defaults)."""
        return self._topic_defaults

    @cached_property
    def _topic_defaults(self) -> TopicConfig:
        """Parsed once per config: every topic's effective config starts from it."""
        return replace(topic_config(self.topic_config_defaults),
                       min_insync_replicas=self.min_insync_replicas,
                       unclean_leader_election_enable=self.unclean_leader_election_enable)

    def topic_config(self, overrides: dict[str, str]) -> TopicConfig:
        """A topic's effective config: its stored overrides over the cluster defaults."""
        defaults = self.topic_defaults()
        config = topic_config(overrides, stored=True)
        # An immutable config's cluster default is pinned as an override when a topic is
        # created (`pinned_overrides`): changing that default never changes an existing topic.
        kept = {d.attr: getattr(defaults, d.attr) for d in TOPIC_CONFIGS.values()
                if d.name not in overrides and not d.immutable}
        return replace(config, **kept)

    def pinned_overrides(self, overrides: dict[str, str]) -> dict[str, str]:
        """A new topic's overrides with this cluster's defaults of immutable configs
        (diskless.enable) written in, where the topic does not set them and they are not
        Kafka's: what the topic is created as stays what it is."""
        defaults, kafka = self.topic_defaults(), TopicConfig()
        pinned = dict(overrides)
        for d in TOPIC_CONFIGS.values():
            value = getattr(defaults, d.attr)
            if d.immutable and d.name not in pinned and value != getattr(kafka, d.attr):
                pinned[d.name] = render(value)
        return pinned

    def describe_topic_config(self, overrides: dict[str, str]) -> list[ConfigEntry]:
        """Every config of a topic with its value and source, as kafka-configs --describe
        --all shows them."""
        kafka, cluster = TopicConfig(), self.topic_defaults()
        entries = []
        for name, d in sorted(TOPIC_CONFIGS.items()):
            synonyms = []
            if name in overrides:
                synonyms.append(("DYNAMIC_TOPIC_CONFIG", name, overrides[name]))
            static = render(getattr(cluster, d.attr))
            if static != render(getattr(kafka, d.attr)):
                synonyms.append(("STATIC_BROKER_CONFIG", d.broker_name, static))
            synonyms.append(("DEFAULT_CONFIG", d.broker_name, render(getattr(kafka, d.attr))))
            source, _, value = synonyms[0]
            entries.append(ConfigEntry(name, value, source, tuple(synonyms), d.type, d.doc))
        return entries


@dataclass(frozen=True)
class BrokerConfigDef:
    """A broker config deltabus takes, by its server.properties name: where it goes in a
    ClusterConfig (`part`: "cluster" for a field of its own, "group" or "socket_server" for a
    field of those, "topic" for a topic config's cluster default), that field or topic
    config (`key`), and its type as Kafka names it."""

    name: str
    part: str
    key: str
    type: str


# ClusterConfig fields that are Kafka broker configs of their name with dots (num_partitions
# is num.partitions), and deltabus's own limits its POLICY_VIOLATION messages name so.
# leader.imbalance.check.interval.ms stands for Kafka's .seconds (COARSE_BROKER_CONFIGS).
_CLUSTER_BROKER_FIELDS = (
    "num_partitions", "default_replication_factor", "auto_create_topics_enable",
    "min_insync_replicas", "unclean_leader_election_enable", "auto_leader_rebalance_enable",
    "auto_balance_enable", "leader_replication_throttled_rate",
    "follower_replication_throttled_rate", "broker_autoscale_min", "broker_autoscale_max",
    "broker_autoscale_target_bytes_in_per_sec", "broker_autoscale_window_ms",
    "broker_autoscale_cooldown_ms",
    "leader_imbalance_check_interval_ms", "log_retention_check_interval_ms",
    "replica_lag_time_max_ms", "replica_fetch_wait_max_ms", "replica_fetch_max_bytes",
    "replica_fetch_response_max_bytes", "replica_fetch_backoff_ms",
    "broker_heartbeat_interval_ms", "broker_session_timeout_ms",
    "auto_create_topics_per_request_max", "max_topics", "max_partitions")
# Kafka's names in coarser units, finest first: the millisecond config each stands for and
# the milliseconds of its unit. Given together, the finest wins, as in Kafka; a negative
# retention in any unit is -1 (forever), as Kafka reads it.
COARSE_BROKER_CONFIGS: dict[str, tuple[str, int]] = {
    "log.retention.minutes": ("log.retention.ms", 60_000),
    "log.retention.hours": ("log.retention.ms", 3_600_000),
    "leader.imbalance.check.interval.seconds": ("leader.imbalance.check.interval.ms", 1_000),
}


def _broker_config_defs() -> dict[str, BrokerConfigDef]:
    """Every broker config of BROKER_CONFIGS: ClusterConfig's of _CLUSTER_BROKER_FIELDS, every
    GroupConfig and SocketServerConfig field (Kafka's group.*, offsets.* and listener limits,
    named as Kafka names them), and TOPIC_DEFAULT_CONFIGS."""
    def of(part: str, f: Field[Any]) -> BrokerConfigDef:
        kind = ("BOOLEAN" if f.type == "bool" else "LONG" if f.name.endswith(("_ms", "_rate"))
                else "INT")
        return BrokerConfigDef(f.name.replace("_", "."), part, f.name, kind)

    defs = [of("cluster", f) for f in fields(ClusterConfig) if f.name in _CLUSTER_BROKER_FIELDS]
    defs += [of("group", f) for f in fields(GroupConfig)]
    defs += [of("socket_server", f) for f in fields(SocketServerConfig)]
    defs += [BrokerConfigDef(name, "topic", topic, TOPIC_CONFIGS[topic].type)
             for name, topic in TOPIC_DEFAULT_CONFIGS.items()]
    return {d.name: d for d in defs}


BROKER_CONFIGS = _broker_config_defs()


def broker_settings(properties: Mapping[str, str], *, source: str = "") -> dict[str, Any]:
    """ClusterConfig keyword arguments of broker configs by their server.properties names
    ({"num.partitions": "3"} gives num_partitions=3), as `cluster start --override` and the
    Spark conf's spark.deltabus.NAME give them. Raises InvalidConfigError in one line naming
    every name deltabus does not take (each after `source`, where it was given), or a bad
    value with Kafka's message; a value out of a field's range is ClusterConfig's ValueError
    (GroupConfig's and SocketServerConfig's are raised here)."""
    taken = set(BROKER_CONFIGS) | set(COARSE_BROKER_CONFIGS)
    unknown = sorted(source + name for name in properties if name not in taken)
    if unknown:
        verb = "is not a broker config" if len(unknown) == 1 else "are not broker configs"
        raise errors.InvalidConfigError(
            f"{', '.join(unknown)} {verb} deltabus takes; it takes {', '.join(sorted(taken))}")
    parts: dict[str, dict[str, Any]] = {"cluster": {}, "group": {}, "socket_server": {},
                                        "topic": {}}
    for name, raw in _in_finest_units(properties).items():
        d = BROKER_CONFIGS[name]
        if d.part == "topic":  # checked as the topic config, named as the broker's
            definition = replace(TOPIC_CONFIGS[d.key], name=name)
            parts["topic"][d.key] = render(_parse(definition, raw))
        else:
            parts[d.part][d.key] = _parse(ConfigDef(name, d.key, d.type, name, ""), raw)
    settings = dict(parts["cluster"])
    if parts["group"]:
        settings["group"] = GroupConfig(**parts["group"])
    if parts["socket_server"]:
        settings["socket_server"] = SocketServerConfig(**parts["socket_server"])
    if parts["topic"]:
        settings["topic_config_defaults"] = parts["topic"]
    return settings


def _in_finest_units(properties: Mapping[str, str]) -> dict[str, str]:
    """`properties` with Kafka's coarser units (log.retention.hours) as the millisecond
    configs they stand for, unless a finer one is given (COARSE_BROKER_CONFIGS)."""
    out = {k: v for k, v in properties.items() if k not in COARSE_BROKER_CONFIGS}
    for name, (fine, unit_ms) in COARSE_BROKER_CONFIGS.items():
        if name in properties and fine not in out:
            count = _parse(ConfigDef(name, "", "LONG", name, ""), properties[name])
            out[fine] = str(count * unit_ms if count >= 0 else -1)
    return out


def _check_relations() -> None:
    assert FETCH_PARTITION_MAX_BYTES <= FETCH_MAX_BYTES <= FETCH_RESPONSE_MAX_BYTES
    assert FETCH_RESPONSE_MAX_BYTES + FETCH_RESPONSE_PARTITION_BYTES_MAX < REQUEST_MAX_BYTES
    assert FETCH_PARTITION_MAX_BYTES <= FETCH_RESPONSE_PARTITION_BYTES_MAX
    assert MESSAGE_MAX_BYTES < REQUEST_MAX_BYTES
    assert FETCH_MAX_WAIT_MS <= FETCH_WAIT_MS_MAX
    # A heartbeat answer's records, with their framing, fit one gRPC message with room to
    # spare, and a broker behind by one full answer can still catch up from the deltas.
    assert (METADATA_FETCH_BYTES_MAX + METADATA_FETCH_RECORDS_MAX
            * METADATA_RECORD_FRAMING_BYTES_MAX) * 2 < REQUEST_MAX_BYTES
    assert METADATA_FETCH_RECORDS_MAX <= METADATA_DELTA_RECORDS_RETAINED_MAX
    assert METADATA_FETCH_COMPRESS_BYTES_MIN < METADATA_FETCH_BYTES_MAX
    assert PARTITIONS_MAX <= REQUEST_PARTITIONS_MAX
    # A batch of the default max.message.bytes is never refused for its count (7 bytes: the
    # smallest record, records.RECORD_BYTES_MIN), nor for what it unpacks to uncompressed.
    assert PRODUCE_BATCH_RECORDS_MAX * 7 >= MESSAGE_MAX_BYTES
    assert MESSAGE_MAX_BYTES <= PRODUCE_UNPACKED_BYTES_MAX <= REQUEST_MAX_BYTES
    year_2500_ms = 16_725_225_600_000
    assert year_2500_ms + FILE_DELETE_DELAY_MS_MAX < _LONG_MAX // 1000  # in microseconds too


_check_relations()
