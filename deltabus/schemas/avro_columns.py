"""Avro binary decoded a column at a time: a batch of records (each Avro binary, without
Confluent's header) becomes Arrow arrays with numpy doing the per-record work.

Why: a typed topic's leader decodes every produced record; one fastavro call and one Python
dict per record capped typed produce at a fifth of untyped. Here each field of the schema is
read for all records at once: every record has a cursor (`_Cursors.pos`, one int64 each), a
field's step reads its bytes at every cursor with numpy gathers and moves every cursor on.

Pure (numpy and pyarrow, no I/O); runs anywhere, stateless and thread-safe. The steps are
built once per schema by `deltabus.schemas.avro` (which owns the schema tree) and cached there.

What must hold, and why:
- A batch this module accepts decodes to exactly the table the record-by-record path (fastavro,
  then pyarrow) builds: the same types, values and nulls. It accepts only bytes that path reads
  without error and whose values fit their columns. Anything else (truncation, bytes left
  over, a bad union or enum index, invalid UTF-8, an out-of-range value, a varint over 64
  bits) raises `Undecodable`, and the caller decodes record by record, which gives the exact
  value or the exact error naming the record.
- Nothing reads outside the batch's buffer, and no value is taken from past its record's end:
  a fixed-size value or a declared length is checked against what is left of its record
  before the gather (so a huge length allocates nothing); a varint is read 8 bytes at a time
  (the buffer ends with 8 zero bytes of padding) and refused where it ends past its record.
- The records a step reads are in ascending order (subsets come from np.flatnonzero), so the
  values a step gathers lie in ascending, non-overlapping ranges of the buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

Int64s = npt.NDArray[np.int64]

# Value ranges the record-by-record path accepts: Python's int32 columns, date.fromordinal and
# datetime (years 1 to 9999).
INT_RANGE = (-(2**31), 2**31 - 1)
DATE_RANGE = (-719_162, 2_932_896)  # days from 1970-01-01 to 0001-01-01 and 9999-12-31
MICROS_RANGE = (-62_135_596_800_000_000, 253_402_300_799_999_999)
MILLIS_RANGE = (-62_135_596_800_000, 253_402_300_799_999)
_VARINT_BYTES_MAX = 10  # 64 bits, 7 to a byte
DECIMAL_BYTES_MAX = 16  # Arrow's decimal128
_PADDING = 8  # zeros after the batch's bytes: an 8-byte read at any cursor stays inside


class Undecodable(Exception):
    """The batch holds something the columnar pass does not read (or that does not decode):
    decode it record by record instead, which says exactly what and where."""


class _Cursors:
    """Read positions of some records of a batch, in ascending record order. `pos` moves on
    as steps read; a read never passes `end`. Not thread-safe: one decode owns it."""

    __slots__ = ("data", "words", "buffer", "pos", "end")

    def __init__(self, data: npt.NDArray[np.uint8], buffer: pa.Buffer, pos: Int64s,
                 end: Int64s) -> None:
        self.data = data  # the batch's bytes, records back to back, then _PADDING zeros
        # the 8 bytes from each offset (unaligned, strides of one byte), for one gather
        self.words = np.ndarray((data.size - _PADDING + 1,), "<u8", data, strides=(1,))
        self.buffer = buffer  # the same bytes as an Arrow buffer, for zero-copy arrays
        self.pos = pos
        self.end = end

    def __len__(self) -> int:
        return int(self.pos.size)

    def subset(self, rows: Int64s) -> _Cursors:
        """The cursors of `rows` (ascending), as copies: write `pos` back after reading."""
        return _Cursors(self.data, self.buffer, self.pos[rows], self.end[rows])

    def advance(self, size: int | Int64s) -> Int64s:
        """Positions of `size` bytes at every cursor, which moves past them; refuses (before
        any read) a negative size, or where fewer are left in the record."""
        if isinstance(size, np.ndarray) and (size < 0).any():
            raise Undecodable("a negative length")
        if (self.end - self.pos < size).any():
            raise Undecodable("a record ends inside a value")
        start = self.pos
        self.pos = start + size
        return start

    def varint(self) -> npt.NDArray[np.uint64]:
        """An unsigned varint at every cursor (7 bits a byte, low first), at most 64 bits.
        Most are one byte (lengths, indexes); up to 8 bytes (a timestamp's 6) are read 8
        bytes at a time and their 7-bit groups packed with shifts; longer ones byte by
        byte. A varint must end inside its record."""
        pos, end = self.pos, self.end
        if (pos >= end).any():
            raise Undecodable("a record ends inside a value")
        byte = self.data[pos]
        if not (byte & 0x80).any():
            self.pos = pos + 1
            return byte.astype(np.uint64)
        word = self.words[pos]
        stop = ~word & _HIGH_BITS  # the high bit of each byte that ends a varint
        if not stop.all():
            return self._long_varint(byte)
        last = stop & (~stop + np.uint64(1))  # the first ending byte's high bit
        keep = (last | (last - np.uint64(1))) & _LOW_BITS
        size = np.bitwise_count(keep).astype(np.int64) // 7
        if (size > end - pos).any():
            raise Undecodable("a varint runs past its record")
        self.pos = pos + size
        return _packed(word & keep)

    def _long_varint(self, byte: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint64]:
        """`varint` where some are over 8 bytes: byte by byte, for the records not yet
        ended."""
        pos, end = self.pos, self.end
        value = (byte & 0x7F).astype(np.uint64)
        size = np.ones(pos.size, np.int64)
        more = np.flatnonzero(byte & 0x80)
        for k in range(1, _VARINT_BYTES_MAX + 1):
            if not more.size:
                break
            at = pos[more] + k
            if k == _VARINT_BYTES_MAX or (at >= end[more]).any():
                raise Undecodable("a varint runs past its record or past 64 bits")
            byte = self.data[at]
            if k == _VARINT_BYTES_MAX - 1 and (byte > 1).any():
                raise Undecodable("a varint holds more than 64 bits")
            value[more] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
            size[more] += 1
            more = more[(byte & 0x80) != 0]
        self.pos = pos + size
        return value

    def length(self) -> Int64s:
        """A length (a zigzag long, not negative) at every cursor. Most lengths are under 64:
        one byte with its low bit (the sign) and high bit (more bytes) clear, read with one
        gather and a shift."""
        pos = self.pos
        if (pos >= self.end).any():
            raise Undecodable("a record ends inside a value")
        byte = self.data[pos]
        if (byte & 0x81).any():  # negative or over one byte: the general read
            size = self.long()
            if (size < 0).any():
                raise Undecodable("a negative length")
            return size
        self.pos = pos + 1
        return (byte >> 1).astype(np.int64)

    def long(self) -> Int64s:
        """A zigzag-encoded int or long at every cursor."""
        raw = self.varint()
        return ((raw >> np.uint64(1)) ^ (np.uint64(0) - (raw & np.uint64(1)))).view(np.int64)


_HIGH_BITS = np.uint64(0x8080808080808080)
_LOW_BITS = np.uint64(0x7F7F7F7F7F7F7F7F)
# Masks packing 7-bit groups: 8 bytes to 4 lanes of 14 bits, to 2 of 28, to one of 56.
_PACKS = [(np.uint64(mask), np.uint64(shift)) for mask, shift in (
    (0x7F007F007F007F00, 1), (0x3FFF00003FFF0000, 2), (0x0FFFFFFF00000000, 4))]


def _packed(groups: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """The value of up to 8 little-endian 7-bit groups (the high bit of each byte clear)."""
    for mask, shift in _PACKS:
        groups = ((groups & mask) >> shift) | (groups & ~mask)
    return groups


class Step:
    """How one Avro type is read for many records at once: `read` gives the Arrow array of
    the values at the cursors (one per cursor) and moves them past the values."""

    def read(self, cursors: _Cursors) -> pa.Array:
        raise NotImplementedError


@dataclass(frozen=True)
class NullStep(Step):
    def read(self, cursors: _Cursors) -> pa.Array:
        return pa.nulls(len(cursors))


@dataclass(frozen=True)
class BooleanStep(Step):
    """One byte; as fastavro reads it, any byte but 0 is true."""

    def read(self, cursors: _Cursors) -> pa.Array:
        return pa.array(cursors.data[cursors.advance(1)] != 0, pa.bool_())


@dataclass(frozen=True)
class IntegerStep(Step):
    """An int or long (zigzag varint), and the logical types held in one: the value must lie
    in `bounds` (what the record path accepts) and is stored times `factor` as `arrow`."""

    arrow: pa.DataType
    bounds: tuple[int, int] | None = None
    factor: int = 1

    def read(self, cursors: _Cursors) -> pa.Array:
        value = cursors.long()
        if self.bounds is not None and value.size and (
                value.min() < self.bounds[0] or value.max() > self.bounds[1]):
            raise Undecodable("a value out of its column's range")
        if self.factor != 1:
            value = value * self.factor
        if self.arrow.bit_width == 32:
            value = value.astype(np.int32)
        return pa.Array.from_buffers(self.arrow, value.size, [None, pa.py_buffer(value)])


@dataclass(frozen=True)
class FloatStep(Step):
    """A float (4 bytes) or double (8), little-endian."""

    size: int

    def read(self, cursors: _Cursors) -> pa.Array:
        start = cursors.advance(self.size)
        # every byte offset as a float (unaligned, strides of one byte): one gather reads them
        at = np.ndarray((cursors.data.size - self.size + 1,), f"<f{self.size}",
                        cursors.data, strides=(1,))
        if self.size == 8:
            return pa.array(at[start], pa.float64())
        # The record path widens each float to a Python float and narrows it back: the same
        # casts here give the same bits (a signalling NaN comes back quiet).
        with np.errstate(invalid="ignore"):  # a signalling NaN is not an error here
            value = at[start].astype(np.float64).astype(np.float32)
        return pa.array(value, pa.float32())


@dataclass(frozen=True)
class BinaryStep(Step):
    """bytes or string (a varint length, then the bytes); a string must be UTF-8."""

    arrow: pa.DataType

    def read(self, cursors: _Cursors) -> pa.Array:
        size = cursors.length()
        return _binaries(cursors, cursors.advance(size), size, self.arrow)


@dataclass(frozen=True)
class FixedStep(Step):
    size: int

    def read(self, cursors: _Cursors) -> pa.Array:
        size = np.full(len(cursors), self.size, np.int64)
        return _binaries(cursors, cursors.advance(self.size), size, pa.binary())


@dataclass(frozen=True)
class EnumStep(Step):
    """A varint index into the symbols, as the symbol's name."""

    symbols: tuple[str, ...]

    def read(self, cursors: _Cursors) -> pa.Array:
        index = cursors.long()
        if (index.view(np.uint64) >= len(self.symbols)).any():  # negatives: huge
            raise Undecodable("an enum index out of range")
        return pa.array(self.symbols, pa.string()).take(pa.array(index))


@dataclass(frozen=True)
class DecimalStep(Step):
    """decimal on bytes (`size` None: a varint length first) or on a fixed of `size` bytes:
    a big-endian two's complement integer, at most 16 bytes and `precision` digits."""

    precision: int
    scale: int
    size: int | None

    def read(self, cursors: _Cursors) -> pa.Array:
        if self.size is None:
            size = cursors.long()
            if (size > DECIMAL_BYTES_MAX).any():
                raise Undecodable("a decimal over 16 bytes")
        else:
            size = np.full(len(cursors), self.size, np.int64)
        start = cursors.advance(size)
        little = _int128(cursors.data, start, size)
        halves = little.view(np.uint64).reshape(-1, 2)
        if not _within_digits(halves[:, 0], halves[:, 1].view(np.int64), self.precision):
            raise Undecodable("a decimal with more digits than its precision")
        return pa.Array.from_buffers(pa.decimal128(self.precision, self.scale), start.size,
                                     [None, pa.py_buffer(little)])


@dataclass(frozen=True)
class RecordStep(Step):
    """A record: its fields one after another, as a struct."""

    arrow: pa.StructType
    fields: tuple[Step, ...]

    def read(self, cursors: _Cursors) -> pa.Array:
        children = [one.read(cursors) for one in self.fields]
        return pa.StructArray.from_arrays(
            children, fields=[self.arrow.field(i) for i in range(self.arrow.num_fields)])


@dataclass(frozen=True)
class UnionStep(Step):
    """A varint branch index, then the branch's value (None: the null branch). One value
    branch is that branch's column, null where the value is; several are a struct with a
    field per branch, only the branch written set (as `avro_arrow_type` says)."""

    arrow: pa.DataType
    branches: tuple[Step | None, ...]

    def read(self, cursors: _Cursors) -> pa.Array:
        index = cursors.long()
        if (index.view(np.uint64) >= len(self.branches)).any():  # negatives: huge
            raise Undecodable("a union branch index out of range")
        values = []
        for branch, step in enumerate(self.branches):
            if step is not None:
                values.append(_read_branch(step, cursors, np.flatnonzero(index == branch)))
        if not values:
            return pa.nulls(len(cursors))
        if len(values) == 1:
            return values[0]
        null = [b for b, step in enumerate(self.branches) if step is None]
        mask = pa.array(index == null[0]) if null else None
        return pa.StructArray.from_arrays(
            values, fields=[self.arrow.field(i) for i in range(self.arrow.num_fields)],
            mask=mask)


def _read_branch(step: Step, cursors: _Cursors, rows: Int64s) -> pa.Array:
    """`step`'s values for the records `rows`, null for the others."""
    count = len(cursors)
    if rows.size == count:
        return step.read(cursors)
    some = cursors.subset(rows)
    values = step.read(some)
    cursors.pos[rows] = some.pos
    where = np.zeros(count, np.int64)
    where[rows] = np.arange(rows.size)
    missing = np.ones(count, np.bool_)
    missing[rows] = False
    return values.take(pa.array(where, mask=missing))


def _binaries(cursors: _Cursors, start: Int64s, size: Int64s,
              arrow: pa.DataType) -> pa.Array:
    """The byte ranges [start, start + size) of the buffer as one binary or string array.
    The ranges ascend without overlapping, so they and the gaps between them are one large
    binary array over the buffer as it is; taking its odd items copies the values out."""
    count = start.size
    bounds = np.empty(2 * count + 1, np.int64)
    bounds[0] = 0
    bounds[1::2] = start
    bounds[2::2] = start + size
    spread = pa.Array.from_buffers(pa.large_binary(), 2 * count,
                                   [None, pa.py_buffer(bounds), cursors.buffer])
    picked = spread.take(pa.array(np.arange(1, 2 * count, 2, dtype=np.int64)))
    if arrow != pa.string():
        return picked.cast(arrow)
    _, offsets, data = picked.buffers()
    bounds = np.frombuffer(offsets, np.int64, count + 1)
    _check_utf8(bounds, data)
    narrow = bounds.astype(np.int32)
    return pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(narrow), data])


