"""Avro decoded a column at a time (deltabus.schemas.avro_columns) gives exactly what the
record-by-record path gives: for random schemas of every type it reads and random rows, for
damaged payloads (the same table or the same error), and at every range limit. Values are
written by fastavro's writer (the tests put in only union branch indexes and record
concatenation), so neither decoder is checked against itself. No Spark."""

from __future__ import annotations

import decimal
import itertools
import json
import math
import re
import tracemalloc
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltabus.schemas import avro as schema_avro
from deltabus.schemas import wire_header
from deltabus.schemas.avro import AvroSchema, decode_avro, decode_avro_records, parse_avro
from deltabus.schemas.avro_columns import (
    DATE_RANGE,
    MICROS_RANGE,
    MILLIS_RANGE,
    Undecodable,
    decode_columns,
)
from tests.schemas.test_avro import fastavro_encoded

INT = (-(2**31), 2**31 - 1)
LONG = (-(2**63), 2**63 - 1)
PAYMENT = {"type": "record", "name": "Payment", "namespace": "bench", "fields": [
    {"name": "id", "type": "string"}, {"name": "amount", "type": "double"},
    {"name": "currency", "type": "string"}, {"name": "note", "type": "string"}]}


@pytest.fixture(autouse=True)
def columnar_however_few(monkeypatch: pytest.MonkeyPatch) -> None:
    """decode_avro takes the columnar pass for batches of any size here (otherwise of
    COLUMNAR_RECORDS_MIN records or more), so the small batches below go through it."""
    monkeypatch.setattr(schema_avro, "COLUMNAR_RECORDS_MIN", 0)


def avro(schema: Any) -> AvroSchema:
    return parse_avro(json.dumps(schema), {})


def record(name: str, **fields: Any) -> dict[str, Any]:
    return {"type": "record", "name": name,
            "fields": [{"name": k, "type": v} for k, v in fields.items()]}


encoded = fastavro_encoded  # the reference encoding (tests/schemas/test_avro.py)


def written(kind: Any, value: Any) -> bytes:
    """A generated value's encoding: a union's branch as chosen ((index, value): fastavro's
    writer would take the first branch that validates), a record's fields one after another,
    anything else as fastavro writes it."""
    if isinstance(kind, list):
        branch, inner = value
        return bytes([2 * branch]) + written(kind[branch], inner)  # a small zigzag varint
    if isinstance(kind, dict) and kind["type"] == "record":
        return b"".join(written(f["type"], value[f["name"]]) for f in kind["fields"])
    return encoded(kind, [value])[0]


def columnar(schema: AvroSchema, payloads: list[bytes]) -> pa.Table:
    """The columnar pass alone: raises Undecodable rather than falling back."""
    plan = schema.decode_plan
    assert plan.steps is not None, "the schema has no columnar plan"
    return decode_columns(plan.steps, plan.arrow_schema, payloads)


def outcome(decode: Any, schema: AvroSchema, payloads: list[bytes]) -> Any:
    """A decode's table (as a comparable value) or its error's message."""
    try:
        table = decode(schema, payloads)
    except ValueError as e:  # fastavro's EOFError names the stream: drop its address
        return ("error", re.sub(r" at 0x[0-9a-f]+", "", str(e)))
    # repr: NaN equals NaN (Table.equals says it does not); bits are checked elsewhere
    return ("table", table.schema, repr(table.to_pylist()))


# -- random schemas of the types the columnar pass reads, with values that fit them ----------

def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(low, high)


def _decimal_values(precision: int, scale: int) -> st.SearchStrategy[decimal.Decimal]:
    top = 10**precision - 1
    return st.integers(-top, top).map(lambda u: decimal.Decimal(f"{u}E-{scale}"))


@st.composite
def _decimal(draw: Any) -> tuple[Any, Any]:
    if draw(st.booleans()):
        precision = draw(st.integers(1, 38))
        base: dict[str, Any] = {"type": "bytes"}
    else:
        size = draw(st.integers(1, 16))
        precision = draw(st.integers(1, math.floor(math.log10(2) * (8 * size - 1))))
        base = {"type": "fixed", "name": "N", "size": size}
    scale = draw(st.integers(0, precision))
    kind = {**base, "logicalType": "decimal", "precision": precision, "scale": scale}
    return kind, _decimal_values(precision, scale)


