"""JSON Schema as Confluent Schema Registry treats it: parsing, canonical text, reader/writer
compatibility after Confluent's JSON Schema rules, and the Arrow columns of a typed topic.

Pure: no I/O, and no $ref is ever fetched: it resolves within the schema or in a reference.
Runs anywhere: the registry checks registrations on the driver, brokers validate and decode a
typed topic's records on executors. `JsonSchema` is immutable and thread-safe (its validator
and columns are cached on first use; two racing threads may both build the same value).

What must hold, and why:
- `parse_json_schema` refuses text that is not JSON, a schema invalid against its draft's
  metaschema (`$schema` picks draft-04, -06, -07, 2019-09 or 2020-12; draft 7 when absent, as
  Confluent), and a `$ref` that resolves nowhere (or only to a `$ref` loop): every schema
  registered here loads in every Confluent client. A reference resolves under its name, under
  that name taken relative to the schema's `$id`, and under its own `$id`.
- `canonical()` is compact JSON with sorted keys: the same schema written with other
  whitespace or key order gets the same id; anything else gets another.
- `read_errors(writer)` lists what stops a document valid under `writer` from being valid
  under the reader (self), one line per problem: the JSON path, what changed, and Confluent's
  name for the difference (`#/properties/amount: type narrowed from number to integer
  (TYPE_NARROWED)`). It follows Confluent's `SchemaDiff`: closed, open and partially open
  content models, required properties (one with a default may be added, as Confluent allows),
  string, number, array and object limits, enums, combined schemas matched branch to branch.
  Where Confluent's Java model (everit) and JSON Schema's meaning part, the meaning wins when
  it is as strict: an untyped writer read by a typed reader is narrowed; a writer's enum is
  checked value by value; a writer's type union may be read by an anyOf of those types.
  `$ref`s are followed; a pair of subschemas met again while under comparison is taken as
  compatible (as Confluent does), so recursive schemas end, and each pair is compared once.
- A typed topic's columns (`json_arrow_type`) are types Delta Lake stores; `decode_json`
  validates every record against the schema before building any column, then builds exactly
  those types: a typed topic never holds a document its schema refuses.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urljoin

import jsonschema
import jsonschema_rs
import pyarrow as pa
import referencing
import referencing.jsonschema
from jsonschema.exceptions import ValidationError, best_match
from jsonschema.protocols import Validator
from referencing.exceptions import Unresolvable

from deltabus.schemas.entities import InvalidSchemaError, ParsedSchema, SchemaType

if TYPE_CHECKING:
    from referencing._core import Resolver  # not re-exported by referencing

_COMBINATORS = ("allOf", "anyOf", "oneOf")
# Keywords that constrain a value: a schema with none of them accepts every value.
_CONSTRAINING = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties",
    "patternProperties", "propertyNames", "minProperties", "maxProperties", "dependencies",
    "dependentRequired", "dependentSchemas", "unevaluatedProperties", "items", "prefixItems",
    "additionalItems", "unevaluatedItems", "contains", "minContains", "maxContains", "minItems",
    "maxItems", "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "allOf", "anyOf", "oneOf",
    "not", "if", "then", "else", "$ref", "$dynamicRef", "$recursiveRef",
})
# Keywords that judge a scalar value on their own (no subschema, no $ref).
_SCALAR_KEYWORDS = frozenset({
    "type", "enum", "const", "minLength", "maxLength", "pattern", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
})
_NUMBER_TYPES = frozenset({"number", "integer"})
_EMPTY: dict[str, Any] = {}  # the schema `true` as an object; never changed
_JSON_SEPARATORS = (",", ":")


@dataclass(frozen=True)
class _Draft:
    name: str
    validator: type[Validator]
    spec: referencing.jsonschema.Specification[Any]
    ref_overrides: bool  # up to draft 7 a $ref's siblings are ignored


_DRAFTS = {
    "json-schema.org/draft-04/schema": _Draft(
        "draft-04", jsonschema.Draft4Validator, referencing.jsonschema.DRAFT4, True),
    "json-schema.org/draft-06/schema": _Draft(
        "draft-06", jsonschema.Draft6Validator, referencing.jsonschema.DRAFT6, True),
    "json-schema.org/draft-07/schema": _Draft(
        "draft-07", jsonschema.Draft7Validator, referencing.jsonschema.DRAFT7, True),
    "json-schema.org/draft/2019-09/schema": _Draft(
        "2019-09", jsonschema.Draft201909Validator, referencing.jsonschema.DRAFT201909, False),
    "json-schema.org/draft/2020-12/schema": _Draft(
        "2020-12", jsonschema.Draft202012Validator, referencing.jsonschema.DRAFT202012, False),
}
_DEFAULT_DRAFT = _DRAFTS["json-schema.org/draft-07/schema"]  # Confluent's default
# The formats jsonschema-rs checks.
_FAST_FORMATS = frozenset({
    "date", "date-time", "duration", "email", "hostname", "idn-email", "idn-hostname", "ipv4",
    "ipv6", "iri", "iri-reference", "json-pointer", "regex", "relative-json-pointer", "time",
    "uri", "uri-reference", "uri-template", "uuid"})
_FAST_VALIDATORS: dict[str, Any] = {
    "draft-04": jsonschema_rs.Draft4Validator, "draft-06": jsonschema_rs.Draft6Validator,
    "draft-07": jsonschema_rs.Draft7Validator, "2019-09": jsonschema_rs.Draft201909Validator,
    "2020-12": jsonschema_rs.Draft202012Validator}


@dataclass(frozen=True)
class _Node:
    """A subschema with what resolves its $refs (its document and base URI)."""

    schema: Any  # a dict or a bool
    resolver: Resolver[Any]
    draft: _Draft


@dataclass(frozen=True)
class _Column:
    """A column's Arrow type and how a JSON value becomes what `pa.array` takes for it."""

    type: pa.DataType
    convert: Callable[[Any], Any] | None  # None: the JSON value as it is
    signature: str  # equal for columns that hold and convert values alike
    fields: tuple[tuple[str, _Column], ...] | None = None  # a struct's


