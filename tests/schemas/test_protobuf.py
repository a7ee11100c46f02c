"""Protobuf schemas: both registered forms parse to one canonical text, imports resolve, the
compatibility rules are Confluent's, message indexes are written as confluent-kafka writes
them, and records confluent-kafka's serializer frames decode into typed columns.

The messages are real generated code (protoc --python_out, as a producer's build makes it), the
registered form is what confluent-kafka's ProtobufSerializer registers, and the records are
framed by the serializer itself."""

from __future__ import annotations

import base64
import datetime
import importlib
import sys
from decimal import Decimal
from types import ModuleType

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import prefix_schema_id_serializer
from confluent_kafka.schema_registry.common.protobuf import (
    _create_index_array,
    _init_pool,
    _schema_to_str,
    _str_to_proto,
)
from confluent_kafka.schema_registry.common.serde import SchemaId
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from google.protobuf import descriptor_pb2, message_factory, timestamp_pb2, wrappers_pb2
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import Message
from grpc_tools import protoc

from deltabus.schemas import (
    Compatibility,
    InvalidSchemaError,
    SchemaType,
    check_compatibility,
    parse,
    split_wire,
)
from deltabus.schemas.protobuf import (
    ProtobufSchema,
    decode_protobuf,
    encode_protobuf,
    message_descriptor,
    message_indexes,
    parse_protobuf,
    protobuf_arrow_schema,
    protobuf_arrow_type,
    read_message_indexes,
    write_message_indexes,
)

COMMON_PROTO = """\
syntax = "proto3";
package deltabus.test.common;

message Money {
  string currency = 1;
  int64 units = 2;
}
"""

SHOP_PROTO = """\
syntax = "proto3";
package deltabus.test.shop;

import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "deltabus_test_common.proto";

// Who ordered.
message Customer { string name = 1; }

message Order {
  enum Status { STATUS_UNKNOWN = 0; STATUS_PAID = 1; }
  message Line { string sku = 1; uint32 quantity = 2; }
  int32 id = 1;
  sint64 delta = 2;
  uint64 big = 3;
  fixed32 f32 = 4;
  double price = 5;
  float ratio = 6;
  bool gift = 7;
  string note = 8;
  bytes blob = 9;
  Status status = 10;
  repeated Line lines = 11;
  map<string, int64> counts = 12;
  google.protobuf.Timestamp placed_at = 13;
  google.protobuf.Int64Value discount = 14;
  deltabus.test.common.Money total = 15;
  optional int32 priority = 16;
  oneof payment { string card = 17; string voucher = 18; }
  Customer customer = 19;
}
"""

# Every construct the printer writes: proto2 labels and defaults, groups, extensions, custom
# options (scalar and message), maps, oneofs, reserved ranges and names, services, enums.
RICH_PROTO2 = r"""
syntax = "proto2";
package rich;
import "google/protobuf/descriptor.proto";
option java_package = "com.example.rich";
option optimize_for = SPEED;
message Doc { optional string text = 1; repeated int32 tags = 2; }
extend google.protobuf.FieldOptions {
  optional string note = 50001;
  optional Doc doc = 50002;
}
message Thing {
  option deprecated = true;
  required int64 id = 1 [(note) = "the \"id\"", (doc) = { text: "x" tags: [1, 2] }];
  optional string name = 2 [default = "a\tb\u00e9", json_name = "Label"];
  optional bytes raw = 3 [default = "\001\377"];
  optional double ratio = 4 [default = -inf];
  optional Kind kind = 5 [default = KIND_B];
  repeated int32 packed_ids = 6 [packed = true];
  map<string, Doc> docs = 7;
  optional group Extra = 8 { optional int32 level = 1; }
  oneof choice { string left = 9; int32 right = 10; }
  enum Kind { KIND_A = 1; KIND_B = 2; reserved 5, 7 to 9; reserved "KIND_C"; }
  extensions 100 to 199;
  reserved 20, 300 to max;
  reserved "gone";
}
extend Thing { optional int32 extra_id = 100; }
service Things {
  rpc Get(Thing) returns (Thing);
  rpc Watch(stream Thing) returns (stream Thing) { option deprecated = true; }
}
"""

