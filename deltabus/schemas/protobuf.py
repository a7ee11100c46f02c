"""Protobuf schemas as Confluent Schema Registry knows them: parsing either registered form,
the .proto text printed back, Confluent's compatibility rules, the message indexes its
serializers write after the wire header, and records decoded into Arrow columns.

What must hold, and why:
- One schema, two forms. Confluent accepts a Protobuf schema as .proto source or as the base64
  of a serialized FileDescriptorProto (what confluent-kafka's ProtobufSerializer registers:
  `_schema_to_str(descriptor.file)`, base64 of `FileDescriptor.serialized_pb`). Both parse to
  the same normalised FileDescriptorProto: source info cleared, the json names protoc derives
  from field names dropped (protoc's descriptor sets spell them out, generated code does not),
  the file named "default" as confluent-kafka's deserializer names it. `canonical()` is .proto
  text printed from it, so the same schema in either form, or written with other whitespace and
  comments, has one canonical text and so one id.
- `text()` is that printed .proto (what GET /schemas/ids/{id} returns by default); `serialized()`
  the base64 FileDescriptorProto (what `?format=serialized` returns: confluent-kafka's
  deserializer asks for that form and adds it to a DescriptorPool). The printed text compiles
  back to the same descriptor (tested), so either form can be stored and served.
- Imports resolve to `references` (Confluent's reference name for Protobuf is the import path;
  the map holds the text, in either form, of every file reachable through imports) or to the
  well-known types (google/protobuf/*.proto), which confluent-kafka never registers
  (`skip.known.types`) and which are always the copies this protobuf runtime bundles.
- Parser: protoc, the language's reference compiler, run in-process from grpcio-tools on a
  temporary directory. Every syntax (proto2, proto3, editions), option, import and
  name-resolution rule is then the one the producers' own protoc applied, and an error reads as
  protoc says it. grpcio-tools' compiler first reports a bad schema as values (file, line,
  column, message), so InvalidSchemaError names protoc's error and the error is not printed;
  then `protoc --descriptor_set_out --include_imports` gives the FileDescriptorSet (protoc's
  warnings on a valid schema, an unused import or no syntax line, do go to stderr). In-process costs
  about half a millisecond where a protoc subprocess costs about 120 ms. A pure-Python parser
  (proto-schema-parser) yields a syntax tree only: descriptors, name resolution, options and
  imports would be ours to write and to keep matching protoc. grpcio-tools is released by the
  gRPC team in step with grpcio and protobuf, which deltabus depends on already: it moves to
  the runtime dependencies.
- Compatibility is Confluent's protobuf diff (io.confluent.kafka.schemaregistry.protobuf.diff)
  on descriptors, see `_Diff`: fields match by number; one line per incompatible difference,
  naming the message, the field and Confluent's difference type.
- A record's bytes after the 5-byte header: the message indexes (a zigzag varint count, then
  that many zigzag varint indexes; the single byte 0 stands for [0], the first message), then
  the serialized message.
- Columns: a message is a struct of nullable fields, each protobuf type the Delta Lake type that
  holds all its values (`protobuf_arrow_type`). A field that can be absent (a message, a oneof
  member, an `optional` or proto2 field) is null when absent, even where proto2 declares a
  default; a proto3 scalar without presence reads as its default, as protobuf reads it.

Runs anywhere: the registry on the driver, brokers decoding typed topics on executors. A
ProtobufSchema is immutable and thread-safe (its DescriptorPool is only read); protoc runs under
a lock. The only I/O is protoc's temporary directory.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import operator
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import pyarrow as pa
from google.protobuf import (
    any_pb2,
    api_pb2,
    descriptor_pb2,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    json_format,
    message_factory,
    source_context_pb2,
    struct_pb2,
    text_encoding,
    text_format,
    timestamp_pb2,
    type_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.descriptor_pb2 import DescriptorProto as MessageProto
from google.protobuf.descriptor_pb2 import EnumDescriptorProto as EnumProto
from google.protobuf.descriptor_pb2 import FieldDescriptorProto as FieldProto
from google.protobuf.descriptor_pb2 import FileDescriptorProto as FileProto
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import DecodeError, Message
from grpc_tools import _protoc_compiler, protoc

from deltabus.schemas.entities import InvalidSchemaError, ParsedSchema, SchemaType

MAIN_FILE = "default"  # the main file's name: confluent-kafka's deserializer names it so
MESSAGE_INDEXES_MAX = 100_000  # confluent-kafka's deserializer refuses longer index arrays
IMPORT_DEPTH_MAX = 100  # a chain of imports longer than this is refused
_VARINT_BYTES_MAX = 10  # a 64-bit varint
_FIELD_NUMBER_MAX = 536_870_911  # 2**29 - 1: what .proto spells `max` in field ranges
_ENUM_NUMBER_MAX = 2_147_483_647  # `max` in enum reserved ranges

_WELL_KNOWN: dict[str, bytes] = {
    module.DESCRIPTOR.name: module.DESCRIPTOR.serialized_pb
    for module in (any_pb2, api_pb2, descriptor_pb2, duration_pb2, empty_pb2, field_mask_pb2,
                   source_context_pb2, struct_pb2, timestamp_pb2, type_pb2, wrappers_pb2)
}
_PROTOC_INCLUDE = str(resources.files("grpc_tools") / "_proto")  # the well-known .proto files
_PROTOC_LOCK = threading.Lock()  # protoc's in-process compiler is not documented thread-safe
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


# --- Message indexes ----------------------------------------------------------------------


def write_message_indexes(indexes: Sequence[int]) -> bytes:
    """Confluent's message indexes for `indexes` (the path to a message: [0] is the schema's
    first message, [1, 0] the first message nested in the second)."""
    if not indexes:
        raise ValueError("message indexes name at least the top-level message")
    if list(indexes) == [0]:
        return b"\x00"  # the common case, which Confluent writes as one byte
    if len(indexes) > MESSAGE_INDEXES_MAX or min(indexes) < 0:
        raise ValueError(f"message indexes {list(indexes)[:10]} are not a path to a message")
    out = bytearray()
    for value in (len(indexes), *indexes):
        _write_zigzag(out, value)
    return bytes(out)


def read_message_indexes(data: memoryview | bytes) -> tuple[list[int], int]:
    """(the message indexes at the start of `data`, how many bytes they take). Raises
    ValueError where `data` does not start with them."""
    if len(data) and data[0] == 0:
        return [0], 1
    count, offset = _read_zigzag(data, 0)
    if not 0 < count <= MESSAGE_INDEXES_MAX:
        raise ValueError(f"the message index count {count} is out of range")
    indexes = []
    for _ in range(count):
        index, offset = _read_zigzag(data, offset)
        if index < 0:
            raise ValueError(f"the message index {index} is negative")
        indexes.append(index)
    return indexes, offset


def _write_zigzag(out: bytearray, value: int) -> None:
    value = (value << 1) ^ (value >> 63)
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_zigzag(data: memoryview | bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    for position in range(offset, min(len(data), offset + _VARINT_BYTES_MAX)):
        byte = data[position]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), position + 1
        shift += 7
    raise ValueError("the message indexes are cut short or not varints")


# --- Parsing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProtobufSchema:
    """A parsed Protobuf schema: its canonical .proto text (what equality compares), and the
    file's descriptor in a DescriptorPool of its own holding its imports. Immutable."""

    canonical_text: str
    file_proto: bytes = field(compare=False, repr=False)  # the normalised FileDescriptorProto
    file: FileDescriptor = field(compare=False, repr=False)
    messages: tuple[str, ...] = field(compare=False, repr=False)  # top-level, in index order
    synthetic_oneofs: frozenset[str] = field(compare=False, repr=False)  # proto3 `optional`'s

    @property
    def schema_type(self) -> SchemaType:
        return SchemaType.PROTOBUF

    def canonical(self) -> str:
        return self.canonical_text

    def text(self) -> str:
        """The schema as .proto source: what the REST API returns by default."""
        return self.canonical_text

    def serialized(self) -> str:
        """The base64 of the FileDescriptorProto: what `?format=serialized` returns."""
        return base64.standard_b64encode(self.file_proto).decode("ascii")

    def read_errors(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, ProtobufSchema):
            raise TypeError(f"a Protobuf schema cannot read data written with {writer!r}")
        return _Diff(writer, self).errors()


