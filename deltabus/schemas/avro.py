"""Avro schemas as Confluent Schema Registry treats them: parsing, canonical text, the Avro
specification's reader/writer resolution rules, and the Arrow columns of a typed topic.

Pure: no I/O. Runs anywhere: the registry checks registrations on the driver, brokers decode a
typed topic's records on executors. `AvroSchema` is immutable and thread-safe (its fastavro
forms are cached on first use; two racing threads may both compute the same value).

What must hold, and why:
- `parse_avro` refuses what Confluent's Java parser refuses (it validates names, unions and
  field defaults), so every schema registered here parses in every Confluent client. Where Java
  ignores something (a logical type that does not fit its type), so do we: the schema is its
  underlying type. Union defaults may match any branch (Avro 1.12).
- `canonical()` is the compact JSON Java's `Schema.toString()` writes: attributes in Java's
  order, fields in their order, docs, defaults and other properties kept (custom properties
  sorted by key), each named type written in full once and by name after that, types defined
  by references by name only (Confluent's `Schemas.toString(schema, knownTypes)`). The same
  schema written differently gets one id; anything a reader could notice gets another.
- `read_errors` follows Java's `SchemaCompatibility`, which Confluent's checks run: names
  compare unqualified or through a reader alias, records' fields by name or reader alias,
  logical types are not compared. A pair of named types already under check is taken as
  compatible when met again, so recursive schemas terminate; each pair is checked once.
- A typed topic's columns are the Arrow types delta-rs stores (`avro_arrow_type`), and
  `decode_avro` builds exactly those types, so a decoded batch appends without casts. A
  payload must decode to its last byte: bytes left over mean another schema wrote it.
- `decode_avro` reads a column at a time (`deltabus.schemas.avro_columns`) where the schema allows
  and gives exactly the table (and errors) of the record-by-record path, `decode_avro_records`.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import fastavro
import pyarrow as pa
from fastavro.validation import ValidationError, validate

from deltabus.schemas.avro_columns import (
    DATE_RANGE,
    DECIMAL_BYTES_MAX,
    INT_RANGE,
    MICROS_RANGE,
    MILLIS_RANGE,
    BinaryStep,
    BooleanStep,
    DecimalStep,
    EnumStep,
    FixedStep,
    FloatStep,
    IntegerStep,
    NullStep,
    RecordStep,
    Step,
    Undecodable,
    UnionStep,
    decode_columns,
)
from deltabus.schemas.entities import InvalidSchemaError, ParsedSchema, SchemaType, without_header

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FULL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_DECIMAL_PRECISION_MAX = 38  # Delta's decimal(38, s); Arrow's decimal128
_FIELD_ORDERS = ("ascending", "descending", "ignore")

# Keys Java's parser reads itself; any other key of a schema object is a property it keeps.
_SCHEMA_RESERVED = frozenset({"doc", "fields", "items", "name", "namespace", "size", "symbols",
                              "values", "type", "aliases"})
_ENUM_RESERVED = _SCHEMA_RESERVED | {"default"}
_FIELD_RESERVED = frozenset({"default", "doc", "name", "order", "type", "aliases"})

# Logical types by (logicalType, underlying type); decimal is checked on its own.
_LOGICAL_TYPES = {
    ("date", "int"): pa.date32(),
    ("time-millis", "int"): pa.int32(),
    ("time-micros", "long"): pa.int64(),
    ("timestamp-millis", "long"): pa.timestamp("us", tz="UTC"),
    ("timestamp-micros", "long"): pa.timestamp("us", tz="UTC"),
    ("local-timestamp-millis", "long"): pa.timestamp("us"),
    ("local-timestamp-micros", "long"): pa.timestamp("us"),
    ("uuid", "string"): pa.string(),
}
# Decoded as their underlying int, long or string: the Arrow type holds that directly.
_DECODED_RAW = frozenset({"time-millis", "time-micros", "uuid"})
_PRIMITIVE_ARROW = {
    "null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
    "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(),
}
# (writer type, reader type) pairs the specification promotes.
_PROMOTIONS = frozenset({("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"),
                         ("long", "double"), ("float", "double"), ("string", "bytes"),
                         ("bytes", "string")})


class _NoDefault:
    def __repr__(self) -> str:
        return "<no default>"


_NO_DEFAULT: Any = _NoDefault()


# The parsed tree. Named types live in one table by full name; the tree refers to them with
# _Ref, so a record can hold itself and a type defined by a reference is shared, not copied.

@dataclass
class _Primitive:
    type: str
    props: dict[str, Any]


@dataclass
class _Array:
    items: _Node
    props: dict[str, Any]


@dataclass
class _Map:
    values: _Node
    props: dict[str, Any]


@dataclass
class _Union:
    branches: list[_Node]


@dataclass
class _Ref:
    name: str  # full name of a named type


@dataclass
class _Field:
    name: str
    type: _Node
    default: Any  # _NO_DEFAULT when it has none
    doc: str | None
    order: str | None
    aliases: list[str]
    props: dict[str, Any]


@dataclass
class _Record:
    name: str
    kind: str  # "record" or "error"
    fields: list[_Field]
    doc: str | None
    aliases: list[str]  # full names
    props: dict[str, Any]


@dataclass
class _Enum:
    name: str
    symbols: list[str]
    default: str | None
    doc: str | None
    aliases: list[str]
    props: dict[str, Any]


@dataclass
class _Fixed:
    name: str
    size: int
    doc: str | None
    aliases: list[str]
    props: dict[str, Any]


_Node = _Primitive | _Array | _Map | _Union | _Ref
_Named = _Record | _Enum | _Fixed


def _split(full: str) -> tuple[str, str | None]:
    """(name, namespace) of a full name."""
    space, _, name = full.rpartition(".")
    return name, space or None


def _qualify(name: str, space: str | None) -> str:
    return name if "." in name or not space else f"{space}.{name}"


def _kind(node: _Node, named: Mapping[str, _Named]) -> str:
    """The node's Avro type: a primitive's name, array, map, union, record, enum or fixed."""
    if isinstance(node, _Primitive):
        return node.type
    if isinstance(node, _Array):
        return "array"
    if isinstance(node, _Map):
        return "map"
    if isinstance(node, _Union):
        return "union"
    target = named[node.name]
    return "record" if isinstance(target, _Record) else \
        "enum" if isinstance(target, _Enum) else "fixed"


def _describe(node: _Node, named: Mapping[str, _Named]) -> str:
    kind = _kind(node, named)
    return f"{kind} '{node.name}'" if isinstance(node, _Ref) else kind


def _logical(node: _Primitive | _Fixed) -> str | None:
    """The node's logical type where it is valid for its type, else None (Java ignores it)."""
    logical = node.props.get("logicalType")
    if not isinstance(logical, str):
        return None
    base = node.type if isinstance(node, _Primitive) else "fixed"
    if logical == "decimal":
        return logical if base in ("bytes", "fixed") and _decimal(node) else None
    return logical if (logical, base) in _LOGICAL_TYPES else None