EDITIONS = """
edition = "2023";
package ed;
option features.field_presence = IMPLICIT;
message A {
  int32 x = 1;
  int32 y = 2 [features.field_presence = EXPLICIT];
  reserved old;
}
"""


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The shop messages as a producer's build generates them (protoc --python_out)."""
    root = tmp_path_factory.mktemp("generated")
    (root / "deltabus_test_common.proto").write_text(COMMON_PROTO)
    (root / "deltabus_test_shop.proto").write_text(SHOP_PROTO)
    status = protoc.main(["protoc", f"-I{root}", f"-I{_protoc_include()}",
                          f"--python_out={root}", "deltabus_test_common.proto",
                          "deltabus_test_shop.proto"])
    assert status == 0
    sys.path.insert(0, str(root))
    try:
        importlib.import_module("deltabus_test_common_pb2")
        return importlib.import_module("deltabus_test_shop_pb2")
    finally:
        sys.path.remove(str(root))


def _protoc_include() -> str:
    from importlib import resources
    return str(resources.files("grpc_tools") / "_proto")


def _registered(descriptor_file: FileDescriptor) -> str:
    """What confluent-kafka's ProtobufSerializer registers for a file."""
    return _schema_to_str(descriptor_file)


@pytest.fixture(scope="module")
def shop(generated: ModuleType) -> ProtobufSchema:
    common = generated.DESCRIPTOR.dependencies[2]
    return parse_protobuf(_registered(generated.DESCRIPTOR),
                          {"deltabus_test_common.proto": _registered(common)})


def _frame(message: Message, schema_id: int = 42) -> bytes:
    """The record confluent-kafka's ProtobufSerializer writes once the schema has id
    `schema_id`: its own serializer, framed by its own prefix_schema_id_serializer."""
    indexes = _create_index_array(message.DESCRIPTOR)

    def framing(payload: bytes, ctx: object, _: object) -> bytes:
        return prefix_schema_id_serializer(payload, ctx,
                                           SchemaId("PROTOBUF", schema_id, None, indexes))

    return ProtobufSerializer(type(message), None, {"schema.id.serializer": framing})(message)


# --- Parsing ------------------------------------------------------------------------------


def test_the_registered_form_and_the_proto_text_have_one_canonical_text(generated) -> None:
    common = generated.DESCRIPTOR.dependencies[2]
    references_serialized = {"deltabus_test_common.proto": _registered(common)}
    from_serializer = parse_protobuf(_registered(generated.DESCRIPTOR), references_serialized)
    from_text = parse_protobuf(SHOP_PROTO, {"deltabus_test_common.proto": COMMON_PROTO})
    reflowed = parse_protobuf(" ".join(SHOP_PROTO.replace("// Who ordered.", "").split()),
                              references_serialized)
    assert from_text.canonical() == from_serializer.canonical() == reflowed.canonical()
    assert from_text.serialized() == from_serializer.serialized()
    assert from_text == from_serializer
    assert "// Who ordered." not in from_text.canonical()
    assert from_text.schema_type == SchemaType.PROTOBUF


def test_the_printed_text_compiles_back_to_the_same_schema() -> None:
    for source in (RICH_PROTO2, EDITIONS, SHOP_PROTO):
        references = {"deltabus_test_common.proto": COMMON_PROTO}
        first = parse_protobuf(source, references)
        again = parse_protobuf(first.text(), references)
        from_serialized = parse_protobuf(first.serialized(), references)
        assert again.canonical() == first.canonical() == from_serialized.canonical()
        assert again.serialized() == first.serialized() == from_serialized.serialized()


