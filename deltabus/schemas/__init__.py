"""Schemas as Confluent Schema Registry knows them: their types, compatibility levels, the
references between them, and the wire format serializers put in front of a record's bytes.

Pure: no I/O. The registry (cluster/schema_registry.py) stores schemas and decides registrations
with `check_compatibility`; each schema type's parsing and reader/writer rules live in a module
of their own (`avro`, `json_schema`, `protobuf`), reached through `parse`, `decode` and
`encode`; what they all share is `entities`. Their libraries (fastavro, jsonschema,
grpcio-tools) are the schemas extra, which the client install lacks: so the type modules are
imported where a type is first used, and asking for a type without its library raises
ModuleNotFoundError naming the extra.

Compatibility in Confluent's terms, with one primitive, `read_errors(reader, writer)`: what
stops data written with `writer` from being read with `reader` (empty: nothing).
- BACKWARD: the new schema reads data written with the latest one (consumers upgrade first);
- FORWARD: the latest schema reads data written with the new one (producers upgrade first);
- FULL: both; the _TRANSITIVE forms check against every live version, not the latest only;
- NONE: no check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import pyarrow as pa

from deltabus import extras
from deltabus.schemas.entities import (
    DEFAULT_COMPATIBILITY,
    LATEST_VERSION,
    MAGIC_BYTE,
    VERSION_MAX,
    WIRE_HEADER,
    Compatibility,
    InvalidSchemaError,
    ParsedSchema,
    SchemaReference,
    SchemaRegistryError,
    SchemaType,
    StoredSchema,
    SubjectVersion,
    check_version,
    incompatible_schema,
    invalid_compatibility_level,
    invalid_schema,
    invalid_version,
    reference_exists,
    schema_not_found,
    split_wire,
    subject_not_found,
    subject_not_soft_deleted,
    subject_soft_deleted,
    version_not_found,
    version_not_soft_deleted,
    version_soft_deleted,
    wire_header,
    without_header,
)

__all__ = [
    "check_compatibility",
    "check_version",
    "Compatibility",
    "decode",
    "DEFAULT_COMPATIBILITY",
    "encode",
    "incompatible_schema",
    "invalid_compatibility_level",
    "invalid_schema",
    "invalid_version",
    "InvalidSchemaError",
    "LATEST_VERSION",
    "MAGIC_BYTE",
    "parse",
    "ParsedSchema",
    "reference_exists",
    "referenced_texts",
    "schema_not_found",
    "SchemaReference",
    "SchemaRegistryError",
    "SchemaType",
    "split_wire",
    "StoredSchema",
    "subject_not_found",
    "subject_not_soft_deleted",
    "subject_soft_deleted",
    "SubjectVersion",
    "VERSION_MAX",
    "version_not_found",
    "version_not_soft_deleted",
    "version_soft_deleted",
    "WIRE_HEADER",
    "wire_header",
    "without_header",
]

def _needs_library(schema_type: SchemaType) -> AbstractContextManager[None]:
    """Where a schema type's module is imported: without the schemas extra, one line saying
    which library is missing and how to install it."""
    return extras.needs(f"the {schema_type.value} schema type", extras.SCHEMAS)


def parse(schema_type: SchemaType, text: str, references: Mapping[str, str]) -> ParsedSchema:
    """Parse a schema of `schema_type`; `references` maps each reference's name to the text of
    the schema it names. Raises InvalidSchemaError saying what is wrong."""
    if schema_type == SchemaType.AVRO:
        with _needs_library(SchemaType.AVRO):
            from deltabus.schemas.avro import parse_avro
        return parse_avro(text, references)
    if schema_type == SchemaType.JSON:
        with _needs_library(SchemaType.JSON):
            from deltabus.schemas.json_schema import parse_json_schema
        return parse_json_schema(text, references)
    with _needs_library(SchemaType.PROTOBUF):
        from deltabus.schemas.protobuf import parse_protobuf
    return parse_protobuf(text, references)


def referenced_texts(references: Sequence[SchemaReference],
                     lookup: Callable[[SchemaReference], StoredSchema]) -> dict[str, str]:
    """Each reference's name -> the text of the schema it names, references of references
    included: a schema may use what its references use, and parsing it needs them all.
    `lookup` finds the schema a reference names (the registry's state, or a registry client)."""
    texts: dict[str, str] = {}
    pending = list(references)
    while pending:
        ref = pending.pop()
        if ref.name in texts:
            continue
        held = lookup(ref)
        texts[ref.name] = held.text
        pending.extend(held.references)
    return texts


def decode(schema: ParsedSchema, payloads: Sequence[bytes] | pa.Array, skip: int = 0) -> Any:
    """Records encoded with `schema` (Python bytes or a binary Arrow array; each past its
    first `skip` bytes: WIRE_HEADER.size for records in the wire format, 0 without the header)
    as a pyarrow Table of its typed columns; raises ValueError naming the first record that
    does not decode."""
    if schema.schema_type == SchemaType.AVRO:
        with _needs_library(SchemaType.AVRO):
            from deltabus.schemas.avro import decode_avro
        return decode_avro(schema, payloads, skip)  # type: ignore[arg-type]
    bodies = without_header(payloads, skip)
    if schema.schema_type == SchemaType.JSON:
        with _needs_library(SchemaType.JSON):
            from deltabus.schemas.json_schema import decode_json
        return decode_json(schema, bodies)  # type: ignore[arg-type]
    with _needs_library(SchemaType.PROTOBUF):
        from deltabus.schemas.protobuf import decode_protobuf
    return decode_protobuf(schema, bodies)  # type: ignore[arg-type]


def encode(schema: ParsedSchema, schema_id: int, rows: Sequence[Any]) -> list[bytes]:
    """Rows (dicts, as `decode` gives them back as Python values) as records in Confluent's
    wire format: the header naming `schema_id`, then the encoding (a Protobuf schema's first
    message). Raises ValueError naming the first row that does not fit."""
    header = wire_header(schema_id)
    if schema.schema_type == SchemaType.AVRO:
        with _needs_library(SchemaType.AVRO):
            from deltabus.schemas.avro import encode_avro
        bodies = encode_avro(schema, rows)  # type: ignore[arg-type]
    elif schema.schema_type == SchemaType.JSON:
        with _needs_library(SchemaType.JSON):
            from deltabus.schemas.json_schema import encode_json
        bodies = encode_json(schema, rows)  # type: ignore[arg-type]
    else:
        with _needs_library(SchemaType.PROTOBUF):
            from deltabus.schemas.protobuf import encode_protobuf
        bodies = encode_protobuf(schema, [0], rows)  # type: ignore[arg-type]
    return [header + body for body in bodies]


def check_compatibility(level: Compatibility, new: ParsedSchema,
                        live: Sequence[ParsedSchema]) -> list[str]:
    """Why `new` may not follow the subject's live versions (oldest first) at `level`; empty
    when it may. A non-transitive level checks against the latest version only."""
    if level == Compatibility.NONE or not live:
        return []
    against = live if level.transitive else live[-1:]
    errors: list[str] = []
    for version in against:
        if level.backward:
            errors += new.read_errors(version)
        if level.forward:
            errors += version.read_errors(new)
    return errors