def _decimal(node: _Primitive | _Fixed) -> tuple[int, int] | None:
    """(precision, scale) of a valid decimal; a fixed holds at most what its bytes do."""
    precision, scale = node.props.get("precision"), node.props.get("scale", 0)
    if type(precision) is not int or type(scale) is not int or precision <= 0:
        return None
    if not 0 <= scale <= precision:
        return None
    if isinstance(node, _Fixed):
        most = math.floor(math.log10(2) * (8 * node.size - 1)) if node.size else 0
        if precision > most:
            return None
    return precision, scale


class _Parser:
    """Builds the tree of one schema text and the texts it references. Reference texts parse
    first (as Java's parser sees them), each when first named or else in the given order."""

    def __init__(self, references: Mapping[str, str]) -> None:
        self.references = references
        self.named: dict[str, _Named] = {}
        self.loading: set[str] = set()
        self.loaded: set[str] = set()
        self.context = ""

    def error(self, path: str, what: str) -> InvalidSchemaError:
        return InvalidSchemaError(f"invalid Avro schema{self.context} at {path or '/'}: {what}")

    def document(self, text: str) -> _Node:
        try:
            doc = json.loads(text, parse_constant=self._no_constant)
        except json.JSONDecodeError as e:
            raise InvalidSchemaError(f"the Avro schema{self.context} is not JSON: {e}") from e
        return self.schema(doc, None, "")

    def _no_constant(self, constant: str) -> Any:
        raise InvalidSchemaError(f"the Avro schema{self.context} is not JSON: {constant}")

    def load_references(self) -> None:
        for name in self.references:
            self.load(name)

    def load(self, reference: str) -> None:
        if reference in self.loaded or reference in self.loading:
            return
        self.loading.add(reference)
        saved, self.context = self.context, f" (reference '{reference}')"
        self.document(self.references[reference])
        self.context = saved
        self.loading.discard(reference)
        self.loaded.add(reference)

    def lookup(self, name: str, space: str | None, path: str) -> _Ref:
        candidates = [_qualify(name, space), name]
        for candidate in candidates:
            if candidate not in self.named and candidate in self.references:
                self.load(candidate)
            if candidate in self.named:
                return _Ref(candidate)
        for reference in self.references:  # a reference named other than the type it defines
            self.load(reference)
            for candidate in candidates:
                if candidate in self.named:
                    return _Ref(candidate)
        raise self.error(path, f"unknown type '{name}'")

    def schema(self, node: Any, space: str | None, path: str) -> _Node:
        if isinstance(node, str):
            return _Primitive(node, {}) if node in _PRIMITIVES else \
                self.lookup(node, space, path)
        if isinstance(node, list):
            return self.union(node, space, path)
        if not isinstance(node, dict):
            raise self.error(path, f"{json.dumps(node)} is not a schema (a JSON string, "
                                   "object or array)")
        kind = node.get("type")
        if not isinstance(kind, str):
            raise self.error(path, "a schema object needs a 'type' naming its type")
        if kind in _PRIMITIVES:
            return _Primitive(kind, _props(node, _SCHEMA_RESERVED))
        if kind in ("record", "error"):
            return self.record(node, space, path)
        if kind == "enum":
            return self.enum(node, space, path)
        if kind == "fixed":
            return self.fixed(node, space, path)
        if kind in ("array", "map"):
            return self.container(node, kind, space, path)
        return self.lookup(kind, space, path)

    def container(self, node: dict[str, Any], kind: str, space: str | None,
                  path: str) -> _Node:
        key = "items" if kind == "array" else "values"
        if key not in node:
            raise self.error(path, f"an {kind} needs '{key}'" if kind == "array"
                             else f"a {kind} needs '{key}'")
        inner = self.schema(node[key], space, f"{path}/{key}")
        props = _props(node, _SCHEMA_RESERVED)
        return _Array(inner, props) if kind == "array" else _Map(inner, props)

    def union(self, node: list[Any], space: str | None, path: str) -> _Union:
        branches: list[_Node] = []
        seen: set[str] = set()
        for index, item in enumerate(node):
            branch = self.schema(item, space, f"{path}/{index}")
            if isinstance(branch, _Union):
                raise self.error(f"{path}/{index}", "a union cannot hold a union directly")
            key = branch.name if isinstance(branch, _Ref) else _kind(branch, self.named)
            if key in seen:
                raise self.error(f"{path}/{index}", f"the union holds {key} twice")
            seen.add(key)
            branches.append(branch)
        return _Union(branches)

    def define(self, node: dict[str, Any], space: str | None, path: str) -> tuple[str, str | None]:
        """(full name, namespace) of a named type, checked and not yet defined."""
        name = node.get("name")
        if not isinstance(name, str) or not _FULL_NAME.match(name):
            raise self.error(path, f"a {node['type']} needs a valid 'name', not "
                                   f"{json.dumps(name)}")
        if "." not in name:
            given = node.get("namespace", space)
            if given is not None and not isinstance(given, str):
                raise self.error(path, f"the namespace {json.dumps(given)} is not a string")
            space = given or None
        full = _qualify(name, space)
        if full in _PRIMITIVES:
            raise self.error(path, f"'{full}' is a primitive type and cannot name a type")
        if full in self.named:
            raise self.error(path, f"'{full}' is defined twice")
        return full, _split(full)[1]

    def named_parts(self, node: dict[str, Any], space: str | None,
                    path: str) -> tuple[str | None, list[str]]:
        """A named type's doc and aliases (full names)."""
        aliases = node.get("aliases", [])
        if not isinstance(aliases, list) or not all(
                isinstance(a, str) and _FULL_NAME.match(a) for a in aliases):
            raise self.error(path, "'aliases' must be a list of names")
        return self.doc(node, path), [_qualify(a, space) for a in aliases]

    def doc(self, node: dict[str, Any], path: str) -> str | None:
        doc = node.get("doc")
        if doc is not None and not isinstance(doc, str):
            raise self.error(path, "'doc' must be a string")
        return doc

    def record(self, node: dict[str, Any], space: str | None, path: str) -> _Ref:
        full, own_space = self.define(node, space, path)
        fields = node.get("fields")
        if not isinstance(fields, list):
            raise self.error(path, f"record '{full}' needs a list of 'fields'")
        doc, aliases = self.named_parts(node, own_space, path)
        record = _Record(full, node["type"], [], doc, aliases, _props(node, _SCHEMA_RESERVED))
        self.named[full] = record  # before its fields: a field may hold the record itself
        for index, item in enumerate(fields):
            one = self.field(item, own_space, f"{path}/fields/{index}")
            if any(f.name == one.name for f in record.fields):
                raise self.error(f"{path}/fields/{index}",
                                 f"record '{full}' has two fields named '{one.name}'")
            record.fields.append(one)
        return _Ref(full)

    def field(self, node: Any, space: str | None, path: str) -> _Field:
        if not isinstance(node, dict):
            raise self.error(path, "a field must be a JSON object")
        name = node.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise self.error(path, f"a field needs a valid 'name', not {json.dumps(name)}")
        if "type" not in node:
            raise self.error(path, f"field '{name}' has no 'type'")
        kind = self.schema(node["type"], space, f"{path}/type")
        default = node.get("default", _NO_DEFAULT)
        if default is not _NO_DEFAULT and not _fits(kind, default, self.named, frozenset()):
            raise self.error(path, f"the default {json.dumps(default)} of field '{name}' is "
                                   f"not a {_describe(kind, self.named)}")
        order = node.get("order")
        if order is not None and order not in _FIELD_ORDERS:
            raise self.error(path, f"field '{name}' has order {json.dumps(order)}, not one of "
                                   f"{', '.join(_FIELD_ORDERS)}")
        aliases = node.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise self.error(path, f"the aliases of field '{name}' must be a list of names")
        return _Field(name, kind, default, self.doc(node, path), order, aliases,
                      _props(node, _FIELD_RESERVED))

    def enum(self, node: dict[str, Any], space: str | None, path: str) -> _Ref:
        full, own_space = self.define(node, space, path)
        symbols = node.get("symbols")
        if not isinstance(symbols, list) or not all(
                isinstance(s, str) and _NAME.match(s) for s in symbols):
            raise self.error(path, f"enum '{full}' needs 'symbols', a list of names")
        if len(set(symbols)) != len(symbols):
            raise self.error(path, f"enum '{full}' has a symbol twice")
        default = node.get("default")
        if default is not None and default not in symbols:
            raise self.error(path, f"the default {json.dumps(default)} of enum '{full}' is "
                                   "not one of its symbols")
        doc, aliases = self.named_parts(node, own_space, path)
        self.named[full] = _Enum(full, symbols, default, doc, aliases,
                                 _props(node, _ENUM_RESERVED))
        return _Ref(full)

    def fixed(self, node: dict[str, Any], space: str | None, path: str) -> _Ref:
        full, own_space = self.define(node, space, path)
        size = node.get("size")
        if type(size) is not int or size < 0:
            raise self.error(path, f"fixed '{full}' needs a 'size', a whole number of bytes")
        doc, aliases = self.named_parts(node, own_space, path)
        self.named[full] = _Fixed(full, size, doc, aliases, _props(node, _SCHEMA_RESERVED))
        return _Ref(full)