def test_the_serialized_form_ignores_the_extensions_generated_code_registers(
        tmp_path) -> None:
    """Importing generated code registers its custom options in protobuf's default pool;
    a schema's serialized form is the same before and after."""
    before = parse_protobuf(RICH_PROTO2, {})
    (tmp_path / "deltabus_test_rich.proto").write_text(RICH_PROTO2)
    assert protoc.main(["protoc", f"-I{tmp_path}", f"-I{_protoc_include()}",
                        f"--python_out={tmp_path}", "deltabus_test_rich.proto"]) == 0
    sys.path.insert(0, str(tmp_path))
    try:
        rich = importlib.import_module("deltabus_test_rich_pb2")
    finally:
        sys.path.remove(str(tmp_path))
    after = parse_protobuf(_registered(rich.DESCRIPTOR), {})
    assert after.serialized() == before.serialized()
    assert after.canonical() == before.canonical()


def test_the_printed_text_keeps_options_defaults_and_groups() -> None:
    text = parse_protobuf(RICH_PROTO2, {}).text()
    for expected in ('option java_package = "com.example.rich";',
                     '(rich.note) = "the \\"id\\""', '(rich.doc) = { text: "x" tags: 1 tags: 2 }',
                     'default = "\\001\\377"', "default = -inf", 'json_name = "Label"',
                     "map<string, .rich.Doc> docs = 7;", "optional group Extra = 8 {",
                     "oneof choice {", "extensions 100 to 199;", "reserved 20, 300 to max;",
                     'reserved "gone";', "rpc Watch(stream .rich.Thing) returns "
                     "(stream .rich.Thing) {", "extend .rich.Thing {"):
        assert expected in text
    assert "reserved old;" in parse_protobuf(EDITIONS, {}).text()


def test_parse_by_schema_type_reaches_the_protobuf_parser() -> None:
    parsed = parse(SchemaType.PROTOBUF, 'syntax = "proto3"; message A { int32 x = 1; }', {})
    assert isinstance(parsed, ProtobufSchema)


def test_an_import_resolves_to_its_reference_in_either_form(generated) -> None:
    common_serialized = _registered(generated.DESCRIPTOR.dependencies[2])
    by_text = parse_protobuf(SHOP_PROTO, {"deltabus_test_common.proto": COMMON_PROTO})
    by_serialized = parse_protobuf(SHOP_PROTO,
                                   {"deltabus_test_common.proto": common_serialized})
    assert by_text == by_serialized
    total = message_descriptor(by_text, [1]).fields_by_name["total"]
    assert total.message_type.full_name == "deltabus.test.common.Money"
    assert total.message_type.file.name == "deltabus_test_common.proto"


def test_well_known_imports_resolve_without_a_reference() -> None:
    schema = parse_protobuf('syntax = "proto3";\nimport "google/protobuf/timestamp.proto";\n'
                            "message A { google.protobuf.Timestamp at = 1; }", {})
    at = message_descriptor(schema, [0]).fields_by_name["at"]
    assert at.message_type.full_name == "google.protobuf.Timestamp"
    serialized = parse_protobuf(schema.serialized(), {})
    assert serialized == schema


def test_a_schema_that_does_not_compile_raises_protocs_error() -> None:
    with pytest.raises(InvalidSchemaError,
                       match=r'^the schema line 2 column 26: "strin" is not defined\.$'):
        parse_protobuf('syntax = "proto3";\nmessage A { int32 x = 1; strin y = 2; }', {})


def test_an_error_in_a_reference_names_the_reference() -> None:
    with pytest.raises(InvalidSchemaError, match=r"^'other\.proto' line 1 column \d+: "):
        parse_protobuf('syntax = "proto3"; import "other.proto"; message A { B b = 1; }',
                       {"other.proto": 'syntax = "proto3"; message B { int32 y = 1 }'})


def test_an_import_without_a_reference_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match='Import "missing.proto" was not found'):
        parse_protobuf('syntax = "proto3"; import "missing.proto"; message A {}', {})
    serialized = descriptor_pb2.FileDescriptorProto(name="x", dependency=["missing.proto"])
    with pytest.raises(InvalidSchemaError, match="imports 'missing.proto', which is neither"):
        parse_protobuf(base64.b64encode(serialized.SerializeToString()).decode(), {})


