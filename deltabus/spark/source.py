"""The `deltabus` Spark data source, read side: `spark.read` and `spark.readStream`.

It takes the options of Spark's Kafka source and gives the same columns, so moving a query from
Kafka to deltabus is a change of format name. What differs is the data path: the driver asks the
cluster only for metadata and offsets (the high watermark bounds every micro-batch), and the
executors read the records straight from the partitions' Delta tables, with no broker in between.

A micro-batch is a set of exact offset ranges [start, end) per partition, below the high
watermark, which every in-sync replica holds: Spark checkpoints those offsets, so a query restarted
from its checkpoint re-reads exactly the ranges it had not committed, neither skipping nor
repeating a record.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from deltabus import config as cfg
from deltabus import errors, schemas
from deltabus.client.admin import AdminClient
from deltabus.client.consumer import Consumer
from deltabus.client.consumer_coordinator import TopicPartition
from deltabus.client.schema_cache import SchemaCache
from deltabus.client.security import ClientSecurity, security_from_properties
from deltabus.log_tables.delta_reads import open_table
from deltabus.log_tables.delta_writes import typed_column_types
from deltabus.log_tables.layout import log_path
from deltabus.log_tables.log_reader import TRANSACTION_COLUMNS, LogReader
from deltabus.log_tables.transactions import aborted_in, consumed_rows, read_markers
from deltabus.log_tables.typed_columns import stored_type
from deltabus.metadata import MetadataImage
from deltabus.records import KEY_FIELDS, TYPED_COLUMNS, VALUE_FIELDS
from deltabus.storage import Storage

log = logging.getLogger(__name__)

KAFKA_COLUMNS = ("key binary, value binary, topic string, partition int, offset long, "
                 "timestamp timestamp, timestampType int")
HEADERS_COLUMN = "headers array<struct<key: string, value: binary>>"
EARLIEST, LATEST = -2, -1  # as in Spark's Kafka source offset JSON

Offsets = dict[str, dict[str, int]]  # {"topic": {"0": 23}}: Spark's Kafka source offset JSON


def kafka_schema(include_headers: bool) -> str:
    """The columns of Spark's Kafka source, in its order."""
    return f"{KAFKA_COLUMNS}, {HEADERS_COLUMN}" if include_headers else KAFKA_COLUMNS


# Source options with this prefix are storage options (storage.AWS_ENDPOINT_URL=...).
STORAGE_OPTION_PREFIX = "storage."