def _check_utf8(bounds: Int64s, data: pa.Buffer | None) -> None:
    """Refuse unless each value (back to back in `data`, between consecutive `bounds`) is
    UTF-8, as Python's decode requires: one pass over the bytes, not a check a value.
    Each value is UTF-8 exactly when the values joined are and none starts on a continuation
    byte (0b10xxxxxx): every value then starts, and ends, on a character boundary of the
    join."""
    total = int(bounds[-1])
    if not total or data is None:  # no bytes: every value is empty
        return
    joined = pa.Array.from_buffers(pa.large_binary(), 1,
                                   [None, pa.py_buffer(bounds[[0, -1]].copy()), data])
    try:
        joined.cast(pa.large_string())
    except pa.ArrowInvalid as e:
        raise Undecodable(str(e)) from e
    starts = bounds[:-1]
    starts = starts[starts < total]
    if ((np.frombuffer(data, np.uint8, total)[starts] & 0xC0) == 0x80).any():
        raise Undecodable("a string starts inside a UTF-8 character")


def _int128(data: npt.NDArray[np.uint8], start: Int64s,
            size: Int64s) -> npt.NDArray[np.uint8]:
    """The big-endian two's complement integers of `size` (at most 16) bytes at `start`, as
    16 little-endian bytes each (Arrow's decimal128), sign-extended."""
    count = start.size
    column = np.arange(DECIMAL_BYTES_MAX)
    lead = (DECIMAL_BYTES_MAX - size)[:, None]  # the fill bytes before the value's
    inside = column >= lead
    source = np.where(inside, start[:, None] + column - lead, 0)  # 0: read, then dropped
    raw = data[source]
    first = raw[np.arange(count), np.minimum(lead[:, 0], DECIMAL_BYTES_MAX - 1)]
    negative = (size > 0) & (first >= 0x80)
    fill = np.where(negative, 0xFF, 0).astype(np.uint8)[:, None]
    big = np.where(inside, raw, fill)
    return np.ascontiguousarray(big[:, ::-1]).ravel()