def test_an_empty_schema_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match="^the schema is empty$"):
        parse_protobuf("  \n", {})


def test_base64_that_is_no_file_descriptor_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match="not a serialized FileDescriptorProto"):
        parse_protobuf(base64.b64encode(b"\xff\xff\xff").decode(), {})


def test_a_reference_outside_the_import_tree_is_refused() -> None:
    with pytest.raises(InvalidSchemaError, match="is not an import path"):
        parse_protobuf('syntax = "proto3"; message A {}', {"../escape.proto": COMMON_PROTO})


def test_confluent_kafkas_deserializer_builds_the_served_serialized_form(shop) -> None:
    """What GET /schemas/ids/{id}?format=serialized returns goes into confluent-kafka's
    deserializer pool as it does there (_init_pool, _str_to_proto named "default")."""
    pool = DescriptorPool()
    _init_pool(pool)
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(
        base64.b64decode(_registered_common_for(shop))))
    pool.Add(_str_to_proto("default", shop.serialized()))
    order = pool.FindMessageTypeByName("deltabus.test.shop.Order")
    message = message_factory.GetMessageClass(order)(id=7, note="hi")
    assert message.SerializeToString() == encode_protobuf(
        shop, "Order", [{"id": 7, "note": "hi"}])[0][2:]


def _registered_common_for(schema: ProtobufSchema) -> str:
    common = schema.file.dependencies[2]
    proto = descriptor_pb2.FileDescriptorProto()
    common.CopyToProto(proto)
    return base64.b64encode(proto.SerializeToString()).decode()


# --- Compatibility ------------------------------------------------------------------------


def _schema(body: str, package: str = "shop", syntax: str = "proto3") -> ProtobufSchema:
    return parse_protobuf(f'syntax = "{syntax}";\npackage {package};\n{body}', {})


ORDER = "message Order { int32 id = 1; string note = 2; }"