def _flag(options: dict[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise errors.InvalidConfigError(f"option {name} must be true or false, not {value!r}")
    return value.lower() == "true"


# Each typed column (records.TYPED_COLUMNS): the source option asking for it, and the topic
# config naming its subject.
TYPED_OPTIONS = {KEY_FIELDS: ("keyFields", "key.schema.subject"),
                 VALUE_FIELDS: ("valueFields", "value.schema.subject")}


def wanted_typed_columns(options: Mapping[str, str]) -> list[str]:
    """The typed columns the options keyFields and valueFields ask for, in table order."""
    lowered = {k.lower(): v for k, v in options.items()}
    return [c for c in TYPED_COLUMNS if _flag(lowered, TYPED_OPTIONS[c][0].lower(), False)]


def _positive(options: dict[str, str], name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise errors.InvalidConfigError(f"option {name} must be a positive number, not {value!r}")
    return number


def _timestamp_ms(options: dict[str, str], name: str) -> int | None:
    """A timestamp option: milliseconds since the epoch, as Spark's Kafka source takes it."""
    value = options.get(name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise errors.InvalidConfigError(
            f"option {name} must be a timestamp in milliseconds since the epoch, not {value!r}"
        ) from None


def _isolation(options: dict[str, str]) -> str:
    """Spark's Kafka source passes kafka.isolation.level to its consumer; so does deltabus."""
    level = options.get("kafka.isolation.level", "read_uncommitted").strip().lower()
    if level not in ("read_uncommitted", "read_committed"):
        raise errors.InvalidConfigError(
            f"option kafka.isolation.level must be read_uncommitted or read_committed, not "
            f"{level!r}")
    return level


def bootstrap_servers(options: dict[str, str]) -> str:
    """The cluster address: `kafka.bootstrap.servers`, as Spark's Kafka source names it."""
    for name in ("kafka.bootstrap.servers", "bootstrap.servers"):
        if options.get(name):
            return options[name]
    raise errors.InvalidConfigError(
        "option kafka.bootstrap.servers is required (the deltabus bootstrap address, "
        "e.g. 127.0.0.1:9192)")


def client_security(options: dict[str, str]) -> ClientSecurity:
    """TLS and SASL from the `kafka.`-prefixed options, as Spark's Kafka source takes them
    (kafka.security.protocol, kafka.sasl.mechanism, kafka.sasl.jaas.config, kafka.ssl.ca.location,
    ...; deltabus.client.security). Checked on the driver, where the PEM files are read: the
    executors get their bytes with the options and need no file."""
    return security_from_properties(options, prefix="kafka.")


def _offsets_json(options: dict[str, str], name: str) -> Offsets | None:
    text = options[name]
    try:
        parsed = json.loads(text)
        return {t: {str(int(p)): int(o) for p, o in ps.items()} for t, ps in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise errors.InvalidConfigError(
            f"option {name} must be earliest, latest or JSON such as "
            f'{{"topic":{{"0":23,"1":-2}}}}, not {text!r}') from None


@dataclass(frozen=True)
class SourceOptions:
    """The options of Spark's Kafka source that deltabus honours, checked once on the driver."""

    bootstrap: str
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[TopicPartition, ...] = ()
    starting: str | Offsets = "latest"
    ending: str | Offsets = "latest"
    starting_timestamp: int | None = None
    starting_by_timestamp: dict[str, dict[str, int]] | None = None
    timestamp_strategy: str = "error"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    # valueFields=true, keyFields=true: a typed topic's decoded values or keys as the struct
    # columns value_fields and key_fields, in these types (the subjects' and partitions' types
    # unified when the query was defined: `typed_column_type`), by column
    typed: tuple[tuple[str, pa.DataType], ...] = ()
    # kafka.isolation.level=read_committed: up to the last stable offset, no aborted record
    read_committed: bool = False
    group_id: str | None = None
    security: ClientSecurity = field(default_factory=ClientSecurity)
    # How executors reach the partition tables (delta-rs's option names): the `storage.KEY`
    # options. Kept out of repr: they hold secrets.
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, options: dict[str, str], *, streaming: bool) -> SourceOptions:
        options = {k.lower(): v for k, v in options.items()}
        chosen = [name for name in ("assign", "subscribe", "subscribepattern") if options.get(name)]
        if len(chosen) != 1:
            raise errors.InvalidConfigError(
                "exactly one of the options assign, subscribe and subscribePattern must be "
                f"given, not {len(chosen)}")
        subscribe: tuple[str, ...] = ()
        assign: tuple[TopicPartition, ...] = ()
        pattern = None
        if "subscribe" in chosen:
            subscribe = tuple(t.strip() for t in options["subscribe"].split(",") if t.strip())
            if not subscribe:
                raise errors.InvalidConfigError("option subscribe names no topic")
        elif "subscribepattern" in chosen:
            pattern = options["subscribepattern"]
            try:
                re.compile(pattern)
            except re.error as e:
                raise errors.InvalidConfigError(
                    f"option subscribePattern is not a regular expression: {e}") from None
        else:
            try:
                parsed = json.loads(options["assign"])
                assign = tuple(TopicPartition(t, int(p)) for t, ps in parsed.items() for p in ps)
            except (ValueError, AttributeError, TypeError):
                raise errors.InvalidConfigError(
                    'option assign must be JSON such as {"topicA":[0,1]}, not '
                    f"{options['assign']!r}") from None
        starting: str | Offsets = "latest" if streaming else "earliest"
        if "startingoffsets" in options:
            value = options["startingoffsets"].strip()
            starting = value.lower() if value.lower() in ("earliest", "latest") \
                else _offsets_json(options, "startingoffsets") or {}
        ending: str | Offsets = "latest"
        if "endingoffsets" in options:
            if streaming:
                raise errors.InvalidConfigError(
                    "option endingOffsets is for batch queries (spark.read) only")
            value = options["endingoffsets"].strip()
            if value.lower() == "earliest":
                raise errors.InvalidConfigError("option endingOffsets cannot be earliest")
            ending = "latest" if value.lower() == "latest" \
                else _offsets_json(options, "endingoffsets") or {}
        by_timestamp = None
        if "startingoffsetsbytimestamp" in options:
            by_timestamp = _offsets_json(options, "startingoffsetsbytimestamp")
        strategy = options.get("startingoffsetsbytimestampstrategy", "error").lower()
        if strategy not in ("error", "latest"):
            raise errors.InvalidConfigError(
                "option startingOffsetsByTimestampStrategy must be error or latest, "
                f"not {strategy!r}")
        return cls(
            bootstrap=bootstrap_servers(options),
            subscribe=subscribe, pattern=pattern, assign=assign,
            starting=starting, ending=ending,
            starting_timestamp=_timestamp_ms(options, "startingtimestamp"),
            starting_by_timestamp=by_timestamp, timestamp_strategy=strategy,
            max_offsets_per_trigger=_positive(options, "maxoffsetspertrigger"),
            min_partitions=_positive(options, "minpartitions"),
            fail_on_data_loss=_flag(options, "failondataloss", True),
            include_headers=_flag(options, "includeheaders", False),
            read_committed=_isolation(options) == "read_committed",
            group_id=options.get("kafka.group.id") or options.get("groupid") or None,
            security=client_security(options),
            storage_options={k[len(STORAGE_OPTION_PREFIX):].upper(): v
                             for k, v in options.items()
                             if k.startswith(STORAGE_OPTION_PREFIX)},
        )


@dataclass(frozen=True)
class OffsetRange:
    """One Spark task's work: records [start, end) of one partition, from one replica table.
    A batch read plans `start`/`end` as EARLIEST/LATEST (and no path) when they are given so:
    the task resolves them when it runs, so a DataFrame or SQL view read again sees the topic
    as it is then (Spark plans a Python data source read once per DataFrame)."""

    topic: str
    partition: int
    start: int
    end: int
    path: str = ""

    def resolved(self, topics: TopicReader) -> OffsetRange:
        tp = TopicPartition(self.topic, self.partition)
        start = self.start
        if start == EARLIEST:
            start = topics.earliest([tp])[tp]
        elif start == LATEST:
            start = topics.latest([tp])[tp]
        end = topics.latest([tp])[tp] if self.end == LATEST else self.end
        return OffsetRange(self.topic, self.partition, start, max(start, end),
                           self.path or topics.table_path(tp))


class RangePartition(InputPartition):
    def __init__(self, ranges: list[OffsetRange]) -> None:
        super().__init__(None)
        self.ranges = ranges


DataLossError = errors.DataLossError  # importable from deltabus.spark, as before


def _data_loss(message: str, fail: bool) -> None:
    hint = ("Some data may have been lost because they are not available in deltabus any more: "
            f"{message}.")
    if fail:
        raise DataLossError(hint + " If you want your query to go on in such cases, set the "
                            "source option failOnDataLoss to false.")
    log.warning("%s Going on, as failOnDataLoss is false.", hint)


class TopicReader:
    """The driver side of a query: which partitions it reads, where their tables are, and their
    offsets, asked of the cluster. Holds a client, so it is dropped when Spark pickles the
    reader for the executors."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumer: Consumer | None = None
        self._image: MetadataImage | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_consumer": None, "_image": None}

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self.options.bootstrap, enable_auto_commit=False,
                                      group_id=self.options.group_id,
                                      client_id="deltabus-spark-source",
                                      security=self.options.security,
                                      isolation_level="read_committed"
                                      if self.options.read_committed else "read_uncommitted")
        return self._consumer

    def refresh(self) -> MetadataImage:
        self._image = self.consumer.metadata()
        return self._image

    def partitions(self) -> list[TopicPartition]:
        """The partitions the query reads now (subscribed topics may grow partitions, and a
        pattern may match new topics: they are read from the start, as Spark's Kafka source)."""
        image = self.refresh()
        o = self.options
        if o.assign:  # ones that do not exist (any more) count as gone
            return sorted(tp for tp in o.assign if image.partition(tp.topic, tp.partition))
        if o.pattern is not None:
            regex = re.compile(o.pattern)
            topics = [t for t in image.topics if not t.startswith("__") and regex.fullmatch(t)]
        else:
            topics = [t for t in o.subscribe if t in image.topics]
        return sorted(TopicPartition(t, p) for t in topics
                      for p in range(len(image.topics[t].partitions)))

    def table_path(self, tp: TopicPartition) -> str:
        """The replica table to read: the leader's, or while it has none an in-sync replica's
        (every one of them holds the records below the high watermark); a diskless
        partition's one table."""
        image = self._image or self.refresh()
        state = image.partition(tp.topic, tp.partition)
        if state is None:
            raise errors.UnknownTopicOrPartitionError(f"{tp.topic}-{tp.partition} does not exist")
        broker = state.leader if state.leader >= 0 else (state.isr or state.replicas)[0]
        diskless = cfg.is_diskless(image.topics[tp.topic].configs)
        return log_path(image.log_root, tp.topic, tp.partition, broker, diskless)

    def latest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return self.consumer.end_offsets(tps) if tps else {}

    def earliest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return self.consumer.beginning_offsets(tps) if tps else {}

    def resolve(self, spec: str | Offsets, tps: list[TopicPartition], *,
                what: str) -> dict[TopicPartition, int]:
        """Offsets from earliest/latest or Spark's offset JSON (-2 earliest, -1 latest)."""
        if spec == "earliest":
            return self.earliest(tps)
        if spec == "latest":
            return self.latest(tps)
        assert isinstance(spec, dict)
        wanted = {TopicPartition(t, int(p)): o for t, ps in spec.items() for p, o in ps.items()}
        missing = [f"{tp.topic}-{tp.partition}" for tp in tps if tp not in wanted]
        if missing and what == "startingOffsets":
            raise errors.InvalidConfigError(
                f"option {what} gives no offset for {', '.join(missing)}")
        earliest = self.earliest([tp for tp in tps if wanted.get(tp) == EARLIEST])
        latest = self.latest([tp for tp in tps if wanted.get(tp, LATEST) == LATEST])
        return {tp: earliest.get(tp, latest.get(tp, wanted.get(tp, LATEST))) for tp in tps}

    def starting(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        o = self.options
        if o.starting_timestamp is not None or o.starting_by_timestamp is not None:
            times = {tp: o.starting_timestamp for tp in tps} if o.starting_timestamp is not None \
                else {TopicPartition(t, int(p)): ts
                      for t, ps in (o.starting_by_timestamp or {}).items() for p, ts in ps.items()}
            found = self.consumer.offsets_for_times({tp: ts for tp, ts in times.items()
                                                     if tp in tps and ts is not None})
            out = {}
            latest = self.latest(tps)
            for tp in tps:
                offset = found.get(tp, -1)
                if offset < 0 and o.timestamp_strategy == "error":
                    raise errors.InvalidConfigError(
                        f"no record of {tp.topic}-{tp.partition} has a timestamp at or after "
                        f"{times.get(tp)} (set startingOffsetsByTimestampStrategy to latest to "
                        "start at the end instead)")
                out[tp] = offset if offset >= 0 else latest[tp]
            return out
        return self.resolve(o.starting, tps, what="startingOffsets")

    def plan(self, start: dict[TopicPartition, int], end: dict[TopicPartition, int]
             ) -> list[RangePartition]:
        """Input partitions for [start, end): one per topic-partition with records, split
        further when minPartitions asks for more tasks (proportionally to the range sizes)."""
        ranges = []
        earliest = self.earliest([tp for tp in end if end[tp] > start.get(tp, 0)])
        for tp, stop in sorted(end.items()):
            first = start.get(tp, 0)
            if tp in earliest and first < earliest[tp]:
                _data_loss(f"{tp.topic}-{tp.partition} starts at offset {earliest[tp]}, but the "
                           f"query was to read from {first}", self.options.fail_on_data_loss)
                first = earliest[tp]
            if stop > first:
                ranges.append(OffsetRange(tp.topic, tp.partition, first, stop,
                                          self.table_path(tp)))
        wanted = self.options.min_partitions or 0
        total = sum(r.end - r.start for r in ranges)
        if wanted <= len(ranges) or total == 0:
            return [RangePartition([r]) for r in ranges]
        out = []
        for r in ranges:
            pieces = max(1, math.ceil((r.end - r.start) / total * wanted))
            step = math.ceil((r.end - r.start) / pieces)
            out += [RangePartition([OffsetRange(r.topic, r.partition, s, min(s + step, r.end),
                                                r.path)])
                    for s in range(r.start, r.end, step)]
        return out

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def typed_column_type(options: SourceOptions, column: str) -> pa.DataType:
    """Driver side, when a query is defined with valueFields (keyFields): the struct type of
    its typed `column`. Each typed topic's subject's latest schema (value.schema.subject,
    key.schema.subject), as its tables store it, and each partition table's column as its
    schema evolved, unified: a stream keeps this type for its life (fields registered later
    are read after a restart). Raises InvalidConfigError when none of the query's topics is
    typed so."""
    option, config = TYPED_OPTIONS[column]
    topics = TopicReader(options)
    found: list[pa.DataType] = []
    try:
        tps = topics.partitions()
        names = sorted({tp.topic for tp in tps})
        with AdminClient(options.bootstrap, security=options.security) as admin:
            subjects = set(schema_subjects(admin, names, config).values())
            if subjects:
                cache = SchemaCache(admin.schema_registry)
                found += [_struct_of(schemas.decode(cache.latest(s)[1], []))
                          for s in sorted(subjects)]
        for tp in tps:
            path = topics.table_path(tp)
            table = open_table(path, storage_options=Storage(path, options.storage_options)
                               .delta_options)
            held = typed_column_types(table).get(column)
            if held is not None:
                found.append(held)
    finally:
        topics.close()
    if not found:
        raise errors.InvalidConfigError(
            f"option {option} reads a typed topic's decoded {column.split('_')[0]}s, and none "
            f"of the query's topics is typed (topic config {config})")
    return unified_struct(found)


def schema_subjects(admin: AdminClient, topics: Iterable[str], config: str) -> dict[str, str]:
    """The topics among `topics` with typed values (`config` value.schema.subject) or keys
    (key.schema.subject), each with its subject."""
    return {topic: entry.value for topic, entries in admin.describe_configs(topics).items()
            for entry in entries if entry.name == config and entry.value}


def unified_struct(types: Sequence[pa.DataType]) -> pa.DataType:
    """One struct type holding values of every one of `types` (versions of a typed topic's
    values, each table's as its schema evolved): fields unified, types promoted."""
    return pa.unify_schemas([pa.schema([pa.field(VALUE_FIELDS, t)]) for t in types],
                            promote_options="permissive").field(0).type


def spark_ddl(arrow_type: pa.DataType) -> str:
    """Spark's DDL for an Arrow type of a typed column."""
    from pyspark.sql.pandas.types import from_arrow_type

    return str(from_arrow_type(arrow_type).simpleString())


def _struct_of(table: pa.Table) -> pa.DataType:
    return stored_type(pa.struct(list(table.schema)))


def read_ranges(partition: RangePartition, options: SourceOptions) -> Iterator[pa.RecordBatch]:
    """Executor side: the records of each range, from the replica's Delta table, as Arrow
    batches in the Kafka source's columns."""
    include_headers, fail_on_data_loss = options.include_headers, options.fail_on_data_loss
    typed = options.typed
    # producer_id and sequence tell transaction markers, which are never rows of the source
    columns = ["offset", "timestamp", "timestamp_type", "key", "value", *TRANSACTION_COLUMNS]
    if include_headers:
        columns.append("headers")
    ranges = partition.ranges
    if any(r.start < 0 or r.end < 0 or not r.path for r in ranges):
        topics = TopicReader(options)
        try:
            ranges = [r.resolved(topics) for r in ranges]
        finally:
            topics.close()
    for r in ranges:
        if r.end <= r.start:
            continue
        reader = LogReader(r.path, Storage(r.path, options.storage_options))
        check_log_start(r, reader.log_start_offset, fail_on_data_loss)
        aborted = (aborted_in(read_markers(reader.parquet_files(r.start)))[0]
                   if options.read_committed else [])
        # Gaps inside the log are records a compacted topic's cleaner removed: not a loss.
        # Groups that cannot hold a marker come without the transaction columns, and need no
        # filter (unless records of aborted transactions are to be dropped).
        for table in reader.read(r.start, r.end, columns, typed=bool(typed),
                                 skip_marker_free=not aborted):
            if TRANSACTION_COLUMNS[0] in table.column_names:
                table = consumed_rows(table, aborted)
            for batch in table.to_batches():
                yield to_kafka_columns(batch, r.topic, r.partition, include_headers, typed)


def check_log_start(r: OffsetRange, log_start: int | None, fail_on_data_loss: bool) -> None:
    """Data loss when the replica table no longer holds the start of `r`: retention or
    DeleteRecords moved its log start offset past it since planning (`log_start` None: the
    table holds no file)."""
    if log_start is None or log_start > r.start:
        _data_loss(f"{r.topic}-{r.partition} has no records [{r.start}, "
                   f"{r.end if log_start is None else min(log_start, r.end)}) in {r.path}",
                   fail_on_data_loss)


_SPARK_SCHEMA = {
    False: pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                      ("partition", pa.int32()), ("offset", pa.int64()),
                      ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())]),
}
_SPARK_SCHEMA[True] = _SPARK_SCHEMA[False].append(pa.field("headers", pa.list_(pa.field(
    "element", pa.struct([("key", pa.string()), ("value", pa.binary())])))))


def to_kafka_columns(batch: pa.RecordBatch, topic: str, partition: int,
                     include_headers: bool,
                     typed: Sequence[tuple[str, pa.DataType]] = ()) -> pa.RecordBatch:
    """Log rows as Spark's Kafka source rows (its column names, order and types), with a
    typed topic's decoded keys or values, each `typed` column in its type (null for records
    that have none: an untyped topic's, or written before the topic was typed)."""
    n = batch.num_rows
    arrays = [batch.column("key"), batch.column("value"), pa.repeat(topic, n),
              pa.repeat(pa.scalar(partition, pa.int32()), n), batch.column("offset"),
              batch.column("timestamp"), batch.column("timestamp_type")]
    if include_headers:
        arrays.append(batch.column("headers"))
    schema = _SPARK_SCHEMA[include_headers]
    for name, fields in typed:
        arrays.append(batch.column(name) if name in batch.schema.names
                      else pa.nulls(n, fields))
        schema = schema.append(pa.field(name, fields))
    return pa.RecordBatch.from_arrays(
        [a if a.type == f.type else a.cast(f.type) for a, f in zip(arrays, schema, strict=True)],
        schema=schema)


def _key(tp: TopicPartition) -> tuple[str, str]:
    return tp.topic, str(tp.partition)


def to_json(offsets: dict[TopicPartition, int]) -> Offsets:
    out: Offsets = {}
    for tp, offset in sorted(offsets.items()):
        topic, partition = _key(tp)
        out.setdefault(topic, {})[partition] = int(offset)
    return out


def from_json(offsets: Offsets) -> dict[TopicPartition, int]:
    return {TopicPartition(t, int(p)): int(o) for t, ps in offsets.items() for p, o in ps.items()}


class BatchReader(DataSourceReader):
    """`spark.read.format("deltabus")`: startingOffsets (default earliest) to endingOffsets
    (default latest: the high watermark when the query is planned)."""

    def __init__(self, options: SourceOptions) -> None:
        self.topics = TopicReader(options)
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        try:
            tps = self.topics.partitions()
            symbolic = (o.min_partitions is None and o.starting_timestamp is None
                        and o.starting_by_timestamp is None)
            if symbolic:  # resolved by each task when it runs (see OffsetRange)
                start = self._symbolic(o.starting, tps, EARLIEST)
                end = self._symbolic(o.ending, tps, LATEST)
                return [RangePartition([OffsetRange(tp.topic, tp.partition, start[tp], end[tp])])
                        for tp in tps]
            start = self.topics.starting(tps)
            end = self.topics.resolve(o.ending, tps, what="endingOffsets")
            return self.topics.plan(start, end)
        finally:
            self.topics.close()

    @staticmethod
    def _symbolic(spec: str | Offsets, tps: list[TopicPartition],
                  default: int) -> dict[TopicPartition, int]:
        if spec == "earliest":
            return dict.fromkeys(tps, EARLIEST)
        if spec == "latest":
            return dict.fromkeys(tps, LATEST)
        assert isinstance(spec, dict)
        return {tp: spec.get(tp.topic, {}).get(str(tp.partition), default) for tp in tps}

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        assert isinstance(partition, RangePartition)
        return read_ranges(partition, self.options)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("deltabus")`: micro-batches of exact offset ranges below the
    high watermark, with maxOffsetsPerTrigger as a read limit (also under availableNow)."""

    def __init__(self, options: SourceOptions) -> None:
        self.topics = TopicReader(options)
        self.options = options
        self._available_now: dict[TopicPartition, int] | None = None
        self._reported: dict[TopicPartition, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"topics": self.topics, "options": self.options, "_available_now": None,
                "_reported": {}}

    def initialOffset(self) -> dict:
        tps = self.topics.partitions()
        return to_json(self.topics.starting(tps))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self.topics.latest(self.topics.partitions())

    def _start_of(self, start: dict[TopicPartition, int],
                  tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Partitions the query did not know yet (new partitions, newly matched topics) start at
        their beginning, as in Spark's Kafka source."""
        new = [tp for tp in tps if tp not in start]
        return {**start, **self.topics.earliest(new)}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start)
        # Spark plans the next batch from where the last one ended only once that one is done
        # (its commit call may come late or, under availableNow, never).
        self._report_progress(begin)
        tps = self.topics.partitions()
        gone = [tp for tp in begin if tp not in tps]
        if gone:
            _data_loss(f"{', '.join(f'{t.topic}-{t.partition}' for t in gone)} no longer exist",
                       self.options.fail_on_data_loss)
        begin = self._start_of({tp: o for tp, o in begin.items() if tp in tps}, tps)
        latest = self._available_now if self._available_now is not None \
            else self.topics.latest(tps)
        latest = {tp: max(latest.get(tp, begin[tp]), begin[tp]) for tp in tps}
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        return to_json(latest)

    def reportLatestOffset(self) -> dict | None:
        tps = self.topics.partitions()
        return to_json(self.topics.latest(tps)) if tps else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ends = from_json(end)
        begin = self._start_of(from_json(start), list(ends))
        return self.topics.plan(begin, ends)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        assert isinstance(partition, RangePartition)
        return read_ranges(partition, self.options)

    def commit(self, end: dict) -> None:
        """Spark finished the micro-batch ending at `end`."""
        self._report_progress(from_json(end))

    def _report_progress(self, offsets: dict[TopicPartition, int]) -> None:
        """With a group id, the query's processed offsets are committed to the group, so
        `consumer-groups --describe` shows its lag like any consumer's."""
        if self.options.group_id is None or not offsets or offsets == self._reported:
            return
        try:
            self.topics.consumer.commit(dict(offsets))
            self._reported = dict(offsets)
        except errors.DeltaBusError as e:  # progress reporting must not stop the query
            log.warning("could not commit the query's offsets to group %s: %s",
                        self.options.group_id, e)

    def stop(self) -> None:
        self.topics.close()


def rate_limit(start: dict[TopicPartition, int], latest: dict[TopicPartition, int],
               max_rows: int) -> dict[TopicPartition, int]:
    """At most `max_rows` records in all, shared out by each partition's backlog (as Spark's
    Kafka source does), every partition with a backlog getting at least one record."""
    backlog = {tp: latest[tp] - start[tp] for tp in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return latest
    out = {}
    for tp, size in backlog.items():
        share = max(1, math.floor(max_rows * size / total)) if size > 0 else 0
        out[tp] = start[tp] + min(size, share)
    return out