def parse_protobuf(text: str, references: Mapping[str, str]) -> ProtobufSchema:
    """Parse a Protobuf schema given as .proto text or as the base64 of a serialized
    FileDescriptorProto; `references` maps import paths to the text (either form) of the files
    they name. Raises InvalidSchemaError naming what is wrong."""
    if not text.strip():
        raise InvalidSchemaError("the schema is empty")
    if MAIN_FILE in references:
        raise InvalidSchemaError(f"a reference may not be named {MAIN_FILE!r}: the main "
                                 "schema's file has that name")
    sources = {MAIN_FILE: text}
    sources.update((name, source) for name, source in references.items()
                   if name not in _WELL_KNOWN)
    files = _load_files(sources)
    pool = DescriptorPool()
    added: list[FileProto] = []
    _add_file(pool, MAIN_FILE, files, (), added)
    main = _normalised(files[MAIN_FILE])
    prefix = f"{main.package}." if main.package else ""
    return ProtobufSchema(
        canonical_text=_ProtoPrinter(main, pool).text(),
        file_proto=_serialized(main, pool),
        file=pool.FindFileByName(MAIN_FILE),
        messages=tuple(prefix + message.name for message in main.message_type),
        synthetic_oneofs=frozenset(name for proto in added for name in _synthetic_oneofs(proto)),
    )


def _load_files(sources: Mapping[str, str]) -> dict[str, FileProto]:
    """Each source's FileDescriptorProto under its name: decoded where it is base64, compiled
    by protoc where it is .proto text."""
    files: dict[str, FileProto] = {}
    texts: dict[str, str] = {}
    for name, source in sources.items():
        proto = _decode_serialized(name, source)
        if proto is None:
            texts[name] = source
        else:
            files[name] = proto
    if texts:
        files.update(_compile(texts, files))
    return files


def _decode_serialized(name: str, source: str) -> FileProto | None:
    """The FileDescriptorProto `source` is the base64 of, or None where it is not base64 (then
    it is .proto text: base64 has no spaces, semicolons nor braces)."""
    stripped = source.strip()
    if len(stripped) % 4 or not _BASE64.fullmatch(stripped):
        return None
    try:
        proto = FileProto.FromString(base64.b64decode(stripped, validate=True))
    except (binascii.Error, DecodeError) as e:
        raise InvalidSchemaError(f"{_where(name)} is base64 but not a serialized "
                                 f"FileDescriptorProto: {e}") from None
    proto.name = name
    return proto


def _compile(texts: Mapping[str, str], imported: Mapping[str, FileProto]) -> dict[str, FileProto]:
    """The files protoc compiles from `texts` (import path -> .proto text) and what they import
    but `imported` (printed for protoc to read) and the well-known types."""
    with tempfile.TemporaryDirectory(prefix="deltabus-protoc-") as root:
        source_root = os.path.join(root, "src")
        for name, text in texts.items():
            _write_source(source_root, name, text)
        for name, proto in imported.items():
            _write_source(source_root, name, _ProtoPrinter(proto, None).text())
        out = os.path.join(root, "descriptors.pb")
        inputs = sorted(texts)
        with _PROTOC_LOCK:
            for name in inputs:
                _check_with_protoc(source_root, name)
            status = protoc.main(["protoc", f"-I{source_root}", f"-I{_PROTOC_INCLUDE}",
                                  f"--descriptor_set_out={out}", "--include_imports", *inputs])
        if status != 0:
            raise InvalidSchemaError(f"protoc refused the schema (exit status {status})")
        with open(out, "rb") as f:
            descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    return {proto.name: proto for proto in descriptor_set.file
            if proto.name not in imported and proto.name not in _WELL_KNOWN}