COMPATIBILITY_CASES = [
    # (what changed, writer, reader, Confluent's difference type, or None: compatible)
    ("field added", ORDER, "message Order { int32 id = 1; string note = 2; bool gift = 3; }",
     None),
    ("field removed", ORDER, "message Order { int32 id = 1; }", None),
    ("field renamed", ORDER, "message Order { int32 key = 1; string note = 2; }", None),
    ("int32 to int64", ORDER, "message Order { int64 id = 1; string note = 2; }", None),
    ("int32 to uint64", ORDER, "message Order { uint64 id = 1; string note = 2; }", None),
    ("int32 to an enum", ORDER,
     "message Order { enum E { A = 0; } E id = 1; string note = 2; }", None),
    ("string to bytes", ORDER, "message Order { int32 id = 1; bytes note = 2; }", None),
    ("string to repeated string", ORDER,
     "message Order { int32 id = 1; repeated string note = 2; }", None),
    ("int32 to sint32", ORDER, "message Order { sint32 id = 1; string note = 2; }",
     "FIELD_SCALAR_KIND_CHANGED"),
    ("int32 to string", ORDER, "message Order { string id = 1; string note = 2; }",
     "FIELD_SCALAR_KIND_CHANGED"),
    ("fixed32 to fixed64", "message Order { fixed32 id = 1; }", "message Order { fixed64 id = 1; }",
     "FIELD_SCALAR_KIND_CHANGED"),
    ("int32 to repeated int32", ORDER,
     "message Order { repeated int32 id = 1; string note = 2; }", "FIELD_NUMERIC_LABEL_CHANGED"),
    ("scalar to message", ORDER,
     "message Order { Note id = 1; string note = 2; } message Note { string t = 1; }",
     "FIELD_KIND_CHANGED"),
    ("message type changed",
     "message Order { A a = 1; } message A { int32 x = 1; } message B { int32 x = 1; }",
     "message Order { B a = 1; } message A { int32 x = 1; } message B { int32 x = 1; }",
     "FIELD_NAMED_TYPE_CHANGED"),
    ("message removed", f"{ORDER} message Extra {{ int32 x = 1; }}", ORDER, "MESSAGE_REMOVED"),
    ("message added", ORDER, f"{ORDER} message Extra {{ int32 x = 1; }}", None),
    ("one field moved into a new oneof", ORDER,
     "message Order { oneof which { int32 id = 1; } string note = 2; }", None),
    ("two fields moved into a oneof", ORDER,
     "message Order { oneof which { int32 id = 1; string note = 2; } }",
     "MULTIPLE_FIELDS_MOVED_TO_ONEOF"),
    ("a field moved into an existing oneof",
     "message Order { int32 id = 1; oneof which { string note = 2; } }",
     "message Order { oneof which { int32 id = 1; string note = 2; } }",
     "FIELD_MOVED_TO_EXISTING_ONEOF"),
    ("a field moved out of a oneof",
     "message Order { oneof which { int32 id = 1; string note = 2; } }", ORDER, None),
    ("a field removed from a oneof",
     "message Order { oneof which { int32 id = 1; string note = 2; } }",
     "message Order { oneof which { int32 id = 1; } }", "ONEOF_FIELD_REMOVED"),
    ("a oneof field added", "message Order { oneof which { int32 id = 1; } }",
     "message Order { oneof which { int32 id = 1; string note = 2; } }", None),
    ("a nested message removed", "message Order { message Line { int32 x = 1; } int32 id = 1; }",
     "message Order { int32 id = 1; }", "MESSAGE_REMOVED"),
    ("a map value type changed", "message Order { map<string, int32> m = 1; }",
     "message Order { map<string, string> m = 1; }", "FIELD_SCALAR_KIND_CHANGED"),
    ("a map became a list", "message Order { map<string, int32> m = 1; }",
     "message Order { repeated int32 m = 1; }", "FIELD_KIND_CHANGED"),
]


@pytest.mark.parametrize(("change", "writer", "reader", "difference"), COMPATIBILITY_CASES,
                         ids=[case[0] for case in COMPATIBILITY_CASES])
def test_compatibility_follows_confluents_rules(change: str, writer: str, reader: str,
                                                difference: str | None) -> None:
    errors = _schema(reader).read_errors(_schema(writer))
    if difference is None:
        assert errors == []
    else:
        assert len(errors) == 1 and errors[0].endswith(f"({difference})"), errors


def test_a_changed_package_is_incompatible() -> None:
    errors = _schema(ORDER, package="shop.v2").read_errors(_schema(ORDER))
    assert errors == ["the package changed from 'shop' to 'shop.v2' (PACKAGE_CHANGED)"]


def test_a_required_field_added_or_removed_is_incompatible() -> None:
    without = _schema("message Order { optional int32 id = 1; }", syntax="proto2")
    required = _schema("message Order { optional int32 id = 1; required string code = 2; }",
                       syntax="proto2")
    assert required.read_errors(without) == [
        "shop.Order field 2 'code': the reader requires a field the writer lacks "
        "(REQUIRED_FIELD_ADDED)"]
    assert without.read_errors(required) == [
        "shop.Order field 2 'code': the reader lacks a field the writer requires "
        "(REQUIRED_FIELD_REMOVED)"]


def test_a_numeric_field_made_required_is_incompatible() -> None:
    optional = _schema("message Order { optional int32 id = 1; }", syntax="proto2")
    required = _schema("message Order { required int32 id = 1; }", syntax="proto2")
    assert required.read_errors(optional) == [
        "shop.Order field 1 'id': the field changed from single to required "
        "(FIELD_NUMERIC_LABEL_CHANGED)"]


def test_an_error_names_the_message_and_the_field() -> None:
    errors = _schema("message Order { string id = 1; }").read_errors(_schema(ORDER))
    assert errors == ["shop.Order field 1 'id': the type changed from int32 to string "
                      "(FIELD_SCALAR_KIND_CHANGED)"]


