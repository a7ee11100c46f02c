"""Record batches (magic v2) to and from partition log rows, with kafka-python's codec: CRC-32C
and the compression codecs clients use (gzip, snappy, lz4, zstd).

Produced batches are decompressed and stored uncompressed, as plain rows: the partition table is
for people and Spark. Fetched rows go out as uncompressed batches carrying their offsets (a
compacted topic's gaps are offset deltas), timestamps, timestamp type and leader epoch.
"""

from __future__ import annotations

import io
import itertools
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import lz4.frame
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import snappy
import zstandard
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c, decode_varint
from numpy.lib.stride_tricks import sliding_window_view

from deltabus import errors
from deltabus.log_tables.control_records import control_mask
from deltabus.log_tables.transactions import AbortedTxn, aborted_mask
from deltabus.records import (
    LOG_APPEND_TIME,
    ProducerState,
    UnpackBudget,
    check_header_count,
    check_record_count,
    normalize_produce,
    produce_batch,
)

FETCH_BATCH_RECORDS_MAX = 4096  # records per batch a fetch answers with
_CRC = struct.Struct(">I")
_LEADER_EPOCH_AT = 12  # int32, outside the CRC
_ATTRIBUTES_AT = DefaultRecordBatch.ATTRIBUTES_OFFSET  # the CRC covers from here to the end
_CRC_AT = DefaultRecordBatch.CRC_OFFSET
_MAGIC_AT = 16
_RECORDS_AT = 61  # the records section follows the batch header


@dataclass(frozen=True)
class ProducedBatch:
    """One record batch of a produce request, as the log takes it."""

    records: pa.Table  # PRODUCE_SCHEMA
    producer: ProducerState
    transactional: bool
    size_bytes: int  # on the wire, compressed or not: what max.message.bytes limits in Kafka


def decode_produce(data: bytes, budget: UnpackBudget | None = None) -> list[ProducedBatch]:
    """The record batches of one partition's produce data. Raises CorruptMessageError for a bad
    CRC or truncated batch, InvalidRecordError for what the log cannot take (old message
    formats, control batches, empty batches, too many headers), RecordListTooLargeError for a
    batch declaring too many records or unpacking past `budget` (the request's, shared by its
    partitions). Each limit is checked before what it bounds is allocated."""
    budget = budget or UnpackBudget()
    out, pos, view = [], 0, memoryview(data)
    while pos < len(view):
        size = _batch_size(view, pos)
        raw = bytes(view[pos:pos + size])
        pos += size
        batch = DefaultRecordBatch(raw)
        if not batch.validate_crc():
            raise errors.CorruptMessageError("a record batch failed its CRC-32C check")
        if batch.is_control_batch:
            raise errors.InvalidRecordError("producers may not send control batches")
        if batch.records_count <= 0:
            raise errors.InvalidRecordError("a record batch must hold at least one record")
        check_record_count(batch.records_count)
        records = _unpack(batch.compression_type, raw[_RECORDS_AT:], budget)
        table = _read_columns(records, batch)
        if table is None:  # a record has headers: read record by record
            keys, values, timestamps, headers = _read_records(records, batch)
            table = produce_batch(values, keys=keys, timestamps_ms=timestamps, headers=headers)
        table = normalize_produce(table)
        producer = (ProducerState(batch.producer_id, batch.producer_epoch, batch.base_sequence,
                                  batch.is_transactional)
                    if batch.producer_id >= 0 else ProducerState())
        out.append(ProducedBatch(table, producer, batch.is_transactional, size))
    if not out:
        raise errors.InvalidRecordError("the produce data holds no record batch")
    return out