@st.composite
def _enum(draw: Any) -> tuple[Any, Any]:
    symbols = [f"S{i}" for i in range(draw(st.integers(1, 5)))]
    return {"type": "enum", "name": "N", "symbols": symbols}, st.sampled_from(symbols)


@st.composite
def _fixed(draw: Any) -> tuple[Any, Any]:
    size = draw(st.integers(0, 20))
    return {"type": "fixed", "name": "N", "size": size}, st.binary(min_size=size,
                                                                   max_size=size)


def _logical(base: str, logical: str) -> dict[str, str]:
    return {"type": base, "logicalType": logical}


LEAVES = st.sampled_from([
    ("null", st.none()),
    ("boolean", st.booleans()),
    ("int", _ints(*INT)),
    ("long", _ints(*LONG)),
    ("float", st.floats(width=32, allow_nan=False)),
    ("double", st.floats(allow_nan=False)),
    ("bytes", st.binary(max_size=40)),
    ("string", st.text(max_size=20)),
    (_logical("int", "date"), _ints(*DATE_RANGE)),
    (_logical("int", "time-millis"), _ints(*INT)),
    (_logical("long", "time-micros"), _ints(*LONG)),
    (_logical("long", "timestamp-millis"), _ints(*MILLIS_RANGE)),
    (_logical("long", "timestamp-micros"), _ints(*MICROS_RANGE)),
    (_logical("long", "local-timestamp-millis"), _ints(*MILLIS_RANGE)),
    (_logical("long", "local-timestamp-micros"), _ints(*MICROS_RANGE)),
    (_logical("string", "uuid"), st.uuids().map(str)),
]) | _decimal() | _enum() | _fixed()


def _kind(kind: Any) -> Any:
    """What the parser lets a union hold once: a primitive (logical or not) by its type; each
    named type is its own (they are all renamed apart)."""
    if isinstance(kind, str):
        return kind
    return kind["type"] if kind["type"] in ("int", "long", "bytes", "string") else id(kind)


@st.composite
def _record(draw: Any, inner: Any) -> tuple[Any, Any]:
    fields = draw(st.lists(inner, min_size=1, max_size=5))
    kind = record("N", **{f"f{i}": k for i, (k, _) in enumerate(fields)})
    return kind, st.fixed_dictionaries({f"f{i}": v for i, (_, v) in enumerate(fields)})


@st.composite
def _union(draw: Any, inner: Any) -> tuple[Any, Any]:
    """["null", T], [T, "null"], [T] or several value branches, with or without null. A
    value is (branch index, the branch's value): `written` writes that branch."""
    value = inner.filter(lambda one: not isinstance(one[0], list) and one[0] != "null")
    branches = draw(st.lists(value, min_size=1, max_size=3, unique_by=lambda b: _kind(b[0])))
    if draw(st.booleans()):
        branches.insert(draw(st.integers(0, len(branches))), ("null", st.none()))
    return [k for k, _ in branches], st.one_of(
        [st.tuples(st.just(i), v) for i, (_, v) in enumerate(branches)])


TYPES = st.recursive(LEAVES, lambda inner: _record(inner) | _union(inner), max_leaves=12)


def _named(kind: Any, names: Any) -> Any:
    """The schema with each named type given a name of its own (the strategies say "N")."""
    if isinstance(kind, list):
        return [_named(k, names) for k in kind]
    if not isinstance(kind, dict):
        return kind
    out = {**kind}
    if "name" in out:
        out["name"] = f"T{next(names)}"
    if "fields" in out:
        out["fields"] = [{**f, "type": _named(f["type"], names)} for f in out["fields"]]
    return out


@st.composite
def schemas_and_rows(draw: Any) -> tuple[Any, list[Any]]:
    """A schema: a top-level record (its fields are columns) or any type (one column)."""
    kind, values = draw(_record(TYPES) if draw(st.booleans()) else TYPES)
    rows = draw(st.lists(values, max_size=12))
    return _named(kind, itertools.count()), rows