@dataclass(frozen=True)
class JsonSchema:
    """A parsed JSON Schema and the referenced schemas its $refs name. Equal (and hashed) by
    canonical text and references; runs anywhere, immutable and thread-safe."""

    text: str  # canonical
    reference_texts: tuple[tuple[str, str], ...]  # (name, canonical text), by name
    contents: Any = field(compare=False, repr=False)
    draft: _Draft = field(compare=False, repr=False)
    registry: referencing.Registry[Any] = field(compare=False, repr=False)
    # (uri, contents) of every referenced schema, for jsonschema-rs (`_fast_validator`)
    resources: tuple[tuple[str, Any], ...] = field(default=(), compare=False, repr=False)

    @property
    def schema_type(self) -> SchemaType:
        return SchemaType.JSON

    def canonical(self) -> str:
        return self.text

    def read_errors(self, writer: ParsedSchema) -> list[str]:
        if not isinstance(writer, JsonSchema):
            return [f"#/: {writer.schema_type} data is not read with a JSON schema (TYPE_CHANGED)"]
        diffs = _Comparison().compare(writer._root, self._root)
        return list(dict.fromkeys(diff.line() for diff in diffs))

    @cached_property
    def _root(self) -> _Node:
        resource = self.draft.spec.create_resource(self.contents)
        return _Node(self.contents, self.registry.resolver_with_root(resource), self.draft)

    @cached_property
    def _validator(self) -> Validator:
        cls = self.draft.validator
        return cls(self.contents, registry=self.registry, format_checker=cls.FORMAT_CHECKER)

    @cached_property
    def _fast_validator(self) -> Any:
        """The same schema, draft, references and format checks in jsonschema-rs: a produce
        check runs every record through it (jsonschema took about 100 µs a record); only a
        refusal is explained by jsonschema (`_validator`), whose messages are the registry's.
        None where jsonschema-rs does not compile the schema: jsonschema checks alone. It
        never fetches a $ref from the network (offline)."""
        cls = _FAST_VALIDATORS[self.draft.name]
        # the formats jsonschema does not check here (a library it needs is not installed,
        # or the draft has no such format) are not checked by jsonschema-rs either
        unchecked = _FAST_FORMATS - set(self.draft.validator.FORMAT_CHECKER.checkers)
        try:
            registry = jsonschema_rs.Registry(list(self.resources)) if self.resources else None
            return cls(self.contents, validate_formats=True, registry=registry, offline=True,
                       formats=dict.fromkeys(unchecked, _any_value))
        except (ValueError, TypeError, jsonschema_rs.ValidationError,
                jsonschema_rs.ReferencingError):
            return None

    @cached_property
    def _layout(self) -> tuple[pa.Schema, tuple[tuple[str, _Column], ...], bool]:
        """The table's schema, its columns, and whether they are the document's properties."""
        root = _column(self._root, frozenset())
        if root.fields is not None:
            return pa.schema([pa.field(n, c.type) for n, c in root.fields]), root.fields, True
        return pa.schema([pa.field("value", root.type)]), (("value", root),), False


# -- parsing ---------------------------------------------------------------------------------


def parse_json_schema(text: str, references: Mapping[str, str]) -> JsonSchema:
    """Parse a JSON Schema as Confluent's registry does; `references` maps each reference's
    name (the URL its $refs use) to its text. Raises InvalidSchemaError saying what is wrong."""
    contents = _load(text, "the schema")
    draft = _draft_of(contents, _DEFAULT_DRAFT, "the schema")
    _check_metaschema(draft, contents, "the schema")
    root_id = draft.spec.create_resource(contents).id() if isinstance(contents, dict) else None
    resources: list[tuple[str, referencing.Resource[Any]]] = []
    texts: dict[str, str] = {}
    for name, reference_text in references.items():
        what = f"reference {name!r}"
        reference = _load(reference_text, what)
        reference_draft = _draft_of(reference, draft, what)
        _check_metaschema(reference_draft, reference, what)
        resource = reference_draft.spec.create_resource(reference)
        uris = {name, resource.id() or name, urljoin(root_id, name) if root_id else name}
        resources += [(uri, resource) for uri in sorted(uris)]
        texts[name] = _canonical(reference)
    schema = JsonSchema(
        text=_canonical(contents), reference_texts=tuple(sorted(texts.items())),
        contents=contents, draft=draft, registry=referencing.Registry().with_resources(resources),
        resources=tuple((uri, r.contents) for uri, r in resources))
    _check_refs(schema._root)
    return schema


def _load(text: str, what: str) -> Any:
    try:
        contents = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, TypeError) as e:
        raise InvalidSchemaError(f"{what} is not JSON: {e}") from None
    if not isinstance(contents, dict | bool):
        raise InvalidSchemaError(f"{what} is not a JSON Schema: a schema is a JSON object or a "
                                 f"boolean, not {_json_type(contents)}")
    return contents


