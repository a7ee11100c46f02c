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
from crc32c import crc32c
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.util import decode_varint, encode_varint
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
COLUMN_READ_RECORDS_MIN = 64  # produced batches of fewer records are read record by record
_CRC = struct.Struct(">I")
_LEADER_EPOCH_AT = 12  # int32, outside the CRC
_ATTRIBUTES_AT = DefaultRecordBatch.ATTRIBUTES_OFFSET  # the CRC covers from here to the end
_CRC_AT = DefaultRecordBatch.CRC_OFFSET
_MAGIC_AT = 16
_TRANSACTIONAL_BIT = 0x10  # in the attributes' low byte
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
        # Column-wise reading costs ~0.2 ms a batch before its first record: a batch of a few
        # records (a producer at linger.ms=0 sends one a request) is read faster one by one.
        table = (_read_columns(records, batch)
                 if batch.records_count >= COLUMN_READ_RECORDS_MIN else None)
        if table is None:  # few records, or a record has headers: read record by record
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


def transactional(data: bytes) -> bool:
    """Whether any record batch of a partition's produce data is a transaction's (attribute
    bit 4), read from the batch headers alone: Kafka checks WRITE on the transactional id of
    a request carrying such batches before it decodes any. Batches too short to have the bit
    count as not (decoding them refuses them)."""
    view, pos = memoryview(data), 0
    while len(view) - pos >= _RECORDS_AT:
        if view[pos + _ATTRIBUTES_AT + 1] & _TRANSACTIONAL_BIT:
            return True
        size = int.from_bytes(view[pos + 8:pos + 12], "big", signed=True) + 12
        if size < _RECORDS_AT:
            return False
        pos += size
    return False


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
    """`encode_fetch_sized`'s record batches."""
    return encode_fetch_sized(log_rows, aborted).data


@dataclass(frozen=True)
class EncodedFetch:
    """Record batches (`data`), and what cuts them to a prefix of their records without
    encoding again: a prefix is the same batches, the last one cut short with its header
    rewritten, so its size is known beforehand (`prefix_sizes`) and making it copies one batch."""

    data: bytes
    prefix_sizes: np.ndarray  # the encoded size of the first 1, 2, ... records
    batch_starts: np.ndarray  # each batch's first record
    offsets: np.ndarray
    timestamps_ms: np.ndarray
    leader_epochs: np.ndarray

    def prefix(self, count: int) -> bytes:
        """The first `count` records, exactly as `encode_fetch` of them encodes them."""
        if count >= len(self.prefix_sizes):
            return self.data
        if count <= 0:
            return b""
        last = count - 1
        first = int(self.batch_starts[np.searchsorted(self.batch_starts, last, "right") - 1])
        at = int(self.prefix_sizes[first - 1]) if first else 0
        batch = bytearray(self.data[at:int(self.prefix_sizes[last])])
        header = list(_BATCH_HEADER.unpack_from(batch))
        header[1] = len(batch) - 12  # the batch's length
        header[2] = int(self.leader_epochs[last])
        header[6] = int(self.offsets[last] - self.offsets[first])  # last offset delta
        header[8] = int(self.timestamps_ms[first:count].max())
        header[12] = count - first  # records
        _BATCH_HEADER.pack_into(batch, 0, *header)
        _CRC.pack_into(batch, _CRC_AT, crc32c(memoryview(batch)[_ATTRIBUTES_AT:]))
        return self.data[:at] + bytes(batch)