def test_an_incompatible_change_inside_a_referenced_message_is_found() -> None:
    main = ('syntax = "proto3"; package shop; import "money.proto"; '
            "message Order { common.Money total = 1; }")
    old = parse_protobuf(main, {"money.proto": COMMON_PROTO.replace("deltabus.test.common",
                                                                   "common")})
    new = parse_protobuf(main, {"money.proto": COMMON_PROTO.replace(
        "deltabus.test.common", "common").replace("int64 units", "string units")})
    errors = new.read_errors(old)
    assert errors[0].startswith("common.Money field 2 'units': the type changed")
    assert errors[-1].endswith("(FIELD_NAMED_TYPE_CHANGED)") and len(errors) == 2
    assert old.read_errors(old) == []


def test_check_compatibility_applies_each_level() -> None:
    v1 = _schema("message Order { oneof which { int32 id = 1; string note = 2; } }")
    v2 = _schema("message Order { oneof which { int32 id = 1; } }")  # drops a oneof member
    # The new schema cannot read the old data (the oneof member it dropped), while the old
    # schema reads the new data: backward and full refuse, forward accepts.
    assert check_compatibility(Compatibility.BACKWARD, v2, [v1]) != []
    assert check_compatibility(Compatibility.FORWARD, v2, [v1]) == []
    assert check_compatibility(Compatibility.FULL, v2, [v1]) != []
    assert check_compatibility(Compatibility.NONE, v2, [v1]) == []


def test_a_transitive_level_checks_every_live_version() -> None:
    v1 = _schema("message Order { int32 id = 1; }")
    v2 = _schema("message Order { }")  # id removed: compatible
    v3 = _schema("message Order { string id = 1; }")  # field 1 back, as a string
    assert check_compatibility(Compatibility.BACKWARD, v3, [v1, v2]) == []
    errors = check_compatibility(Compatibility.BACKWARD_TRANSITIVE, v3, [v1, v2])
    assert errors == ["shop.Order field 1 'id': the type changed from int32 to string "
                      "(FIELD_SCALAR_KIND_CHANGED)"]


# --- Message indexes ----------------------------------------------------------------------


@pytest.mark.parametrize("indexes", [[0], [1], [1, 0], [3, 2, 70]])
def test_message_indexes_round_trip_as_confluent_writes_them(indexes: list[int]) -> None:
    written = write_message_indexes(indexes)
    confluent = SchemaId("PROTOBUF", 1, None, indexes).id_to_bytes()[5:]
    assert written == confluent
    assert read_message_indexes(memoryview(written + b"rest")) == (indexes, len(written))


def test_the_first_message_is_the_single_byte_zero() -> None:
    assert write_message_indexes([0]) == b"\x00"
    assert write_message_indexes([1, 0]) == b"\x04\x02\x00"


def test_cut_message_indexes_are_refused() -> None:
    with pytest.raises(ValueError, match="cut short"):
        read_message_indexes(memoryview(b"\x04\x02"))
    with pytest.raises(ValueError, match="out of range"):
        read_message_indexes(memoryview(b"\x03"))  # a count of -2


def test_message_indexes_name_top_level_and_nested_messages(shop, generated) -> None:
    assert message_descriptor(shop, [0]).full_name == "deltabus.test.shop.Customer"
    assert message_descriptor(shop, [1, 0]).full_name == "deltabus.test.shop.Order.Line"
    assert message_indexes(shop, "Order.Line") == [1, 0]
    assert message_indexes(shop, "deltabus.test.shop.Order") == [1]
    assert _create_index_array(generated.Order.Line.DESCRIPTOR) == [1, 0]
    with pytest.raises(ValueError, match="out of range"):
        message_descriptor(shop, [2])


# --- Arrow columns ------------------------------------------------------------------------