def _refuse_constant(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


_DOCUMENTS = json.JSONDecoder(parse_constant=_refuse_constant)


def _any_value(_value: str) -> bool:
    return True


def _draft_of(contents: Any, default: _Draft, what: str) -> _Draft:
    if not isinstance(contents, dict) or "$schema" not in contents:
        return default
    uri = contents["$schema"]
    key = uri.rstrip("#").removeprefix("https://").removeprefix("http://") \
        if isinstance(uri, str) else None
    if key not in _DRAFTS:
        raise InvalidSchemaError(f"{what} names an unknown $schema {uri!r}: deltabus knows "
                                 f"draft-04, draft-06, draft-07, 2019-09 and 2020-12")
    return _DRAFTS[key]


def _check_metaschema(draft: _Draft, contents: Any, what: str) -> None:
    try:
        draft.validator.check_schema(contents)
    except jsonschema.SchemaError as e:
        raise InvalidSchemaError(f"{what} is not a valid {draft.name} JSON Schema: "
                                 f"{_pointer(e.absolute_path)}: {_one_line(e.message)}") from None


def _check_refs(root: _Node) -> None:
    """Every $ref reachable from the root resolves, and no $ref chain loops."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        schema = node.schema
        if not isinstance(schema, dict) or id(schema) in seen:
            continue
        seen.add(id(schema))
        ref = schema.get("$ref")
        if isinstance(ref, str):
            try:
                resolved = node.resolver.lookup(ref)
            except Unresolvable:
                raise InvalidSchemaError(f"$ref {ref!r} does not resolve: neither the schema "
                                         f"nor one of its references defines it") from None
            stack.append(_enter(resolved.contents, resolved.resolver, node.draft))
            _deref(node)  # raises on a loop of $refs
        stack.extend(_child(node, sub) for sub in node.draft.spec.subresources_of(schema))


def _canonical(contents: Any) -> str:
    return json.dumps(contents, sort_keys=True, separators=_JSON_SEPARATORS, ensure_ascii=False)


# -- walking schemas -------------------------------------------------------------------------


def _enter(schema: Any, resolver: Resolver[Any], draft: _Draft) -> _Node:
    if isinstance(schema, dict):
        resolver = resolver.in_subresource(draft.spec.create_resource(schema))
    return _Node(schema, resolver, draft)


def _child(node: _Node, schema: Any) -> _Node:
    return _enter(schema, node.resolver, node.draft)


def _follows_ref(node: _Node) -> bool:
    """Whether the node is its $ref's target: up to draft 7 always, later when no sibling
    constrains (else the $ref is one conjunct among them)."""
    schema = node.schema
    if not isinstance(schema, dict) or not isinstance(schema.get("$ref"), str):
        return False
    return node.draft.ref_overrides or not any(k in _CONSTRAINING for k in schema
                                                if k != "$ref")


def _deref(node: _Node) -> _Node:
    chain: list[Any] = []
    while _follows_ref(node):
        if any(schema is node.schema for schema in chain):
            raise InvalidSchemaError(f"$ref {node.schema['$ref']!r} is a loop of $refs that "
                                     f"never reaches a schema")
        chain.append(node.schema)
        resolved = node.resolver.lookup(node.schema["$ref"])
        node = _enter(resolved.contents, resolved.resolver, node.draft)
    return node


def _is_any(schema: Any) -> bool:
    """True for a schema every value is valid under (true, {}, annotations only)."""
    return schema is True or (isinstance(schema, dict)
                              and not any(k in _CONSTRAINING for k in schema))


def _types(schema: dict[str, Any]) -> frozenset[str] | None:
    """The declared types; None: any type."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return frozenset([declared])
    if isinstance(declared, list):
        return frozenset(declared)
    return None


def _values(schema: dict[str, Any]) -> list[Any] | None:
    """The values an enum or const allows; None: not an enumeration."""
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return enum if isinstance(enum, list) else None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _value_key(value: Any) -> str:
    """Equal for values JSON Schema holds equal (1 and 1.0 are; 1 and true are not)."""
    def norm(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        return v
    return json.dumps(norm(value), sort_keys=True)


def _dict(schema: dict[str, Any], keyword: str) -> dict[str, Any]:
    value = schema.get(keyword)
    return value if isinstance(value, dict) else {}


def _required(schema: dict[str, Any]) -> list[str]:
    value = schema.get("required")
    return [name for name in value if isinstance(name, str)] if isinstance(value, list) else []


def _has_default(node: _Node) -> bool:
    return any(isinstance(n.schema, dict) and "default" in n.schema for n in (node, _deref(node)))


# -- compatibility ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Diff:
    """One difference, with its path relative to the pair of schemas compared."""

    path: tuple[str, ...]
    name: str  # Confluent's Difference.Type
    text: str

    def line(self) -> str:
        return f"{_pointer(self.path)}: {self.text} ({self.name})"


def _under(prefix: tuple[str, ...], diffs: Iterable[_Diff]) -> list[_Diff]:
    return [_Diff(prefix + d.path, d.name, d.text) for d in diffs]


# The rest of an object's properties (or an array's items) past those named (or positioned):
# None: any value; False: none; else the schema they must match.
_Rest = _Node | Literal[False] | None


class _Comparison:
    """One `read_errors` call: memoised pairs, the pairs under comparison, and the synthetic
    subschemas it made (kept alive, so their ids stay theirs). Not thread-safe; short-lived."""

    def __init__(self) -> None:
        self.memo: dict[tuple[int, int], list[_Diff]] = {}
        self.active: set[tuple[int, int]] = set()
        self.made: dict[tuple[str, int], tuple[Any, Any]] = {}

    def compare(self, writer: _Node, reader: _Node) -> list[_Diff]:
        """What stops data valid under `writer` from being valid under `reader`."""
        writer, reader = _deref(writer), _deref(reader)
        key = (id(writer.schema), id(reader.schema))
        if key in self.memo:
            return self.memo[key]
        if key in self.active:
            return []  # a recursive pair: compatible unless something else says otherwise
        self.active.add(key)
        try:
            diffs = self._compare(writer, reader)
        finally:
            self.active.discard(key)
        self.memo[key] = diffs
        return diffs

    def _compare(self, writer: _Node, reader: _Node) -> list[_Diff]:
        if _is_any(reader.schema) or writer.schema is False:
            return []
        if reader.schema is False:
            return [_Diff((), "TYPE_NARROWED", "the reader refuses every value (false)")]
        if writer.schema is True:
            writer = _Node(_EMPTY, writer.resolver, writer.draft)
        writer_combined, reader_combined = self._combined(writer), self._combined(reader)
        if writer_combined and reader_combined:
            return self._match(writer_combined, reader_combined)
        if reader_combined:
            return self._read_by_combined(writer, reader_combined)
        if writer_combined:
            return self._combined_read(writer_combined, reader)
        return self._compare_plain(writer, reader)

    def _combined(self, node: _Node) -> tuple[str, list[_Node]] | None:
        """The node as allOf/anyOf/oneOf branches, or None when it combines nothing. Other
        keywords beside a combinator (or a $ref of draft 2019-09 on) make an allOf with them."""
        schema = node.schema
        if not isinstance(schema, dict):
            return None
        key = ("combined", id(schema))
        if key not in self.made:
            kinds = [k for k in _COMBINATORS if isinstance(schema.get(k), list)]
            ref = schema.get("$ref") if isinstance(schema.get("$ref"), str) else None
            base = {k: v for k, v in schema.items() if k not in _COMBINATORS and k != "$ref"}
            parts = ([{"$ref": ref}] if ref else []) + ([base] if not _is_any(base) else [])
            result: tuple[str, list[Any]] | None = None
            if len(kinds) == 1 and not parts:
                result = (kinds[0], schema[kinds[0]])
            elif kinds or ref:
                parts += schema["allOf"] if "allOf" in kinds else []
                parts += [{k: schema[k]} for k in kinds if k != "allOf"]
                result = ("allOf", parts)
            self.made[key] = (schema, result)
        made = self.made[key][1]
        return None if made is None else (made[0], [_child(node, b) for b in made[1]])

    def _type_parts(self, node: _Node) -> list[_Node]:
        """A writer with a type union as one schema per type (an anyOf of them)."""
        schema = node.schema
        types = _types(schema) if isinstance(schema, dict) else None
        if not types or len(types) < 2 or _values(schema) is not None:
            return [node]
        key = ("parts", id(schema))
        if key not in self.made:
            self.made[key] = (schema, [{**schema, "type": t} for t in sorted(types)])
        return [_child(node, part) for part in self.made[key][1]]

    def _read_by_combined(self, writer: _Node, reader: tuple[str, list[_Node]]) -> list[_Diff]:
        kind, branches = reader
        if len(branches) == 1:
            return _under((kind, "0"), self.compare(writer, branches[0]))
        if kind == "allOf":  # every conjunct must read the writer's data
            return [d for i, branch in enumerate(branches)
                    for d in _under((kind, str(i)), self.compare(writer, branch))]
        diffs = []  # a sum: each of the writer's types is read by some branch
        for part in self._type_parts(writer):
            if all(self.compare(part, branch) for branch in branches):
                diffs.append(_Diff((), "TYPE_CHANGED", f"no {kind} branch of the reader reads "
                                                       f"{_describe(part.schema)}"))
        return diffs

    def _combined_read(self, writer: tuple[str, list[_Node]], reader: _Node) -> list[_Diff]:
        kind, branches = writer
        if kind == "allOf":  # the writer's data matches every conjunct: one read is enough
            results = [self.compare(branch, reader) for branch in branches]
            return [] if not all(results) else _under((kind, "0"), results[0])
        return [d for i, branch in enumerate(branches)
                for d in _under((kind, str(i)), self.compare(branch, reader))]

    def _match(self, writer: tuple[str, list[_Node]],
               reader: tuple[str, list[_Node]]) -> list[_Diff]:
        """Confluent's CombinedSchemaDiff: the criterion may only widen, and branches pair up
        (a sum's writer branches each with a reader branch; a product's reader branches each
        with a writer branch)."""
        (writer_kind, writer_branches), (reader_kind, reader_branches) = writer, reader
        if writer_kind != reader_kind and not _widens(writer_kind, len(writer_branches),
                                                      reader_kind, len(reader_branches)):
            return [_Diff((), "COMBINED_TYPE_CHANGED",
                          f"combined type changed from {writer_kind} to {reader_kind}")]
        ws, rs = _distinct(writer_branches), _distinct(reader_branches)
        diffs = []
        product = reader_kind == "allOf"
        if product and len(rs) > len(ws):
            diffs.append(_Diff((), "PRODUCT_TYPE_EXTENDED", f"allOf extended from {len(ws)} "
                                                            f"to {len(rs)} branches"))
        if not product and len(ws) > len(rs):
            diffs.append(_Diff((), "SUM_TYPE_NARROWED", f"{reader_kind} narrowed from "
                                                        f"{len(ws)} to {len(rs)} branches"))
        pairs = {(i, j): self.compare(w, r) for i, w in enumerate(ws) for j, r in enumerate(rs)}
        matched = _matching(len(ws), len(rs), lambda i, j: not pairs[i, j])
        if len(matched) >= min(len(ws), len(rs)):
            return diffs
        if product:  # reader branches no writer branch implies
            unmatched = [(i, i) for i in range(len(rs)) if i not in matched.values()]
        else:
            unmatched = [(i, i) for i in range(len(ws)) if i not in matched]
        kind = reader_kind if product else writer_kind
        for i, j in unmatched:
            diffs += _under((kind, str(i)), pairs.get((i, j), [])) or [
                _Diff((kind, str(i)), "COMBINED_TYPE_SUBSCHEMAS_CHANGED",
                      "no branch of the other schema pairs with this branch")]
        return diffs

    def _compare_plain(self, writer: _Node, reader: _Node) -> list[_Diff]:
        ws, rs = writer.schema, reader.schema
        values = _values(ws)
        diffs: list[_Diff] = []
        if values is not None:  # the writer's data is these values: check each
            diffs += _compare_values(values, reader)
            writer_types: frozenset[str] | None = frozenset(_json_type(v) for v in values)
        else:
            diffs += _compare_types(ws, rs) + _compare_enum_added(ws, rs)
            writer_types = _types(ws)
        reader_types = _types(rs)
        if values is None and _meets(writer_types, reader_types, frozenset({"string"})):
            diffs += _compare_strings(ws, rs)
        if values is None and _meets(writer_types, reader_types, _NUMBER_TYPES):
            diffs += _compare_numbers(ws, rs, writer_types)
        if _meets(writer_types, reader_types, frozenset({"object"})):
            diffs += self._compare_objects(writer, reader)
        if _meets(writer_types, reader_types, frozenset({"array"})):
            diffs += self._compare_arrays(writer, reader)
        return diffs + self._compare_not(writer, reader)

    def _compare_objects(self, writer: _Node, reader: _Node) -> list[_Diff]:
        ws, rs = writer.schema, reader.schema
        wp, rp = _dict(ws, "properties"), _dict(rs, "properties")
        required = set(_required(rs))
        diffs: list[_Diff] = []
        for name in [*wp, *(n for n in rp if n not in wp)]:
            path = ("properties", name)
            if name in wp and name in rp:
                found = self.compare(_child(writer, wp[name]), _child(reader, rp[name]))
            elif name in wp:
                found = self._property_removed(_child(writer, wp[name]), reader, name)
            else:
                found = self._property_added(writer, _child(reader, rp[name]), name,
                                             name in required)
            diffs += _under(path, found)
        for name in _required(rs):
            if name in _required(ws) or (name in rp and name not in wp):
                continue  # guaranteed, or reported as an added property
            if name in rp and _has_default(_child(reader, rp[name])):
                continue  # REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED
            diffs.append(_Diff(("required", name), "REQUIRED_ATTRIBUTE_ADDED",
                               f"property {name!r} made required: the writer may omit it"))
        rest = self._compare_rest(_object_rest(writer), _object_rest(reader),
                                  "ADDITIONAL_PROPERTIES", "additional properties")
        diffs += _under(("additionalProperties",), rest)
        diffs += _upper_limit(ws, rs, "maxProperties", "MAX_PROPERTIES")
        diffs += _lower_limit(ws, rs, "minProperties", "MIN_PROPERTIES")
        return diffs + self._compare_dependencies(writer, reader)

    def _property_removed(self, prop: _Node, reader: _Node, name: str) -> list[_Diff]:
        """A property the writer names and the reader does not: the reader's rest reads it."""
        rest = _rest_for(reader, name)
        if rest is None or prop.schema is False:
            return []  # PROPERTY_REMOVED_FROM_OPEN_CONTENT_MODEL (or never written)
        if rest is False:
            return [_Diff((), "PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL",
                          f"property {name!r} removed from a closed content model: the reader "
                          f"refuses it")]
        if self.compare(prop, rest):
            return [_Diff((), "PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                          f"property {name!r} removed, and the reader's additional or pattern "
                          f"properties do not read it")]
        return []

    def _property_added(self, writer: _Node, prop: _Node, name: str,
                        required: bool) -> list[_Diff]:
        """A property the reader names and the writer does not: the writer's rest wrote it."""
        rest = _rest_for(writer, name)
        kind = "required" if required else "optional"
        if rest is None:
            if _is_any(_deref(prop).schema):
                return []  # PROPERTY_WITH_EMPTY_SCHEMA_ADDED_TO_OPEN_CONTENT_MODEL
            return [_Diff((), f"{kind.upper()}_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL",
                          f"{kind} property {name!r} added to an open content model: the "
                          f"writer may have written any value under that name")]
        diffs = []
        if rest is not False and self.compare(rest, prop):
            diffs.append(_Diff((), "PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                               f"property {name!r} added, and it does not read what the "
                               f"writer's additional or pattern properties allow"))
        if required and not _has_default(prop):
            diffs.append(_Diff((), "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL",
                               f"required property {name!r} added: the writer may omit it"))
        return diffs

    def _compare_rest(self, writer: _Rest, reader: _Rest, name: str, what: str,
                      narrowed: str = "") -> list[_Diff]:
        """The schemas of the properties (items) neither side names (positions)."""
        if reader is None or writer is False:
            return []  # {name}_ADDED / _EXTENDED, or nothing written
        if reader is False:
            return [_Diff((), f"{name}_REMOVED", f"{what} removed: the writer allows them")]
        if writer is None:
            return [_Diff((), narrowed or f"{name}_NARROWED",
                          f"{what} narrowed from any value to a schema")]
        return self.compare(writer, reader)

    def _compare_dependencies(self, writer: _Node, reader: _Node) -> list[_Diff]:
        ws, rs = writer.schema, reader.schema
        diffs: list[_Diff] = []
        for keyword in ("dependencies", "dependentRequired", "dependentSchemas"):
            wd = _dict(ws, keyword)
            for key, rdep in _dict(rs, keyword).items():
                wdep, path = wd.get(key), (keyword, key)
                if isinstance(rdep, list):
                    if not isinstance(wdep, list):
                        diffs.append(_Diff(path, "DEPENDENCY_ARRAY_ADDED",
                                           f"dependency of {key!r} on {rdep} added"))
                    elif not set(rdep) <= set(wdep):
                        name = "EXTENDED" if set(wdep) <= set(rdep) else "CHANGED"
                        diffs.append(_Diff(path, f"DEPENDENCY_ARRAY_{name}",
                                           f"dependency of {key!r} {name.lower()} from {wdep} "
                                           f"to {rdep}"))
                elif wdep is None or isinstance(wdep, list):
                    diffs.append(_Diff(path, "DEPENDENCY_SCHEMA_ADDED",
                                       f"schema dependency of {key!r} added"))
                else:
                    diffs += _under(path, self.compare(_child(writer, wdep), _child(reader, rdep)))
        return diffs

    def _compare_arrays(self, writer: _Node, reader: _Node) -> list[_Diff]:
        (wt, wrest), (rt, rrest) = _array_items(writer), _array_items(reader)
        tuple_keyword = "items" if reader.draft.ref_overrides else "prefixItems"
        diffs: list[_Diff] = []
        for i in range(max(len(wt), len(rt))):
            path = (tuple_keyword, str(i))
            if i < len(wt) and i < len(rt):
                diffs += _under(path, self.compare(wt[i], rt[i]))
            elif i < len(wt):
                diffs += _under(path, self._item_removed(wt[i], rrest))
            else:
                diffs += _under(path, self._item_added(wrest, rt[i]))
        if wt or rt:
            rest_path = "additionalItems" if reader.draft.ref_overrides else "items"
            rest = self._compare_rest(wrest, rrest, "ADDITIONAL_ITEMS", "additional items")
        else:
            rest_path = "items"
            rest = self._compare_rest(wrest, rrest, "ADDITIONAL_ITEMS", "items", "SCHEMA_ADDED")
        diffs += _under((rest_path,), rest)
        diffs += _upper_limit(writer.schema, reader.schema, "maxItems", "MAX_ITEMS")
        diffs += _lower_limit(writer.schema, reader.schema, "minItems", "MIN_ITEMS")
        if reader.schema.get("uniqueItems") is True and not writer.schema.get("uniqueItems"):
            diffs.append(_Diff(("uniqueItems",), "UNIQUE_ITEMS_ADDED", "uniqueItems added"))
        return diffs

    def _item_removed(self, item: _Node, reader: _Rest) -> list[_Diff]:
        """A position the writer's tuple names and the reader's does not: its rest reads it."""
        if reader is None or item.schema is False:
            return []  # ITEM_REMOVED_FROM_OPEN_CONTENT_MODEL, or never written
        if reader is False:
            return [_Diff((), "ITEM_REMOVED_FROM_CLOSED_CONTENT_MODEL",
                          "item removed from a closed content model: the reader refuses it")]
        if self.compare(item, reader):
            return [_Diff((), "ITEM_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                          "item removed, and the reader's additional items do not read it")]
        return []

    def _item_added(self, writer: _Rest, item: _Node) -> list[_Diff]:
        """A position the reader's tuple names and the writer's does not: its rest wrote it."""
        if writer is False:
            return []  # ITEM_ADDED_TO_CLOSED_CONTENT_MODEL: never written
        if writer is None:
            if _is_any(_deref(item).schema):
                return []
            return [_Diff((), "ITEM_ADDED_TO_OPEN_CONTENT_MODEL",
                          "item added to an open content model: the writer may have written "
                          "any value there")]
        if self.compare(writer, item):
            return [_Diff((), "ITEM_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
                          "item added, and it does not read the writer's additional items")]
        return []

    def _compare_not(self, writer: _Node, reader: _Node) -> list[_Diff]:
        if "not" not in reader.schema:
            return []
        if "not" not in writer.schema:
            return [_Diff(("not",), "NOT_TYPE_EXTENDED", "not added")]
        if not self.compare(_child(reader, reader.schema["not"]),
                            _child(writer, writer.schema["not"])):
            return []
        return [_Diff(("not",), "NOT_TYPE_EXTENDED",
                      "the reader's not refuses values the writer's not allows")]


def _widens(writer_kind: str, writer_size: int, reader_kind: str, reader_size: int) -> bool:
    """Confluent's allowed criterion changes: to anyOf; to oneOf from a singleton; singleton
    to singleton allOf."""
    return (reader_kind == "anyOf" or (reader_kind == "oneOf" and writer_size == 1)
            or (reader_kind == "allOf" and writer_size == 1 and reader_size == 1))


def _distinct(nodes: list[_Node]) -> list[_Node]:
    seen: dict[str, _Node] = {}
    for node in nodes:
        seen.setdefault(_canonical(node.schema), node)
    return list(seen.values())


def _matching(left: int, right: int, fits: Callable[[int, int], bool]) -> dict[int, int]:
    """A maximum matching of a bipartite graph (Kuhn's augmenting paths): left -> right."""
    owner: dict[int, int] = {}

    def augment(i: int, tried: set[int]) -> bool:
        for j in range(right):
            if j not in tried and fits(i, j):
                tried.add(j)
                if j not in owner or augment(owner[j], tried):
                    owner[j] = i
                    return True
        return False

    for i in range(left):
        augment(i, set())
    return {i: j for j, i in owner.items()}


def _meets(writer: frozenset[str] | None, reader: frozenset[str] | None,
           group: frozenset[str]) -> bool:
    """Whether the writer may write a value of `group` that the reader accepts as one."""
    return (writer is None or bool(writer & group)) and (reader is None or bool(reader & group))


def _accepts(types: frozenset[str], kind: str) -> bool:
    return kind in types or (kind == "integer" and "number" in types)


def _describe(schema: Any) -> str:
    types = _types(schema) if isinstance(schema, dict) else None
    return _type_names(types) if types else "any value"


def _type_names(types: frozenset[str]) -> str:
    ordered = sorted(types)
    return ordered[0] if len(ordered) == 1 else "[" + ", ".join(ordered) + "]"


def _compare_types(ws: dict[str, Any], rs: dict[str, Any]) -> list[_Diff]:
    writer, reader = _types(ws), _types(rs)
    if reader is None:
        return []
    if writer is None:
        return [_Diff((), "TYPE_NARROWED", f"type narrowed from any type to "
                                           f"{_type_names(reader)}")]
    if all(_accepts(reader, t) for t in writer):
        return []  # TYPE_EXTENDED, or unchanged
    if all(_accepts(writer, t) for t in reader):
        return [_Diff((), "TYPE_NARROWED", f"type narrowed from {_type_names(writer)} to "
                                           f"{_type_names(reader)}")]
    return [_Diff((), "TYPE_CHANGED", f"type changed from {_type_names(writer)} to "
                                      f"{_type_names(reader)}")]


def _compare_enum_added(ws: dict[str, Any], rs: dict[str, Any]) -> list[_Diff]:
    if _values(rs) is None:
        return []
    keyword = "const" if "const" in rs else "enum"
    return [_Diff((keyword,), "ENUM_ARRAY_NARROWED",
                  f"{keyword} added: the writer allows values outside it")]


def _compare_values(values: list[Any], reader: _Node) -> list[_Diff]:
    """The writer's enum against the reader's scalar keywords, value by value."""
    rs = reader.schema
    local = {k: v for k, v in rs.items() if k in _SCALAR_KEYWORDS}
    if not local:
        return []
    validator = reader.draft.validator(local)
    refused = [v for v in values if not validator.is_valid(v)]
    if not refused:
        return []
    reader_values = _values(rs)
    if reader_values is None:
        error = best_match(validator.iter_errors(refused[0]))
        reason = _one_line(error.message) if error is not None else "refused"
        return [_Diff((), "ENUM_ARRAY_NARROWED",
                      f"the reader refuses the writer's enum values {refused}: {reason}")]
    writer_keys = {_value_key(v) for v in values}
    narrowed = all(_value_key(v) in writer_keys for v in reader_values)
    name = "ENUM_ARRAY_NARROWED" if narrowed else "ENUM_ARRAY_CHANGED"
    verb = "narrowed" if narrowed else "changed"
    return [_Diff(("enum",), name, f"enum {verb}: the reader refuses {refused}")]


def _compare_strings(ws: dict[str, Any], rs: dict[str, Any]) -> list[_Diff]:
    diffs = _upper_limit(ws, rs, "maxLength", "MAX_LENGTH")
    diffs += _lower_limit(ws, rs, "minLength", "MIN_LENGTH")
    writer, reader = ws.get("pattern"), rs.get("pattern")
    if reader is None or reader == writer:
        return diffs
    name = "PATTERN_ADDED" if writer is None else "PATTERN_CHANGED"
    was = "" if writer is None else f" from {writer!r}"
    return diffs + [_Diff(("pattern",), name, f"pattern {name.split('_')[1].lower()}{was} "
                                              f"to {reader!r}")]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _num(schema: dict[str, Any], keyword: str) -> float | None:
    value = schema.get(keyword)
    return value if _number(value) else None


def _upper_limit(ws: dict[str, Any], rs: dict[str, Any], keyword: str, name: str) -> list[_Diff]:
    writer, reader = _num(ws, keyword), _num(rs, keyword)
    if reader is None or (writer is not None and reader >= writer):
        return []
    if writer is None:
        return [_Diff((keyword,), f"{name}_ADDED", f"{keyword} {reader} added")]
    return [_Diff((keyword,), f"{name}_DECREASED",
                  f"{keyword} decreased from {writer} to {reader}")]


def _lower_limit(ws: dict[str, Any], rs: dict[str, Any], keyword: str, name: str) -> list[_Diff]:
    writer, reader = _num(ws, keyword), _num(rs, keyword)
    if reader is None or reader <= (writer or 0):
        return []
    if writer is None:
        return [_Diff((keyword,), f"{name}_ADDED", f"{keyword} {reader} added")]
    return [_Diff((keyword,), f"{name}_INCREASED",
                  f"{keyword} increased from {writer} to {reader}")]


_Bound = tuple[float, bool, str]  # value, exclusive, the keyword that sets it


def _bound(schema: dict[str, Any], upper: bool) -> _Bound | None:
    """The tightest upper (or lower) bound, draft 4's boolean exclusiveMaximum included."""
    inclusive, exclusive = ("maximum", "exclusiveMaximum") if upper else \
        ("minimum", "exclusiveMinimum")
    value, flag = _num(schema, inclusive), schema.get(exclusive)
    found: list[_Bound] = []
    if value is not None:
        found.append((value, flag is True, exclusive if flag is True else inclusive))
    limit = _num(schema, exclusive)  # draft 6 on: a number of its own
    if limit is not None:
        found.append((limit, True, exclusive))
    if not found:
        return None
    if upper:
        return min(found, key=lambda b: (b[0], not b[1]))
    return max(found, key=lambda b: (b[0], b[1]))


def _compare_bound(ws: dict[str, Any], rs: dict[str, Any], upper: bool) -> list[_Diff]:
    writer, reader = _bound(ws, upper), _bound(rs, upper)
    if reader is None:
        return []
    value, exclusive, keyword = reader
    name = re.sub(r"(?<!^)([A-Z])", r"_\1", keyword).upper()
    if writer is None:
        return [_Diff((keyword,), f"{name}_ADDED", f"{keyword} {value} added")]
    tighter = value < writer[0] if upper else value > writer[0]
    if not tighter and not (value == writer[0] and exclusive and not writer[1]):
        return []
    verb = "DECREASED" if upper else "INCREASED"
    return [_Diff((keyword,), f"{name}_{verb}",
                  f"{keyword} {verb.lower()} from {writer[0]} to {value}" if tighter
                  else f"bound {value} became exclusive")]


def _compare_numbers(ws: dict[str, Any], rs: dict[str, Any],
                     writer_types: frozenset[str] | None) -> list[_Diff]:
    diffs = _compare_bound(ws, rs, upper=True) + _compare_bound(ws, rs, upper=False)
    writer, reader = ws.get("multipleOf"), rs.get("multipleOf")
    if not _number(reader):
        return diffs
    step = Fraction(str(reader))
    if not _number(writer):
        if writer_types == {"integer"} and (1 / step).denominator == 1:
            return diffs  # every integer is a multiple of it
        return diffs + [_Diff(("multipleOf",), "MULTIPLE_OF_ADDED", f"multipleOf {reader} added")]
    written = Fraction(str(writer))
    if (written / step).denominator == 1:
        return diffs  # MULTIPLE_OF_REDUCED, or unchanged
    name = "EXPANDED" if (step / written).denominator == 1 else "CHANGED"
    return diffs + [_Diff(("multipleOf",), f"MULTIPLE_OF_{name}",
                          f"multipleOf {name.lower()} from {writer} to {reader}")]


def _object_rest(node: _Node) -> _Rest:
    return _rest(node, node.schema, ("additionalProperties", "unevaluatedProperties"))


def _rest(node: _Node, schema: dict[str, Any], keywords: Sequence[str]) -> _Rest:
    for keyword in keywords:
        if keyword in schema:
            value = schema[keyword]
            if value is False:
                return False
            return None if _is_any(value) else _child(node, value)
    return None


def _rest_for(node: _Node, name: str) -> _Rest:
    """What an object's schema says of a property it does not name: its first matching
    pattern property, else its additional properties."""
    for pattern, sub in _dict(node.schema, "patternProperties").items():
        try:
            if re.search(pattern, name):
                return _child(node, sub)
        except re.error:
            continue
    return _object_rest(node)


def _array_items(node: _Node) -> tuple[list[_Node], _Rest]:
    """An array schema's positional item schemas and the schema of the items past them."""
    schema = node.schema
    prefix, items = schema.get("prefixItems"), schema.get("items")
    if isinstance(prefix, list):
        return [_child(node, s) for s in prefix], _rest(node, schema, ("items",))
    if isinstance(items, list):
        return [_child(node, s) for s in items], _rest(node, schema, ("additionalItems",))
    return [], _rest(node, schema, ("items",))


# -- columns ---------------------------------------------------------------------------------


def _json_text(value: Any) -> Any:
    if value is None:
        return None
    return json.dumps(value, separators=_JSON_SEPARATORS, ensure_ascii=False, sort_keys=True)


def _to_float(value: Any) -> Any:
    return None if value is None else float(value)


def _to_datetime(value: Any) -> Any:
    if value is None:
        return None
    parsed = dt.datetime.fromisoformat(value.upper())  # RFC 3339 allows 't' and 'z'
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _to_date(value: Any) -> Any:
    return None if value is None else dt.date.fromisoformat(value)


_FALLBACK = _Column(pa.string(), _json_text, "json")
_LEAVES = {
    "integer": _Column(pa.int64(), None, "int64"),
    "number": _Column(pa.float64(), _to_float, "float64"),
    "boolean": _Column(pa.bool_(), None, "bool"),
    "string": _Column(pa.string(), None, "string"),
    "date-time": _Column(pa.timestamp("us", tz="UTC"), _to_datetime, "timestamp"),
    "date": _Column(pa.date32(), _to_date, "date32"),
}


def _column(node: _Node, active: frozenset[int]) -> _Column:
    """The column of a subschema's values; `active`: the schemas being mapped above it (one
    met again is recursive, and held as JSON text)."""
    node = _deref(node)
    schema = node.schema
    if not isinstance(schema, dict) or _is_any(schema) or id(schema) in active:
        return _FALLBACK
    active = active | {id(schema)}
    types = _types(schema)
    values = _values(schema)
    if types is None and values is not None:
        types = frozenset(_json_type(v) for v in values)
    if types is not None:
        return _typed_column(node, types - {"null"}, active)
    for kind in ("anyOf", "oneOf"):
        if isinstance(schema.get(kind), list):
            return _one_of_columns([_child(node, b) for b in schema[kind]], active)
    conjuncts = _conjuncts(node)
    if any(_is_object(_deref(c)) for c in conjuncts):
        return _object_column(node, active)
    constraining = [c for c in conjuncts if not _is_any(_deref(c).schema)]
    return _column(constraining[0], active) if len(constraining) == 1 else _FALLBACK


def _typed_column(node: _Node, types: frozenset[str], active: frozenset[int]) -> _Column:
    schema = node.schema
    if types == _NUMBER_TYPES:
        return _LEAVES["number"]
    if len(types) != 1:
        return _FALLBACK
    (kind,) = types
    if kind == "string" and schema.get("format") in ("date-time", "date"):
        return _LEAVES[schema["format"]]
    if kind in _LEAVES:
        return _LEAVES[kind]
    if kind == "object":
        return _object_column(node, active)
    items = schema.get("items")
    if kind == "array" and isinstance(items, dict | bool) and "prefixItems" not in schema:
        element = _column(_child(node, items), active)
        convert = element.convert
        return _Column(pa.list_(element.type),
                       None if convert is None else _list_converter(convert),
                       f"list<{element.signature}>")
    return _FALLBACK


def _one_of_columns(branches: list[_Node], active: frozenset[int]) -> _Column:
    """A sum of branches: their one column if all (but `null`) map alike, else JSON text."""
    columns = [_column(b, active) for b in branches if _types_of(b) != frozenset({"null"})]
    if columns and all(c.signature == columns[0].signature for c in columns):
        return columns[0]
    return _FALLBACK


def _types_of(node: _Node) -> frozenset[str] | None:
    schema = _deref(node).schema
    return _types(schema) if isinstance(schema, dict) else None


def _is_object(node: _Node) -> bool:
    types = _types(node.schema) if isinstance(node.schema, dict) else None
    return types is not None and types - {"null"} == {"object"}


def _conjuncts(node: _Node) -> list[_Node]:
    """The allOf branches of a node, with its $ref when that is one conjunct among others."""
    schema = node.schema
    branches = [_child(node, b) for b in schema.get("allOf") or [] if isinstance(b, dict)]
    if isinstance(schema.get("$ref"), str) and not _follows_ref(node):
        branches.append(_child(node, {"$ref": schema["$ref"]}))
    return branches


def _object_properties(node: _Node, active: frozenset[int]) -> dict[str, _Node]:
    """An object's properties, those of its allOf conjuncts included (first one wins)."""
    properties = {name: _child(node, sub) for name, sub in _dict(node.schema, "properties").items()}
    for conjunct in _conjuncts(node):
        conjunct = _deref(conjunct)
        if isinstance(conjunct.schema, dict) and id(conjunct.schema) not in active:
            inherited = _object_properties(conjunct, active | {id(conjunct.schema)})
            for name, sub in inherited.items():
                properties.setdefault(name, sub)
    return properties


def _object_column(node: _Node, active: frozenset[int]) -> _Column:
    properties = _object_properties(node, active)
    if properties:
        fields = tuple((name, _column(sub, active)) for name, sub in properties.items())
        arrow = pa.struct([pa.field(name, c.type, nullable=True) for name, c in fields])
        signature = "struct<" + ",".join(f"{n}:{c.signature}" for n, c in fields) + ">"
        return _Column(arrow, _struct_converter(fields), signature, fields)
    extra = node.schema.get("additionalProperties")
    if isinstance(extra, dict) and not _is_any(extra):
        value = _column(_child(node, extra), active)
        convert = value.convert
        return _Column(pa.map_(pa.string(), value.type),
                       None if convert is None else _map_converter(convert),
                       f"map<{value.signature}>")
    return _FALLBACK


def _struct_converter(fields: tuple[tuple[str, _Column], ...]) -> Callable[[Any], Any] | None:
    converters = [(name, c.convert) for name, c in fields]
    if all(convert is None for _, convert in converters):
        return None  # pyarrow takes the dict as it is, and ignores keys it has no field for

    def convert(value: Any) -> Any:
        if not isinstance(value, dict):
            return None
        return {name: value.get(name) if c is None else c(value.get(name))
                for name, c in converters}
    return convert


def _list_converter(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else [convert(v) for v in value]


def _map_converter(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else [(k, convert(v)) for k, v in value.items()]


def json_arrow_type(schema: JsonSchema) -> pa.DataType:
    """The Arrow (and Delta) type of a document of `schema`: object with properties -> struct
    (every field nullable), string -> string (format date-time -> timestamp[us, UTC], date ->
    date32), integer -> int64, number -> float64, boolean -> bool, array with items -> list,
    [T, "null"] -> T, object with only an additionalProperties schema -> map<string, T>;
    anything else (no type, differing anyOf/oneOf branches, a recursion) -> the value's JSON
    text as a string."""
    return _column(schema._root, frozenset()).type


def json_arrow_schema(schema: JsonSchema) -> pa.Schema:
    """A typed topic's columns: an object's properties, else one column `value`."""
    return schema._layout[0]


# -- records ---------------------------------------------------------------------------------


def decode_json(schema: JsonSchema, payloads: Sequence[bytes]) -> pa.Table:
    """The table (`json_arrow_schema`) of JSON documents (no wire header), each validated
    against `schema` first. Raises ValueError naming the first record that is not JSON, not
    valid under the schema, or not held by its column."""
    fast = schema._fast_validator
    documents: list[Any] = []
    for index, payload in enumerate(payloads):
        data = payload.tobytes() if isinstance(payload, memoryview) else payload
        try:
            document = _read_document(data)
        except (ValueError, TypeError) as e:
            raise ValueError(f"record {index} is not JSON: {e}") from None
        if fast is None or not fast.is_valid(document):
            _explain_refusal(schema, fast, index, document)
        documents.append(document)
    arrow_schema, columns, by_property = schema._layout
    arrays = []
    for name, column in columns:
        values = [d.get(name) if isinstance(d, dict) else None for d in documents] \
            if by_property else documents
        arrays.append(_array(values, column, name))
    return pa.Table.from_arrays(arrays, schema=arrow_schema)


def _read_document(data: bytes) -> Any:
    """A record's JSON document: UTF-8 read straight with one shared decoder (json.loads makes
    a decoder a call, a fifth of a record's time), other encodings as json.loads detects."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return json.loads(data, parse_constant=_refuse_constant)
    return _DOCUMENTS.decode(text.removeprefix("\ufeff"))  # a byte order mark, as json.loads


def _explain_refusal(schema: JsonSchema, fast: Any, index: int, document: Any) -> None:
    """Raise ValueError naming why record `index` is not valid, in jsonschema's words, where
    jsonschema-rs (`fast`, None: not used) refused it; without `fast`, jsonschema decides."""
    error = best_match(schema._validator.iter_errors(document))
    if error is not None:
        raise ValueError(f"record {index} is not valid under the schema: {_error_line(error)}")
    if fast is not None:  # the two differ (a format's edge): jsonschema-rs decides
        first = next(iter(fast.iter_errors(document)), None)
        raise ValueError(f"record {index} is not valid under the schema: "
                         f"{_one_line(str(first))}")


def _array(values: list[Any], column: _Column, name: str) -> pa.Array:
    convert = column.convert
    if convert is not None:
        converted = []
        for index, value in enumerate(values):
            try:
                converted.append(convert(value))
            except (ValueError, TypeError, AttributeError, OverflowError) as e:
                raise ValueError(f"record {index}: column {name!r}: {e}") from None
        values = converted
    try:
        return pa.array(values, type=column.type)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        for index, value in enumerate(values):  # find the record to name
            try:
                pa.array([value], type=column.type)
            except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:
                raise ValueError(f"record {index}: column {name!r} of type {column.type} "
                                 f"cannot hold its value: {e}") from None
        raise


def encode_json(schema: JsonSchema, rows: Sequence[object]) -> list[bytes]:
    """Each row (a JSON value: dicts, lists, str, int, float, bool, None) as compact UTF-8
    JSON, validated against `schema` first. Raises ValueError naming the first bad row."""
    validator = schema._validator
    encoded = []
    for index, row in enumerate(rows):
        error = best_match(validator.iter_errors(row))
        if error is not None:
            raise ValueError(f"row {index} is not valid under the schema: {_error_line(error)}")
        try:
            encoded.append(json.dumps(row, separators=_JSON_SEPARATORS, ensure_ascii=False,
                                      allow_nan=False).encode())
        except (TypeError, ValueError) as e:  # UnicodeEncodeError too
            raise ValueError(f"row {index} is not JSON: {e}") from None
    return encoded


# -- messages --------------------------------------------------------------------------------


def _pointer(path: Iterable[Any]) -> str:
    """A JSON pointer fragment as Confluent writes it: '#/' and the escaped segments."""
    return "#/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _error_line(error: ValidationError) -> str:
    return f"{_pointer(error.absolute_path)}: {_one_line(error.message)}"