def encode_fetch_sized(log_rows: pa.Table,
                       aborted: Sequence[AbortedTxn] = ()) -> EncodedFetch:
    """Log rows (LOG_SCHEMA, in offset order) as uncompressed record batches. Markers go as
    control batches of one record each; the records of the `aborted` transactions (those a
    read_committed fetch is told of) in transactional batches of their producer, which the
    client then drops. No batch mixes a marker or an aborted transaction with other rows.

    Every fetch answer is encoded here, so this is built column-wise for all its batches at
    once: each field of every record is a column of bytes (varints by numpy; keys, values and
    headers as stored) that Arrow joins row by row into the records; Python only writes each
    batch's 61-byte header. A door reads a little more than a partition's byte limit and cuts
    the encoding to the longest prefix that fits (`EncodedFetch.prefix`)."""
    if log_rows.num_rows == 0:
        empty = np.zeros(0, np.int64)
        return EncodedFetch(b"", empty, empty, empty, empty, empty)
    log_rows = log_rows.combine_chunks()
    control = control_mask(log_rows).to_numpy(zero_copy_only=False)
    in_aborted = aborted_mask(log_rows, aborted) & ~control
    slices = _batch_slices(log_rows, control, in_aborted)
    starts = np.array([start for start, _ in slices], np.int64)
    counts = np.array([count for _, count in slices], np.int64)
    first_of = np.repeat(starts, counts)  # each row's batch's first row
    offsets = log_rows.column("offset").to_numpy()
    timestamps = _micros(log_rows) // 1000  # Kafka's are in ms
    records, ends = _records(log_rows, control, offsets - offsets[first_of],
                             timestamps - timestamps[first_of])
    max_timestamps = np.maximum.reduceat(timestamps, starts)
    append_time = log_rows.column("timestamp_type").to_numpy() == LOG_APPEND_TIME
    epochs = log_rows.column("leader_epoch").to_numpy()
    parts: list[bytes | bytearray | memoryview] = []
    for i, (start, count) in enumerate(slices):
        last = start + count - 1
        attributes = DefaultRecordBatch.TIMESTAMP_TYPE_MASK if append_time[start] else 0
        producer = _NO_PRODUCER
        if control[start]:
            attributes |= _CONTROL_ATTRIBUTES
            producer = _producer_of(log_rows, start, base_sequence=-1)
        elif in_aborted[start]:
            attributes |= _TRANSACTIONAL
            producer = _producer_of(log_rows, start)
        data = records[ends[start - 1] if start else 0:ends[last]]
        header = bytearray(_BATCH_HEADER.size)
        _BATCH_HEADER.pack_into(header, 0, int(offsets[start]),
                                _BATCH_HEADER.size - 12 + len(data), int(epochs[last]), 2, 0,
                                attributes, int(offsets[last] - offsets[start]),
                                int(timestamps[start]), int(max_timestamps[i]), *producer,
                                count)
        _CRC.pack_into(header, _CRC_AT,
                       crc32c(data, crc32c(memoryview(header)[_ATTRIBUTES_AT:])))
        parts += (header, data)
    prefix_sizes = ends + _BATCH_HEADER.size * np.repeat(np.arange(1, len(slices) + 1), counts)
    return EncodedFetch(b"".join(parts), prefix_sizes, starts, offsets, timestamps, epochs)


_TRANSACTIONAL = 0x10  # attribute bits of a record batch
_CONTROL_ATTRIBUTES = 0x30  # a control batch is transactional too
_NO_PRODUCER = (-1, -1, -1)


def _producer_of(rows: pa.Table, row: int,
                 base_sequence: int | None = None) -> tuple[int, int, int]:
    """(producer id, epoch, base sequence) of the batch of one producer's rows from `row`."""
    return (rows.column("producer_id")[row].as_py(), rows.column("producer_epoch")[row].as_py(),
            rows.column("sequence")[row].as_py() if base_sequence is None else base_sequence)


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
        _CRC.pack_into(buffer, _CRC_AT, crc32c(memoryview(buffer)[_ATTRIBUTES_AT:]))
        out.append(bytes(buffer))
    return b"".join(out)