# -- the columnar pass equals the record path ------------------------------------------------

@settings(max_examples=300, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(schemas_and_rows())
def test_columnar_decode_equals_the_record_path(case: tuple[Any, list[Any]]) -> None:
    kind, rows = case
    schema, payloads = avro(kind), [written(kind, row) for row in rows]
    fast, slow = columnar(schema, payloads), decode_avro_records(schema, payloads)
    assert fast.schema == slow.schema
    assert fast.equals(slow)


@st.composite
def damaged(draw: Any) -> tuple[Any, list[bytes]]:
    """Records of a random schema, some cut short, grown or with a byte changed."""
    kind, rows = draw(schemas_and_rows())
    payloads = [written(kind, row) for row in rows]
    for i in draw(st.lists(st.integers(0, max(len(payloads) - 1, 0)), min_size=1,
                           max_size=3)):
        if not payloads:
            break
        one = payloads[i]
        how = draw(st.sampled_from(["cut", "grow", "change"]))
        if how == "cut":
            one = one[:draw(st.integers(0, max(len(one) - 1, 0)))]
        elif how == "grow":
            one = one + draw(st.binary(min_size=1, max_size=3))
        elif one:
            at = draw(st.integers(0, len(one) - 1))
            one = one[:at] + bytes([draw(st.integers(0, 255))]) + one[at + 1:]
        payloads[i] = one
    return kind, payloads


@settings(max_examples=300, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(damaged())
def test_damaged_payloads_give_the_record_path_s_table_or_error(
        case: tuple[Any, list[bytes]]) -> None:
    kind, payloads = case
    schema = avro(kind)
    assert outcome(decode_avro, schema, payloads) == outcome(decode_avro_records, schema,
                                                             payloads)


def test_decode_avro_reads_a_supported_schema_without_the_record_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    schema = avro(PAYMENT)
    rows = [{"id": "p1", "amount": 2.5, "currency": "EUR", "note": "é"}]
    payloads = encoded(PAYMENT, rows)

    def refuse(*_: Any) -> None:
        raise AssertionError("the record path ran")

    monkeypatch.setattr(schema_avro, "decode_avro_records", refuse)
    assert decode_avro(schema, payloads).to_pylist() == rows


def test_a_batch_below_the_minimum_decodes_record_by_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema_avro, "COLUMNAR_RECORDS_MIN", 64)
    schema = avro(PAYMENT)
    payloads = encoded(PAYMENT, [{"id": "p", "amount": 1.0, "currency": "EUR", "note": ""}]
                       * 64)
    assert decode_avro(schema, payloads[:63]).num_rows == 63

    def refuse(*_: Any) -> None:
        raise AssertionError("the columnar pass ran")

    monkeypatch.setattr(schema_avro, "decode_columns", refuse)
    assert decode_avro(schema, payloads[:63]).num_rows == 63
    with pytest.raises(AssertionError, match="the columnar pass ran"):
        decode_avro(schema, payloads)


@pytest.mark.parametrize("columnar_min", [0, 10**6])  # the columnar pass, the record path
def test_records_behind_a_wire_header_decode_in_place_as_without_it(
        monkeypatch: pytest.MonkeyPatch, columnar_min: int) -> None:
    monkeypatch.setattr(schema_avro, "COLUMNAR_RECORDS_MIN", columnar_min)
    schema = avro(PAYMENT)
    rows = [{"id": f"p{i}", "amount": i / 4, "currency": "EUR", "note": "é" * i}
            for i in range(70)]  # notes of 64 bytes and more: two-byte lengths
    payloads = encoded(PAYMENT, rows)
    headed = pa.array([wire_header(7) + p for p in payloads], pa.binary())
    assert decode_avro(schema, headed, 5).to_pylist() == rows
    assert decode_avro(schema, headed.slice(3), 5).to_pylist() == rows[3:]
    damaged = headed.to_pylist()
    damaged[4] = damaged[4][:-1]
    with pytest.raises(ValueError, match="record 4 does not decode"):
        decode_avro(schema, damaged, 5)


WIDE = {"type": "fixed", "name": "Wide", "size": 20, "logicalType": "decimal",
        "precision": 30, "scale": 2}


@pytest.mark.parametrize("kind, value", [
    (record("R", v={"type": "array", "items": "int"}), [1, 2]),
    (record("R", v={"type": "map", "values": "string"}), {"k": "v"}),
    (record("R", v=["null", record("In", a={"type": "array", "items": "long"})]), {"a": [3]}),
    (record("R", v=WIDE), decimal.Decimal("1.25")),  # over 16 bytes: no int128
])
def test_a_schema_with_an_array_map_or_wide_decimal_decodes_record_by_record(
        kind: Any, value: Any) -> None:
    schema = avro(kind)
    assert schema.decode_plan.steps is None
    payloads = encoded(kind, [{"v": value}, {"v": value}])
    assert decode_avro(schema, payloads).equals(decode_avro_records(schema, payloads))
    assert decode_avro(schema, payloads).num_rows == 2


def test_an_empty_batch_is_an_empty_table_of_the_columns() -> None:
    schema = avro(PAYMENT)
    assert columnar(schema, []).equals(decode_avro_records(schema, []))
    assert columnar(schema, []).schema == decode_avro_records(schema, []).schema


# -- what does not decode: the columnar pass refuses it, the record path names the record ----

LONG_STRING = record("R", n="long", s="string")


def test_a_truncated_payload_is_refused_naming_its_record() -> None:
    schema = avro(LONG_STRING)
    payloads = encoded(LONG_STRING, [{"n": i, "s": "abc"} for i in range(4)])
    payloads[2] = payloads[2][:-1]  # the string's last byte
    with pytest.raises(Undecodable):
        columnar(schema, payloads)
    with pytest.raises(ValueError, match="record 2 does not decode with the schema"):
        decode_avro(schema, payloads)


def test_a_payload_cut_inside_a_varint_is_refused_naming_its_record() -> None:
    schema = avro(LONG_STRING)
    payloads = encoded(LONG_STRING, [{"n": 2**40, "s": ""}, {"n": 2**40, "s": ""}])
    payloads[1] = payloads[1][:3]  # the long's varint continues past the end
    with pytest.raises(Undecodable):
        columnar(schema, payloads)
    with pytest.raises(ValueError, match="record 1 does not decode"):
        decode_avro(schema, payloads)


def test_bytes_left_over_are_refused_naming_the_record() -> None:
    schema = avro(LONG_STRING)
    payloads = encoded(LONG_STRING, [{"n": 1, "s": "a"}] * 3)
    payloads[1] += b"\x00\x00"
    with pytest.raises(Undecodable):
        columnar(schema, payloads)
    with pytest.raises(ValueError, match="record 1 has 2 bytes left"):
        decode_avro(schema, payloads)


@pytest.mark.parametrize("bad", [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\x80"])
def test_a_string_that_is_not_utf8_is_refused_naming_its_record(bad: bytes) -> None:
    schema = avro(record("R", s="string"))
    payloads = [b"\x02a", b"\x02b", bytes([2 * len(bad)]) + bad]
    with pytest.raises(Undecodable):
        columnar(schema, payloads)
    with pytest.raises(ValueError, match="record 2 does not decode.*UnicodeDecodeError"):
        decode_avro(schema, payloads)


def test_strings_invalid_alone_are_refused_though_their_bytes_join_into_utf8() -> None:
    schema = avro(record("R", s="string"))
    payloads = [b"\x02\xc3", b"\x02\xa9"]  # b"\xc3\xa9" is "é"
    with pytest.raises(Undecodable):
        columnar(schema, payloads)
    with pytest.raises(ValueError, match="record 0 does not decode"):
        decode_avro(schema, payloads)


def test_a_union_branch_index_past_the_union_is_refused_naming_its_record() -> None:
    schema = avro(record("R", u=["null", "string"]))
    payloads = [b"\x00", b"\x02\x02x", b"\x04\x02x"]  # branches 0, 1, 2
    with pytest.raises(Undecodable):
        columnar(schema, payloads)
    with pytest.raises(ValueError, match="record 2 does not decode.*IndexError"):
        decode_avro(schema, payloads)


def test_an_enum_index_past_the_symbols_is_refused_naming_its_record() -> None:
    schema = avro(record("R", e={"type": "enum", "name": "E", "symbols": ["A", "B"]}))
    payloads = [b"\x02", b"\x04"]  # symbols 1, 2
    with pytest.raises(Undecodable):
        columnar(schema, payloads)
    with pytest.raises(ValueError, match="record 1 does not decode.*IndexError"):
        decode_avro(schema, payloads)


def test_a_negative_union_index_reads_as_fastavro_reads_it() -> None:
    """fastavro indexes a Python list with the index, so -1 is the last branch: the columnar
    pass refuses it and the record path's value stands."""
    schema = avro(record("R", u=["null", "string"]))
    payloads = [b"\x02\x02y", b"\x01\x02x"]  # branch 1 "y", branch -1 "x"
    with pytest.raises(Undecodable):
        columnar(schema, payloads)
    assert decode_avro(schema, payloads).to_pylist() == [{"u": "y"}, {"u": "x"}]


def test_a_negative_enum_index_reads_as_fastavro_reads_it() -> None:
    schema = avro(record("R", e={"type": "enum", "name": "E", "symbols": ["A", "B"]}))
    payloads = [b"\x00", b"\x01"]  # symbols 0, -1
    with pytest.raises(Undecodable):
        columnar(schema, payloads)
    assert decode_avro(schema, payloads).to_pylist() == [{"e": "A"}, {"e": "B"}]


def test_a_negative_length_is_refused_naming_its_record() -> None:
    schema = avro(record("R", s="string", b="bytes"))
    for payloads in ([b"\x02a\x00", b"\x01\x00"], [b"\x02a\x00", b"\x00\x03"]):
        with pytest.raises(Undecodable):
            columnar(schema, payloads)
        with pytest.raises(ValueError, match="record 1 does not decode"):
            decode_avro(schema, payloads)


def test_a_huge_declared_length_is_refused_before_anything_is_allocated() -> None:
    schema = avro(record("R", s="bytes"))
    huge = encoded(record("R", s="long"), [{"s": 2**62}])[0]  # a length, as a zigzag long
    payloads = [b"\x02a"] * 1000 + [huge + b"abc"]
    tracemalloc.start()
    try:
        with pytest.raises(Undecodable):
            columnar(schema, payloads)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10_000_000
    with pytest.raises(ValueError, match="record 1000 does not decode"):
        decode_avro(schema, payloads)


@pytest.mark.parametrize("varint", [
    b"\xff" * 10 + b"\x01",  # eleven bytes
    b"\xff" * 9 + b"\x7f",  # ten, the last holding more than the 64th bit
])
def test_a_varint_over_64_bits_is_left_to_the_record_path(varint: bytes) -> None:
    schema = avro(record("R", n="long"))
    payloads = [b"\x02", varint]
    with pytest.raises(Undecodable):
        columnar(schema, payloads)
    assert outcome(decode_avro, schema, payloads) == outcome(decode_avro_records, schema,
                                                             payloads)


# -- values at the edges of their columns ----------------------------------------------------

@pytest.mark.parametrize("kind, low, high", [
    ("int", *INT),
    (_logical("int", "time-millis"), *INT),
    (_logical("int", "date"), *DATE_RANGE),
    (_logical("long", "timestamp-millis"), *MILLIS_RANGE),
    (_logical("long", "local-timestamp-millis"), *MILLIS_RANGE),
    (_logical("long", "timestamp-micros"), *MICROS_RANGE),
    (_logical("long", "local-timestamp-micros"), *MICROS_RANGE),
])
def test_values_at_the_range_ends_decode_and_one_past_is_refused(kind: Any, low: int,
                                                                 high: int) -> None:
    schema = avro(record("R", v=kind))
    as_long = record("R", v="long")  # writes any long: fastavro checks no range
    inside = encoded(as_long, [{"v": low}, {"v": 0}, {"v": high}])
    assert columnar(schema, inside).equals(decode_avro_records(schema, inside))
    for past in (low - 1, high + 1):
        payloads = [inside[1], *encoded(as_long, [{"v": past}])]
        with pytest.raises(Undecodable):
            columnar(schema, payloads)
        with pytest.raises(ValueError, match="record 1 does not"):
            decode_avro(schema, payloads)


def test_longs_at_the_ends_of_64_bits_decode() -> None:
    schema = avro(record("R", v="long"))
    payloads = encoded(record("R", v="long"), [{"v": v} for v in (*LONG, -1, 0, 1, 63, -64)])
    assert columnar(schema, payloads).column("v").to_pylist() == [*LONG, -1, 0, 1, 63, -64]


@pytest.mark.parametrize("size", [None, 16])
def test_decimals_of_38_digits_decode_and_39_are_refused(size: int | None) -> None:
    base = {"type": "bytes"} if size is None else {"type": "fixed", "name": "D", "size": size}
    kind = record("R", d={**base, "logicalType": "decimal", "precision": 38, "scale": 3})
    as_bytes = record("R", d="bytes" if size is None else {"type": "fixed", "name": "D",
                                                            "size": size})
    top = 10**38 - 1

    def raw(value: int) -> bytes:  # as Java's BigInteger.toByteArray: the fewest bytes
        width = size or ((~value if value < 0 else value).bit_length() + 8) // 8
        return value.to_bytes(width, "big", signed=True)

    edges = [top, -top, 0, -1, 1, -128, 127, -(2**15), 2**64, -(2**64), -(2**64) - 1]
    schema = avro(kind)
    payloads = encoded(as_bytes, [{"d": raw(v)} for v in edges])
    assert columnar(schema, payloads).column("d").to_pylist() == [
        decimal.Decimal(f"{v}E-3") for v in edges]
    assert columnar(schema, payloads).equals(decode_avro_records(schema, payloads))
    for past in (top + 1, -top - 1):
        wrong = [payloads[0], *encoded(as_bytes, [{"d": raw(past)}])]
        with pytest.raises(Undecodable):
            columnar(schema, wrong)
        with pytest.raises(ValueError, match="record 1 does not fit its columns"):
            decode_avro(schema, wrong)


def test_a_bytes_decimal_over_16_bytes_is_left_to_the_record_path() -> None:
    schema = avro(record("R", d={"type": "bytes", "logicalType": "decimal", "precision": 4,
                                 "scale": 2}))
    payloads = [bytes([2 * 17]) + b"\x00" * 16 + b"\x05"]  # 5, sign-extended to 17 bytes
    with pytest.raises(Undecodable):
        columnar(schema, payloads)
    assert decode_avro(schema, payloads).to_pylist() == [{"d": decimal.Decimal("0.05")}]


def test_an_empty_bytes_decimal_is_zero_as_fastavro_reads_it() -> None:
    schema = avro(record("R", d={"type": "bytes", "logicalType": "decimal", "precision": 4,
                                 "scale": 2}))
    assert columnar(schema, [b"\x00"]).equals(decode_avro_records(schema, [b"\x00"]))


@pytest.mark.parametrize("kind, bits, patterns", [
    ("float", np.uint32, [0x7FC00000, 0x7F800001, 0xFFA00000, 0x00000001, 0x80000000]),
    ("double", np.uint64, [0x7FF8000000000000, 0x7FF0000000000001, 0xFFF4000000000000, 1]),
])
def test_float_bits_are_the_record_path_s_even_for_nans(kind: str, bits: Any,
                                                         patterns: list[int]) -> None:
    schema = avro(record("R", f=kind))
    payloads = [np.array([p], bits).astype(np.dtype(bits).newbyteorder("<")).tobytes()
                for p in patterns]
    fast = columnar(schema, payloads).column("f").chunk(0).to_numpy().view(bits)
    slow = decode_avro_records(schema, payloads).column("f").chunk(0).to_numpy().view(bits)
    assert fast.tolist() == slow.tolist()


def test_any_nonzero_byte_is_a_true_boolean_as_fastavro_reads_it() -> None:
    schema = avro(record("R", b="boolean"))
    payloads = [b"\x00", b"\x01", b"\x02", b"\xff"]
    assert columnar(schema, payloads).column("b").to_pylist() == [False, True, True, True]
    assert columnar(schema, payloads).equals(decode_avro_records(schema, payloads))
