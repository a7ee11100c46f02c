"""Batch reads of topics through Spark's own Parquet reader: no Python worker in the data path.

Why: in one `make bench` run (issue 21), a `format("deltabus")` read drained 2.29 M records/s,
95% of a Python data source serving the same records from memory (2.40 M/s), which is itself
only 54-56% of Spark reading the same Parquet files directly (4.26 M/s): Spark's Python data
source path is the limit, not deltabus's reader. `read_topic` therefore builds the DataFrame
from `spark.read.parquet(...)` over the partition tables' data files, filtered to the offsets.

What it gives: exactly the rows `spark.read.format("deltabus")` gives for the same options (the
Kafka source's columns, in its types), resolved once, on the driver, when it is called:
- each partition's range [start, end) comes from `TopicReader` (source.py), as the Python
  source's: `end` is the high watermark (the last stable offset under read_committed) or the
  endingOffsets given; a start below the log start offset is data loss (failOnDataLoss);
- the files are the leader replica table's current Delta snapshot (delta-rs's add actions), so
  files that retention, compaction or a merge removed are never read; only files whose offset
  statistics overlap the range are listed, and an offset filter (pushed down to the Parquet
  row groups) drops the rest, records below the log start offset included;
- transaction markers are never rows (a marker is a row with producer_id >= 0 and sequence -1).
  The driver finds them with `read_markers`, which reads the files' footers and only the row
  groups whose statistics allow a marker (none, for a topic without transactions), and the
  filter leaves their offsets out: so the scan reads no producer_id or sequence column. Past
  MARKER_SCAN_FILES_MAX files or MARKER_OFFSETS_MAX markers, the filter tests each row's
  producer_id and sequence instead. Under read_committed the records of aborted transactions
  are left out too, by producer and offset range, found from the same markers;
- each row's topic and partition are literals of its partition's scan: one Parquet scan per
  topic-partition, unioned, so no per-row lookup is needed (a path-derived partition would be a
  string operation per row). The price is on the driver: Spark plans each scan (some 40 ms
  each on a loaded 2-core machine), so a read of thousands of partitions plans for minutes.

What differs from the Python source: the DataFrame is the topic at the call, a snapshot (the
Python source resolves `earliest`/`latest` again each time its DataFrame runs). Read it again
and it gives the same records, until the log cleaner deletes a file it lists
(`file.delete.delay.ms` after a merge, retention or compaction): then Spark fails with a
missing file, and `read_topic` must be called again.

Where the Parquet path cannot give the same rows cheaply, `read_topic` returns the Python
source's DataFrame instead (and logs why):
- a root on an object store whose scheme this Spark has no Hadoop filesystem for (pip's
  PySpark has none for s3://, s3a://, abfss://, gs://: their jars are not bundled), or any
  object store under Spark Connect, whose JVM this process cannot ask (a local or FUSE root
  takes the Parquet path there too). Where Spark has the filesystem (Databricks,
  EMR, hadoop-aws on the classpath) it reads with its own Hadoop configuration (instance
  profiles, fs.s3a.* settings): the deltabus storage options reach delta-rs on the driver only;
- read_committed over more than ABORTED_TXNS_MAX aborted transactions in one partition's range
  (each is a condition of the filter).

Runs on the driver (the DataFrame it returns runs Spark's reader on the executors). Each call
has its own client and tables, so calls may run from several threads at once.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import re
import weakref
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltabus.log_tables.delta_reads import open_table
from deltabus.log_tables.delta_writes import typed_column_types
from deltabus.log_tables.log_reader import LOG_START_TXN_APP_ID, data_files, files_overlapping
from deltabus.log_tables.transactions import AbortedTxn, aborted_in, read_markers
from deltabus.records import KEY_FIELDS, VALUE_FIELDS
from deltabus.spark.source import (
    STORAGE_OPTION_PREFIX,
    OffsetRange,
    SourceOptions,
    TopicReader,
    check_log_start,
    kafka_schema,
    spark_ddl,
    unified_struct,
)
from deltabus.storage import Storage, spark_storage_options

log = logging.getLogger(__name__)

# Read_committed: aborted transactions one partition's filter may name before the read falls
# back to the Python source (each is a condition every row of the partition is tested against).
ABORTED_TXNS_MAX = 64
# Read_uncommitted: a partition's data files whose footers the driver reads to find its markers
# (a read of each file's footer, and of the few row groups whose statistics allow a marker);
# past it, the scan tests each row's producer_id and sequence instead. And the marker offsets a
# filter may list before it does the same.
MARKER_SCAN_FILES_MAX = 256
MARKER_OFFSETS_MAX = 10_000
# Partition tables opened at once on the driver (a delta-rs load reads the table's log).
TABLE_LOADS_PARALLEL_MAX = 8
# The columns of a partition table the Parquet path reads, in Spark's types (records.LOG_SCHEMA).
FILE_SCHEMA = ("offset bigint, timestamp timestamp, timestamp_type int, key binary, "
               "value binary, headers array<struct<key: string, value: binary>>, "
               "producer_id bigint, sequence int")
_GLOB_CHARS = re.compile(r"([\\*?\[\]{}])")

# Storage options `deltabus.spark.register` was given, by SparkSession (a Cluster's).
_registered: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def remember_storage_options(spark: Any, options: Mapping[str, str]) -> None:
    """Keep the storage options `register` was given for `spark`, so `read_topic` in that
    session opens the tables with them as `format("deltabus")` does."""
    _registered[spark] = dict(options)


@dataclass(frozen=True)
class PartitionScan:
    """One topic-partition's share of a read: its range, the data files that may hold it, and
    what the filter must leave out."""

    topic: str
    partition: int
    start: int  # at or above the log start offset
    end: int
    files: tuple[str, ...]
    # Whether some listed file holds offsets outside [start, end) (else no range filter).
    straddles: bool
    # The offsets of the markers in [start, end), found from the files' footers on the driver
    # (so the Parquet scan need not read producer_id and sequence); None: not looked for, the
    # filter tests every row's producer_id and sequence instead.
    markers: tuple[int, ...] | None = ()
    aborted: tuple[AbortedTxn, ...] = ()
    # A typed topic's table: its typed columns (records.TYPED_COLUMNS) with their types.
    typed: tuple[tuple[str, pa.DataType], ...] = ()


class FallBack(Exception):  # noqa: N818 (a decision, not an error: never leaves this module)
    """The Parquet path cannot give the Python source's rows here; the reason is the message."""