def _batch_size(view: memoryview, pos: int) -> int:
    """The size of the record batch at `pos` (its length field and the 12 bytes before it)."""
    if len(view) - pos < _RECORDS_AT:
        raise errors.CorruptMessageError("a record batch is truncated")
    if view[pos + _MAGIC_AT] != 2:
        raise errors.UnsupportedForMessageFormatError(
            "only record batches of magic v2 are accepted (Kafka 0.11 and later clients)")
    size = int.from_bytes(view[pos + 8:pos + 12], "big", signed=True) + 12
    if size < _RECORDS_AT or pos + size > len(view):
        raise errors.CorruptMessageError("a record batch is truncated")
    return size


def _unpack(codec: int, data: bytes, budget: UnpackBudget) -> bytes:
    """A batch's records section uncompressed, never more than `budget` allows: each codec
    stops one byte past what is left of it, so a bomb is refused without being unpacked.
    Kafka itself unpacks a batch as a stream and keeps none of it; deltabus stores records
    uncompressed, so what a batch unpacks to is what its log takes."""
    if codec == _NONE:
        return data
    unpacker = _UNPACKERS.get(codec)
    if unpacker is None:
        raise errors.CorruptMessageError(f"unknown compression codec {codec}")
    limit = budget.remaining_bytes
    try:
        out = unpacker(data, limit)
    except _OverLimit:
        budget.take(limit + 1)  # refused: RECORD_LIST_TOO_LARGE naming the limit
        raise
    except (OSError, ValueError, EOFError, RuntimeError, zlib.error, zstandard.ZstdError,
            snappy.UncompressError) as e:
        raise errors.CorruptMessageError(f"a record batch cannot be unpacked: {e}") from None
    budget.take(len(out))
    return out


class _OverLimit(Exception):
    """A compressed block declares more than the budget allows (found before unpacking it)."""


def _gunzip(data: bytes, limit: int) -> bytes:
    out = bytearray()
    while data and len(out) <= limit:
        stream = zlib.decompressobj(wbits=31)
        out += stream.decompress(data, limit + 1 - len(out))
        if len(out) > limit:
            break
        if not stream.eof:
            raise ValueError("truncated gzip stream")
        data = stream.unused_data
    return bytes(out)


def _unsnappy(data: bytes, limit: int) -> bytes:
    """Raw snappy, or xerial's framing of snappy blocks (Kafka's Java clients); each block
    declares its unpacked length first, which is checked before it is unpacked."""
    if not data.startswith(_XERIAL_MAGIC):
        return _unsnappy_block(data, limit)
    out, pos = bytearray(), len(_XERIAL_MAGIC) + 8  # magic, version, compatible version
    while pos < len(data) and len(out) <= limit:
        size = int.from_bytes(data[pos:pos + 4], "big")
        out += _unsnappy_block(data[pos + 4:pos + 4 + size], limit - len(out))
        pos += 4 + size
    return bytes(out)


def _unsnappy_block(block: bytes, limit: int) -> bytes:
    declared, shift = 0, 0
    for byte in block[:5]:  # the unpacked length, an unsigned varint
        declared |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    else:
        raise ValueError("a snappy block without its length")
    if declared > limit:
        raise _OverLimit
    return bytes(snappy.decompress(block))


def _unlz4(data: bytes, limit: int) -> bytes:
    stream = lz4.frame.LZ4FrameDecompressor()
    out = stream.decompress(data, max_length=limit + 1)
    if len(out) <= limit and not stream.eof:
        raise ValueError("truncated lz4 frame")
    return bytes(out)


def _unzstd(data: bytes, limit: int) -> bytes:
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data),
                                                     read_across_frames=True) as reader:
        return bytes(reader.read(limit + 1))


