"""The record: its Arrow schema on the wire and in the partition tables, and how a produce batch
becomes a log batch.

Invariants:
- A stored record always has `offset` and `timestamp`; offsets in a log batch are contiguous.
- The stored schema uses only Delta types delta-spark reads with no table features (no
  timestamp_ntz, no deletion vectors), so `spark.read.format("delta")` opens every partition table.
- Clients send any subset of PRODUCE columns with `value` required; everything else is filled here,
  vectorised, because per-record Python would cap produce throughput.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltabus import config as cfg
from deltabus import errors

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

CREATE_TIME = 0
LOG_APPEND_TIME = 1
NO_PRODUCER_ID = -1

# What a partition table holds, column for column.
LOG_SCHEMA = pa.schema([
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
    pa.field("timestamp_type", pa.int32(), nullable=False),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", HEADERS_TYPE),
    pa.field("producer_id", pa.int64(), nullable=False),
    pa.field("producer_epoch", pa.int16(), nullable=False),
    pa.field("sequence", pa.int32(), nullable=False),
    pa.field("leader_epoch", pa.int32(), nullable=False),
])

# What a producer may send; only `value` is required.
# A typed topic's partition tables carry each record's decoded value in this struct column,
# beside the raw bytes (the topic config value.schema.subject names the schema's subject), and
# its decoded key in KEY_FIELDS (key.schema.subject): the typed columns, in this order.
VALUE_FIELDS = "value_fields"
KEY_FIELDS = "key_fields"
TYPED_COLUMNS = (KEY_FIELDS, VALUE_FIELDS)

PRODUCE_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("timestamp", TIMESTAMP_TYPE),
    pa.field("headers", HEADERS_TYPE),
])


class Header(NamedTuple):
    key: str
    value: bytes | None


class ConsumerRecord(NamedTuple):
    """One record as a consumer sees it (the fields of Kafka's ConsumerRecord)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms since the epoch
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    leader_epoch: int = -1


@dataclass(frozen=True)
class ProducerState:
    """Idempotent-producer fields stamped on a batch (-1 when the producer is not idempotent)."""

    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    base_sequence: int = -1
    transactional: bool = False  # a batch of a transaction (Kafka's attribute bit 4)


def produce_batch(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    timestamps_ms: Sequence[int | None] | None = None,
    headers: Sequence[Iterable[tuple[str, bytes | None]] | None] | None = None,
) -> pa.Table:
    """Build a produce batch from Python lists (the client's per-record path)."""
    n = len(values)
    columns: dict[str, pa.Array] = {"value": pa.array(values, pa.binary())}
    columns["key"] = pa.array(keys, pa.binary()) if keys is not None else pa.nulls(n, pa.binary())
    if timestamps_ms is not None and any(t is not None for t in timestamps_ms):
        columns["timestamp"] = pa.array(timestamps_ms, pa.int64()).cast(pa.timestamp("ms", "UTC"))
    if headers is not None and any(headers):
        columns["headers"] = pa.array(
            [[{"key": k, "value": v} for k, v in h] if h else None for h in headers], HEADERS_TYPE
        )
    return pa.table(columns)


def normalize_produce(table: pa.Table) -> pa.Table:
    """Check a client's produce batch and bring it to PRODUCE_SCHEMA (missing columns as nulls).

    Raises InvalidRecordError naming the column at fault; nothing is written on error.
    """
    check_record_count(table.num_rows)
    names = set(table.column_names)
    if "value" not in names:
        raise errors.InvalidRecordError("a produce batch needs a 'value' column")
    unknown = names - set(PRODUCE_SCHEMA.names)
    if unknown:
        raise errors.InvalidRecordError(f"unknown produce columns: {sorted(unknown)}")
    n = table.num_rows
    columns = []
    for field in PRODUCE_SCHEMA:
        if field.name not in names:
            columns.append(pa.nulls(n, field.type))
            continue
        column = table.column(field.name)
        try:
            if field.name == "timestamp" and pa.types.is_integer(column.type):
                column = column.cast(pa.int64()).cast(pa.timestamp("ms", "UTC"))
            if column.type != field.type:  # a cast costs even when there is nothing to do
                column = column.cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise errors.InvalidRecordError(
                f"column {field.name!r} has type {column.type}, expected {field.type}: {e}"
            ) from None
        columns.append(column)
    out = pa.Table.from_arrays(columns, schema=PRODUCE_SCHEMA)
    headers = out.column("headers")
    if headers.null_count < n:
        check_header_count(pc.max(pc.list_value_length(headers)).as_py() or 0)
        if pc.struct_field(pc.list_flatten(headers), "key").null_count:
            raise errors.InvalidRecordError("a header key must not be null")
    return out


def check_record_count(records: int) -> None:
    """RECORD_LIST_TOO_LARGE for a batch of more records than PRODUCE_BATCH_RECORDS_MAX: checked
    on the count a batch declares, before anything is allocated per record."""
    if records > cfg.PRODUCE_BATCH_RECORDS_MAX:
        raise errors.RecordListTooLargeError(
            f"a produce batch declares {records} records, more than the limit of "
            f"{cfg.PRODUCE_BATCH_RECORDS_MAX} (PRODUCE_BATCH_RECORDS_MAX)")


def check_header_count(headers: int) -> None:
    """INVALID_RECORD for a record of more headers than RECORD_HEADERS_MAX."""
    if headers > cfg.RECORD_HEADERS_MAX:
        raise errors.InvalidRecordError(
            f"a record has {headers} headers, more than the limit of {cfg.RECORD_HEADERS_MAX} "
            f"(RECORD_HEADERS_MAX)")


class UnpackBudget:
    """What the record batches of one produce request may still unpack to: compressed Kafka
    batches and compressed Arrow IPC buffers together, PRODUCE_UNPACKED_BYTES_MAX at most.

    Not thread-safe: one request's thread decodes its batches with it.
    """

    def __init__(self, limit_bytes: int = cfg.PRODUCE_UNPACKED_BYTES_MAX) -> None:
        self.limit_bytes = limit_bytes
        self.remaining_bytes = limit_bytes

    def take(self, size_bytes: int) -> None:
        """Count `size_bytes` unpacked; RECORD_LIST_TOO_LARGE past the limit (as Kafka answers
        a batch larger than its log takes in one piece: RecordBatchTooLargeException)."""
        if size_bytes > self.remaining_bytes:
            raise errors.RecordListTooLargeError(
                f"the record batches of this produce request unpack to more than "
                f"{self.limit_bytes} bytes (PRODUCE_UNPACKED_BYTES_MAX: what an uncompressed "
                f"request may carry)")
        self.remaining_bytes -= size_bytes


def record_sizes(batch: pa.Table) -> np.ndarray:
    """Per-record size in bytes as Kafka counts it for max.message.bytes (key + value + headers)."""
    size = np.zeros(batch.num_rows, dtype=np.int64)
    for name in ("key", "value"):
        lengths = pc.binary_length(batch.column(name)).fill_null(0)
        size += lengths.to_numpy(zero_copy_only=False)
    headers = batch.column("headers")
    if headers.null_count < batch.num_rows:
        # Headers are rare and small: count them roughly, per record, by their flattened bytes.
        for i, h in enumerate(headers.to_pylist()):
            if h:
                size[i] += sum(len(x["key"].encode()) + len(x["value"] or b"") for x in h)
    return size


# A magic v2 record batch: its 61-byte header (base offset to records count), then each record:
# length, attributes, timestamp delta, offset delta, key, value and headers, lengths as zigzag
# varints. max.message.bytes is checked on that size, per batch, as Kafka checks it.
RECORD_BATCH_OVERHEAD_BYTES = 61
RECORD_BYTES_MIN = 7  # a record of no key, no value, no header: one byte per field
# A record's bytes beyond its key, value and headers at most (each varint at its longest), and a
# header's beyond its key and value: what a producer reserves so its batches always fit.
RECORD_OVERHEAD_BYTES_MAX = 36
HEADER_OVERHEAD_BYTES_MAX = 10
_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


def _varint_bytes(values: np.ndarray) -> np.ndarray:
    """The length of each int64 of `values` as Kafka's zigzag varint."""
    zigzag = ((values.astype(np.int64) << 1) ^ (values.astype(np.int64) >> 63)).astype(np.uint64)
    return np.searchsorted(_VARINT_LIMITS, zigzag, side="right").astype(np.int64) + 1


def _binary_lengths(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Byte length of each value, -1 for null (how a record encodes a null key or value)."""
    return pc.binary_length(column).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def _headers_bytes(headers: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Per record: (its header count, the bytes of its headers with their length varints)."""
    array = headers.combine_chunks() if isinstance(headers, pa.ChunkedArray) else headers
    counts = pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
    if not counts.any():
        return counts.astype(np.int64), np.zeros(len(array), np.int64)
    flat = array.values
    key_lengths = _binary_lengths(pc.struct_field(flat, "key").cast(pa.binary()))
    value_lengths = _binary_lengths(pc.struct_field(flat, "value"))
    each = (_varint_bytes(key_lengths) + np.maximum(key_lengths, 0)
            + _varint_bytes(value_lengths) + np.maximum(value_lengths, 0))
    total = np.concatenate(([0], np.cumsum(each)))
    offsets = array.offsets.to_numpy()
    sums = total[offsets[1:]] - total[offsets[:-1]]
    sums[counts == 0] = 0
    return counts.astype(np.int64), sums


def record_encoded_sizes(batch: pa.Table) -> np.ndarray:
    """Each record's bytes in an uncompressed magic v2 batch of `batch` (PRODUCE_SCHEMA), as a
    Kafka client encodes it: offset deltas from 0, timestamp deltas from the first record's (a
    null timestamp, which the broker fills, counts as the first's)."""
    n = batch.num_rows
    stamps = pc.cast(batch.column("timestamp"), pa.int64())  # microseconds
    present = stamps.drop_null()
    first = present[0].as_py() if len(present) else 0
    millis = stamps.fill_null(first).to_numpy(zero_copy_only=False) // 1000 - first // 1000
    keys, values = _binary_lengths(batch.column("key")), _binary_lengths(batch.column("value"))
    counts, header_bytes = _headers_bytes(batch.column("headers"))
    body = (1 + _varint_bytes(millis) + _varint_bytes(np.arange(n, dtype=np.int64))
            + _varint_bytes(keys) + np.maximum(keys, 0) + _varint_bytes(values)
            + np.maximum(values, 0) + _varint_bytes(counts) + header_bytes)
    return _varint_bytes(body) + body


def record_bytes_max(table: pa.Table) -> np.ndarray:
    """Each record's bytes in a record batch at most, from whichever of PRODUCE_SCHEMA's
    key, value and headers columns `table` has (others count nothing): what a producer counts
    to keep its batches within max.message.bytes before the broker sees them."""
    size = np.full(table.num_rows, RECORD_OVERHEAD_BYTES_MAX, np.int64)
    for name in ("key", "value"):
        if name in table.column_names and _is_binary(table.column(name).type):
            size += np.maximum(_binary_lengths(table.column(name)), 0)
    if "headers" in table.column_names and table.column("headers").type == HEADERS_TYPE:
        size += _headers_bytes(table.column("headers"))[1]  # exact, with their varints
    return size


def _is_binary(kind: pa.DataType) -> bool:
    return bool(pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                or pa.types.is_string(kind) or pa.types.is_large_string(kind))


def batch_size_bytes(batch: pa.Table) -> int:
    """The size of `batch` (PRODUCE_SCHEMA) as one uncompressed magic v2 record batch."""
    return RECORD_BATCH_OVERHEAD_BYTES + int(record_encoded_sizes(batch).sum())


def largest_batch_bytes(batch: pa.Table, batch_rows: Sequence[int]) -> int:
    """The size of the largest of the record batches `batch` (PRODUCE_SCHEMA) is made of, each
    of `batch_rows` records in turn, as uncompressed magic v2 record batches: what
    max.message.bytes limits on the gRPC door, where each Arrow record batch of a produce
    entry's `arrow_records` is one record batch (Kafka's door has the client's own batches)."""
    sizes = record_encoded_sizes(batch)
    starts = np.concatenate(([0], np.cumsum(batch_rows[:-1]))).astype(np.int64)
    return RECORD_BATCH_OVERHEAD_BYTES + int(np.add.reduceat(sizes, starts).max())


def batch_bytes_at_most(batch: pa.Table) -> int | None:
    """At least the size of `batch` (PRODUCE_SCHEMA) as one uncompressed magic v2 record batch,
    from its columns' buffer sizes alone, so at least that of any record batch it is made of;
    None when it has headers (only counted exactly). A batch that fits under this bound needs
    no per-record count (`largest_batch_bytes`), which cost a broker more than its Delta commit
    for a small batch."""
    if batch.column("headers").null_count != batch.num_rows:
        return None
    return (RECORD_BATCH_OVERHEAD_BYTES + RECORD_OVERHEAD_BYTES_MAX * batch.num_rows
            + batch.column("key").nbytes + batch.column("value").nbytes)


def arrow_batch_rows(table: pa.Table) -> list[int]:
    """The record count of each Arrow record batch of `table` (as `from_ipc` read them)."""
    return [b.num_rows for b in table.to_batches() if b.num_rows] or [table.num_rows]


def batch_size_min_bytes(records: int) -> int:
    """The least a batch of `records` records takes (each of the smallest kind)."""
    return RECORD_BATCH_OVERHEAD_BYTES + RECORD_BYTES_MIN * records


def check_batch_size(size_bytes: int, max_message_bytes: int, where: str,
                     at_least: bool = False) -> None:
    """Kafka's check of a batch against max.message.bytes (UnifiedLog's analyzeAndValidateRecords:
    RecordTooLargeException, MESSAGE_TOO_LARGE, with its message)."""
    if size_bytes > max_message_bytes:
        raise errors.MessageTooLargeError(
            f"The record batch size in the append to {where} is {'at least ' * at_least}"
            f"{size_bytes} bytes which exceeds the maximum configured value "
            f"(max.message.bytes={max_message_bytes}).")


class ProducedBatch(NamedTuple):
    """A normalised produce batch and what the leader stamps on it (`to_log_group`)."""

    batch: pa.Table
    leader_epoch: int
    timestamp_type: int = CREATE_TIME
    producer: ProducerState = ProducerState()
    # a typed topic's decoded keys or values (a struct each), by typed column (TYPED_COLUMNS)
    typed: Mapping[str, pa.Array] = MappingProxyType({})


def to_log_batch(
    batch: pa.Table,
    *,
    base_offset: int,
    now_ms: int,
    leader_epoch: int,
    timestamp_type: int = CREATE_TIME,
    producer: ProducerState = ProducerState(),
) -> pa.Table:
    """Give a normalised produce batch its offsets and broker-side fields, as LOG_SCHEMA."""
    return to_log_group([ProducedBatch(batch, leader_epoch, timestamp_type, producer)],
                        base_offset=base_offset, now_ms=now_ms)


def to_log_group(produced: Sequence[ProducedBatch], *, base_offset: int,
                 now_ms: int) -> pa.Table:
    """Produce batches as one log batch of consecutive offsets from `base_offset`, each row
    stamped with its batch's fields, as LOG_SCHEMA.

    Built column by column over the whole group, not batch by batch: a Kafka client at
    linger.ms=0 sends a request per record, so a group commit gathers hundreds of one-record
    batches, and the commit round (which holds the partition's next commit back) must not pay
    a dozen Arrow calls per batch, each a chance to lose the GIL to the request threads."""
    counts = np.array([p.batch.num_rows for p in produced], dtype=np.int64)
    n = int(counts.sum())
    # one chunk: delta-rs may write the chunks of a table in any order (a bulk produce entry
    # of several Arrow batches left files out of offset order: every Parquet read sorted them)
    records = (produced[0].batch if len(produced) == 1
               else pa.concat_tables([p.batch for p in produced])).combine_chunks()

    def each(values: list[int], dtype: type) -> np.ndarray:
        return np.repeat(np.array(values, dtype=dtype), counts)

    timestamp_types = each([p.timestamp_type for p in produced], np.int32)
    now = pa.scalar(now_ms * 1000, TIMESTAMP_TYPE)
    timestamp = pc.fill_null(records.column("timestamp").cast(TIMESTAMP_TYPE), now)
    if (timestamp_types == LOG_APPEND_TIME).any():
        timestamp = pc.if_else(pa.array(timestamp_types == LOG_APPEND_TIME), now, timestamp)
    base_sequences = each([p.producer.base_sequence for p in produced], np.int64)
    # each row's place in its own batch: 0, 1, ... from every batch's first row
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    sequence = np.where(base_sequences >= 0,
                        np.arange(n, dtype=np.int64) - starts + base_sequences, -1)
    columns = [
        pa.array(np.arange(base_offset, base_offset + n, dtype=np.int64)),
        timestamp,
        pa.array(timestamp_types),
        records.column("key"),
        records.column("value"),
        records.column("headers"),
        pa.array(each([p.producer.producer_id for p in produced], np.int64)),
        pa.array(each([p.producer.producer_epoch for p in produced], np.int16)),
        pa.array(sequence.astype(np.int32)),
        pa.array(each([p.leader_epoch for p in produced], np.int32)),
    ]
    table = pa.Table.from_arrays(columns, schema=LOG_SCHEMA)
    for name in TYPED_COLUMNS:
        if any(name in p.typed for p in produced):
            table = table.append_column(name, typed_column(produced, counts, name))
    return table


def typed_column(produced: Sequence[ProducedBatch], counts: np.ndarray, name: str) -> pa.Array:
    """The group's typed column `name`: each batch's decoded keys or values, their struct
    types unified (records written with different versions of a schema: missing fields are
    null), null for a batch that has none."""
    parts = [pa.table({name: p.typed[name] if name in p.typed else pa.nulls(int(n))})
             for p, n in zip(produced, counts, strict=True)]
    column = pa.concat_tables(parts, promote_options="permissive").column(name)
    return column.combine_chunks()


def to_ipc_batches(tables: Sequence[pa.Table]) -> bytes:
    """Serialise tables of one schema as one Arrow IPC stream of a record batch each: a bulk
    produce entry whose batches each stay within max.message.bytes (`largest_batch_bytes`)."""
    parts = [_ipc_ready(t) for t in tables]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, parts[0].schema) as writer:
        for part in parts:
            writer.write_table(part)
    return sink.getvalue().to_pybytes()


def to_ipc(table: pa.Table) -> bytes:
    """Serialise a table as one Arrow IPC stream of one record batch (what `arrow_records`
    carries), so its size is the records' size plus one batch's metadata.

    The chunks are combined first: the IPC writer writes a record batch per chunk, with its own
    metadata, and a read across 500 small files has hundreds of chunks; each batch also carried
    the whole buffers of the rebuilt all-null columns below (a 1 MB read of 349 files became
    20 MB on the wire). All-null columns are rebuilt: the IPC writer ships the whole parent
    buffers of a sliced all-null list column (a 1 MB read of a cached 250k-record batch became
    3 MB on the wire).
    """
    table = _ipc_ready(table)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _ipc_ready(table: pa.Table) -> pa.Table:
    """One chunk, all-null columns rebuilt (see to_ipc)."""
    table = table.combine_chunks()
    for i, column in enumerate(table.columns):
        if column.null_count == table.num_rows and table.num_rows:
            table = table.set_column(i, table.field(i), pa.nulls(table.num_rows, column.type))
    return table


def from_ipc(data: bytes, budget: UnpackBudget | None = None) -> pa.Table:
    """Read an Arrow IPC stream; raises CorruptMessageError when it is not a valid one.

    A producer's stream is hostile input: each record batch's declared row count is checked
    (check_record_count) and what its compressed buffers unpack to is counted against `budget`
    (UnpackBudget) before the batch is read, since reading allocates what they declare; every
    batch is then validated in full, so a forged offset cannot make a later kernel read out of
    bounds. Dictionary batches are refused (no produce column is dictionary-encoded).
    """
    budget = budget or UnpackBudget()
    schema, batches, rows = None, [], 0
    try:
        for message in pa.ipc.MessageReader.open_stream(pa.py_buffer(data)):
            if message.type == "schema" and schema is None:
                schema = pa.ipc.read_schema(message)
                continue
            if message.type != "record batch" or schema is None:
                raise errors.CorruptMessageError(
                    f"arrow_records holds a {message.type} message where a record batch goes")
            declared, unpacked = _record_batch_header(message)
            rows += declared
            check_record_count(rows)
            budget.take(unpacked)
            batch = pa.ipc.read_record_batch(message, schema)
            batch.validate(full=True)
            batches.append(batch)
        if schema is None:
            raise errors.CorruptMessageError("arrow_records holds no schema")
        return pa.Table.from_batches(batches, schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, struct.error,
            IndexError) as e:
        raise errors.CorruptMessageError(f"arrow_records is not an Arrow IPC stream: {e}") from None


def _record_batch_header(message: pa.ipc.Message) -> tuple[int, int]:
    """(rows, bytes its compressed buffers unpack to: 0 when not compressed) of a record batch
    message, read from its flatbuffer metadata (Arrow's Message.fbs: Message.header is a
    RecordBatch of fields length, nodes, buffers, compression) and the length each compressed
    buffer starts with, without reading the batch."""
    meta = message.metadata.to_pybytes()
    root = struct.unpack_from("<I", meta, 0)[0]
    header = _fb_field(meta, root, 2)
    if header is None:
        raise errors.CorruptMessageError("a record batch message without its header")
    batch = header + struct.unpack_from("<I", meta, header)[0]
    length_at = _fb_field(meta, batch, 0)
    rows = struct.unpack_from("<q", meta, length_at)[0] if length_at is not None else 0
    buffers_at = _fb_field(meta, batch, 2)
    if _fb_field(meta, batch, 3) is None or buffers_at is None:
        return rows, 0
    body = message.body.to_pybytes() if message.body is not None else b""
    vector = buffers_at + struct.unpack_from("<I", meta, buffers_at)[0]
    unpacked = 0
    for i in range(struct.unpack_from("<I", meta, vector)[0]):
        offset, length = struct.unpack_from("<qq", meta, vector + 4 + 16 * i)
        if length >= 8:  # each compressed buffer: its unpacked length, -1 if kept as is
            unpacked += max(0, struct.unpack_from("<q", body, offset)[0])
    return rows, unpacked


def _fb_field(buffer: bytes, table: int, index: int) -> int | None:
    """Where field `index` of the flatbuffer table at `table` lies, None when absent."""
    vtable = table - struct.unpack_from("<i", buffer, table)[0]
    if 4 + 2 * index + 2 > struct.unpack_from("<H", buffer, vtable)[0]:
        return None
    offset = struct.unpack_from("<H", buffer, vtable + 4 + 2 * index)[0]
    return table + offset if offset else None


def iter_consumer_records(topic: str, partition: int, table: pa.Table) -> list[ConsumerRecord]:
    """Turn a fetched log batch into ConsumerRecords (one Python object per record)."""
    if table.num_rows == 0:
        return []
    offsets = table.column("offset").to_pylist()
    ts = pc.cast(table.column("timestamp"), pa.int64()).to_numpy(zero_copy_only=False) // 1000
    ts_type = table.column("timestamp_type").to_pylist()
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist()
    headers_col = table.column("headers")
    if headers_col.null_count == table.num_rows:
        headers: list = [[] for _ in range(table.num_rows)]
    else:
        headers = [[(h["key"], h["value"]) for h in hs] if hs else []
                   for hs in headers_col.to_pylist()]
    epochs = table.column("leader_epoch").to_pylist()
    return [
        ConsumerRecord(topic, partition, o, int(t), tt, k, v, h, e)
        for o, t, tt, k, v, h, e in zip(offsets, ts.tolist(), ts_type, keys, values, headers,
                                        epochs, strict=True)
    ]