def read_topic(spark: Any, bootstrap_servers: str, topics: str | Iterable[str] | None = None,
               *, starting_offsets: str = "earliest", ending_offsets: str = "latest",
               include_headers: bool = False, options: Mapping[str, str] | None = None,
               value_fields: bool = False, key_fields: bool = False) -> Any:
    """The records of `topics` (a name, names, or None with `assign`/`subscribePattern` in
    `options`) from `starting_offsets` to `ending_offsets` (earliest/latest or the Kafka
    source's offset JSON) as a DataFrame with the Kafka source's columns, read by Spark's
    Parquet reader; a snapshot at this call (see the module docstring).

    `options`: any other option of the Kafka source, as `format("deltabus")` takes them
    (kafka.isolation.level, failOnDataLoss, startingTimestamp, the kafka.-prefixed security
    settings of a secured cluster, storage.KEY storage options, ...).

    `value_fields`: a typed topic's decoded values too, as the struct column `value_fields`
    (`SELECT value_fields.amount ... WHERE value_fields.currency = 'EUR'`, no parsing): the
    partitions' struct types unified (each table's schema evolved on its own), null for a record
    of an untyped topic (a read that falls back gives them through the Python source's
    valueFields option). `key_fields`: likewise a topic's decoded keys (key.schema.subject),
    as the struct column `key_fields`."""
    given = _source_options(bootstrap_servers, topics, starting_offsets, ending_offsets,
                            include_headers, options)
    stored = {**spark_storage_options(spark), **_registered.get(spark, {})}
    parsed = SourceOptions.parse(
        {**{f"{STORAGE_OPTION_PREFIX}{k}": v for k, v in stored.items()}, **given},
        streaming=False)
    try:
        scans = plan_scans(spark, parsed)
    except FallBack as reason:
        log.info("reading through the deltabus Python source: %s", reason)
        given = {**given, "keyFields": str(key_fields).lower(),
                 "valueFields": str(value_fields).lower()}
        return spark.read.format("deltabus").options(**given).load()
    wanted = [c for c, on in ((KEY_FIELDS, key_fields), (VALUE_FIELDS, value_fields)) if on]
    return scans_frame(spark, scans, parsed.include_headers,
                       {c: _typed_type(scans, c) for c in wanted})


