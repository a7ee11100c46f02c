"""Avro schemas: parsing refuses what Confluent refuses, one canonical text per schema, the
specification's reader/writer rules at every compatibility level, and typed columns decoded
from real fastavro encodings (no Spark)."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import uuid
from collections.abc import Mapping
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from deltabus.schemas import Compatibility, InvalidSchemaError, SchemaType, check_compatibility
from deltabus.schemas.avro import (
    AvroSchema,
    avro_arrow_schema,
    avro_arrow_type,
    decode_avro,
    encode_avro,
    parse_avro,
)

UTC = datetime.UTC


def avro(schema: Any, references: Mapping[str, str] | None = None) -> AvroSchema:
    return parse_avro(json.dumps(schema), references or {})


def record(name: str, *fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def fld(name: str, kind: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": kind, **extra}


def payment(*more: dict[str, Any]) -> AvroSchema:
    """shop.Payment: id and currency, then `more` fields."""
    return avro(record("Payment", fld("id", "string"), fld("currency", "string"), *more,
                       namespace="shop"))


def one_field(kind: Any, **extra: Any) -> AvroSchema:
    return avro(record("R", fld("f", kind, **extra)))


def enum(*symbols: str, **extra: Any) -> dict[str, Any]:
    return {"type": "enum", "name": "Colour", "symbols": list(symbols), **extra}


def fixed(size: int, name: str = "Hash", **extra: Any) -> dict[str, Any]:
    return {"type": "fixed", "name": name, "size": size, **extra}


# -- parsing ---------------------------------------------------------------------------------

def test_an_avro_schema_is_of_type_avro() -> None:
    assert avro("string").schema_type == SchemaType.AVRO


def test_text_that_is_not_json_is_an_invalid_schema() -> None:
    with pytest.raises(InvalidSchemaError, match="not JSON"):
        parse_avro('{"type": "record", ', {})


def test_an_unknown_type_is_an_invalid_schema_naming_it_and_where() -> None:
    with pytest.raises(InvalidSchemaError,
                       match=r"at /fields/1/type: unknown type 'Money'"):
        avro(record("Payment", fld("id", "string"), fld("amount", "Money"), namespace="shop"))


@pytest.mark.parametrize("kind, default", [
    ("int", "zero"),
    ("int", 2**31),  # out of an int's range
    ("long", 1.5),
    ("boolean", 0),
    ("string", None),
    ({"type": "array", "items": "int"}, ["a"]),
    ({"type": "map", "values": "long"}, {"k": "v"}),
    (["null", "string"], 3),  # a value of no branch
    (enum("RED", "GREEN"), "BLUE"),
    (fixed(2), "abc"),
    (record("Inner", fld("x", "int")), {}),  # the field without a default is missing
])
def test_a_default_that_is_not_a_value_of_the_fields_type_is_refused(kind: Any,
                                                                     default: Any) -> None:
    with pytest.raises(InvalidSchemaError, match=r"the default .* of field 'f' is not a"):
        one_field(kind, default=default)


def test_a_union_default_may_be_a_value_of_any_branch() -> None:  # Avro 1.12
    assert one_field(["null", "string"], default="none").canonical().endswith(
        '"default":"none"}]}')


@pytest.mark.parametrize("schema, wrong", [
    (record("R", fld("a", "int"), fld("a", "long")), "two fields named 'a'"),
    (["int", "string", "int"], "the union holds int twice"),
    (["null", ["int", "string"]], "cannot hold a union"),
    (record("R", fld("a", record("R", fld("b", "int")))), "'R' is defined twice"),
    (record("R", fld("a", enum("RED", "RED"))), "has a symbol twice"),
    (record("R", fld("a", enum("RED", default="BLUE"))), "not one of its symbols"),
    (record("R", fld("1a", "int")), "valid 'name'"),
    (record("R", fld("a", {"type": "array"})), "needs 'items'"),
    (record("R", fld("a", fixed(-1))), "needs a 'size'"),
    ({"type": "record", "name": "R"}, "needs a list of 'fields'"),
    (record("R", fld("a", "int", order="sideways")), "order"),
    (42, "is not a schema"),
])
def test_a_malformed_schema_is_refused_saying_why(schema: Any, wrong: str) -> None:
    with pytest.raises(InvalidSchemaError, match=wrong):
        avro(schema)


def test_a_logical_type_that_does_not_fit_its_type_is_ignored_as_java_does() -> None:
    no_precision = avro({"type": "bytes", "logicalType": "decimal"})
    date_on_string = avro({"type": "string", "logicalType": "date"})
    assert avro_arrow_type(no_precision) == pa.binary()
    assert avro_arrow_type(date_on_string) == pa.string()


# -- canonical text --------------------------------------------------------------------------

def test_the_same_schema_written_differently_has_one_canonical_text() -> None:
    compact = ('{"type":"record","name":"Payment","namespace":"shop","fields":[{"name":"id",'
               '"type":"string"},{"name":"note","type":["null",{"type":"string"}],'
               '"default":null},{"name":"key","type":{"type":"string","logicalType":"uuid",'
               '"connect.name":"k"}}]}')
    spaced = """{
        "fields": [
            {"type": {"type": "string"}, "name": "id"},
            {"default": null, "name": "note", "type": ["null", "string"]},
            {"name": "key", "type": {"connect.name": "k", "logicalType": "uuid",
                                     "type": "string"}}
        ],
        "name": "shop.Payment",
        "type": "record"
    }"""
    assert parse_avro(compact, {}).canonical() == parse_avro(spaced, {}).canonical()
    assert parse_avro(compact, {}) == parse_avro(spaced, {})


def test_the_canonical_text_is_java_s_compact_json() -> None:
    schema = avro(record("Payment", fld("id", "string"),
                         fld("billing", record("Address", fld("city", "string"))),
                         fld("shipping", "Address"), namespace="shop"))
    assert schema.canonical() == (
        '{"type":"record","name":"Payment","namespace":"shop","fields":['
        '{"name":"id","type":"string"},'
        '{"name":"billing","type":{"type":"record","name":"Address","fields":['
        '{"name":"city","type":"string"}]}},'
        '{"name":"shipping","type":"Address"}]}')


def test_the_canonical_text_parses_back_to_itself() -> None:
    schema = payment(fld("amount", {"type": "bytes", "logicalType": "decimal", "precision": 9,
                                    "scale": 2}, doc="in cents", default="\u0000"),
                     fld("kind", enum("CARD", "CASH", default="CASH"), aliases=["type"]))
    assert parse_avro(schema.canonical(), {}).canonical() == schema.canonical()


@pytest.mark.parametrize("changed", [
    payment(fld("amount", "long", doc="in cents")),  # a doc
    payment(fld("amount", "long", default=1)),  # a default
    avro(record("Payment", fld("currency", "string"), fld("id", "string"), namespace="shop")),
    avro(record("Payment", fld("id", "string"), fld("currency", "string"), namespace="bank")),
    payment(fld("amount", "long", **{"connect.name": "x"})),  # a property
])
def test_any_change_a_reader_could_notice_changes_the_canonical_text(
        changed: AvroSchema) -> None:
    assert changed.canonical() != payment(fld("amount", "long")).canonical()
    assert changed != payment(fld("amount", "long"))


# -- reader/writer resolution (reader = the new schema: backward) ----------------------------

def test_a_field_added_with_a_default_is_accepted_backward() -> None:
    assert payment(fld("amount", "long", default=0)).read_errors(payment()) == []


def test_a_field_added_without_a_default_is_refused_backward() -> None:
    assert payment(fld("amount", "long")).read_errors(payment()) == [
        "READER_FIELD_MISSING_DEFAULT_VALUE: field 'amount' at /fields/2: the reader has no "
        "default and the writer lacks it"]


def test_a_removed_field_is_accepted_backward() -> None:
    assert payment().read_errors(payment(fld("amount", "long"))) == []


@pytest.mark.parametrize("writer, reader", [
    ("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"),
    ("long", "double"), ("float", "double"), ("string", "bytes"), ("bytes", "string"),
])
def test_a_promoted_type_is_accepted(writer: str, reader: str) -> None:
    assert one_field(reader).read_errors(one_field(writer)) == []


@pytest.mark.parametrize("writer, reader", [
    ("long", "int"), ("double", "float"), ("float", "long"), ("int", "string"),
    ("boolean", "int"),
])
def test_a_narrowed_or_unrelated_type_is_refused(writer: str, reader: str) -> None:
    assert one_field(reader).read_errors(one_field(writer)) == [
        f"TYPE_MISMATCH at /fields/0/type: the reader's {reader} cannot read the writer's "
        f"{writer}"]


def test_an_enum_symbol_added_is_accepted_backward_and_refused_forward() -> None:
    old, new = one_field(enum("RED", "GREEN")), one_field(enum("RED", "GREEN", "BLUE"))
    assert new.read_errors(old) == []
    assert old.read_errors(new) == [
        "MISSING_ENUM_SYMBOLS at /fields/0/type/symbols: the reader's enum 'Colour' lacks the "
        "writer's symbols [BLUE] and has no default"]


def test_an_enum_symbol_removed_is_refused_unless_the_reader_has_a_default() -> None:
    old = one_field(enum("RED", "GREEN", "BLUE"))
    assert one_field(enum("RED", "GREEN")).read_errors(old) != []
    assert one_field(enum("RED", "GREEN", default="RED")).read_errors(old) == []


def test_a_union_branch_added_is_accepted_backward_and_refused_forward() -> None:
    old, new = one_field(["null", "string"]), one_field(["null", "string", "long"])
    assert new.read_errors(old) == []
    assert old.read_errors(new) == [
        "MISSING_UNION_BRANCH at /fields/0/type/2: the reader's union has no branch that reads "
        "the writer's long"]


def test_a_union_branch_removed_is_refused_backward() -> None:
    assert one_field(["null", "string"]).read_errors(one_field(["null", "string", "long"]))


def test_a_reader_union_reads_a_writer_type_one_of_its_branches_reads() -> None:
    assert one_field(["null", "long"]).read_errors(one_field("int")) == []
    assert one_field(["null", "string"]).read_errors(one_field("int")) != []


def test_a_writer_union_needs_every_branch_readable() -> None:
    assert one_field("string").read_errors(one_field(["null", "string"])) == [
        "TYPE_MISMATCH at /fields/0/type/0: the reader's string cannot read the writer's null"]


def test_a_fixed_size_change_is_refused() -> None:
    assert one_field(fixed(32)).read_errors(one_field(fixed(16))) == [
        "FIXED_SIZE_MISMATCH at /fields/0/type/size: the reader's fixed 'Hash' holds 32 bytes, "
        "the writer's 16"]


def test_a_fixed_renamed_is_refused() -> None:
    errors = one_field(fixed(16, "Digest")).read_errors(one_field(fixed(16, "Hash")))
    assert errors == ["NAME_MISMATCH at /fields/0/type/name: the reader's 'Digest' is not the "
                      "writer's 'Hash' (by name or alias)"]


def test_a_renamed_record_is_refused_without_an_alias_and_accepted_with_one() -> None:
    old = avro(record("Payment", fld("id", "string"), namespace="shop"))
    renamed = avro(record("Charge", fld("id", "string"), namespace="shop"))
    aliased = avro(record("Charge", fld("id", "string"), namespace="shop",
                          aliases=["Payment"]))
    assert renamed.read_errors(old) == [
        "NAME_MISMATCH at /name: the reader's 'shop.Charge' is not the writer's "
        "'shop.Payment' (by name or alias)"]
    assert aliased.read_errors(old) == []


def test_a_record_moved_to_another_namespace_still_reads_as_java_does() -> None:
    old = avro(record("Payment", fld("id", "string"), namespace="shop"))
    assert avro(record("Payment", fld("id", "string"), namespace="bank")).read_errors(old) == []


def test_a_renamed_field_is_read_through_its_alias() -> None:
    old = avro(record("R", fld("total", "long")))
    assert avro(record("R", fld("amount", "long"))).read_errors(old) != []
    assert avro(record("R", fld("amount", "long", aliases=["total"]))).read_errors(old) == []


def test_a_nested_record_change_is_refused_at_its_path() -> None:
    def order(city: Any) -> AvroSchema:
        return avro(record("Order", fld("id", "string"),
                           fld("to", record("Address", fld("street", "string"),
                                            fld("city", city)))))

    assert order("long").read_errors(order("int")) == []
    assert order("int").read_errors(order("long")) == [
        "TYPE_MISMATCH at /fields/1/type/fields/1/type: the reader's int cannot read the "
        "writer's long"]


def test_array_items_and_map_values_are_resolved_recursively() -> None:
    def holder(kind: str) -> AvroSchema:
        return avro(record("R", fld("a", {"type": "array", "items": kind}),
                           fld("m", {"type": "map", "values": kind})))

    assert holder("long").read_errors(holder("int")) == []
    assert holder("int").read_errors(holder("long")) == [
        "TYPE_MISMATCH at /fields/0/type/items: the reader's int cannot read the writer's long",
        "TYPE_MISMATCH at /fields/1/type/values: the reader's int cannot read the writer's "
        "long"]


def test_a_record_cannot_read_an_array() -> None:
    errors = avro(record("R", fld("a", "int"))).read_errors(avro({"type": "array",
                                                                   "items": "int"}))
    assert errors == ["TYPE_MISMATCH at /: the reader's record 'R' cannot read the writer's "
                      "array"]


# -- compatibility levels (deltabus.schemas.check_compatibility) -----------------------------

def test_backward_refuses_a_field_added_without_a_default_that_forward_accepts() -> None:
    live, new = [payment()], payment(fld("amount", "long"))
    assert check_compatibility(Compatibility.BACKWARD, new, live) != []
    assert check_compatibility(Compatibility.FORWARD, new, live) == []
    assert check_compatibility(Compatibility.FULL, new, live) != []


def test_forward_refuses_removing_a_field_without_a_default_that_backward_accepts() -> None:
    live, new = [payment(fld("amount", "long"))], payment()
    assert check_compatibility(Compatibility.FORWARD, new, live) != []
    assert check_compatibility(Compatibility.BACKWARD, new, live) == []
    assert check_compatibility(Compatibility.FULL, new, live) != []


def test_full_accepts_a_field_added_with_a_default() -> None:
    assert check_compatibility(Compatibility.FULL, payment(fld("amount", "long", default=0)),
                               [payment()]) == []


V1 = payment()
V2 = payment(fld("amount", "long", default=0))
V3 = payment(fld("amount", "long"))  # reads V2's data, not V1's


@pytest.mark.parametrize("level, live, new", [
    # V3 reads V2's data (the latest), not V1's (the first)
    (Compatibility.BACKWARD_TRANSITIVE, [V1, V2], V3),
    # the latest, V2, reads V1's data (amount has a default); the first, V3, does not
    (Compatibility.FORWARD_TRANSITIVE, [V3, V2], V1),
    (Compatibility.FULL_TRANSITIVE, [V1, V2], V3),
])
def test_an_evolution_compatible_with_the_latest_only_is_refused_transitively(
        level: Compatibility, live: list[AvroSchema], new: AvroSchema) -> None:
    latest_only = Compatibility(level.name.removesuffix("_TRANSITIVE"))
    assert check_compatibility(latest_only, new, live) == []
    assert check_compatibility(level, new, live) != []


def test_none_accepts_any_change() -> None:
    assert check_compatibility(Compatibility.NONE, avro("string"), [avro("int")]) == []
    assert check_compatibility(Compatibility.BACKWARD, avro("string"), [avro("int")]) != []


# -- references and recursion ----------------------------------------------------------------

ADDRESS = json.dumps(record("Address", fld("city", "string"), namespace="com.acme"))


def test_a_record_may_use_a_named_type_defined_in_a_reference() -> None:
    customer = avro(record("Customer", fld("name", "string"), fld("home", "com.acme.Address"),
                           namespace="com.acme"), {"com.acme.Address": ADDRESS})
    assert customer.canonical().endswith('{"name":"home","type":"Address"}]}')
    row = {"name": "Ada", "home": {"city": "London"}}
    assert decode_avro(customer, encode_avro(customer, [row])).to_pylist() == [row]


def test_a_reference_may_use_another_reference_given_in_any_order() -> None:
    person = json.dumps(record("Person", fld("home", "com.acme.Address"), namespace="com.acme"))
    refs = {"com.acme.Person": person, "com.acme.Address": ADDRESS}
    team = avro(record("Team", fld("lead", "com.acme.Person")), refs)
    assert avro_arrow_schema(team).field("lead").type == pa.struct(
        [pa.field("home", pa.struct([pa.field("city", pa.string())]))])


def test_a_reference_named_otherwise_than_its_type_still_defines_it() -> None:
    person = json.dumps(record("Person", fld("home", "com.acme.Address"), namespace="com.acme"))
    team = avro(record("Team", fld("lead", "com.acme.Person")),
                {"person": person, "address": ADDRESS})
    assert avro_arrow_schema(team).names == ["lead"]


def test_a_type_no_reference_defines_is_unknown() -> None:
    with pytest.raises(InvalidSchemaError, match="unknown type 'com.acme.Address'"):
        avro(record("Customer", fld("home", "com.acme.Address")))


LINKED = record("Node", fld("value", "long"), fld("next", ["null", "Node"], default=None))


def test_a_recursive_record_parses_checks_and_encodes_without_looping() -> None:
    node = avro(LINKED)
    assert node.read_errors(node) == []
    grown = avro(record("Node", fld("value", "long"), fld("next", ["null", "Node"]),
                        fld("label", "string")))
    assert grown.read_errors(node) == [
        "READER_FIELD_MISSING_DEFAULT_VALUE: field 'label' at /fields/2: the reader has no "
        "default and the writer lacks it"]
    encoded = encode_avro(node, [{"value": 1, "next": {"value": 2, "next": None}}])
    assert fastavro.schemaless_reader(io.BytesIO(encoded[0]), fastavro.parse_schema(LINKED),
                                      None) == {"value": 1, "next": {"value": 2, "next": None}}


def test_a_recursive_record_has_no_column_type() -> None:
    with pytest.raises(InvalidSchemaError, match="recursive record"):
        avro_arrow_type(avro(LINKED))


# -- Arrow types -----------------------------------------------------------------------------

@pytest.mark.parametrize("schema, arrow", [
    ("null", pa.null()),
    ("boolean", pa.bool_()),
    ("int", pa.int32()),
    ("long", pa.int64()),
    ("float", pa.float32()),
    ("double", pa.float64()),
    ("bytes", pa.binary()),
    ("string", pa.string()),
    (enum("RED"), pa.string()),
    (fixed(16), pa.binary()),
    ({"type": "array", "items": "int"}, pa.list_(pa.int32())),
    ({"type": "map", "values": "long"}, pa.map_(pa.string(), pa.int64())),
    (record("R", fld("a", "int"), fld("b", ["null", "string"])),
     pa.struct([pa.field("a", pa.int32()), pa.field("b", pa.string())])),
    (["null", "double"], pa.float64()),
    (["string", "null"], pa.string()),
    (["null", "int", "string", record("P", fld("x", "int"))],
     pa.struct([pa.field("int", pa.int32()), pa.field("string", pa.string()),
                pa.field("P", pa.struct([pa.field("x", pa.int32())]))])),
    ({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
     pa.decimal128(10, 2)),
    (fixed(8, logicalType="decimal", precision=18, scale=4), pa.decimal128(18, 4)),
    ({"type": "int", "logicalType": "date"}, pa.date32()),
    ({"type": "long", "logicalType": "timestamp-millis"}, pa.timestamp("us", tz="UTC")),
    ({"type": "long", "logicalType": "timestamp-micros"}, pa.timestamp("us", tz="UTC")),
    ({"type": "long", "logicalType": "local-timestamp-millis"}, pa.timestamp("us")),
    ({"type": "long", "logicalType": "local-timestamp-micros"}, pa.timestamp("us")),
    ({"type": "int", "logicalType": "time-millis"}, pa.int32()),
    ({"type": "long", "logicalType": "time-micros"}, pa.int64()),
    ({"type": "string", "logicalType": "uuid"}, pa.string()),
])
def test_each_avro_type_maps_to_the_arrow_type_delta_stores(schema: Any,
                                                            arrow: pa.DataType) -> None:
    assert avro_arrow_type(avro(schema)) == arrow


def test_a_top_level_record_gives_its_fields_as_nullable_columns() -> None:
    columns = avro_arrow_schema(payment(fld("amount", "long")))
    assert columns.names == ["id", "currency", "amount"]
    assert all(f.nullable for f in columns)


def test_a_top_level_non_record_is_one_value_column() -> None:
    assert avro_arrow_schema(avro(["null", "long"])) == pa.schema([pa.field("value",
                                                                             pa.int64())])


@pytest.mark.parametrize("schema, why", [
    ({"type": "bytes", "logicalType": "decimal", "precision": 39}, "more than 38 digits"),
    (record("Empty"), "no fields"),
    ([], "empty union"),
])
def test_a_type_delta_cannot_store_has_no_column_type(schema: Any, why: str) -> None:
    with pytest.raises(InvalidSchemaError, match=why):
        avro_arrow_type(avro(schema))


# -- decoding and encoding -------------------------------------------------------------------

EVENT = record(
    "Event",
    fld("id", "string"),
    fld("to", record("Address", fld("city", "string"), fld("zip", ["null", "int"]))),
    fld("tags", {"type": "array", "items": "string"}),
    fld("counts", {"type": "map", "values": "long"}),
    fld("colour", enum("RED", "GREEN")),
    fld("note", ["null", "string"], default=None),
    fld("either", ["null", "long", "string", "Address"]),
    fld("amount", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}),
    fld("day", {"type": "int", "logicalType": "date"}),
    fld("at", {"type": "long", "logicalType": "timestamp-millis"}),
    fld("local", {"type": "long", "logicalType": "local-timestamp-micros"}),
    fld("hash", fixed(4)),
    fld("took", {"type": "int", "logicalType": "time-millis"}),
    fld("key", {"type": "string", "logicalType": "uuid"}),
    namespace="shop",
)
KEY = uuid.UUID("6f1c2c5e-8d3a-4a55-9f0e-1a2b3c4d5e6f")
ROWS: list[dict[str, Any]] = [
    {"id": "a", "to": {"city": "Paris", "zip": 75001}, "tags": ["x", "y"],
     "counts": {"k": 1, "l": 2}, "colour": "GREEN", "note": None, "either": 7,
     "amount": decimal.Decimal("12.34"), "day": datetime.date(2024, 2, 29),
     "at": datetime.datetime(2024, 2, 29, 12, 0, 1, 123000, tzinfo=UTC),
     "local": datetime.datetime(2024, 2, 29, 12, 0, 1, 123456), "hash": b"\x00\x01\x02\x03",
     "took": datetime.time(0, 0, 1, 500000), "key": KEY},
    {"id": "b", "to": {"city": "Lyon", "zip": None}, "tags": [], "counts": {},
     "colour": "RED", "note": "hi", "either": {"city": "Nice", "zip": 6000},
     "amount": decimal.Decimal("-0.50"), "day": datetime.date(1970, 1, 1),
     "at": datetime.datetime(1970, 1, 1, tzinfo=UTC), "local": datetime.datetime(1999, 12, 31),
     "hash": b"abcd", "took": 0, "key": str(KEY)},
    {"id": "c", "to": {"city": "Metz", "zip": 57000}, "tags": ["z"], "counts": {"m": -1},
     "colour": "RED", "note": None, "either": "text", "amount": decimal.Decimal("0.00"),
     "day": datetime.date(2000, 1, 1), "at": datetime.datetime(2000, 1, 1, tzinfo=UTC),
     "local": datetime.datetime(2000, 1, 1), "hash": b"wxyz", "took": 1, "key": KEY},
]


def fastavro_encoded(schema: Any, rows: list[Any]) -> list[bytes]:
    """Each row as fastavro writes it (Avro binary, no header): the reference encoding."""
    parsed = fastavro.parse_schema(schema)
    out = []
    for row in rows:
        stream = io.BytesIO()
        fastavro.schemaless_writer(stream, parsed, row)
        out.append(stream.getvalue())
    return out


def test_records_fastavro_encoded_decode_to_the_typed_columns() -> None:
    schema = avro(EVENT)
    table = decode_avro(schema, fastavro_encoded(EVENT, ROWS))
    assert table.schema == avro_arrow_schema(schema)
    first, second, third = table.to_pylist()
    assert first["to"] == {"city": "Paris", "zip": 75001}
    assert first["tags"] == ["x", "y"] and first["counts"] == [("k", 1), ("l", 2)]
    assert first["colour"] == "GREEN" and first["note"] is None and second["note"] == "hi"
    assert [r["either"] for r in (first, second, third)] == [
        {"long": 7, "string": None, "Address": None},
        {"long": None, "string": None, "Address": {"city": "Nice", "zip": 6000}},
        {"long": None, "string": "text", "Address": None}]
    assert first["amount"] == decimal.Decimal("12.34")
    assert second["amount"] == decimal.Decimal("-0.50")
    assert first["day"] == datetime.date(2024, 2, 29)
    assert first["at"] == datetime.datetime(2024, 2, 29, 12, 0, 1, 123000, tzinfo=UTC)
    assert first["local"] == datetime.datetime(2024, 2, 29, 12, 0, 1, 123456)
    assert first["hash"] == b"\x00\x01\x02\x03"
    assert [r["took"] for r in (first, second, third)] == [1500, 0, 1]
    assert first["key"] == second["key"] == str(KEY)


def test_encode_gives_the_bytes_fastavro_gives_and_decode_reads_them_back() -> None:
    schema = avro(EVENT)
    encoded = encode_avro(schema, ROWS)
    assert encoded == fastavro_encoded(EVENT, ROWS)
    assert decode_avro(schema, encoded) == decode_avro(schema, fastavro_encoded(EVENT, ROWS))


def test_decoded_columns_append_to_a_delta_table(tmp_path: Any) -> None:
    table = decode_avro(avro(EVENT), fastavro_encoded(EVENT, ROWS))
    write_deltalake(str(tmp_path), table)
    back = DeltaTable(str(tmp_path)).to_pyarrow_table()
    assert back.num_rows == 3
    assert back.column("amount").to_pylist() == table.column("amount").to_pylist()


def test_a_non_record_schema_encodes_and_decodes_its_value_column() -> None:
    schema = avro(["null", "string"])
    table = decode_avro(schema, encode_avro(schema, [{"value": "a"}, {"value": None}]))
    assert table.to_pydict() == {"value": ["a", None]}


def test_a_payload_that_does_not_decode_is_refused_naming_its_record() -> None:
    good = fastavro_encoded(EVENT, ROWS[:1])[0]
    with pytest.raises(ValueError, match="record 1 does not decode with the schema"):
        decode_avro(avro(EVENT), [good, good[:7]])


def test_a_payload_with_bytes_left_over_is_refused_naming_its_record() -> None:
    schema = avro(record("R", fld("a", "int")))
    with pytest.raises(ValueError, match="record 2 has 1 bytes left"):
        decode_avro(schema, [b"\x02", b"\x04", b"\x06\x00"])


def test_a_row_that_does_not_fit_the_schema_is_refused_naming_its_row() -> None:
    with pytest.raises(ValueError, match="row 1 does not fit the schema"):
        encode_avro(avro(EVENT), [ROWS[0], {**ROWS[1], "colour": "BLUE"}])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.fixed_dictionaries({
    "n": st.integers(-(2**63), 2**63 - 1),
    "i": st.integers(-(2**31), 2**31 - 1),
    "s": st.text(),
    "b": st.binary(),
    "d": st.floats(allow_nan=False),
    "o": st.none() | st.text(),
}), max_size=20))
def test_a_batch_decodes_to_the_rows_encoded(rows: list[dict[str, Any]]) -> None:
    schema = avro(record("P", fld("n", "long"), fld("i", "int"), fld("s", "string"),
                         fld("b", "bytes"), fld("d", "double"), fld("o", ["null", "string"])))
    assert decode_avro(schema, encode_avro(schema, rows)).to_pylist() == rows