def _props(node: dict[str, Any], reserved: frozenset[str]) -> dict[str, Any]:
    return {key: node[key] for key in sorted(node) if key not in reserved}


def _fits(node: _Node, value: Any, named: Mapping[str, _Named],
          seen: frozenset[tuple[str, int]]) -> bool:
    """Whether a JSON default `value` is a value of `node` (Java's isValidDefault, with an
    enum's default one of its symbols and a fixed's as long as its size)."""
    if isinstance(node, _Primitive):
        return _fits_primitive(node.type, value)
    if isinstance(node, _Array):
        return isinstance(value, list) and all(_fits(node.items, v, named, seen) for v in value)
    if isinstance(node, _Map):
        return isinstance(value, dict) and all(
            _fits(node.values, v, named, seen) for v in value.values())
    if isinstance(node, _Union):  # Avro 1.12: any branch (1.11: the first only)
        return any(_fits(branch, value, named, seen) for branch in node.branches)
    target = named[node.name]
    if isinstance(target, _Enum):
        return value in target.symbols
    if isinstance(target, _Fixed):
        return _fits_primitive("bytes", value) and len(value) == target.size
    if not isinstance(value, dict):
        return False
    if (target.name, id(value)) in seen:  # a field's default holding the record again
        return True
    seen = seen | {(target.name, id(value))}
    return all((f.name in value or f.default is not _NO_DEFAULT)
               and _fits(f.type, value.get(f.name, f.default), named, seen)
               for f in target.fields)