def _typed_type(scans: list[PartitionScan], column: str) -> pa.DataType:
    """The type every scan's typed `column` is read as: the partitions' types unified."""
    types = [t for s in scans for name, t in s.typed if name == column]
    return unified_struct(types) if types else pa.struct([])


def _source_options(bootstrap: str, topics: str | Iterable[str] | None, starting: str,
                    ending: str, include_headers: bool, options: Mapping[str, str] | None
                    ) -> dict[str, str]:
    """The Kafka source's options for this read (what the Python source is given too)."""
    given = {"kafka.bootstrap.servers": bootstrap, "startingOffsets": starting,
             "endingOffsets": ending, "includeHeaders": str(include_headers).lower()}
    if topics is not None:
        given["subscribe"] = topics if isinstance(topics, str) else ",".join(topics)
    return {**given, **{str(k): str(v) for k, v in (options or {}).items()}}


def plan_scans(spark: Any, options: SourceOptions) -> list[PartitionScan]:
    """Each partition's scan, resolved on the driver; FallBack where the Parquet path cannot
    serve the read (module docstring)."""
    topics = TopicReader(dataclasses.replace(options, min_partitions=None))
    try:
        tps = topics.partitions()
        start = topics.starting(tps)
        end = topics.resolve(options.ending, tps, what="endingOffsets")
        ranges = [r for p in topics.plan(start, end) for r in p.ranges]
    finally:
        topics.close()
    for table_path in {_scheme(r.path): r.path for r in ranges}.values():  # one per scheme
        if not spark_reads(spark, table_path):
            raise FallBack(f"this Spark has no Hadoop filesystem for {_scheme(table_path)}://")
    if not ranges:
        return []
    with ThreadPoolExecutor(min(TABLE_LOADS_PARALLEL_MAX, len(ranges))) as pool:
        scans = list(pool.map(lambda r: partition_scan(r, options), ranges))
    return [s for s in scans if s.files]


def _scheme(uri: str) -> str:
    return urlsplit(uri).scheme.lower() if "://" in uri else ""


def spark_reads(spark: Any, uri: str) -> bool:
    """Whether Spark's own reader can open `uri`: a local or FUSE path always; an object
    store's only where Spark's JVM has a Hadoop filesystem for its scheme."""
    scheme = _scheme(uri)
    if not scheme or scheme == "file":
        return True
    try:
        jvm = spark.sparkContext._jvm
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(
            scheme, spark.sparkContext._jsc.hadoopConfiguration())
    except Exception:  # no filesystem for the scheme, or Spark Connect (no JVM here)
        return False
    return True


def partition_scan(r: OffsetRange, options: SourceOptions) -> PartitionScan:
    """The files of the replica table `r.path` holding [r.start, r.end), at its current Delta
    version, with the markers among them and (read_committed) the aborted transactions."""
    storage = Storage(r.path, options.storage_options)
    table = open_table(r.path, storage_options=storage.delta_options)
    files = data_files(table)
    recorded_start = table.transaction_version(LOG_START_TXN_APP_ID) or 0
    log_start = None
    if files.num_rows:
        first, last = files.column("min.offset")[0].as_py(), files.column("max.offset")[-1].as_py()
        log_start = min(max(int(first), recorded_start), int(last) + 1)
    check_log_start(r, log_start, options.fail_on_data_loss)
    start = max(r.start, recorded_start)
    wanted = files_overlapping(files, start, r.end)
    if not wanted.num_rows:
        return PartitionScan(r.topic, r.partition, start, r.end, (), False)
    typed = tuple(typed_column_types(table).items())
    straddles = bool(pc.min(wanted.column("min.offset")).as_py() < start
                     or pc.max(wanted.column("max.offset")).as_py() >= r.end)
    uris = tuple(posixpath.join(r.path, unquote(p)) for p in wanted.column("path").to_pylist())
    # read_committed must know the aborted transactions, whose markers may come after r.end
    later = files_overlapping(files, start, 2**63 - 1) if options.read_committed else wanted
    if not options.read_committed and later.num_rows > MARKER_SCAN_FILES_MAX:
        return PartitionScan(r.topic, r.partition, start, r.end, uris, straddles, None,
                             typed=typed)
    markers = read_markers(_opened(storage, r.path, later.column("path").to_pylist()))
    offsets = [o for o in markers.column("offset").to_pylist() if start <= o < r.end]
    aborted = [a for a in aborted_in(markers)[0] if a.first_offset < r.end
               and a.last_offset > start] if options.read_committed else []
    if len(aborted) > ABORTED_TXNS_MAX:
        raise FallBack(f"{r.topic}-{r.partition} has {len(aborted)} aborted transactions in "
                       f"the range read_committed reads (more than {ABORTED_TXNS_MAX})")
    return PartitionScan(r.topic, r.partition, start, r.end, uris, straddles,
                         tuple(offsets) if len(offsets) <= MARKER_OFFSETS_MAX else None,
                         tuple(aborted), typed)