def _within_digits(low: npt.NDArray[np.uint64], high: Int64s, precision: int) -> bool:
    """Whether every 128-bit integer (high * 2**64 + low) has at most `precision` digits."""
    top = 10**precision
    over_high, over_low = divmod(top, 2**64)
    under_high, under_low = divmod(-top, 2**64)  # floor division: two's complement halves
    too_big = (high > over_high) | ((high == over_high) & (low >= np.uint64(over_low)))
    too_small = (high < under_high) | ((high == under_high) & (low <= np.uint64(under_low)))
    return not (too_big.any() or too_small.any())


def decode_columns(steps: Sequence[Step], schema: pa.Schema,
                   payloads: Sequence[bytes] | pa.Array, skip: int = 0) -> pa.Table:
    """The table of `schema` whose columns `steps` read, one after another, from every
    payload (Python bytes, or a binary Arrow array: read from its buffers, no Python object a
    record), each past its first `skip` bytes (Confluent's wire header: read in place, not
    sliced off into a copy). Raises Undecodable where a payload does not decode, or decodes
    with bytes left over: the caller then decodes record by record for the exact error."""
    try:
        batch = (payloads.cast(pa.large_binary()) if isinstance(payloads, pa.Array)
                 else pa.array(payloads, pa.large_binary()))
    except (pa.ArrowException, TypeError) as e:  # not bytes: the record path says which
        raise Undecodable(str(e)) from e
    if isinstance(batch, pa.ChunkedArray):  # more than Arrow puts in one array
        raise Undecodable("the batch is too large for one array")
    if batch.null_count:
        raise Undecodable("a null payload")
    _, offsets_buffer, values = batch.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64, len(batch) + 1, batch.offset * 8)
    base, size = int(offsets[0]), int(offsets[-1] - offsets[0])
    offsets = offsets - base
    start = offsets[:-1] + skip
    if skip and (start > offsets[1:]).any():
        raise Undecodable("a payload shorter than its header")
    data = np.empty(size + _PADDING, np.uint8)
    data[size:] = 0
    if size:
        data[:size] = np.frombuffer(values, np.uint8, size, base)
    cursors = _Cursors(data, pa.py_buffer(data), start, offsets[1:])
    columns = [step.read(cursors) for step in steps]
    if (cursors.pos != cursors.end).any():
        raise Undecodable("bytes left over after a record")
    return pa.Table.from_arrays(columns, schema=schema)