_NONE = 0
_UNPACKERS: dict[int, Callable[[bytes, int], bytes]] = {
    1: _gunzip, 2: _unsnappy, 3: _unlz4, 4: _unzstd}
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _read_columns(buffer: bytes, batch: DefaultRecordBatch) -> pa.Table | None:
    """A batch's records as columns (value, key, timestamp), read with numpy rather than record
    by record (the slow part of a Kafka produce); None when a record has headers, which
    `_read_records` reads. Only where each record starts is found record by record: the rest
    is a few array operations per field, for all records at once. Raises CorruptMessageError
    where `_read_records` would."""
    count = batch.records_count
    # varints, and the windows binary views are cut from, end within the pad
    buf = np.frombuffer(buffer + bytes(_PAD_BYTES), np.uint8)
    try:
        starts = _record_starts(buffer, buf, count)
        at = starts[:-1]
        length, size = _varints_at(buf, at)
        end = at + size + length
        at = at + size
        at = at + _varints_at(buf, at)[1]  # attributes: unused
        delta, size = _varints_at(buf, at)
        at = at + size
        at = at + _varints_at(buf, at)[1]  # offset delta: the log assigns offsets
        key_length, size = _varints_at(buf, at)
        key_at = at + size
        at = key_at + np.maximum(key_length, 0)
        value_length, size = _varints_at(buf, at)
        value_at = at + size
        at = value_at + np.maximum(value_length, 0)
        header_count, size = _varints_at(buf, at)
        if header_count.any():
            return None
        if not np.array_equal(at + size, end) or starts[-1] != len(buffer):
            raise ValueError("a record's length does not match its fields")
    except (ValueError, IndexError) as e:
        raise errors.CorruptMessageError(f"a record batch cannot be read: {e}") from None
    return pa.table({"value": _binary_at(buf, value_at, value_length),
                     "key": _binary_at(buf, key_at, key_length),
                     "timestamp": pa.array(batch.first_timestamp + delta, _TIMESTAMP)})


_TIMESTAMP = pa.timestamp("ms", "UTC")
_VARINT_BYTES_MAX = 10
_PAD_BYTES = 16