def _batch_slices(log_rows: pa.Table, control: np.ndarray,
                  in_aborted: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each batch: at most FETCH_BATCH_RECORDS_MAX records of one timestamp
    type; with LogAppendTime, of one timestamp too (a client gives every record of such a batch
    the batch's max timestamp, as the broker set one time per append); a marker alone; an
    aborted transaction's rows apart from others."""
    kinds = log_rows.column("timestamp_type").to_numpy()
    stamps = _micros(log_rows)
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


def _micros(log_rows: pa.Table) -> np.ndarray:
    """The rows' timestamps in µs since the epoch (the column's unit), without a copy."""
    return log_rows.column("timestamp").combine_chunks().to_numpy().view(np.int64)

# A field of every record: one value each (an Arrow array), or the same for all (a scalar),
# with its byte lengths (an array, or one int).
_Field = tuple[pa.Array | pa.Scalar, np.ndarray | int]


def _records(rows: pa.Table, control: np.ndarray, offset_deltas: np.ndarray,
             timestamp_deltas: np.ndarray) -> tuple[memoryview, np.ndarray]:
    """Every row as a v2 record (length, attributes, timestamp and offset deltas, key, value,
    headers), back to back, and where each record ends. Markers carry no headers."""
    fields = [_varints(timestamp_deltas), _varints(offset_deltas)]
    for name in ("key", "value"):
        data, lengths = _nullable_binary(rows.column(name).combine_chunks())
        fields += (_varints(lengths), (data, np.maximum(lengths, 0)))
    fields += _headers(rows.column("headers"), control)
    body = 1 + sum(lengths for _, lengths in fields)  # 1: the attributes byte, always 0
    length = _varints(np.broadcast_to(body, (rows.num_rows,)).astype(np.int64))
    joined = pc.binary_join_element_wise(length[0], _NO_ATTRIBUTES,
                                         *(data for data, _ in fields), _NOTHING)
    ends = np.cumsum(np.broadcast_to(length[1] + body, (rows.num_rows,)))
    if isinstance(joined, pa.Scalar):  # every record the same: each field was a scalar
        return memoryview(joined.as_py() * rows.num_rows), ends
    offsets = np.frombuffer(joined.buffers()[1], np.int32, 1, joined.offset * 4)
    return memoryview(joined.buffers()[2])[int(offsets[0]):], ends


_NO_ATTRIBUTES = pa.scalar(b"\x00")
_NOTHING = pa.scalar(b"")


def _varints(values: np.ndarray) -> _Field:
    """Kafka's zigzag varints of int64 `values`: a scalar when they are all the same (a batch's
    value lengths often are), else a binary array."""
    if len(values) and (values == values[0]).all():
        encoded = bytearray()
        length = encode_varint(int(values[0]), encoded.append)
        return pa.scalar(bytes(encoded)), length
    rest = ((values << 1) ^ (values >> 63)).astype(np.uint64)
    width = max(1, (int(rest.max(initial=0)).bit_length() + 6) // 7)
    groups = np.empty((len(values), width), np.uint8)
    lengths = np.ones(len(values), np.int32)
    for i in range(width):
        low = (rest & np.uint64(0x7F)).astype(np.uint8)
        rest >>= np.uint64(7)
        more = rest > 0
        groups[:, i] = low | (more.view(np.uint8) << 7)
        lengths += more
    data = groups[np.arange(width) < lengths[:, None]]
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(values),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)]), lengths


def _nullable_binary(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A binary column with nulls as empty values, and its lengths with -1 for null (Kafka's
    length of a null key or value)."""
    lengths = pc.fill_null(pc.binary_length(column), -1).to_numpy().astype(np.int64)
    return pc.fill_null(column, b""), lengths


def _headers(column: pa.ChunkedArray | pa.Array, control: np.ndarray) -> list[_Field]:
    """The header count and the headers of each record (count, then for each header its
    key's length and key, its value's length and value), as two fields."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if control.any():
        column = pc.if_else(pa.array(control), pa.nulls(len(column), column.type), column)
    counts = pc.fill_null(pc.list_value_length(column), 0).to_numpy().astype(np.int64)
    if not counts.any():
        return [_varints(counts)]
    header_keys, header_values = pc.list_flatten(column).flatten()  # null headers: key ""
    keys, key_lengths = _nullable_binary(pc.cast(header_keys, pa.binary()))
    values, value_lengths = _nullable_binary(header_values)
    each = pc.binary_join_element_wise(_varints(key_lengths)[0], keys,
                                       _varints(value_lengths)[0], values, _NOTHING)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), each), _NOTHING)
    return [_varints(counts),
            (joined, pc.binary_length(joined).to_numpy().astype(np.int64))]