SCALARS = """
syntax = "proto3";
package t;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
message All {
  int32 i32 = 1; sint32 s32 = 2; sfixed32 sf32 = 3;
  int64 i64 = 4; sint64 s64 = 5; sfixed64 sf64 = 6;
  uint32 u32 = 7; fixed32 f32 = 8; uint64 u64 = 9; fixed64 f64 = 10;
  float fl = 11; double db = 12; bool b = 13; string s = 14; bytes by = 15;
  enum E { E0 = 0; } E e = 16;
  repeated int32 list = 17;
  map<int32, string> m = 18;
  google.protobuf.Timestamp ts = 19;
  google.protobuf.Int64Value w_i64 = 20; google.protobuf.UInt64Value w_u64 = 21;
  google.protobuf.Int32Value w_i32 = 22; google.protobuf.UInt32Value w_u32 = 23;
  google.protobuf.FloatValue w_fl = 24; google.protobuf.DoubleValue w_db = 25;
  google.protobuf.BoolValue w_b = 26; google.protobuf.StringValue w_s = 27;
  google.protobuf.BytesValue w_by = 28;
  google.protobuf.Struct json = 29;
  Inner inner = 30;
  repeated Inner inners = 31;
}
message Inner { string x = 1; }
message Node { string name = 1; repeated Node children = 2; }
message Nothing {}
"""

EXPECTED_TYPES = {
    "i32": pa.int32(), "s32": pa.int32(), "sf32": pa.int32(),
    "i64": pa.int64(), "s64": pa.int64(), "sf64": pa.int64(),
    "u32": pa.int64(), "f32": pa.int64(),
    "u64": pa.decimal128(20, 0), "f64": pa.decimal128(20, 0),
    "fl": pa.float32(), "db": pa.float64(), "b": pa.bool_(), "s": pa.string(),
    "by": pa.binary(), "e": pa.string(), "list": pa.list_(pa.int32()),
    "m": pa.map_(pa.int32(), pa.string()), "ts": pa.timestamp("us", tz="UTC"),
    "w_i64": pa.int64(), "w_u64": pa.decimal128(20, 0), "w_i32": pa.int32(),
    "w_u32": pa.int64(), "w_fl": pa.float32(), "w_db": pa.float64(), "w_b": pa.bool_(),
    "w_s": pa.string(), "w_by": pa.binary(), "json": pa.string(),
    "inner": pa.struct([pa.field("x", pa.string())]),
    "inners": pa.list_(pa.struct([pa.field("x", pa.string())])),
}


def test_each_protobuf_type_maps_to_its_delta_column_type() -> None:
    schema = parse_protobuf(SCALARS, {})
    columns = protobuf_arrow_schema(message_descriptor(schema, [0]))
    assert {f.name: f.type for f in columns} == EXPECTED_TYPES
    assert all(f.nullable for f in columns)
    assert protobuf_arrow_type(message_descriptor(schema, [1])) == EXPECTED_TYPES["inner"]


def test_a_recursive_message_cannot_be_a_column() -> None:
    schema = parse_protobuf(SCALARS, {})
    with pytest.raises(InvalidSchemaError, match="t.Node holds itself .* recursive"):
        protobuf_arrow_type(message_descriptor(schema, [2]))


def test_a_message_without_fields_cannot_be_a_column() -> None:
    schema = parse_protobuf(SCALARS, {})
    with pytest.raises(InvalidSchemaError, match="t.Nothing has no fields"):
        protobuf_arrow_schema(message_descriptor(schema, [3]))


# --- Records ------------------------------------------------------------------------------


def _order(generated: ModuleType, **overrides: object) -> Message:
    common = sys.modules["deltabus_test_common_pb2"]
    order = generated.Order(
        id=-5, delta=-9, big=2**64 - 1, f32=2**32 - 1, price=2.5, ratio=0.5, gift=True,
        note="héllo", blob=b"\x00\x01", status=generated.Order.STATUS_PAID,
        lines=[generated.Order.Line(sku="a", quantity=2**32 - 1)],
        counts={"x": 1},
        placed_at=timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=123_456_789),
        discount=wrappers_pb2.Int64Value(value=3), total=common.Money(currency="EUR", units=10),
        priority=0, card="4111", customer=generated.Customer(name="Ann"))
    for name, value in overrides.items():
        setattr(order, name, value)
    return order