def _write_source(root: str, name: str, text: str) -> None:
    parts = name.split("/")
    if (not name or name.startswith("/") or "\\" in name or "\x00" in name
            or any(part in ("", ".", "..") for part in parts)):
        raise InvalidSchemaError(f"{name!r} is not an import path (relative, '/'-separated, "
                                 "no '..')")
    path = os.path.join(root, *parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _check_with_protoc(root: str, name: str) -> None:
    """Raise InvalidSchemaError with protoc's first error where `name` does not compile."""
    try:
        _protoc_compiler.get_protos(name.encode(), [root.encode(), _PROTOC_INCLUDE.encode()])
    except _protoc_compiler.ProtocErrors as e:
        errors = list(e.errors())
        located = [error for error in errors if error.line >= 0] or errors
        first = located[0]
        filename = first.filename.decode(errors="replace")
        at = f" line {first.line + 1} column {first.column + 1}" if first.line >= 0 else ""
        message = " ".join(first.message.decode(errors="replace").split())
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InvalidSchemaError(f"{_where(filename)}{at}: {message}{more}") from None


def _where(name: str) -> str:
    return "the schema" if name == MAIN_FILE else f"{name!r}"


def _add_file(pool: DescriptorPool, name: str, files: Mapping[str, FileProto],
              chain: tuple[str, ...], added: list[FileProto]) -> None:
    """Add file `name` to `pool` after its imports (`chain`: the files importing it)."""
    if any(proto.name == name for proto in added):
        return
    if name in chain or len(chain) > IMPORT_DEPTH_MAX:
        raise InvalidSchemaError(f"the imports loop or go deeper than {IMPORT_DEPTH_MAX}: "
                                 + " -> ".join((*chain, name)))
    proto = files.get(name)
    if proto is None and name in _WELL_KNOWN:
        proto = FileProto.FromString(_WELL_KNOWN[name])
    if proto is None:
        raise InvalidSchemaError(f"{_where(chain[-1])} imports {name!r}, which is neither a "
                                 "reference nor a well-known type")
    for dependency in proto.dependency:
        _add_file(pool, dependency, files, (*chain, name), added)
    try:
        pool.Add(proto)
    except (TypeError, ValueError) as e:
        raise InvalidSchemaError(f"{_where(name)} is not a valid file descriptor: "
                                 + " ".join(str(e).split())) from None
    added.append(proto)


def _normalised(proto: FileProto) -> FileProto:
    """`proto` as either registered form gives it: no source info, no derived json names."""
    out = FileProto()
    out.CopyFrom(proto)
    out.name = MAIN_FILE
    out.ClearField("source_code_info")
    for field_proto in _all_fields(out):
        if field_proto.json_name == _json_name(field_proto.name):
            field_proto.ClearField("json_name")
    return out


def _serialized(proto: FileProto, pool: DescriptorPool) -> bytes:
    """`proto`'s bytes, the same whichever form it came from and whatever extensions other
    code registered in the default pool: read again with the schema's own descriptor types,
    its custom options are known fields, serialized in field-number order."""
    try:
        own = pool.FindMessageTypeByName(FileProto.DESCRIPTOR.full_name)
    except KeyError:  # the schema imports no descriptor.proto: it has no custom options
        return proto.SerializeToString(deterministic=True)
    message_class = message_factory.GetMessageClass(own)
    return message_class.FromString(proto.SerializeToString()).SerializeToString(
        deterministic=True)


def _all_fields(proto: FileProto) -> Iterable[FieldProto]:
    yield from proto.extension
    messages = list(proto.message_type)
    while messages:
        message = messages.pop()
        yield from message.field
        yield from message.extension
        messages.extend(message.nested_type)


def _json_name(name: str) -> str:
    """protoc's default json name for a field (ToJsonName: drop '_', capitalise what follows)."""
    out: list[str] = []
    upper = False
    for char in name:
        if char == "_":
            upper = True
        else:
            out.append(char.upper() if upper else char)
            upper = False
    return "".join(out)


def _synthetic_oneofs(proto: FileProto) -> Iterable[str]:
    """The full names of the oneofs protoc made for proto3 `optional` fields in `proto`."""
    scopes = [(f".{proto.package}" if proto.package else "", message)
              for message in proto.message_type]
    while scopes:
        scope, message = scopes.pop()
        name = f"{scope}.{message.name}"
        for index, oneof in enumerate(message.oneof_decl):
            members = [f for f in message.field
                       if f.HasField("oneof_index") and f.oneof_index == index]
            if members and all(f.proto3_optional for f in members):
                yield f"{name}.{oneof.name}".lstrip(".")
        scopes.extend((name, nested) for nested in message.nested_type)


# --- Printing .proto text -----------------------------------------------------------------

_SCALAR_NAMES = {
    FieldProto.TYPE_DOUBLE: "double", FieldProto.TYPE_FLOAT: "float",
    FieldProto.TYPE_INT64: "int64", FieldProto.TYPE_UINT64: "uint64",
    FieldProto.TYPE_INT32: "int32", FieldProto.TYPE_FIXED64: "fixed64",
    FieldProto.TYPE_FIXED32: "fixed32", FieldProto.TYPE_BOOL: "bool",
    FieldProto.TYPE_STRING: "string", FieldProto.TYPE_BYTES: "bytes",
    FieldProto.TYPE_UINT32: "uint32", FieldProto.TYPE_SFIXED32: "sfixed32",
    FieldProto.TYPE_SFIXED64: "sfixed64", FieldProto.TYPE_SINT32: "sint32",
    FieldProto.TYPE_SINT64: "sint64",
}


class _ProtoPrinter:
    """Prints a FileDescriptorProto as .proto source, deterministically: declaration order,
    two-space indents, types fully qualified. `pool` (holding the file's imports) lets custom
    options print; without it only the standard options do (enough for protoc to compile a
    file importing this one)."""

    def __init__(self, proto: FileProto, pool: DescriptorPool | None) -> None:
        self.proto = proto
        self.pool = pool
        self.editions = proto.syntax == "editions"
        self.proto3 = proto.syntax == "proto3"
        self.lines: list[str] = []

    def text(self) -> str:
        proto = self.proto
        if self.editions:
            edition = descriptor_pb2.Edition.Name(proto.edition).removeprefix("EDITION_")
            self._line(0, f'edition = "{edition}";')
        else:
            self._line(0, f'syntax = "{proto.syntax or "proto2"}";')
        if proto.package:
            self._line(0, f"package {proto.package};")
        for index, dependency in enumerate(proto.dependency):
            kind = ("public " if index in proto.public_dependency
                    else "weak " if index in proto.weak_dependency else "")
            self._line(0, f"import {kind}{_quote(dependency)};")
        for dependency in proto.option_dependency:
            self._line(0, f"import option {_quote(dependency)};")
        self._options(0, proto.options)
        scope = f".{proto.package}" if proto.package else ""
        nested = {f"{scope}.{message.name}": message for message in proto.message_type}
        hidden = _hidden_types(proto.extension, nested)
        for message in proto.message_type:
            if f"{scope}.{message.name}" not in hidden:
                self._message(0, message, f"{scope}.{message.name}")
        for enum in proto.enum_type:
            self._enum(0, enum)
        for service in proto.service:
            self._service(service)
        self._extensions(0, proto.extension, nested)
        return "\n".join(self.lines) + "\n"

    def _line(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def _open(self, depth: int, text: str) -> None:
        """The first line of a definition: top-level ones stand a blank line apart."""
        if depth == 0:
            self.lines.append("")
        self._line(depth, text)

    def _options(self, depth: int, options: Message) -> None:
        for assignment in self._assignments(options):
            self._line(depth, f"option {assignment};")

    def _message(self, depth: int, message: MessageProto, scope: str) -> None:
        self._open(depth, f"message {message.name} {{")
        self._body(depth + 1, message, scope)
        self._line(depth, "}")

    def _body(self, depth: int, message: MessageProto, scope: str) -> None:
        self._options(depth, message.options)
        nested = {f"{scope}.{inner.name}": inner for inner in message.nested_type}
        hidden = _hidden_types([*message.field, *message.extension], nested)
        waiting = [inner for inner in message.nested_type
                   if f"{scope}.{inner.name}" not in hidden]
        printed_oneofs: set[int] = set()
        for field_proto in message.field:
            oneof = _real_oneof_index(field_proto)
            if oneof is not None and oneof in printed_oneofs:
                continue
            members = [field_proto] if oneof is None else [
                f for f in message.field if _real_oneof_index(f) == oneof]
            self._nested_before(depth, message, scope, members, hidden, waiting)
            if oneof is None:
                self._field(depth, field_proto, nested)
            else:
                printed_oneofs.add(oneof)
                self._oneof(depth, message, oneof, nested)
        self._extensions(depth, message.extension, nested)
        for inner in waiting:
            self._message(depth, inner, f"{scope}.{inner.name}")
        for enum in message.enum_type:
            self._enum(depth, enum)
        for extension_range in message.extension_range:
            options = self._option_list(extension_range.options, [])
            numbers = _ranges([(extension_range.start, extension_range.end - 1)],
                              _FIELD_NUMBER_MAX)
            self._line(depth, f"extensions {numbers}{options};")
        self._reserved(depth, [(r.start, r.end - 1) for r in message.reserved_range],
                       message.reserved_name, _FIELD_NUMBER_MAX)

    def _nested_before(self, depth: int, message: MessageProto, scope: str,
                       fields: Sequence[FieldProto], hidden: set[str],
                       waiting: list[MessageProto]) -> None:
        """A map or group field declares its nested type where it stands: print the nested
        messages declared before that type first, so the nested types keep their order (the
        message indexes count map entries)."""
        names = [f"{scope}.{inner.name}" for inner in message.nested_type]
        anchors = [names.index(f.type_name) for f in fields if f.type_name in hidden]
        if not anchors:
            return
        while waiting and names.index(f"{scope}.{waiting[0].name}") < max(anchors):
            inner = waiting.pop(0)
            self._message(depth, inner, f"{scope}.{inner.name}")

    def _oneof(self, depth: int, message: MessageProto, index: int,
               nested: Mapping[str, MessageProto]) -> None:
        self._line(depth, f"oneof {message.oneof_decl[index].name} {{")
        self._options(depth + 1, message.oneof_decl[index].options)
        for field_proto in message.field:
            if _real_oneof_index(field_proto) == index:
                self._field(depth + 1, field_proto, nested, in_oneof=True)
        self._line(depth, "}")

    def _field(self, depth: int, field_proto: FieldProto, nested: Mapping[str, MessageProto],
               in_oneof: bool = False) -> None:
        entry = nested.get(field_proto.type_name)
        options = self._field_options(field_proto)
        head = f"{field_proto.name} = {field_proto.number}{options}"
        if entry is not None and entry.options.map_entry:
            key, value = sorted(entry.field, key=lambda f: f.number)
            self._line(depth, f"map<{self._type(key)}, {self._type(value)}> {head};")
        elif entry is not None and field_proto.type == FieldProto.TYPE_GROUP:
            label = self._label(field_proto, in_oneof)
            self._line(depth, f"{label}group {entry.name} = {field_proto.number}{options} {{")
            self._body(depth + 1, entry, field_proto.type_name)
            self._line(depth, "}")
        else:
            label = self._label(field_proto, in_oneof)
            self._line(depth, f"{label}{self._type(field_proto)} {head};")

    def _label(self, field_proto: FieldProto, in_oneof: bool) -> str:
        if field_proto.label == FieldProto.LABEL_REPEATED:
            return "repeated "
        if in_oneof or self.editions:
            return ""
        if field_proto.label == FieldProto.LABEL_REQUIRED:
            return "required "
        if self.proto3:
            return "optional " if field_proto.proto3_optional else ""
        return "optional "

    def _type(self, field_proto: FieldProto) -> str:
        return _SCALAR_NAMES.get(field_proto.type) or field_proto.type_name

    def _field_options(self, field_proto: FieldProto) -> str:
        first = []
        if field_proto.HasField("default_value"):
            first.append(f"default = {_default_literal(field_proto)}")
        if field_proto.HasField("json_name") and (
                field_proto.json_name != _json_name(field_proto.name)):
            first.append(f"json_name = {_quote(field_proto.json_name)}")
        return self._option_list(field_proto.options, first)

    def _option_list(self, options: Message, first: list[str]) -> str:
        items = first + self._assignments(options)
        return f" [{', '.join(items)}]" if items else ""

    def _extensions(self, depth: int, extensions: Sequence[FieldProto],
                    nested: Mapping[str, MessageProto]) -> None:
        extendee = None
        for extension in extensions:
            if extension.extendee != extendee:
                if extendee is not None:
                    self._line(depth, "}")
                extendee = extension.extendee
                self._open(depth, f"extend {extendee} {{")
            self._field(depth + 1, extension, nested)
        if extendee is not None:
            self._line(depth, "}")

    def _enum(self, depth: int, enum: EnumProto) -> None:
        self._open(depth, f"enum {enum.name} {{")
        self._options(depth + 1, enum.options)
        for value in enum.value:
            options = self._option_list(value.options, [])
            self._line(depth + 1, f"{value.name} = {value.number}{options};")
        self._reserved(depth + 1, [(r.start, r.end) for r in enum.reserved_range],
                       enum.reserved_name, _ENUM_NUMBER_MAX)
        self._line(depth, "}")

    def _reserved(self, depth: int, ranges: list[tuple[int, int]], names: Sequence[str],
                  maximum: int) -> None:
        if ranges:
            self._line(depth, f"reserved {_ranges(ranges, maximum)};")
        if names:
            spelled = names if self.editions else [_quote(name) for name in names]
            self._line(depth, f"reserved {', '.join(spelled)};")

    def _service(self, service: descriptor_pb2.ServiceDescriptorProto) -> None:
        self._open(0, f"service {service.name} {{")
        self._options(1, service.options)
        for method in service.method:
            source = ("stream " if method.client_streaming else "") + method.input_type
            result = ("stream " if method.server_streaming else "") + method.output_type
            signature = f"rpc {method.name}({source}) returns ({result})"
            assignments = self._assignments(method.options)
            if not assignments:
                self._line(1, f"{signature};")
                continue
            self._line(1, f"{signature} {{")
            for assignment in assignments:
                self._line(2, f"option {assignment};")
            self._line(1, "}")
        self._line(0, "}")

    def _assignments(self, options: Message) -> list[str]:
        """`name = value` for each option set in `options` (custom options too, where the pool
        knows them: the options message is read again with the pool's own option types)."""
        if self.pool is not None:
            try:
                own = self.pool.FindMessageTypeByName(options.DESCRIPTOR.full_name)
            except KeyError:  # the file imports no descriptor.proto: no custom options
                own = None
            if own is not None:
                options = message_factory.GetMessageClass(own).FromString(
                    options.SerializeToString(deterministic=True))
        return _option_assignments(options, "")


def _option_assignments(options: Message, prefix: str) -> list[str]:
    out: list[str] = []
    for option, value in options.ListFields():
        if option.name == "uninterpreted_option":
            continue
        name = prefix + (f"({option.full_name})" if option.is_extension else option.name)
        values = list(value) if option.is_repeated else [value]
        for item in values:
            if option.message_type is None:
                out.append(f"{name} = {_option_literal(option, item)}")
            elif option.is_extension or option.is_repeated:
                text = text_format.MessageToString(item, as_one_line=True)
                out.append(f"{name} = {{ {text} }}" if text else f"{name} = {{}}")
            else:  # a standard message-typed option (features): one assignment per leaf
                out.extend(_option_assignments(item, f"{name}."))
    return out


def _option_literal(option: FieldDescriptor, value: Any) -> str:
    if option.enum_type is not None:
        known = option.enum_type.values_by_number.get(value)
        return known.name if known is not None else str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, bytes):
        return f'"{text_encoding.CEscape(value, as_utf8=False)}"'
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


def _default_literal(field_proto: FieldProto) -> str:
    if field_proto.type == FieldProto.TYPE_STRING:
        return _quote(field_proto.default_value)
    if field_proto.type == FieldProto.TYPE_BYTES:  # the descriptor holds it C-escaped already
        return f'"{field_proto.default_value}"'
    return field_proto.default_value


def _quote(text: str) -> str:
    return f'"{text_encoding.CEscape(text, as_utf8=True)}"'


def _ranges(ranges: Sequence[tuple[int, int]], maximum: int) -> str:
    """`1, 3 to 5, 9 to max` for inclusive (start, end) pairs."""
    spelled = []
    for start, end in ranges:
        if start == end:
            spelled.append(str(start))
        else:
            spelled.append(f"{start} to {'max' if end == maximum else end}")
    return ", ".join(spelled)


def _real_oneof_index(field_proto: FieldProto) -> int | None:
    if field_proto.HasField("oneof_index") and not field_proto.proto3_optional:
        return field_proto.oneof_index
    return None


def _hidden_types(fields: Iterable[FieldProto], nested: Mapping[str, MessageProto]) -> set[str]:
    """The nested types written as part of a field (map entries and groups), not by
    themselves."""
    hidden: set[str] = set()
    for field_proto in fields:
        entry = nested.get(field_proto.type_name)
        if entry is not None and (entry.options.map_entry
                                  or field_proto.type == FieldProto.TYPE_GROUP):
            hidden.add(field_proto.type_name)
    return hidden


# --- Compatibility ------------------------------------------------------------------------

_WIRE_KINDS = {  # Confluent's ScalarKind: types one of which reads another's bytes
    FieldDescriptor.TYPE_INT32: "varint", FieldDescriptor.TYPE_INT64: "varint",
    FieldDescriptor.TYPE_UINT32: "varint", FieldDescriptor.TYPE_UINT64: "varint",
    FieldDescriptor.TYPE_BOOL: "varint", FieldDescriptor.TYPE_ENUM: "varint",
    FieldDescriptor.TYPE_SINT32: "zigzag", FieldDescriptor.TYPE_SINT64: "zigzag",
    FieldDescriptor.TYPE_STRING: "length-delimited", FieldDescriptor.TYPE_BYTES:
    "length-delimited",
    FieldDescriptor.TYPE_FIXED32: "fixed32", FieldDescriptor.TYPE_SFIXED32: "fixed32",
    FieldDescriptor.TYPE_FIXED64: "fixed64", FieldDescriptor.TYPE_SFIXED64: "fixed64",
    FieldDescriptor.TYPE_FLOAT: "float", FieldDescriptor.TYPE_DOUBLE: "double",
}
_TYPE_NAMES = {getattr(FieldDescriptor, f"TYPE_{name.upper()}"): name
               for name in _SCALAR_NAMES.values()}


class _Diff:
    """Confluent's protobuf SchemaDiff, on descriptors: what stops `reader` reading data
    written with `writer`. Incompatible, as Confluent has it: PACKAGE_CHANGED, MESSAGE_REMOVED
    (top-level or nested), FIELD_KIND_CHANGED (scalar/enum, message, map),
    FIELD_SCALAR_KIND_CHANGED (across _WIRE_KINDS), FIELD_NAMED_TYPE_CHANGED (another message,
    or an incompatible change inside a referenced one), FIELD_NUMERIC_LABEL_CHANGED (a numeric
    field between single, repeated and required), REQUIRED_FIELD_ADDED / _REMOVED,
    ONEOF_FIELD_REMOVED, MULTIPLE_FIELDS_MOVED_TO_ONEOF, FIELD_MOVED_TO_EXISTING_ONEOF.
    Compatible: fields, messages, enums, enum constants and oneofs added or removed (a field
    leaving a oneof included), names changed, messages reordered, string/bytes labels.
    One difference from Confluent: it compares labels only where both fields spell one, so a
    proto3 `int32 x` becoming `repeated int32 x` passes there; here it is
    FIELD_NUMERIC_LABEL_CHANGED, as for any numeric field (a packed list is no varint)."""

    def __init__(self, writer: ProtobufSchema, reader: ProtobufSchema) -> None:
        self.writer = writer
        self.reader = reader
        self._comparing: set[tuple[str, str]] = set()

    def errors(self) -> list[str]:
        out: list[str] = []
        old, new = self.writer.file.package, self.reader.file.package
        if old != new:
            out.append(f"the package changed from {old!r} to {new!r} (PACKAGE_CHANGED)")
        self._messages(_top_level(self.writer), _top_level(self.reader), out)
        return out

    def _messages(self, writer: Sequence[Descriptor], reader: Sequence[Descriptor],
                  out: list[str]) -> None:
        by_name = {message.name: message for message in reader}
        for message in writer:
            if message.GetOptions().map_entry:
                continue  # compared as the map field's key and value
            if message.name not in by_name:
                out.append(f"{message.full_name}: the message was removed (MESSAGE_REMOVED)")
            else:
                self._message(message, by_name[message.name], out)

    def _message(self, writer: Descriptor, reader: Descriptor, out: list[str]) -> None:
        pair = (writer.full_name, reader.full_name)
        if pair in self._comparing:
            return  # a message holding itself: compared already, higher up
        self._comparing.add(pair)
        try:
            self._fields(writer, reader, out)
            self._messages(writer.nested_types, reader.nested_types, out)
        finally:
            self._comparing.discard(pair)

    def _fields(self, writer: Descriptor, reader: Descriptor, out: list[str]) -> None:
        writer_oneof = self._oneof_of(writer, self.writer)
        reader_oneof = self._oneof_of(reader, self.reader)
        writer_top = {f.number: f for f in writer.fields if f.number not in writer_oneof}
        reader_top = {f.number: f for f in reader.fields if f.number not in reader_oneof}
        self._oneof_moves(reader, reader_oneof, writer_top, writer_oneof, out)
        self._oneof_members(writer, reader, writer_oneof, reader_oneof, out)
        for number in sorted(writer_top.keys() | reader_top.keys()):
            old, new = writer_top.get(number), reader_top.get(number)
            if new is None and old is not None and old.is_required:
                out.append(f"{_at(writer, old)}: the reader lacks a field the writer requires "
                           "(REQUIRED_FIELD_REMOVED)")
            elif old is None and new is not None and new.is_required:
                out.append(f"{_at(reader, new)}: the reader requires a field the writer lacks "
                           "(REQUIRED_FIELD_ADDED)")
            elif old is not None and new is not None:
                self._field(writer, old, new, out)
        common = {f.number for f in writer.fields} & {f.number for f in reader.fields}
        for number in sorted(common):
            moved = writer_oneof.get(number) != reader_oneof.get(number)
            if moved:  # in or out of a oneof, or into another one: compared here only
                self._field(writer, writer.fields_by_number[number],
                            reader.fields_by_number[number], out)

    def _oneof_of(self, message: Descriptor, schema: ProtobufSchema) -> dict[int, str]:
        """Field number -> the name of its (real, not proto3 `optional`'s) oneof."""
        return {f.number: f.containing_oneof.name for f in message.fields
                if f.containing_oneof is not None
                and f.containing_oneof.full_name not in schema.synthetic_oneofs}

    def _oneof_moves(self, reader: Descriptor, reader_oneof: Mapping[int, str],
                     writer_top: dict[int, FieldDescriptor], writer_oneof: Mapping[int, str],
                     out: list[str]) -> None:
        """A oneof keeps one of its fields: two fields the writer could set together may not
        move into one, nor a field into a oneof holding others already."""
        for name in sorted(set(reader_oneof.values())):
            numbers = [n for n, oneof in reader_oneof.items() if oneof == name]
            moved = [n for n in numbers if n in writer_top]
            existing = [n for n in numbers if n in writer_oneof]
            where = f"{reader.full_name} oneof {name!r}"
            if len(moved) > 1:
                out.append(f"{where}: fields {', '.join(map(str, moved))} moved into it "
                           "(MULTIPLE_FIELDS_MOVED_TO_ONEOF)")
            elif moved and existing:
                out.append(f"{where}: field {moved[0]} moved into it beside fields of a "
                           "writer's oneof (FIELD_MOVED_TO_EXISTING_ONEOF)")
            for number in moved:
                del writer_top[number]

    def _oneof_members(self, writer: Descriptor, reader: Descriptor,
                       writer_oneof: Mapping[int, str], reader_oneof: Mapping[int, str],
                       out: list[str]) -> None:
        """A field leaving a oneof that stays is an incompatible removal (the writer's choice
        is lost); one moved elsewhere is compared where it went."""
        reader_names = set(reader_oneof.values())
        for number, name in sorted(writer_oneof.items()):
            if name not in reader_names:
                continue  # the whole oneof went: ONEOF_REMOVED, compatible
            old = writer.fields_by_number[number]
            new = reader.fields_by_number.get(number)
            if new is None:
                out.append(f"{_at(writer, old)}: the field was removed from oneof {name!r} "
                           "(ONEOF_FIELD_REMOVED)")
            elif reader_oneof.get(number) == name:
                self._field(writer, old, new, out)

    def _field(self, message: Descriptor, old: FieldDescriptor, new: FieldDescriptor,
               out: list[str], labels: bool = True) -> None:
        at = _at(message, old)
        old_kind, new_kind = _kind(old), _kind(new)
        if old_kind != new_kind:
            out.append(f"{at}: the field changed from a {old_kind} to a {new_kind} "
                       "(FIELD_KIND_CHANGED)")
        elif old_kind == "map":
            for part in ("key", "value"):
                self._field(message, old.message_type.fields_by_name[part],
                            new.message_type.fields_by_name[part], out, labels=False)
        elif old_kind == "message":
            self._named_type(at, old.message_type, new.message_type, out)
        elif _WIRE_KINDS[old.type] != _WIRE_KINDS[new.type]:
            out.append(f"{at}: the type changed from {_type_name(old)} to {_type_name(new)} "
                       "(FIELD_SCALAR_KIND_CHANGED)")
        elif labels and _label(old) != _label(new) and _WIRE_KINDS[old.type] != (
                "length-delimited"):
            out.append(f"{at}: the field changed from {_label(old)} to {_label(new)} "
                       "(FIELD_NUMERIC_LABEL_CHANGED)")

    def _named_type(self, at: str, old: Descriptor, new: Descriptor, out: list[str]) -> None:
        old_name, new_name = _local_name(old), _local_name(new)
        if old_name != new_name:
            out.append(f"{at}: the message type changed from {old.full_name} to "
                       f"{new.full_name} (FIELD_NAMED_TYPE_CHANGED)")
            return
        if old.file.name == new.file.name == MAIN_FILE:
            return  # both defined in the schema itself: compared message by message
        if old.file.name == new.file.name and old.file.serialized_pb == new.file.serialized_pb:
            return  # the same imported file on both sides
        inner: list[str] = []
        self._message(old, new, inner)
        if inner:
            out.extend(inner)
            out.append(f"{at}: message type {new.full_name} changed incompatibly "
                       "(FIELD_NAMED_TYPE_CHANGED)")


def _top_level(schema: ProtobufSchema) -> list[Descriptor]:
    return [schema.file.pool.FindMessageTypeByName(name) for name in schema.messages]


def _at(message: Descriptor, field_descriptor: FieldDescriptor) -> str:
    return f"{message.full_name} field {field_descriptor.number} {field_descriptor.name!r}"


def _kind(field_descriptor: FieldDescriptor) -> str:
    message = field_descriptor.message_type
    if message is None:
        return "scalar"
    return "map" if message.GetOptions().map_entry else "message"


def _label(field_descriptor: FieldDescriptor) -> str:
    if field_descriptor.is_repeated:
        return "repeated"
    return "required" if field_descriptor.is_required else "single"


def _type_name(field_descriptor: FieldDescriptor) -> str:
    if field_descriptor.enum_type is not None:
        return f"enum {field_descriptor.enum_type.full_name}"
    return _TYPE_NAMES[field_descriptor.type]


def _local_name(message: Descriptor) -> str:
    package = message.file.package
    return message.full_name[len(package) + 1:] if package else message.full_name


# --- Messages -----------------------------------------------------------------------------


def message_descriptor(schema: ProtobufSchema, indexes: Sequence[int]) -> Descriptor:
    """The message Confluent's message `indexes` name in `schema` ([0]: the first top-level
    message; [1, 0]: the first message nested in the second). ValueError if there is none."""
    if not indexes:
        raise ValueError("message indexes name at least the top-level message")
    top = indexes[0]
    if not 0 <= top < len(schema.messages):
        raise ValueError(f"message index {top} is out of range: the schema has "
                         f"{len(schema.messages)} top-level message(s)")
    descriptor = schema.file.pool.FindMessageTypeByName(schema.messages[top])
    for index in indexes[1:]:
        nested = descriptor.nested_types
        if not 0 <= index < len(nested):
            raise ValueError(f"message index {index} is out of range: {descriptor.full_name} "
                             f"has {len(nested)} nested message(s)")
        descriptor = nested[index]
    return descriptor


def message_indexes(schema: ProtobufSchema, name: str) -> list[int]:
    """The message indexes of the message `name` (full, or relative to the package) of
    `schema`. ValueError if the schema defines no such message."""
    package = schema.file.package
    for candidate in (name, f"{package}.{name}" if package else name):
        try:
            descriptor = schema.file.pool.FindMessageTypeByName(candidate)
        except KeyError:
            continue
        if descriptor.file.name == MAIN_FILE:
            return _indexes_of(schema, descriptor)
    raise ValueError(f"the schema defines no message {name!r}")


def _indexes_of(schema: ProtobufSchema, descriptor: Descriptor) -> list[int]:
    path = []
    while descriptor.containing_type is not None:
        parent = descriptor.containing_type
        names = [nested.full_name for nested in parent.nested_types]
        path.append(names.index(descriptor.full_name))
        descriptor = parent
    path.append(schema.messages.index(descriptor.full_name))
    return path[::-1]


def encode_protobuf(schema: ProtobufSchema, message: str | Sequence[int],
                    rows: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """Each row (a dict as protobuf's JSON mapping reads it) as what follows Confluent's wire
    header: the message indexes, then the serialized message. `message` is the message's name
    or its indexes. ValueError naming the first row that is not such a message."""
    indexes = message_indexes(schema, message) if isinstance(message, str) else list(message)
    descriptor = message_descriptor(schema, indexes)
    prefix = write_message_indexes(indexes)
    message_class = message_factory.GetMessageClass(descriptor)
    out = []
    for index, row in enumerate(rows):
        try:
            parsed = json_format.ParseDict(dict(row), message_class())
        except (json_format.ParseError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"row {index} is not a {descriptor.full_name}: {e}") from None
        out.append(prefix + parsed.SerializeToString())
    return out


def decode_protobuf(schema: ProtobufSchema, payloads: Sequence[bytes]) -> pa.Table:
    """The records' messages as a table (`protobuf_arrow_schema` of their message). Each
    payload is what follows Confluent's wire header; all name the same message. ValueError
    naming the first record that does not parse or names another message."""
    views = [memoryview(payload) for payload in payloads]
    indexes = _record_indexes(views[0], 0)[0] if views else [0]
    try:
        descriptor = message_descriptor(schema, indexes)
    except ValueError as e:
        raise ValueError(f"record 0: {e}") from None
    message_class = message_factory.GetMessageClass(descriptor)
    messages = []
    for index, view in enumerate(views):
        found, offset = _record_indexes(view, index)
        if found != indexes:
            raise ValueError(f"record {index} has message indexes {found}, record 0 {indexes}: "
                             "the records of one table are of one message type")
        parsed = message_class()
        try:
            parsed.ParseFromString(view[offset:])
        except DecodeError as e:
            raise ValueError(f"record {index} does not parse as {descriptor.full_name}: "
                             f"{e}") from None
        messages.append(parsed)
    return _table(descriptor, messages)


def _record_indexes(view: memoryview, index: int) -> tuple[list[int], int]:
    try:
        return read_message_indexes(view)
    except ValueError as e:
        raise ValueError(f"record {index}: {e}") from None


# --- Arrow columns ------------------------------------------------------------------------

_SCALAR_ARROW = {
    FieldDescriptor.TYPE_INT32: pa.int32(), FieldDescriptor.TYPE_SINT32: pa.int32(),
    FieldDescriptor.TYPE_SFIXED32: pa.int32(), FieldDescriptor.TYPE_INT64: pa.int64(),
    FieldDescriptor.TYPE_SINT64: pa.int64(), FieldDescriptor.TYPE_SFIXED64: pa.int64(),
    # Delta has no unsigned types: the next wider signed type holds every value
    FieldDescriptor.TYPE_UINT32: pa.int64(), FieldDescriptor.TYPE_FIXED32: pa.int64(),
    FieldDescriptor.TYPE_UINT64: pa.decimal128(20, 0),
    FieldDescriptor.TYPE_FIXED64: pa.decimal128(20, 0),
    FieldDescriptor.TYPE_FLOAT: pa.float32(), FieldDescriptor.TYPE_DOUBLE: pa.float64(),
    FieldDescriptor.TYPE_BOOL: pa.bool_(), FieldDescriptor.TYPE_STRING: pa.string(),
    FieldDescriptor.TYPE_BYTES: pa.binary(), FieldDescriptor.TYPE_ENUM: pa.string(),
}
_TIMESTAMP = "google.protobuf.Timestamp"
_WRAPPERS = {
    "google.protobuf.DoubleValue": pa.float64(), "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(), "google.protobuf.UInt64Value":
    pa.decimal128(20, 0),
    "google.protobuf.Int32Value": pa.int32(), "google.protobuf.UInt32Value": pa.int64(),
    "google.protobuf.BoolValue": pa.bool_(), "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
# JSON-shaped values, recursive as messages: a column holds their JSON text
_JSON_VALUES = frozenset({"google.protobuf.Struct", "google.protobuf.Value",
                          "google.protobuf.ListValue"})


def protobuf_arrow_type(descriptor: Descriptor) -> pa.DataType:
    """The Delta-compatible Arrow type of message `descriptor`: a struct of nullable fields;
    Timestamp a UTC timestamp, a wrapper its nullable scalar, Struct/Value/ListValue JSON text.
    InvalidSchemaError for a message no column can hold (recursive, or without fields)."""
    return _message_arrow_type(descriptor, ())


def protobuf_arrow_schema(descriptor: Descriptor) -> pa.Schema:
    """The columns of a table of `descriptor` messages: one nullable column per field."""
    struct = _message_arrow_type(descriptor, ())
    if not isinstance(struct, pa.StructType):
        raise InvalidSchemaError(f"{descriptor.full_name} is a single value, not a message "
                                 "whose fields can be columns")
    return pa.schema([struct.field(index) for index in range(struct.num_fields)])


def _message_arrow_type(descriptor: Descriptor, enclosing: tuple[str, ...]) -> pa.DataType:
    name = descriptor.full_name
    if name == _TIMESTAMP:
        return pa.timestamp("us", tz="UTC")
    if name in _WRAPPERS:
        return _WRAPPERS[name]
    if name in _JSON_VALUES:
        return pa.string()
    if name in enclosing:
        raise InvalidSchemaError(f"{name} holds itself ({' -> '.join((*enclosing, name))}): "
                                 "a recursive message cannot be a column")
    if not descriptor.fields:
        raise InvalidSchemaError(f"{name} has no fields: Delta has no empty struct column")
    inner = (*enclosing, name)
    return pa.struct([pa.field(f.name, _field_arrow_type(f, inner), nullable=True)
                      for f in descriptor.fields])


def _field_arrow_type(field_descriptor: FieldDescriptor,
                      enclosing: tuple[str, ...]) -> pa.DataType:
    message = field_descriptor.message_type
    if message is not None and message.GetOptions().map_entry:
        key, value = message.fields_by_name["key"], message.fields_by_name["value"]
        return pa.map_(_field_arrow_type(key, enclosing), _field_arrow_type(value, enclosing))
    single = (_message_arrow_type(message, enclosing) if message is not None
              else _SCALAR_ARROW[field_descriptor.type])
    return pa.list_(single) if field_descriptor.is_repeated else single


def _table(descriptor: Descriptor, messages: Sequence[Message]) -> pa.Table:
    schema = protobuf_arrow_schema(descriptor)
    columns = [pa.array([read(message) for message in messages], type=column.type)
               for read, column in zip(_field_readers(descriptor), schema, strict=True)]
    return pa.Table.from_arrays(columns, schema=schema)


_Reader = Callable[[Any], Any]


@functools.lru_cache(maxsize=1024)
def _field_readers(descriptor: Descriptor) -> tuple[_Reader, ...]:
    """For each field of `descriptor`, what reads it from a message as a column value."""
    return tuple(_field_reader(f) for f in descriptor.fields)


def _field_reader(field_descriptor: FieldDescriptor) -> _Reader:
    name = field_descriptor.name
    message = field_descriptor.message_type
    if message is not None and message.GetOptions().map_entry:
        key = _value_reader(message.fields_by_name["key"])
        value = _value_reader(message.fields_by_name["value"])
        key_of, value_of = key or _identity, value or _identity

        def entries(m: Message) -> list[tuple[Any, Any]]:
            found = getattr(m, name)  # a map's items() goes through collections.abc: slow
            return [(key_of(k), value_of(found[k])) for k in found] if found else []
        return entries
    single = _value_reader(field_descriptor)
    if field_descriptor.is_repeated:
        if single is None:
            return lambda m: getattr(m, name)[:]  # a list: the container's slice is one
        read = single
        return lambda m: [read(item) for item in getattr(m, name)]
    if field_descriptor.has_presence:
        read = single or _identity
        return lambda m: read(getattr(m, name)) if m.HasField(name) else None
    return operator.attrgetter(name) if single is None else (
        lambda m: single(getattr(m, name)))


def _value_reader(field_descriptor: FieldDescriptor) -> _Reader | None:
    """What turns one value of the field (not a list, not absent) into a column value; None
    where the value is the column value as it is (a scalar)."""
    message = field_descriptor.message_type
    if field_descriptor.enum_type is not None:
        names = {value.number: value.name for value in field_descriptor.enum_type.values}
        return lambda number: names.get(number, str(number))  # an open enum's unknown value
    if message is None:
        return None
    if message.full_name == _TIMESTAMP:
        return lambda ts: ts.seconds * 1_000_000 + ts.nanos // 1_000
    if message.full_name in _WRAPPERS:
        return operator.attrgetter("value")
    if message.full_name in _JSON_VALUES:
        return lambda value: json.dumps(json_format.MessageToDict(value), separators=(",", ":"))
    return _struct_reader(message)


def _struct_reader(message: Descriptor) -> _Reader:
    readers = [(f.name, _field_reader(f)) for f in message.fields]
    return lambda m: {name: read(m) for name, read in readers}


def _identity(value: Any) -> Any:
    return value