def _opened(storage: Storage, table_path: str, paths: list[str]) -> Iterator[pq.ParquetFile]:
    """The data files at `paths` (add actions' paths), opened one at a time, in order."""
    for path in paths:
        with storage.open_input(posixpath.join(table_path, unquote(path))) as source:
            yield pq.ParquetFile(source)


def scans_frame(spark: Any, scans: list[PartitionScan], include_headers: bool,
                typed: Mapping[str, pa.DataType] | None = None) -> Any:
    """The DataFrame of the scans: one Parquet scan each, filtered and given the Kafka
    source's columns, unioned; an empty one with those columns when there is none. Built
    from SQL expression strings: each Column built in Python is a round trip to the JVM (0.5
    ms each on a loaded 2-core machine, a third of a 4-partition read's time)."""
    if not scans:
        from pyspark.sql.types import StructType

        ddl = kafka_schema(include_headers) + "".join(
            f", {name} {spark_ddl(fields)}" for name, fields in (typed or {}).items())
        return spark.createDataFrame([], StructType.fromDDL(ddl))
    frames = [_scan_frame(spark, s, include_headers, typed or {}) for s in scans]
    while len(frames) > 1:  # a balanced tree, so a topic of many partitions plans shallow
        frames = [frames[i].unionAll(frames[i + 1]) if i + 1 < len(frames) else frames[i]
                  for i in range(0, len(frames), 2)]
    return frames[0]


def scan_filter(scan: PartitionScan) -> str | None:
    """The SQL condition a row of `scan`'s files must meet to be a record of the read (None:
    every row is): in its range, not a marker, not of an aborted transaction."""
    keep = []
    if scan.straddles:
        keep.append(f"`offset` >= {scan.start} AND `offset` < {scan.end}")
    if scan.markers is None:  # a marker is the one row with a producer id and no sequence
        keep.append("(producer_id < 0 OR sequence <> -1)")
    elif scan.markers:
        keep.append(f"`offset` NOT IN ({', '.join(map(str, scan.markers))})")
    keep += [f"NOT (producer_id = {t.producer_id} AND `offset` >= {t.first_offset} "
             f"AND `offset` < {t.last_offset})" for t in scan.aborted]
    return " AND ".join(keep) or None


def _scan_frame(spark: Any, scan: PartitionScan, include_headers: bool,
                typed: Mapping[str, pa.DataType]) -> Any:
    schema = FILE_SCHEMA
    for name, fields in typed.items():  # files written before a field came: null
        if fields.num_fields:
            schema += f", {name} {spark_ddl(fields)}"
    df = spark.read.schema(schema).parquet(*(_literal_path(f) for f in scan.files))
    condition = scan_filter(scan)
    if condition is not None:
        df = df.where(condition)
    topic = scan.topic.replace("\\", "\\\\").replace("'", "\\'")  # legal names need none
    columns = ["key", "value", f"'{topic}' AS topic",
               f"CAST({scan.partition} AS INT) AS `partition`", "`offset`", "`timestamp`",
               "timestamp_type AS timestampType"]
    if include_headers:
        columns.append("headers")
    columns += [name if fields.num_fields else f"NULL AS {name}"
                for name, fields in typed.items()]
    return df.selectExpr(*columns)


def _literal_path(uri: str) -> str:
    """`uri` as Spark's reader takes a path: it expands glob characters, so they are escaped."""
    return _GLOB_CHARS.sub(r"\\\1", uri)