def test_records_framed_by_confluent_kafkas_serializer_decode_into_typed_columns(
        shop, generated) -> None:
    records = [_frame(_order(generated)), _frame(generated.Order(id=1))]
    payloads = []
    for record in records:
        schema_id, payload = split_wire(record)
        assert schema_id == 42
        payloads.append(bytes(payload))
    table = decode_protobuf(shop, payloads)
    assert table.schema == protobuf_arrow_schema(message_descriptor(shop, [1]))
    first, second = table.to_pylist()
    assert first == {
        "id": -5, "delta": -9, "big": Decimal(2**64 - 1), "f32": 2**32 - 1, "price": 2.5,
        "ratio": 0.5, "gift": True, "note": "héllo", "blob": b"\x00\x01",
        "status": "STATUS_PAID", "lines": [{"sku": "a", "quantity": 2**32 - 1}],
        "counts": [("x", 1)],
        "placed_at": datetime.datetime(2023, 11, 14, 22, 13, 20, 123_456,
                                       tzinfo=datetime.UTC),
        "discount": 3, "total": {"currency": "EUR", "units": 10}, "priority": 0,
        "card": "4111", "voucher": None, "customer": {"name": "Ann"},
    }
    # Absent: a message, a wrapper, an `optional` and a oneof are null; a proto3 scalar
    # without presence reads as its default.
    assert second["customer"] is None and second["discount"] is None
    assert second["priority"] is None and second["card"] is None
    assert second["note"] == "" and second["big"] == 0 and second["status"] == "STATUS_UNKNOWN"


def test_a_nested_message_decodes_by_its_indexes(shop, generated) -> None:
    line = generated.Order.Line(sku="b", quantity=3)
    _, payload = split_wire(_frame(line))
    assert bytes(payload[:3]) == b"\x04\x02\x00"  # [1, 0]
    table = decode_protobuf(shop, [bytes(payload)])
    assert table.to_pylist() == [{"sku": "b", "quantity": 3}]


def test_a_record_that_does_not_parse_is_refused_naming_it(shop, generated) -> None:
    good = bytes(split_wire(_frame(generated.Order(id=1)))[1])
    with pytest.raises(ValueError, match=r"^record 2 does not parse as deltabus\.test\.shop"
                                         r"\.Order"):
        decode_protobuf(shop, [good, good, b"\x02\x02\x0a\xff"])
    with pytest.raises(ValueError, match="^record 1: the message indexes are cut short"):
        decode_protobuf(shop, [good, b"\x04"])


def test_records_of_another_message_type_are_refused(shop, generated) -> None:
    order = bytes(split_wire(_frame(generated.Order(id=1)))[1])
    customer = bytes(split_wire(_frame(generated.Customer(name="x")))[1])
    with pytest.raises(ValueError, match=r"^record 1 has message indexes \[0\], record 0 \[1\]"):
        decode_protobuf(shop, [order, customer])


def test_encoded_rows_decode_back_and_a_bad_row_is_named(shop, generated) -> None:
    rows = [{"id": 3, "note": "x", "placedAt": "2024-01-01T00:00:00Z"}, {"card": "1"}]
    payloads = encode_protobuf(shop, "Order", rows)
    assert payloads[0][:2] == b"\x02\x02"  # [1]
    parsed = generated.Order.FromString(payloads[0][2:])
    assert parsed.id == 3 and parsed.placed_at.seconds == 1_704_067_200
    assert decode_protobuf(shop, payloads).column("card").to_pylist() == [None, "1"]
    assert decode_protobuf(shop, []).num_rows == 0
    with pytest.raises(ValueError, match=r"^row 1 is not a deltabus\.test\.shop\.Order"):
        encode_protobuf(shop, [1], [{"id": 1}, {"id": "not a number"}])