def _fits_primitive(kind: str, value: Any) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("int", "long"):
        low, high = (_INT_MIN, _INT_MAX) if kind == "int" else (_LONG_MIN, _LONG_MAX)
        return type(value) is int and low <= value <= high
    if kind in ("float", "double"):
        return type(value) in (int, float)
    if kind == "bytes":  # code points 0-255 stand for the bytes
        return isinstance(value, str) and all(ord(c) < 256 for c in value)
    return isinstance(value, str)


class _CanonicalWriter:
    """The JSON value of Java's Schema.toString(): see the module docstring."""

    def __init__(self, named: Mapping[str, _Named], known: set[str]) -> None:
        self.named = named
        self.written = set(known)

    def node(self, node: _Node, space: str | None) -> Any:
        if isinstance(node, _Primitive):
            return {"type": node.type, **node.props} if node.props else node.type
        if isinstance(node, _Array):
            return {"type": "array", "items": self.node(node.items, space), **node.props}
        if isinstance(node, _Map):
            return {"type": "map", "values": self.node(node.values, space), **node.props}
        if isinstance(node, _Union):
            return [self.node(branch, space) for branch in node.branches]
        if node.name in self.written:
            name, own_space = _split(node.name)
            return name if own_space is None or own_space == space else node.name
        self.written.add(node.name)
        return self.definition(self.named[node.name], space)

    def definition(self, target: _Named, space: str | None) -> dict[str, Any]:
        name, own_space = _split(target.name)
        kind = target.kind if isinstance(target, _Record) else \
            "enum" if isinstance(target, _Enum) else "fixed"
        out: dict[str, Any] = {"type": kind, "name": name}
        if own_space is not None and own_space != space:
            out["namespace"] = own_space
        elif own_space is None and space is not None:
            out["namespace"] = ""
        if target.doc is not None:
            out["doc"] = target.doc
        if isinstance(target, _Record):
            out["fields"] = [self.field(f, own_space) for f in target.fields]
        elif isinstance(target, _Enum):
            out["symbols"] = target.symbols
            if target.default is not None:
                out["default"] = target.default
        else:
            out["size"] = target.size
        out.update(target.props)
        if target.aliases:
            out["aliases"] = [a if _split(a)[1] != own_space else _split(a)[0]
                              for a in target.aliases]
        return out

    def field(self, one: _Field, space: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": one.name, "type": self.node(one.type, space)}
        if one.doc is not None:
            out["doc"] = one.doc
        if one.default is not _NO_DEFAULT:
            out["default"] = one.default
        if one.order not in (None, "ascending"):
            out["order"] = one.order
        if one.aliases:
            out["aliases"] = one.aliases
        out.update(one.props)
        return out


def _branch_names(branches: Sequence[_Node], named: Mapping[str, _Named]) -> list[str]:
    """Column names of a multi-branch union's branches: the type's name (a named type's
    unqualified name, its full name with '_' for '.' where two share it)."""
    short = [_split(b.name)[0] if isinstance(b, _Ref) else _kind(b, named) for b in branches]
    return [s if short.count(s) == 1 or not isinstance(b, _Ref) else b.name.replace(".", "_")
            for s, b in zip(short, branches, strict=True)]


class _FastavroWriter:
    """The schema as fastavro parses it: full names, each named type defined at its first use
    (references' types too), valid logical types only. For decoding, unions of several
    non-null branches wrap each branch in a record of one field named as its column: the
    encoding is the same (a record is its fields' encodings) and the value read is the
    branch's struct, e.g. {"string": "x"}; time and uuid values stay ints and strings."""

    def __init__(self, named: Mapping[str, _Named], decoding: bool) -> None:
        self.named = named
        self.decoding = decoding
        self.written: set[str] = set()
        self.wrappers = 0

    def node(self, node: _Node) -> Any:
        if isinstance(node, _Primitive):
            logical = self.logical(node)
            return {"type": node.type, **logical} if logical else node.type
        if isinstance(node, _Array):
            return {"type": "array", "items": self.node(node.items)}
        if isinstance(node, _Map):
            return {"type": "map", "values": self.node(node.values)}
        if isinstance(node, _Union):
            return self.union(node)
        if node.name in self.written:
            return node.name
        self.written.add(node.name)
        target = self.named[node.name]
        if isinstance(target, _Enum):
            return {"type": "enum", "name": target.name, "symbols": target.symbols}
        if isinstance(target, _Fixed):
            return {"type": "fixed", "name": target.name, "size": target.size,
                    **self.logical(target)}
        fields = [{"name": f.name, "type": self.node(f.type)} for f in target.fields]
        for out, one in zip(fields, target.fields, strict=True):
            if one.default is not _NO_DEFAULT:
                out["default"] = one.default
        return {"type": "record", "name": target.name, "fields": fields}

    def logical(self, node: _Primitive | _Fixed) -> dict[str, Any]:
        """The logical type's attributes fastavro reads ({}: none, or read as the base)."""
        logical = _logical(node)
        if logical is None or (self.decoding and logical in _DECODED_RAW):
            return {}
        decimal = _decimal(node)
        if logical == "decimal" and decimal is not None:
            return {"logicalType": logical, "precision": decimal[0], "scale": decimal[1]}
        return {"logicalType": logical}

    def union(self, node: _Union) -> list[Any]:
        values = [b for b in node.branches if _kind(b, self.named) != "null"]
        if not self.decoding or len(values) < 2:
            return [self.node(branch) for branch in node.branches]
        names = iter(_branch_names(values, self.named))
        out: list[Any] = []
        for branch in node.branches:
            if _kind(branch, self.named) == "null":
                out.append("null")
                continue
            self.wrappers += 1
            while f"deltabus.union.Branch{self.wrappers}" in self.named:
                self.wrappers += 1
            out.append({"type": "record", "name": f"deltabus.union.Branch{self.wrappers}",
                        "fields": [{"name": next(names), "type": self.node(branch)}]})
        return out


class _Resolution:
    """Whether a reader reads what a writer wrote: the specification's schema resolution, in
    the order and with the error types of Java's SchemaCompatibility (Confluent's checks)."""

    def __init__(self, reader: Mapping[str, _Named], writer: Mapping[str, _Named]) -> None:
        self.reader = reader
        self.writer = writer
        self.checked: dict[tuple[str, str], list[str] | None] = {}  # None: under check

    def errors(self, r: _Node, w: _Node, path: str) -> list[str]:
        r_kind, w_kind = _kind(r, self.reader), _kind(w, self.writer)
        if r_kind == w_kind:
            if isinstance(r, _Array) and isinstance(w, _Array):
                return self.errors(r.items, w.items, f"{path}/items")
            if isinstance(r, _Map) and isinstance(w, _Map):
                return self.errors(r.values, w.values, f"{path}/values")
            if isinstance(r, _Ref) and isinstance(w, _Ref):
                return self.named(self.reader[r.name], self.writer[w.name], path)
            if not isinstance(w, _Union):
                return []
        if isinstance(w, _Union):  # every branch the writer may write must be readable
            return [e for i, branch in enumerate(w.branches)
                    for e in self.errors(r, branch, f"{path}/{i}")]
        if (w_kind, r_kind) in _PROMOTIONS:
            return []
        described = _describe(w, self.writer)
        if isinstance(r, _Union):
            if any(not self.errors(branch, w, path) for branch in r.branches):
                return []
            return [f"MISSING_UNION_BRANCH at {path or '/'}: the reader's union has no "
                    f"branch that reads the writer's {described}"]
        return [f"TYPE_MISMATCH at {path or '/'}: the reader's {_describe(r, self.reader)} "
                f"cannot read the writer's {described}"]

    def named(self, r: _Named, w: _Named, path: str) -> list[str]:
        key = (r.name, w.name)
        if key in self.checked:
            return self.checked[key] or []
        self.checked[key] = None
        errors = []
        if _split(r.name)[0] != _split(w.name)[0] and w.name not in r.aliases:
            errors.append(f"NAME_MISMATCH at {path}/name: the reader's '{r.name}' is not the "
                          f"writer's '{w.name}' (by name or alias)")
        if isinstance(r, _Fixed) and isinstance(w, _Fixed) and r.size != w.size:
            errors.append(f"FIXED_SIZE_MISMATCH at {path}/size: the reader's fixed '{r.name}' "
                          f"holds {r.size} bytes, the writer's {w.size}")
        if isinstance(r, _Enum) and isinstance(w, _Enum) and r.default is None:
            missing = [s for s in w.symbols if s not in r.symbols]
            if missing:
                errors.append(f"MISSING_ENUM_SYMBOLS at {path}/symbols: the reader's enum "
                              f"'{r.name}' lacks the writer's symbols [{', '.join(missing)}] "
                              "and has no default")
        if isinstance(r, _Record) and isinstance(w, _Record):
            errors += self.fields(r, w, path)
        self.checked[key] = errors
        return errors

    def fields(self, r: _Record, w: _Record, path: str) -> list[str]:
        by_name = {f.name: f for f in w.fields}
        errors = []
        for index, one in enumerate(r.fields):
            at = f"{path}/fields/{index}"
            written = next((by_name[n] for n in [one.name, *one.aliases] if n in by_name), None)
            if written is not None:
                errors += self.errors(one.type, written.type, f"{at}/type")
            elif one.default is _NO_DEFAULT:
                errors.append(f"READER_FIELD_MISSING_DEFAULT_VALUE: field '{one.name}' at {at}:"
                              " the reader has no default and the writer lacks it")
        return errors


@dataclass(frozen=True)
class _DecodePlan:
    reader: Any  # fastavro's parsed schema
    arrow_schema: pa.Schema
    columns: bool  # the top level is a record: its fields are the columns
    steps: tuple[Step, ...] | None  # each column's columnar read; None: record by record


@dataclass(frozen=True)
class AvroSchema:
    """A parsed Avro schema (ParsedSchema). Build it with `parse_avro`. Equal schemas have the
    same canonical text and the same references."""

    canonical_text: str
    references: tuple[tuple[str, str], ...]
    root: _Node = field(compare=False, repr=False)
    named: Mapping[str, _Named] = field(compare=False, repr=False)

    @property
    def schema_type(self) -> SchemaType:
        return SchemaType.AVRO

    def canonical(self) -> str:
        return self.canonical_text

    def read_errors(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, AvroSchema):
            return [f"TYPE_MISMATCH at /: the writer's schema is {writer.schema_type}, "
                    "not AVRO"]
        errors = _Resolution(self.named, writer.named).errors(self.root, writer.root, "")
        return list(dict.fromkeys(errors))  # a pair met in two places is reported once

    @cached_property
    def writer_schema(self) -> Any:
        """fastavro's parsed form of the schema, for encoding."""
        return fastavro.parse_schema(_FastavroWriter(self.named, decoding=False).node(self.root))

    @cached_property
    def decode_plan(self) -> _DecodePlan:
        arrow_schema = avro_arrow_schema(self)
        reader = fastavro.parse_schema(_FastavroWriter(self.named, decoding=True).node(self.root))
        top = _top_record(self)
        nodes = [f.type for f in top.fields] if top is not None else [self.root]
        steps = [_step(node, self.named) for node in nodes]
        columnar = [s for s in steps if s is not None]
        return _DecodePlan(reader, arrow_schema, top is not None,
                           tuple(columnar) if len(columnar) == len(steps) else None)


def parse_avro(text: str, references: Mapping[str, str]) -> AvroSchema:
    """Parse an Avro schema text as Confluent's registry does. `references` maps the full name
    of each named type the text uses from elsewhere to the schema text defining it. Raises
    InvalidSchemaError saying what is wrong and where (a JSON pointer into the text)."""
    parser = _Parser(references)
    try:
        parser.load_references()
        known = set(parser.named)
        root = parser.document(text)
    except RecursionError as e:
        raise InvalidSchemaError("the Avro schema nests too deeply") from e
    canonical = _CanonicalWriter(parser.named, known).node(root, None)
    text_out = json.dumps(canonical, separators=(",", ":"), ensure_ascii=False)
    return AvroSchema(text_out, tuple(sorted(references.items())), root, parser.named)


def _top_record(schema: AvroSchema) -> _Record | None:
    root = schema.root
    if isinstance(root, _Ref) and isinstance(schema.named[root.name], _Record):
        return schema.named[root.name]  # type: ignore[return-value]
    return None


def avro_arrow_type(schema: AvroSchema) -> pa.DataType:
    """The Arrow type (one Delta Lake can store) of the schema's values. Raises
    InvalidSchemaError for a schema no Delta column holds (a recursive record, a record with
    no fields, an empty union, a decimal of more than 38 digits)."""
    return _arrow(schema.root, schema.named, ())


def avro_arrow_schema(schema: AvroSchema) -> pa.Schema:
    """A typed topic's columns: a top-level record's fields, else one column named "value".
    Every column is nullable."""
    kind = avro_arrow_type(schema)
    if _top_record(schema) is not None:
        return pa.schema([kind.field(i) for i in range(kind.num_fields)])
    return pa.schema([pa.field("value", kind)])


def _arrow(node: _Node, named: Mapping[str, _Named], records: tuple[str, ...]) -> pa.DataType:
    if isinstance(node, _Primitive):
        logical = _logical(node)
        return _PRIMITIVE_ARROW[node.type] if logical is None else _arrow_logical(node, logical)
    if isinstance(node, _Array):
        return pa.list_(_arrow(node.items, named, records))
    if isinstance(node, _Map):
        return pa.map_(pa.string(), _arrow(node.values, named, records))
    if isinstance(node, _Union):
        return _arrow_union(node, named, records)
    target = named[node.name]
    if isinstance(target, _Enum):
        return pa.string()
    if isinstance(target, _Fixed):
        logical = _logical(target)
        return pa.binary() if logical is None else _arrow_logical(target, logical)
    if target.name in records:
        raise InvalidSchemaError(f"record '{target.name}' holds itself: a recursive record "
                                 "has no Delta column type")
    if not target.fields:
        raise InvalidSchemaError(f"record '{target.name}' has no fields: Delta stores no "
                                 "empty struct")
    inner = (*records, target.name)
    return pa.struct([pa.field(f.name, _arrow(f.type, named, inner)) for f in target.fields])


def _arrow_logical(node: _Primitive | _Fixed, logical: str) -> pa.DataType:
    decimal = _decimal(node)
    if decimal is None:  # _logical made sure a decimal is valid: the others are by type
        return _LOGICAL_TYPES[(logical, node.type if isinstance(node, _Primitive) else "")]
    precision, scale = decimal
    if precision > _DECIMAL_PRECISION_MAX:
        raise InvalidSchemaError(f"decimal({precision}, {scale}) has more than "
                                 f"{_DECIMAL_PRECISION_MAX} digits: Delta cannot store it")
    return pa.decimal128(precision, scale)


def _arrow_union(node: _Union, named: Mapping[str, _Named],
                 records: tuple[str, ...]) -> pa.DataType:
    """["null", T] is T (nullable); several values are a struct with a field per branch."""
    if not node.branches:
        raise InvalidSchemaError("an empty union holds no value: it has no Delta column type")
    values = [b for b in node.branches if _kind(b, named) != "null"]
    if not values:
        return pa.null()
    if len(values) == 1:
        return _arrow(values[0], named, records)
    names = _branch_names(values, named)
    return pa.struct([pa.field(name, _arrow(branch, named, records))
                      for name, branch in zip(names, values, strict=True)])


# Integer columns' reads by (type, logical type): the values the record path accepts (Python's
# int32, date and datetime ranges) and the factor to the column's unit (millis to micros).
_INTEGER_READS: dict[tuple[str, str | None], tuple[tuple[int, int] | None, int]] = {
    ("int", None): (INT_RANGE, 1),
    ("int", "date"): (DATE_RANGE, 1),
    ("int", "time-millis"): (INT_RANGE, 1),
    ("long", None): (None, 1),
    ("long", "time-micros"): (None, 1),
    ("long", "timestamp-millis"): (MILLIS_RANGE, 1000),
    ("long", "local-timestamp-millis"): (MILLIS_RANGE, 1000),
    ("long", "timestamp-micros"): (MICROS_RANGE, 1),
    ("long", "local-timestamp-micros"): (MICROS_RANGE, 1),
}


def _step(node: _Node, named: Mapping[str, _Named]) -> Step | None:
    """The columnar read of `node`'s values, as `avro_arrow_type` types them; None where
    there is none (arrays and maps are block-encoded, a decimal over 16 bytes is not an
    int128): whatever holds one is read record by record. Call after `avro_arrow_type`
    succeeded (a recursive record would not end)."""
    if isinstance(node, _Primitive):
        return _primitive_step(node)
    if isinstance(node, _Array | _Map):
        return None
    if isinstance(node, _Union):
        values = [_step(b, named) for b in node.branches if _kind(b, named) != "null"]
        if None in values:
            return None
        read = iter(values)
        return UnionStep(_arrow_union(node, named, ()), tuple(
            None if _kind(b, named) == "null" else next(read) for b in node.branches))
    target = named[node.name]
    if isinstance(target, _Enum):
        return EnumStep(tuple(target.symbols))
    if isinstance(target, _Fixed):
        decimal = _decimal(target) if _logical(target) else None
        if decimal is None:
            return FixedStep(target.size)
        return DecimalStep(*decimal, target.size) if target.size <= DECIMAL_BYTES_MAX else None
    fields = [_step(f.type, named) for f in target.fields]
    columnar = [f for f in fields if f is not None]
    if len(columnar) < len(fields):
        return None
    return RecordStep(_arrow(node, named, ()), tuple(columnar))


def _primitive_step(node: _Primitive) -> Step | None:
    logical = _logical(node)
    arrow = _arrow(node, {}, ())
    if node.type in ("int", "long"):
        read = _INTEGER_READS.get((node.type, logical))
        return None if read is None else IntegerStep(arrow, *read)
    if node.type in ("float", "double"):
        return FloatStep(4 if node.type == "float" else 8)
    if logical == "decimal":
        return DecimalStep(arrow.precision, arrow.scale, None)
    if node.type in ("bytes", "string"):
        return BinaryStep(arrow)
    return BooleanStep() if node.type == "boolean" else NullStep()


# Batches smaller than this decode record by record: the columnar pass costs a few hundred
# microseconds whatever the batch, which the record path beats below about 50-100 records.
COLUMNAR_RECORDS_MIN = 64

# What fastavro raises on bytes that are not a value of the schema: truncation (EOFError), a
# bad union or enum index (IndexError), bad UTF-8 (ValueError), a date or time out of range
# (OverflowError, ValueError), a decimal that does not fit (ArithmeticError).
_DECODE_ERRORS = (EOFError, IndexError, KeyError, ValueError, TypeError, OverflowError,
                  ArithmeticError)


def decode_avro(schema: AvroSchema, payloads: Sequence[bytes] | pa.Array,
                skip: int = 0) -> pa.Table:
    """The typed columns (`avro_arrow_schema`) of records encoded with `schema` (Avro binary,
    each past its first `skip` bytes: 5 for Confluent's header, 0 without it). Raises
    ValueError naming the first record that does not decode, InvalidSchemaError where the
    schema has no columns.

    Read a column at a time with numpy (`deltabus.schemas.avro_columns`) where the schema has a
    columnar plan and the batch is large enough: per-record Python capped typed produce.
    The record-by-record path (`decode_avro_records`) reads the rest, and any batch the
    columnar pass refuses, so the error (or value) is exactly its own."""
    plan = schema.decode_plan
    if plan.steps is not None and len(payloads) >= COLUMNAR_RECORDS_MIN:
        try:
            return decode_columns(plan.steps, plan.arrow_schema, payloads, skip)
        except Undecodable:
            pass  # the record path finds what does not decode, and names the record
    return decode_avro_records(schema, without_header(payloads, skip))


def decode_avro_records(schema: AvroSchema, payloads: Sequence[bytes]) -> pa.Table:
    """`decode_avro` one record at a time with fastavro, then the columns from Python values:
    the reference the columnar pass equals, and the path for what it does not read."""
    plan = schema.decode_plan
    values = []
    for index, payload in enumerate(payloads):
        stream = io.BytesIO(payload)
        try:
            values.append(fastavro.schemaless_reader(stream, plan.reader, None))
        except _DECODE_ERRORS as e:
            detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise ValueError(f"record {index} does not decode with the schema: {detail}") from e
        left = len(payload) - stream.tell()
        if left:
            raise ValueError(f"record {index} has {left} bytes left after its value: another "
                             "schema wrote it")
    try:
        return _table(plan, values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
        for index, value in enumerate(values):  # which record: on failure only, one by one
            try:
                _table(plan, [value])
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as one:
                raise ValueError(f"record {index} does not fit its columns: {one}") from one
        raise ValueError(f"the records do not fit their columns: {e}") from e


def _table(plan: _DecodePlan, values: list[Any]) -> pa.Table:
    if plan.columns:
        return pa.Table.from_pylist(values, schema=plan.arrow_schema)
    return pa.Table.from_arrays([pa.array(values, type=plan.arrow_schema.field(0).type)],
                                schema=plan.arrow_schema)


def encode_avro(schema: AvroSchema, rows: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """Avro binary encodings (without Confluent's header) of `rows`: for a top-level record,
    each row is the record; otherwise the value is the row's "value" (as `decode_avro`'s
    column). Values are as fastavro takes them: a union's value as is, Decimal, date,
    datetime. Raises ValueError naming the first row that does not fit the schema."""
    parsed = schema.writer_schema
    columns = _top_record(schema) is not None
    out = []
    for index, row in enumerate(rows):
        if not columns and "value" not in row:
            raise ValueError(f"row {index} has no 'value' (the schema is not a record)")
        datum = row if columns else row["value"]
        try:
            validate(datum, parsed, raise_errors=True)
        except ValidationError as e:
            wrong = "; ".join(str(error) for error in e.errors)
            raise ValueError(f"row {index} does not fit the schema: {wrong}") from e
        stream = io.BytesIO()
        try:
            fastavro.schemaless_writer(stream, parsed, datum)
        except (ValueError, TypeError, OverflowError, ArithmeticError) as e:
            raise ValueError(f"row {index} does not fit the schema: {e}") from e
        out.append(stream.getvalue())
    return out
