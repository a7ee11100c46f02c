"""JSON Schema in the schema registry: parsing as Confluent does, canonical text, Confluent's
reader/writer compatibility rules, and the typed columns a JSON Schema topic decodes into."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pytest

from deltabus.schemas import (
    Compatibility,
    InvalidSchemaError,
    SchemaType,
    check_compatibility,
    parse,
    split_wire,
    wire_header,
)
from deltabus.schemas.json_schema import (
    JsonSchema,
    decode_json,
    encode_json,
    json_arrow_schema,
    json_arrow_type,
    parse_json_schema,
)

DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT2020 = "https://json-schema.org/draft/2020-12/schema"


def schema(contents: Any, references: dict[str, Any] | None = None) -> JsonSchema:
    texts = {name: json.dumps(ref) for name, ref in (references or {}).items()}
    return parse_json_schema(json.dumps(contents), texts)


def record(properties: dict[str, Any], required: tuple[str, ...] = (), closed: bool = False,
           **extra: Any) -> dict[str, Any]:
    """An object schema; `closed`: additionalProperties false."""
    contents: dict[str, Any] = {"type": "object", "properties": properties, **extra}
    if required:
        contents["required"] = list(required)
    if closed:
        contents["additionalProperties"] = False
    return contents


def problems(reader: Any, writer: Any) -> list[str]:
    """What stops data written with `writer` from being read with `reader`."""
    return schema(reader).read_errors(schema(writer))


def names(lines: list[str]) -> list[str]:
    """The Confluent difference names at the end of each line."""
    return [line.rsplit("(", 1)[1].rstrip(")") for line in lines]


# -- parsing -----------------------------------------------------------------------------------


def test_text_that_is_not_json_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match="the schema is not JSON"):
        parse_json_schema('{"type": "object",', {})


def test_nan_is_not_json_and_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match="not JSON"):
        parse_json_schema('{"type": "number", "maximum": NaN}', {})


def test_json_that_is_neither_object_nor_boolean_is_not_a_schema() -> None:
    with pytest.raises(InvalidSchemaError, match="not a JSON Schema.*not array"):
        parse_json_schema("[1, 2]", {})


def test_a_schema_invalid_against_its_metaschema_is_refused_naming_the_path() -> None:
    with pytest.raises(InvalidSchemaError, match=r"draft-07.*#/properties/name/type"):
        schema(record({"name": {"type": "strin"}}))


def test_an_invalid_regex_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match="regex"):
        schema({"type": "string", "pattern": "["})


def test_the_dollar_schema_picks_the_draft_and_draft_7_is_the_default() -> None:
    draft4_bounds = {"type": "number", "maximum": 5, "exclusiveMaximum": True}
    with pytest.raises(InvalidSchemaError, match="draft-07"):
        schema(draft4_bounds)  # draft 7: exclusiveMaximum is a number
    assert schema({"$schema": DRAFT4, **draft4_bounds}).read_errors(
        schema({"$schema": DRAFT4, **draft4_bounds})) == []


def test_an_unknown_dollar_schema_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match="unknown \\$schema"):
        schema({"$schema": "http://json-schema.org/draft-03/schema#"})


def test_a_ref_that_resolves_nowhere_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match="'address.json' does not resolve"):
        schema(record({"home": {"$ref": "address.json"}}))
    with pytest.raises(InvalidSchemaError, match="does not resolve"):
        schema(record({"home": {"$ref": "#/definitions/address"}}))


def test_a_loop_of_refs_that_never_reaches_a_schema_is_refused() -> None:
    looping = record({"x": {"$ref": "#/definitions/a"}}, definitions={
        "a": {"$ref": "#/definitions/b"}, "b": {"$ref": "#/definitions/a"}})
    with pytest.raises(InvalidSchemaError, match="loop"):
        schema(looping)


def test_a_reference_that_is_not_a_valid_schema_is_refused_naming_it() -> None:
    with pytest.raises(InvalidSchemaError, match="reference 'address.json' is not JSON"):
        parse_json_schema(json.dumps({"$ref": "address.json"}), {"address.json": "{"})
    with pytest.raises(InvalidSchemaError, match="reference 'address.json' is not a valid"):
        schema({"$ref": "address.json"}, {"address.json": {"type": 5}})


def test_canonical_text_is_the_same_across_whitespace_and_key_order() -> None:
    one = parse_json_schema('{"type": "object",\n  "properties": {"a": {"type": "string"}}}', {})
    two = parse_json_schema('{"properties":{"a":{"type":"string"}},"type":"object"}', {})
    assert one.canonical() == two.canonical() == \
        '{"properties":{"a":{"type":"string"}},"type":"object"}'
    assert one == two and hash(one) == hash(two)
    other = parse_json_schema('{"properties":{"a":{"type":"integer"}},"type":"object"}', {})
    assert other.canonical() != one.canonical() and other != one


def test_parse_from_schemas_gives_a_json_schema() -> None:
    parsed = parse(SchemaType.JSON, '{"type": "string"}', {})
    assert isinstance(parsed, JsonSchema)
    assert parsed.schema_type == SchemaType.JSON


# -- compatibility: objects --------------------------------------------------------------------


def test_optional_property_added_to_a_closed_model_is_compatible() -> None:
    writer = record({"a": {"type": "string"}}, closed=True)
    reader = record({"a": {"type": "string"}, "b": {"type": "integer"}}, closed=True)
    assert problems(reader, writer) == []


def test_property_added_to_an_open_model_is_refused() -> None:
    writer = record({"a": {"type": "string"}})
    reader = record({"a": {"type": "string"}, "b": {"type": "integer"}})
    assert problems(reader, writer) == [
        "#/properties/b: optional property 'b' added to an open content model: the writer may "
        "have written any value under that name (OPTIONAL_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL)"]


def test_property_with_an_empty_schema_added_to_an_open_model_is_compatible() -> None:
    writer = record({"a": {"type": "string"}})
    assert problems(record({"a": {"type": "string"}, "b": {}}), writer) == []


def test_required_property_added_is_refused_unless_it_has_a_default() -> None:
    writer = record({"a": {"type": "string"}}, closed=True)
    required = record({"a": {"type": "string"}, "b": {"type": "integer"}}, ("b",), closed=True)
    assert names(problems(required, writer)) == ["REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL"]
    with_default = record({"a": {"type": "string"}, "b": {"type": "integer", "default": 0}},
                          ("b",), closed=True)
    assert problems(with_default, writer) == []


def test_existing_property_made_required_is_refused() -> None:
    writer = record({"a": {"type": "string"}})
    found = problems(record({"a": {"type": "string"}}, ("a",)), writer)
    assert found == ["#/required/a: property 'a' made required: the writer may omit it "
                     "(REQUIRED_ATTRIBUTE_ADDED)"]
    assert problems(writer, record({"a": {"type": "string"}}, ("a",))) == []


def test_property_removed_is_refused_by_a_closed_reader_and_read_by_an_open_one() -> None:
    writer = record({"a": {"type": "string"}, "b": {"type": "integer"}}, closed=True)
    closed_reader = record({"a": {"type": "string"}}, closed=True)
    assert names(problems(closed_reader, writer)) == ["PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL"]
    assert problems(record({"a": {"type": "string"}}), writer) == []


def test_additional_properties_removed_is_refused() -> None:
    writer = record({"a": {"type": "string"}})
    found = problems(record({"a": {"type": "string"}}, closed=True), writer)
    assert found == ["#/additionalProperties: additional properties removed: the writer allows "
                     "them (ADDITIONAL_PROPERTIES_REMOVED)"]
    assert problems(writer, record({"a": {"type": "string"}}, closed=True)) == []


def test_a_property_added_must_read_what_a_partially_open_writer_allowed() -> None:
    writer = record({"a": {"type": "string"}}, additionalProperties={"type": "string"})
    fits = record({"a": {"type": "string"}, "b": {"type": "string"}},
                  additionalProperties={"type": "string"})
    assert problems(fits, writer) == []
    does_not = record({"a": {"type": "string"}, "b": {"type": "integer"}},
                      additionalProperties={"type": "string"})
    assert "PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL" in \
        names(problems(does_not, writer))


def test_a_nested_object_change_names_its_full_path() -> None:
    def customer(zip_type: str) -> dict[str, Any]:
        address = record({"zip": {"type": zip_type}}, closed=True)
        return record({"customer": record({"address": address}, closed=True)}, closed=True)
    assert problems(customer("integer"), customer("string")) == [
        "#/properties/customer/properties/address/properties/zip: type changed from string to "
        "integer (TYPE_CHANGED)"]
    assert problems(customer("string"), customer("string")) == []


# -- compatibility: types, strings, numbers, enums --------------------------------------------


def test_type_narrowed_is_refused_and_widened_is_compatible() -> None:
    def amount(kind: Any) -> dict[str, Any]:
        return record({"amount": {"type": kind}}, closed=True)
    assert problems(amount("integer"), amount("number")) == [
        "#/properties/amount: type narrowed from number to integer (TYPE_NARROWED)"]
    assert problems(amount("number"), amount("integer")) == []  # TYPE_EXTENDED
    assert problems(amount(["string", "null"]), amount("string")) == []
    assert names(problems(amount("string"), amount(["string", "null"]))) == ["TYPE_NARROWED"]
    assert names(problems(amount("string"), amount("integer"))) == ["TYPE_CHANGED"]


def test_an_untyped_writer_read_by_a_typed_reader_is_narrowed() -> None:
    assert names(problems({"type": "string"}, {})) == ["TYPE_NARROWED"]
    assert problems({}, {"type": "string"}) == []


@pytest.mark.parametrize(("writer", "reader", "expected"), [
    ({"maxLength": 10}, {"maxLength": 5}, "MAX_LENGTH_DECREASED"),
    ({"maxLength": 5}, {"maxLength": 10}, None),
    ({}, {"maxLength": 5}, "MAX_LENGTH_ADDED"),
    ({"maxLength": 5}, {}, None),
    ({"minLength": 1}, {"minLength": 3}, "MIN_LENGTH_INCREASED"),
    ({"minLength": 3}, {"minLength": 1}, None),
    ({}, {"pattern": "^a"}, "PATTERN_ADDED"),
    ({"pattern": "^a"}, {"pattern": "^b"}, "PATTERN_CHANGED"),
    ({"pattern": "^a"}, {}, None),
])
def test_string_limits(writer: dict[str, Any], reader: dict[str, Any],
                       expected: str | None) -> None:
    found = problems({"type": "string", **reader}, {"type": "string", **writer})
    assert names(found) == ([expected] if expected else [])


@pytest.mark.parametrize(("writer", "reader", "expected"), [
    ({"maximum": 10}, {"maximum": 5}, "MAXIMUM_DECREASED"),
    ({"maximum": 5}, {"maximum": 10}, None),
    ({}, {"minimum": 0}, "MINIMUM_ADDED"),
    ({"minimum": 5}, {"minimum": 0}, None),
    ({"exclusiveMinimum": 0}, {"minimum": 0}, None),
    ({"minimum": 0}, {"exclusiveMinimum": 0}, "EXCLUSIVE_MINIMUM_INCREASED"),
    ({"multipleOf": 10}, {"multipleOf": 5}, None),
    ({"multipleOf": 5}, {"multipleOf": 10}, "MULTIPLE_OF_EXPANDED"),
    ({"multipleOf": 0.5}, {"multipleOf": 0.2}, "MULTIPLE_OF_CHANGED"),
    ({}, {"multipleOf": 2}, "MULTIPLE_OF_ADDED"),
])
def test_number_limits(writer: dict[str, Any], reader: dict[str, Any],
                       expected: str | None) -> None:
    found = problems({"type": "number", **reader}, {"type": "number", **writer})
    assert names(found) == ([expected] if expected else [])


@pytest.mark.parametrize(("writer", "reader", "expected"), [
    ({}, {"not": {"type": "null"}}, "NOT_TYPE_EXTENDED"),
    ({"not": {"type": "null"}}, {}, None),
    ({"not": {"enum": ["a"]}}, {"not": {"enum": ["a", "b"]}}, "NOT_TYPE_EXTENDED"),
    ({"not": {"enum": ["a", "b"]}}, {"not": {"enum": ["a"]}}, None),
    ({"type": "array"}, {"type": "array", "uniqueItems": True}, "UNIQUE_ITEMS_ADDED"),
    ({"type": "array", "uniqueItems": True}, {"type": "array"}, None),
    ({"type": "object"}, {"type": "object", "minProperties": 1}, "MIN_PROPERTIES_ADDED"),
    ({"type": "object", "maxProperties": 3}, {"type": "object", "maxProperties": 2},
     "MAX_PROPERTIES_DECREASED"),
    ({"type": "object"}, {"type": "object", "dependencies": {"a": ["b"]}},
     "DEPENDENCY_ARRAY_ADDED"),
    ({"type": "object", "dependencies": {"a": ["b"]}},
     {"type": "object", "dependencies": {"a": ["b", "c"]}}, "DEPENDENCY_ARRAY_EXTENDED"),
    ({"type": "object", "dependencies": {"a": ["b", "c"]}},
     {"type": "object", "dependencies": {"a": ["b"]}}, None),
])
def test_other_keywords(writer: dict[str, Any], reader: dict[str, Any],
                        expected: str | None) -> None:
    assert names(problems(reader, writer)) == ([expected] if expected else [])


def test_draft_4_exclusive_bounds_compare_as_bounds() -> None:
    def bounded(exclusive: bool) -> dict[str, Any]:
        return {"$schema": DRAFT4, "type": "number", "maximum": 5, "exclusiveMaximum": exclusive}
    assert names(problems(bounded(True), bounded(False))) == ["EXCLUSIVE_MAXIMUM_DECREASED"]
    assert problems(bounded(False), bounded(True)) == []


def test_enum_narrowed_is_refused_and_extended_is_compatible() -> None:
    def status(*values: str) -> dict[str, Any]:
        return {"type": "string", "enum": list(values)}
    assert problems(status("a", "b"), status("a", "b", "c")) == [
        "#/enum: enum narrowed: the reader refuses ['c'] (ENUM_ARRAY_NARROWED)"]
    assert problems(status("a", "b", "c"), status("a", "b")) == []
    assert names(problems(status("a", "c"), status("a", "b"))) == ["ENUM_ARRAY_CHANGED"]
    assert names(problems(status("a"), {"type": "string"})) == ["ENUM_ARRAY_NARROWED"]


def test_a_writers_enum_is_checked_value_by_value() -> None:
    assert problems({"type": "string"}, {"enum": ["a", "b"]}) == []
    assert problems({"type": "string", "maxLength": 3}, {"enum": ["abc"]}) == []
    assert names(problems({"type": "string", "maxLength": 2}, {"enum": ["abc"]})) == [
        "ENUM_ARRAY_NARROWED"]
    assert names(problems({"type": "integer"}, {"const": "x"})) == ["ENUM_ARRAY_NARROWED"]


# -- compatibility: arrays ----------------------------------------------------------------------


def test_array_items_narrowed_are_refused_and_widened_are_compatible() -> None:
    def numbers(kind: Any, **limits: Any) -> dict[str, Any]:
        return record({"xs": {"type": "array", "items": {"type": kind}, **limits}}, closed=True)
    assert problems(numbers("integer"), numbers("number")) == [
        "#/properties/xs/items: type narrowed from number to integer (TYPE_NARROWED)"]
    assert problems(numbers("number"), numbers("integer")) == []
    assert names(problems(numbers("number", maxItems=3), numbers("number", maxItems=5))) == [
        "MAX_ITEMS_DECREASED"]
    assert names(problems({"type": "array", "items": {"type": "string"}}, {"type": "array"})) \
        == ["SCHEMA_ADDED"]


def test_tuple_items_against_a_closed_rest_of_items() -> None:
    pair = {"type": "array", "items": [{"type": "string"}, {"type": "integer"}],
            "additionalItems": False}
    triple = {"type": "array", "items": [{"type": "string"}, {"type": "integer"},
                                         {"type": "boolean"}], "additionalItems": False}
    assert problems(triple, pair) == []  # ITEM_ADDED_TO_CLOSED_CONTENT_MODEL
    assert names(problems(pair, triple)) == ["ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL"]


# -- compatibility: combined schemas and $refs --------------------------------------------------


STRING, INTEGER, NULL = {"type": "string"}, {"type": "integer"}, {"type": "null"}


def test_combined_schema_unchanged_or_with_a_branch_added_is_compatible() -> None:
    assert problems({"oneOf": [STRING, INTEGER]}, {"oneOf": [STRING, INTEGER]}) == []
    assert problems({"oneOf": [STRING, INTEGER, NULL]}, {"oneOf": [STRING, INTEGER]}) == []
    assert problems({"oneOf": [INTEGER, STRING]}, {"oneOf": [STRING, INTEGER]}) == []
    assert problems({"anyOf": [STRING, INTEGER]}, {"oneOf": [STRING, INTEGER]}) == []
    assert problems({"anyOf": [STRING, INTEGER]}, STRING) == []  # SUM_TYPE_EXTENDED
    assert problems({"anyOf": [STRING, NULL]}, {"type": ["string", "null"]}) == []


def test_combined_schema_with_a_branch_removed_or_changed_is_refused() -> None:
    assert names(problems({"oneOf": [STRING]}, {"oneOf": [STRING, INTEGER]})) == [
        "SUM_TYPE_NARROWED"]
    changed = problems({"oneOf": [STRING, {"type": "integer", "maximum": 5}]},
                       {"oneOf": [STRING, INTEGER]})
    assert changed == ["#/oneOf/1/maximum: maximum 5 added (MAXIMUM_ADDED)"]
    assert names(problems({"oneOf": [STRING, INTEGER]}, {"anyOf": [STRING, INTEGER]})) == [
        "COMBINED_TYPE_CHANGED"]
    assert names(problems({"allOf": [STRING, {"maxLength": 3}]}, {"allOf": [STRING]})) == [
        "PRODUCT_TYPE_EXTENDED"]
    assert names(problems({"anyOf": [STRING, NULL]}, INTEGER)) == ["TYPE_CHANGED"]


def test_an_allof_reader_must_read_with_every_conjunct() -> None:
    writer = {"type": "string", "maxLength": 3}
    assert problems({"allOf": [STRING, {"maxLength": 5}]}, writer) == []
    assert problems({"allOf": [STRING, {"maxLength": 2}]}, writer) == [
        "#/allOf/1/maxLength: maxLength decreased from 3 to 2 (MAX_LENGTH_DECREASED)"]


def test_an_allof_writer_is_read_when_one_conjunct_is() -> None:
    reader = {"type": "string", "maxLength": 5}
    assert problems(reader, {"allOf": [{"type": "string", "maxLength": 3}, {"minLength": 1}]}) \
        == []
    assert names(problems(reader, {"allOf": [STRING, {"minLength": 1}]})) == ["MAX_LENGTH_ADDED"]


def test_local_refs_are_followed() -> None:
    def with_address(zip_type: str) -> dict[str, Any]:
        address = record({"zip": {"type": zip_type}}, closed=True)
        return record({"home": {"$ref": "#/definitions/address"}}, closed=True,
                      definitions={"address": address})
    assert problems(with_address("integer"), with_address("string")) == [
        "#/properties/home/properties/zip: type changed from string to integer (TYPE_CHANGED)"]
    inline = record({"home": record({"zip": {"type": "string"}}, closed=True)}, closed=True)
    assert problems(with_address("string"), inline) == []


def test_refs_to_a_referenced_schema_resolve_by_name() -> None:
    order = record({"home": {"$ref": "address.json"}}, ("home",), closed=True)
    address_v1 = record({"zip": {"type": "string"}}, ("zip",), closed=True)
    address_v2 = record({"zip": {"type": "string", "maxLength": 5}}, ("zip",), closed=True)
    v1 = schema(order, {"address.json": address_v1})
    v2 = schema(order, {"address.json": address_v2})
    assert v1.read_errors(v1) == []
    assert v2.read_errors(v1) == [
        "#/properties/home/properties/zip/maxLength: maxLength 5 added (MAX_LENGTH_ADDED)"]
    with pytest.raises(ValueError, match="record 0 .*#/home/zip"):
        decode_json(v1, [b'{"home": {"zip": 75001}}'])
    assert v1.reference_texts == (("address.json", json.dumps(address_v1, sort_keys=True,
                                                              separators=(",", ":"))),)


def test_a_reference_resolves_relative_to_the_schemas_id() -> None:
    order = {"$id": "https://example.com/schemas/order.json", "type": "object",
             "properties": {"home": {"$ref": "address.json"}}}
    parsed = schema(order, {"address.json": {"type": "object"}})
    assert parsed.read_errors(parsed) == []


def test_a_draft_2020_12_schema_with_defs_and_prefix_items() -> None:
    def point(z_type: str) -> dict[str, Any]:
        return {"$schema": DRAFT2020, "$defs": {"coordinate": {"type": "number"}},
                "type": "object", "properties": {
                    "xy": {"type": "array", "prefixItems": [{"$ref": "#/$defs/coordinate"}] * 2,
                           "items": False},
                    "z": {"$ref": "#/$defs/coordinate", "type": z_type}}}
    assert problems(point("number"), point("number")) == []
    assert problems(point("integer"), point("number")) == [
        "#/properties/z/allOf/1: type narrowed from number to integer (TYPE_NARROWED)"]
    assert json_arrow_type(schema(point("number"))) == pa.struct(
        [pa.field("xy", pa.string()), pa.field("z", pa.float64())])


def test_a_recursive_schema_compares_and_ends() -> None:
    def tree(value_type: str) -> dict[str, Any]:
        node = record({"value": {"type": value_type},
                       "children": {"type": "array", "items": {"$ref": "#/definitions/node"}}},
                      closed=True)
        return {"$ref": "#/definitions/node", "definitions": {"node": node}}
    assert problems(tree("number"), tree("number")) == []
    assert problems(tree("number"), tree("integer")) == []
    assert problems(tree("integer"), tree("number")) == [
        "#/properties/value: type narrowed from number to integer (TYPE_NARROWED)"]


# -- check_compatibility at each level ------------------------------------------------------------


V1 = record({"a": {"type": "string"}}, closed=True)
V2 = record({"a": {"type": "string"}, "b": {"type": "integer"}}, closed=True)


@pytest.mark.parametrize(("level", "refused"), [
    (Compatibility.BACKWARD, False),
    (Compatibility.FORWARD, True),
    (Compatibility.FULL, True),
    (Compatibility.NONE, False),
])
def test_check_compatibility_of_an_optional_property_added_to_a_closed_model(
        level: Compatibility, refused: bool) -> None:
    found = check_compatibility(level, schema(V2), [schema(V1)])
    assert names(found) == (["PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL"] if refused else [])


def test_check_compatibility_at_none_accepts_anything() -> None:
    assert check_compatibility(Compatibility.NONE, schema(INTEGER), [schema(STRING)]) == []
    assert check_compatibility(Compatibility.BACKWARD, schema(INTEGER), [schema(STRING)]) != []


def enum(*values: str) -> JsonSchema:
    return schema({"type": "string", "enum": list(values)})


@pytest.mark.parametrize(("level", "live", "new"), [
    (Compatibility.BACKWARD_TRANSITIVE, [enum("a", "b"), enum("a")], enum("a", "c")),
    (Compatibility.FORWARD_TRANSITIVE, [enum("a"), enum("a", "b")], enum("b")),
    (Compatibility.FULL_TRANSITIVE, [enum("a", "b"), enum("a")], enum("a")),
])
def test_transitive_levels_refuse_what_only_the_first_version_refuses(
        level: Compatibility, live: list[JsonSchema], new: JsonSchema) -> None:
    latest_only = Compatibility[level.name.removesuffix("_TRANSITIVE")]
    assert check_compatibility(latest_only, new, live) == []
    assert names(check_compatibility(level, new, live)) in (
        ["ENUM_ARRAY_NARROWED"], ["ENUM_ARRAY_CHANGED"])


# -- Arrow columns ------------------------------------------------------------------------------


@pytest.mark.parametrize(("contents", "expected"), [
    ({"type": "string"}, pa.string()),
    ({"type": "string", "format": "date-time"}, pa.timestamp("us", tz="UTC")),
    ({"type": "string", "format": "date"}, pa.date32()),
    ({"type": "integer"}, pa.int64()),
    ({"type": "number"}, pa.float64()),
    ({"type": ["integer", "number"]}, pa.float64()),
    ({"type": "boolean"}, pa.bool_()),
    ({"type": ["integer", "null"]}, pa.int64()),
    ({"type": "array", "items": {"type": "string"}}, pa.list_(pa.string())),
    ({"type": "object", "additionalProperties": {"type": "integer"}},
     pa.map_(pa.string(), pa.int64())),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
     pa.struct([pa.field("a", pa.int64()), pa.field("b", pa.string())])),
    ({"enum": ["a", "b"]}, pa.string()),
    ({"oneOf": [{"type": "string"}, {"type": "null"}]}, pa.string()),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, pa.string()),  # JSON text
    ({}, pa.string()),
    ({"type": "object"}, pa.string()),
    ({"type": ["string", "integer"]}, pa.string()),
])
def test_arrow_type_of_each_kind_of_schema(contents: dict[str, Any],
                                           expected: pa.DataType) -> None:
    assert json_arrow_type(schema(contents)) == expected


def test_struct_fields_are_all_nullable() -> None:
    parsed = schema(record({"a": {"type": "integer"}}, ("a",)))
    assert all(f.nullable for f in json_arrow_type(parsed))


def test_refs_and_allof_conjuncts_map_to_the_struct_they_name() -> None:
    base = record({"id": {"type": "integer"}})
    extended = {"definitions": {"base": base},
                "allOf": [{"$ref": "#/definitions/base"},
                          record({"name": {"type": "string"}})]}
    assert json_arrow_type(schema(extended)) == pa.struct(
        [pa.field("id", pa.int64()), pa.field("name", pa.string())])


def test_a_recursive_schema_holds_its_recursion_as_json_text() -> None:
    node = record({"value": {"type": "integer"}, "next": {"$ref": "#"}})
    assert json_arrow_type(schema(node)) == pa.struct(
        [pa.field("value", pa.int64()), pa.field("next", pa.string())])


def test_arrow_schema_is_an_objects_properties_else_one_value_column() -> None:
    parsed = schema(record({"a": {"type": "integer"}, "b": {"type": "boolean"}}))
    assert json_arrow_schema(parsed) == pa.schema([("a", pa.int64()), ("b", pa.bool_())])
    assert json_arrow_schema(schema({"type": "array", "items": {"type": "number"}})) == \
        pa.schema([("value", pa.list_(pa.float64()))])


# -- decoding and encoding ----------------------------------------------------------------------


ORDER = record({
    "id": {"type": "integer"},
    "placed": {"type": "string", "format": "date-time"},
    "lines": {"type": "array", "items": record({"sku": {"type": "string"},
                                                 "qty": {"type": "integer"}})},
    "customer": {"type": ["object", "null"], "properties": {"name": {"type": "string"}}},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    "extra": {},
}, ("id",))


def test_decode_builds_typed_columns() -> None:
    payloads = [
        json.dumps({"id": 1, "placed": "2024-03-01T12:00:00+02:00",
                    "lines": [{"sku": "x", "qty": 2}], "customer": {"name": "Ann", "vip": True},
                    "labels": {"k": "v"}, "extra": [1, {"b": None}]}).encode(),
        b'{"id": 2.0, "customer": null}',
    ]
    table = decode_json(schema(ORDER), payloads)
    assert table.schema == json_arrow_schema(schema(ORDER))
    assert table.to_pylist() == [
        {"id": 1, "placed": dt.datetime(2024, 3, 1, 10, tzinfo=dt.UTC),
         "lines": [{"sku": "x", "qty": 2}], "customer": {"name": "Ann"},
         "labels": [("k", "v")], "extra": '[1,{"b":null}]'},
        {"id": 2, "placed": None, "lines": None, "customer": None, "labels": None,
         "extra": None},
    ]


def test_decode_reads_payloads_after_the_wire_header() -> None:
    _, payload = split_wire(wire_header(7) + b'{"id": 3}')
    assert decode_json(schema(ORDER), [payload]).column("id").to_pylist() == [3]


def test_decode_of_a_non_object_schema_fills_one_value_column() -> None:
    table = decode_json(schema({"type": "array", "items": {"type": "integer"}}),
                        [b"[1, 2]", b"[]"])
    assert table.column_names == ["value"]
    assert table.column("value").to_pylist() == [[1, 2], []]


def test_decode_refuses_an_invalid_document_naming_its_index() -> None:
    with pytest.raises(ValueError, match=r"record 1 .*#/id: 'x' is not of type 'integer'"):
        decode_json(schema(ORDER), [b'{"id": 1}', b'{"id": "x"}'])
    with pytest.raises(ValueError, match=r"record 0 .*#/placed: .*date-time"):
        decode_json(schema(ORDER), [b'{"id": 1, "placed": "yesterday"}'])
    with pytest.raises(ValueError, match=r"record 0 .*'id' is a required property"):
        decode_json(schema(ORDER), [b"{}"])


FORMATS = record({f: {"type": "string", "format": f} for f in (
    "date-time", "date", "email", "ipv4", "ipv6", "uuid", "regex", "uri", "hostname")})


@pytest.mark.parametrize(("draft", "document", "valid"), [
    (None, {"date-time": "2024-03-01T12:00:00Z", "date": "2024-03-01", "email": "a@b.example",
            "ipv4": "10.0.0.1", "ipv6": "::1", "uuid": "0b6c1d4e-5f7a-4b8c-9d0e-1f2a3b4c5d6e",
            "regex": "^a+$"}, True),
    (None, {"date-time": "2024-03-01 12:00"}, False),
    (None, {"date": "2024-02-30"}, False),
    (None, {"ipv4": "10.0.0.256"}, False),
    (None, {"regex": "(unclosed"}, False),
    (DRAFT4, {"date-time": "yesterday"}, False),
    (DRAFT2020, {"date-time": "yesterday"}, False),
    (DRAFT2020, {"date-time": "2024-03-01T12:00:00+02:00"}, True),
    (DRAFT2020, {"uuid": "not-a-uuid"}, False),
    # formats jsonschema does not check (draft-07 has no uuid; uri and hostname need libraries
    # deltabus does not install) are not checked on produce either
    (None, {"uuid": "not-a-uuid", "uri": "not a uri", "hostname": "-bad-"}, True),
])
def test_produce_checks_accept_and_refuse_as_the_registrys_validator_does(
        draft: str | None, document: dict[str, Any], valid: bool) -> None:
    """Records are checked with jsonschema-rs, for speed; what it accepts and refuses, formats
    included, is what jsonschema (the registry's validator, and the refusals' words) decides."""
    parsed = schema({**FORMATS, "$schema": draft} if draft else FORMATS)
    assert parsed._fast_validator is not None  # the fast path is the one checked here
    assert parsed._validator.is_valid(document) is valid
    payload = json.dumps(document).encode()
    if valid:
        assert decode_json(parsed, [payload]).num_rows == 1
    else:
        with pytest.raises(ValueError, match="record 0 is not valid under the schema"):
            decode_json(parsed, [payload])


def test_decode_refuses_a_record_that_is_not_json_naming_its_index() -> None:
    with pytest.raises(ValueError, match="record 2 is not JSON"):
        decode_json(schema(ORDER), [b'{"id": 1}', b'{"id": 2}', b'{"id": '])


def test_encode_then_decode_round_trips() -> None:
    rows = [{"id": 1, "lines": [{"sku": "a", "qty": 1}], "labels": {"x": "y"}},
            {"id": 2, "customer": {"name": "Bo"}}]
    payloads = encode_json(schema(ORDER), rows)
    assert payloads[1] == b'{"id":2,"customer":{"name":"Bo"}}'
    table = decode_json(schema(ORDER), payloads)
    assert table.column("id").to_pylist() == [1, 2]
    assert table.column("lines").to_pylist() == [[{"sku": "a", "qty": 1}], None]
    assert table.column("customer").to_pylist() == [None, {"name": "Bo"}]


def test_encode_refuses_an_invalid_row_naming_its_index() -> None:
    with pytest.raises(ValueError, match=r"row 1 .*'id' is a required property"):
        encode_json(schema(ORDER), [{"id": 1}, {"lines": []}])
    with pytest.raises(ValueError, match="row 0 is not JSON"):
        encode_json(schema({"type": "number"}), [float("nan")])
