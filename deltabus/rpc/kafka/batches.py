"""Record batches (magic v2) to and from partition log rows, with kafka-python's codec: CRC-32C
and the compression codecs clients use (gzip, snappy, lz4, zstd).

Produced batches are decompressed and stored uncompressed, as plain rows: the partition table is
for people and Spark. Fetched rows go out as uncompressed batches carrying their offsets (a
compacted topic's gaps are offset deltas), timestamps, timestamp type and leader epoch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c

from deltabus import errors
from deltabus.records import LOG_APPEND_TIME, ProducerState, normalize_produce, produce_batch

FETCH_BATCH_RECORDS_MAX = 4096  # records per batch a fetch answers with
_CRC = struct.Struct(">I")
_LEADER_EPOCH_AT = 12  # int32, outside the CRC
_ATTRIBUTES_AT = DefaultRecordBatch.ATTRIBUTES_OFFSET  # the CRC covers from here to the end
_CRC_AT = DefaultRecordBatch.CRC_OFFSET
_MAGIC_AT = 16


@dataclass(frozen=True)
class ProducedBatch:
    """One record batch of a produce request, as the log takes it."""

    records: pa.Table  # PRODUCE_SCHEMA
    producer: ProducerState
    transactional: bool


def decode_produce(data: bytes) -> list[ProducedBatch]:
    """The record batches of one partition's produce data. Raises CorruptRecordError for a bad
    CRC or truncated batch, InvalidRecordError for what the log cannot take (old message
    formats, control batches, empty batches)."""
    out = []
    records = MemoryRecords(bytes(data))
    while records.has_next():
        batch = records.next_batch()
        if batch is None:
            break
        if not isinstance(batch, DefaultRecordBatch):
            raise errors.UnsupportedForMessageFormatError(
                "only record batches of magic v2 are accepted (Kafka 0.11 and later clients)")
        if not batch.validate_crc():
            raise errors.CorruptRecordError("a record batch failed its CRC-32C check")
        if batch.is_control_batch:
            raise errors.InvalidRecordError("producers may not send control batches")
        try:
            rows = [(r.key, r.value, r.timestamp, r.headers) for r in batch]
        except Exception as e:  # truncated or undecompressible
            raise errors.CorruptRecordError(f"a record batch cannot be read: {e}") from None
        if not rows:
            raise errors.InvalidRecordError("a record batch must hold at least one record")
        keys, values, timestamps, headers = zip(*rows, strict=True)
        table = normalize_produce(produce_batch(
            list(values), keys=list(keys), timestamps_ms=list(timestamps),
            headers=[[(k, v) for k, v in h] if h else None for h in headers]))
        producer = (ProducerState(batch.producer_id, batch.producer_epoch, batch.base_sequence)
                    if batch.producer_id >= 0 else ProducerState())
        out.append(ProducedBatch(table, producer, batch.is_transactional))
    if not out:
        raise errors.InvalidRecordError("the produce data holds no record batch")
    return out


def encode_fetch(log_rows: pa.Table) -> bytes:
    """Log rows (LOG_SCHEMA, in offset order) as uncompressed record batches."""
    parts = []
    for start in range(0, log_rows.num_rows, FETCH_BATCH_RECORDS_MAX):
        parts.append(_encode_batch(log_rows.slice(start, FETCH_BATCH_RECORDS_MAX)))
    return b"".join(parts)


def _encode_batch(rows: pa.Table) -> bytes:
    offsets = rows.column("offset").to_pylist()
    base = offsets[0]
    timestamps = pc.cast(pc.cast(rows.column("timestamp"), pa.timestamp("ms", tz="UTC")),
                         pa.int64()).to_pylist()
    keys = rows.column("key").to_pylist()
    values = rows.column("value").to_pylist()
    headers = rows.column("headers").to_pylist()
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=2**31 - 1)
    for i, offset in enumerate(offsets):
        builder.append(offset - base, timestamp=timestamps[i], key=keys[i], value=values[i],
                       headers=[(h["key"], h["value"]) for h in headers[i] or ()])
    buffer = builder.build()
    struct.pack_into(">q", buffer, 0, base)
    struct.pack_into(">i", buffer, _LEADER_EPOCH_AT, rows.column("leader_epoch")[-1].as_py())
    if rows.column("timestamp_type")[0].as_py() == LOG_APPEND_TIME:
        attributes = struct.unpack_from(">h", buffer, _ATTRIBUTES_AT)[0]
        struct.pack_into(">h", buffer, _ATTRIBUTES_AT,
                         attributes | DefaultRecordBatch.TIMESTAMP_TYPE_MASK)
        _CRC.pack_into(buffer, _CRC_AT, calc_crc32c(bytes(buffer[_ATTRIBUTES_AT:])))
    return bytes(buffer)