def _record_starts(buffer: bytes, buf: np.ndarray, count: int) -> np.ndarray:
    """Where each of `count` records starts, and where the last ends: the one sequential pass,
    over each record's length varint alone, which leaps over a run of records as long as the
    one before (`_same_run`: a producer of fixed-size records sends runs hundreds long).
    IndexError past the end, ValueError for a negative length or an overlong varint."""
    starts = [0] * (count + 1)
    pos = last = same = 0
    leap_after = _LEAP_AFTER
    records = iter(range(count))
    for i in records:
        starts[i] = start = pos
        raw = buffer[pos]
        if raw < 0x80:  # the usual lengths, up to 63 and 8,191 bytes, take one or two bytes
            pos += 1
        elif buffer[pos + 1] < 0x80:
            raw = (raw & 0x7F) | buffer[pos + 1] << 7
            pos += 2
        else:
            raw, pos = _decode_varint_raw(buffer, pos)
        if raw & 1:
            raise ValueError(f"a record declares a length of {(raw >> 1) ^ -1}")
        pos += raw >> 1
        if pos - start != last:
            last, same = pos - start, 0
        elif (same := same + 1) == leap_after:
            head = last - (raw >> 1)
            room = len(buffer) - head - pos  # the varints compared stay in the buffer
            run = _same_run(buf, pos, head, last, min(count - i - 1, room // last + 1))
            starts[i + 1:i + 1 + run] = range(pos, pos + run * last, last)
            pos, same = pos + run * last, 0
            if run:
                next(itertools.islice(records, run - 1, None), None)  # leap over them
            if run < leap_after:  # runs are short here: leaping costs more than it saves
                leap_after *= 2
    starts[count] = pos
    return np.array(starts, np.int64)


_LEAP_AFTER = 8  # records as long as the one before them, read one by one, before a leap


def _same_run(buf: np.ndarray, pos: int, head: int, stride: int, most: int) -> int:
    """How many records from `pos` on, `stride` bytes apart, begin with the same `head` bytes
    (their length varint) as the one just before `pos`: each of those is `stride` bytes long
    too, so the next one starts where the sequential pass would find it. Looks ahead in
    windows growing fourfold, so a short run costs little more than a long one's start;
    `most` bounds it (the records left, and the bytes: a varint read stays in the buffer)."""
    first = buf[pos - stride:pos - stride + head].tolist()
    done, window = 0, 64
    while done < most:
        take = min(window, most - done)
        at = np.arange(pos + done * stride, pos + (done + take) * stride, stride)
        same = buf[at] == first[0]
        for k in range(1, head):
            same &= buf[at + k] == first[k]
        if not same.all():
            return done + int(np.argmin(same))
        done, window = done + take, window * 4
    return done


def _decode_varint_raw(buffer: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint (not yet unzigzagged) at `pos`, and the position after it."""
    shift = raw = 0
    while True:
        byte = buffer[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return raw, pos
        shift += 7
        if shift >= 7 * _VARINT_BYTES_MAX:
            raise ValueError("a varint is longer than 10 bytes")


def _varints_at(buf: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varints starting at each position `at` of `buf` (int64), and their sizes.
    `buf` ends in _VARINT_BYTES_MAX zero bytes, so every varint read ends within it."""
    first = buf[at]
    if not (first & 0x80).any():  # one byte each, as most fields of small records are
        small = first.astype(np.int64)
        return (small >> 1) ^ -(small & 1), np.ones(len(at), np.int64)
    raw = np.zeros(len(at), np.uint64)
    size = np.zeros(len(at), np.int64)
    going = np.ones(len(at), bool)
    for k in range(_VARINT_BYTES_MAX):
        byte = buf[at + k]
        raw |= np.where(going, (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k), 0).astype(
            np.uint64)
        size += going
        going &= byte >= 0x80
        if not going.any():
            break
    else:
        raise ValueError("a varint is longer than 10 bytes")
    signed = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
    return signed, size


def _binary_at(buf: np.ndarray, at: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary column of the byte strings at `at` of `lengths` (negative: null). Built as
    Arrow's binary view over `buf` (a 16-byte view a string: its length, then up to 12 bytes
    inline, else a 4-byte prefix, buffer 0 and where the bytes are), which Arrow's cast
    gathers into a binary column in one native pass."""
    n = len(at)
    valid = lengths >= 0
    nulls = n - int(np.count_nonzero(valid))
    if nulls == n:  # no record has one (keys, usually)
        return pa.nulls(n, pa.binary())
    sizes = np.where(valid, lengths, 0)
    if sizes.sum() > _INT32_MAX:
        raise ValueError("a record batch holds more than 2 GiB of keys or values")
    views = np.zeros((n, 4), "<i4")
    views[:, 0] = sizes
    short = sizes <= _INLINE_BYTES_MAX
    if short.any():
        rows = _rows(short)
        window = sliding_window_view(buf, _INLINE_BYTES_MAX)[at[rows]]
        views.view(np.uint8)[rows, 4:] = np.where(
            np.arange(_INLINE_BYTES_MAX) < sizes[rows, None], window, 0)
    if not short.all():
        rows = _rows(~short)
        views[rows, 1] = sliding_window_view(buf, 4)[at[rows]].view("<i4")[:, 0]  # the prefix
        views[rows, 3] = at[rows]
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    viewed = pa.Array.from_buffers(pa.binary_view(), n, [
        validity, pa.py_buffer(views), pa.py_buffer(buf)], nulls)
    return viewed.cast(pa.binary())


def _rows(mask: np.ndarray) -> slice | np.ndarray:
    """The rows `mask` selects, as a slice where it selects all (no gather needed)."""
    return slice(None) if mask.all() else np.flatnonzero(mask)


_INLINE_BYTES_MAX = 12  # what a binary view holds inline
_INT32_MAX = 2**31 - 1


def _read_records(buffer: bytes, batch: DefaultRecordBatch) -> tuple[list, list, list, list]:
    """Keys, values, timestamps and headers of a batch's records (Kafka's DefaultRecord layout),
    refusing a record of more headers than RECORD_HEADERS_MAX before reading them."""
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    timestamps: list[int] = []
    headers: list[list[tuple[str, bytes | None]] | None] = []
    pos = 0
    try:
        for _ in range(batch.records_count):
            length, pos = decode_varint(buffer, pos)
            end = pos + length
            _, pos = decode_varint(buffer, pos)  # attributes: unused
            delta, pos = decode_varint(buffer, pos)
            _, pos = decode_varint(buffer, pos)  # offset delta: the log assigns offsets
            timestamps.append(batch.first_timestamp + delta)
            key, pos = _read_bytes(buffer, pos)
            value, pos = _read_bytes(buffer, pos)
            keys.append(key)
            values.append(value)
            count, pos = decode_varint(buffer, pos)
            if count < 0:
                raise ValueError(f"a record declares {count} headers")
            check_header_count(count)
            record_headers = []
            for _ in range(count):
                name, pos = _read_bytes(buffer, pos)
                if name is None:
                    raise ValueError("a header key is null")
                header_value, pos = _read_bytes(buffer, pos)
                record_headers.append((name.decode(), header_value))
            headers.append(record_headers or None)
            if pos != end:
                raise ValueError("a record's length does not match its fields")
    except (ValueError, IndexError) as e:  # UnicodeDecodeError is a ValueError
        raise errors.CorruptMessageError(f"a record batch cannot be read: {e}") from None
    if pos != len(buffer):
        raise errors.CorruptMessageError("a record batch holds more than its records")
    return keys, values, timestamps, headers


def _read_bytes(buffer: bytes, pos: int) -> tuple[bytes | None, int]:
    length, pos = decode_varint(buffer, pos)
    if length < 0:
        return None, pos
    if pos + length > len(buffer):
        raise ValueError("a record is truncated")
    return buffer[pos:pos + length], pos + length


def encode_fetch(log_rows: pa.Table, aborted: Sequence[AbortedTxn] = ()) -> bytes:
    """Log rows (LOG_SCHEMA, in offset order) as uncompressed record batches. Markers go as
    control batches of one record each; the records of the `aborted` transactions (those a
    read_committed fetch is told of) in transactional batches of their producer, which the
    client then drops. No batch mixes a marker or an aborted transaction with other rows."""
    control = control_mask(log_rows).to_numpy(zero_copy_only=False)
    in_aborted = aborted_mask(log_rows, aborted) & ~control
    parts = []
    for start, length in _batch_slices(log_rows, control, in_aborted):
        rows = log_rows.slice(start, length)
        if control[start]:
            parts.append(_encode_columnar(rows.set_column(
                rows.schema.get_field_index("headers"), "headers",
                pa.nulls(rows.num_rows, rows.schema.field("headers").type)),
                _CONTROL_ATTRIBUTES, _producer_of(rows, base_sequence=-1)))
            continue
        producer = _producer_of(rows) if in_aborted[start] else _NO_PRODUCER
        extra = _TRANSACTIONAL if in_aborted[start] else 0
        headers = rows.column("headers")
        if headers.null_count == rows.num_rows or not pc.any(
                pc.greater(pc.list_value_length(headers), 0)).as_py():
            parts.append(_encode_columnar(rows, extra, producer))
        else:
            parts.append(_encode_batch(rows, producer))
    return b"".join(parts)


_TRANSACTIONAL = 0x10  # attribute bits of a record batch
_CONTROL_ATTRIBUTES = 0x30  # a control batch is transactional too
_NO_PRODUCER = (-1, -1, -1)


def _producer_of(rows: pa.Table, base_sequence: int | None = None) -> tuple[int, int, int]:
    """(producer id, epoch, base sequence) of a batch of one producer's rows."""
    return (rows.column("producer_id")[0].as_py(), rows.column("producer_epoch")[0].as_py(),
            rows.column("sequence")[0].as_py() if base_sequence is None else base_sequence)




CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}  # compression.type -> batch attribute
_PACKERS: dict[int, Callable[[bytes], bytes]] = {
    1: kafka_codec.gzip_encode, 2: kafka_codec.snappy_encode, 3: kafka_codec.lz4_encode,
    4: kafka_codec.zstd_encode,
}


def compress_batches(data: bytes, codec: int) -> bytes:
    """Uncompressed record batches (as encode_fetch makes them) with each batch's records
    compressed by `codec` (1-4, Kafka's attribute bits), as a topic's compression.type asks.
    A batch that would not shrink stays as it is, so an answer never grows past the byte
    limits it was cut to."""
    pack = _PACKERS[codec]
    out, pos, view = [], 0, memoryview(data)
    while pos < len(view):
        size = _batch_size(view, pos)
        batch = view[pos:pos + size]
        pos += size
        if struct.unpack_from(">h", batch, _ATTRIBUTES_AT)[0] & 0x20:  # a marker goes as is
            out.append(bytes(batch))
            continue
        packed = pack(bytes(batch[_RECORDS_AT:]))
        if len(packed) >= size - _RECORDS_AT:
            out.append(bytes(batch))
            continue
        buffer = bytearray(batch[:_RECORDS_AT])
        buffer += packed
        struct.pack_into(">i", buffer, 8, len(buffer) - 12)
        attributes = struct.unpack_from(">h", buffer, _ATTRIBUTES_AT)[0]
        struct.pack_into(">h", buffer, _ATTRIBUTES_AT, attributes | codec)
        _CRC.pack_into(buffer, _CRC_AT, calc_crc32c(memoryview(buffer)[_ATTRIBUTES_AT:]))
        out.append(bytes(buffer))
    return b"".join(out)


def _batch_slices(log_rows: pa.Table, control: np.ndarray,
                  in_aborted: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each batch: at most FETCH_BATCH_RECORDS_MAX records of one timestamp
    type; with LogAppendTime, of one timestamp too (a client gives every record of such a batch
    the batch's max timestamp, as the broker set one time per append); a marker alone; an
    aborted transaction's rows apart from others."""
    kinds = log_rows.column("timestamp_type").to_numpy()
    stamps = pc.cast(log_rows.column("timestamp"), pa.int64()).to_numpy()
    cut = kinds[1:] != kinds[:-1]
    cut |= (kinds[1:] == LOG_APPEND_TIME) & (stamps[1:] != stamps[:-1])
    cut |= control[1:] | control[:-1] | (in_aborted[1:] != in_aborted[:-1])
    if in_aborted.any():
        pids = log_rows.column("producer_id").to_numpy()
        cut |= in_aborted[1:] & (pids[1:] != pids[:-1])
    bounds = [0, *(np.nonzero(cut)[0] + 1).tolist(), log_rows.num_rows]
    return [(s, min(FETCH_BATCH_RECORDS_MAX, end - s))
            for lo, end in zip(bounds, bounds[1:], strict=False)
            for s in range(lo, end, FETCH_BATCH_RECORDS_MAX)]


_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")  # v2 record batch header: 61 bytes


def _zigzag_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kafka's zigzag varints of int64 `values`: (bytes as an (n, 10) matrix, lengths)."""
    rest = ((values << 1) ^ (values >> 63)).astype(np.uint64)
    groups = np.empty((len(values), 10), np.uint8)
    lengths = np.ones(len(values), np.int64)
    for i in range(10):
        groups[:, i] = (rest & np.uint64(0x7F)).astype(np.uint8)
        rest >>= np.uint64(7)
        more = rest > 0
        groups[more, i] |= 0x80
        lengths += more
    return groups, lengths


def _binary(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, lengths with -1 for null, data bytes) of a binary column."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(array)
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], np.int32)[array.offset:array.offset + n + 1]
    data = (np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None
            else np.empty(0, np.uint8))
    lengths = np.diff(offsets).astype(np.int64)
    if array.null_count:
        lengths[array.is_null().to_numpy(zero_copy_only=False)] = -1
    return offsets[:-1].astype(np.int64), lengths, data


def _encode_columnar(rows: pa.Table, attributes_extra: int = 0,
                     producer: tuple[int, int, int] = _NO_PRODUCER) -> bytes:
    """One uncompressed batch of records without headers, built column-wise with numpy (the
    per-record builder is the slow part of a Kafka fetch)."""
    n = rows.num_rows
    offsets = rows.column("offset").to_numpy()
    timestamps = pc.cast(pc.cast(rows.column("timestamp"), pa.timestamp("ms", tz="UTC")),
                         pa.int64()).to_numpy()
    base_offset, first_ts = int(offsets[0]), int(timestamps[0])
    key_starts, key_lengths, key_data = _binary(rows.column("key"))
    value_starts, value_lengths, value_data = _binary(rows.column("value"))
    fields = [_zigzag_varints(timestamps - first_ts), _zigzag_varints(offsets - base_offset),
              _zigzag_varints(key_lengths)]
    value_length_varints = _zigzag_varints(value_lengths)
    key_bytes, value_bytes = np.maximum(key_lengths, 0), np.maximum(value_lengths, 0)
    # body: attributes(1) ts off keylen key valuelen value headers-count(1)
    body = (2 + fields[0][1] + fields[1][1] + fields[2][1] + key_bytes
            + value_length_varints[1] + value_bytes)
    length_varints = _zigzag_varints(body)
    sizes = length_varints[1] + body
    starts = _BATCH_HEADER.size + np.concatenate(([0], np.cumsum(sizes)[:-1]))
    out = np.zeros(_BATCH_HEADER.size + int(sizes.sum()), np.uint8)

    def put_varints(varints: tuple[np.ndarray, np.ndarray], at: np.ndarray) -> None:
        groups, lengths = varints
        rows_i, cols = np.nonzero(np.arange(10) < lengths[:, None])
        out[at[rows_i] + cols] = groups[rows_i, cols]

    def put_bytes(data: np.ndarray, first: np.ndarray, count: np.ndarray,
                  at: np.ndarray) -> None:
        total = int(count.sum())
        if total == 0:
            return
        record = np.repeat(np.arange(n), count)
        within = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
        out[at[record] + within] = data[first[record] + within]

    at = starts.copy()
    put_varints(length_varints, at)
    at += length_varints[1] + 1  # the attributes byte stays 0
    for varints in fields:
        put_varints(varints, at)
        at = at + varints[1]
    put_bytes(key_data, key_starts, key_bytes, at)
    at = at + key_bytes
    put_varints(value_length_varints, at)
    at = at + value_length_varints[1]
    put_bytes(value_data, value_starts, value_bytes, at)  # then a 0: no headers
    attributes = attributes_extra | (DefaultRecordBatch.TIMESTAMP_TYPE_MASK if rows.column(
        "timestamp_type")[0].as_py() == LOG_APPEND_TIME else 0)
    buffer = bytearray(out.tobytes())
    _BATCH_HEADER.pack_into(buffer, 0, base_offset, len(buffer) - 12,
                            rows.column("leader_epoch")[-1].as_py(), 2, 0, attributes,
                            int(offsets[-1]) - base_offset, first_ts, int(timestamps.max()),
                            *producer, n)
    _CRC.pack_into(buffer, _CRC_AT, calc_crc32c(memoryview(buffer)[_ATTRIBUTES_AT:]))
    return bytes(buffer)


def _encode_batch(rows: pa.Table, producer: tuple[int, int, int] = _NO_PRODUCER) -> bytes:
    offsets = rows.column("offset").to_pylist()
    base = offsets[0]
    timestamps = pc.cast(pc.cast(rows.column("timestamp"), pa.timestamp("ms", tz="UTC")),
                         pa.int64()).to_pylist()
    keys = rows.column("key").to_pylist()
    values = rows.column("value").to_pylist()
    headers = rows.column("headers").to_pylist()
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0,
                                        is_transactional=producer != _NO_PRODUCER,
                                        producer_id=producer[0], producer_epoch=producer[1],
                                        base_sequence=producer[2], batch_size=2**31 - 1)
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
