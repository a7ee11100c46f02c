"""Schemas as Confluent Schema Registry knows them: their types, compatibility levels, the
references between them, and the wire format serializers put in front of a record's bytes.

Pure: no I/O. The registry (cluster/schema_registry.py) stores schemas and decides registrations
with `check_compatibility`; each schema type's parsing and reader/writer rules live in a module
of their own (schema_avro, schema_json, schema_protobuf), reached through `parse`, `decode` and
`encode`. Their libraries (fastavro, jsonschema, grpcio-tools) are the schemas extra, which the
client install lacks: asking for a type without it raises ModuleNotFoundError naming the extra.

Compatibility in Confluent's terms, with one primitive, `read_errors(reader, writer)`: what
stops data written with `writer` from being read with `reader` (empty: nothing).
- BACKWARD: the new schema reads data written with the latest one (consumers upgrade first);
- FORWARD: the latest schema reads data written with the new one (producers upgrade first);
- FULL: both; the _TRANSITIVE forms check against every live version, not the latest only;
- NONE: no check.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from deltabus import extras

MAGIC_BYTE = 0
LATEST_VERSION = -1  # a subject's latest live version ("latest" or -1 on the REST API)
VERSION_MAX = 2**31 - 1
WIRE_HEADER = struct.Struct(">bI")  # Confluent's wire format: magic byte 0, schema id (4 bytes)


class SchemaType(enum.StrEnum):
    AVRO = "AVRO"
    JSON = "JSON"
    PROTOBUF = "PROTOBUF"


class Compatibility(enum.StrEnum):
    NONE = "NONE"
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"

    @property
    def transitive(self) -> bool:
        return self.name.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        return self.name.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        return self.name.startswith(("FORWARD", "FULL"))


DEFAULT_COMPATIBILITY = Compatibility.BACKWARD  # Confluent's default


class InvalidSchemaError(ValueError):
    """A schema text that does not parse as its type (Confluent: 42201 Invalid schema)."""


@dataclass(frozen=True)
class SchemaReference:
    """A reference from a schema to another subject's version, under the name the schema
    uses for it (an Avro full name, a JSON Schema $ref URL, a .proto import path)."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class StoredSchema:
    """A schema the registry holds, under its id, with its text as registered."""

    schema_id: int
    schema_type: SchemaType
    text: str
    references: tuple[SchemaReference, ...]


@dataclass(frozen=True)
class SubjectVersion:
    """A version of a subject: the schema it holds, and whether it is soft-deleted."""

    subject: str
    version: int
    schema_id: int
    deleted: bool = False


class ParsedSchema(Protocol):
    """A parsed schema of one type."""

    @property
    def schema_type(self) -> SchemaType: ...

    def canonical(self) -> str:
        """The schema's normalised text: two registrations of the same schema written
        differently (whitespace, key order) get the same id."""
        ...

    def read_errors(self, writer: ParsedSchema) -> list[str]:
        """What stops data written with `writer` from being read with this schema, one line
        each (empty: compatible). `writer` is of the same type."""
        ...


def _needs_library(schema_type: SchemaType) -> AbstractContextManager[None]:
    """Where a schema type's module is imported: without the schemas extra, one line saying
    which library is missing and how to install it."""
    return extras.needs(f"the {schema_type.value} schema type", extras.SCHEMAS)


def parse(schema_type: SchemaType, text: str, references: Mapping[str, str]) -> ParsedSchema:
    """Parse a schema of `schema_type`; `references` maps each reference's name to the text of
    the schema it names. Raises InvalidSchemaError saying what is wrong."""
    if schema_type == SchemaType.AVRO:
        with _needs_library(SchemaType.AVRO):
            from deltabus.schema_avro import parse_avro
        return parse_avro(text, references)
    if schema_type == SchemaType.JSON:
        with _needs_library(SchemaType.JSON):
            from deltabus.schema_json import parse_json_schema
        return parse_json_schema(text, references)
    with _needs_library(SchemaType.PROTOBUF):
        from deltabus.schema_protobuf import parse_protobuf
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
            from deltabus.schema_avro import decode_avro
        return decode_avro(schema, payloads, skip)  # type: ignore[arg-type]
    bodies = without_header(payloads, skip)
    if schema.schema_type == SchemaType.JSON:
        with _needs_library(SchemaType.JSON):
            from deltabus.schema_json import decode_json
        return decode_json(schema, bodies)  # type: ignore[arg-type]
    with _needs_library(SchemaType.PROTOBUF):
        from deltabus.schema_protobuf import decode_protobuf
    return decode_protobuf(schema, bodies)  # type: ignore[arg-type]


def without_header(payloads: Sequence[bytes] | pa.Array, skip: int) -> list[bytes]:
    """Each payload past its first `skip` bytes, as Python bytes (the record-by-record paths
    read those)."""
    if isinstance(payloads, pa.Array):
        payloads = payloads.to_pylist()
    return [p[skip:] for p in payloads] if skip else list(payloads)


def encode(schema: ParsedSchema, schema_id: int, rows: Sequence[Any]) -> list[bytes]:
    """Rows (dicts, as `decode` gives them back as Python values) as records in Confluent's
    wire format: the header naming `schema_id`, then the encoding (a Protobuf schema's first
    message). Raises ValueError naming the first row that does not fit."""
    header = wire_header(schema_id)
    if schema.schema_type == SchemaType.AVRO:
        with _needs_library(SchemaType.AVRO):
            from deltabus.schema_avro import encode_avro
        bodies = encode_avro(schema, rows)  # type: ignore[arg-type]
    elif schema.schema_type == SchemaType.JSON:
        with _needs_library(SchemaType.JSON):
            from deltabus.schema_json import encode_json
        bodies = encode_json(schema, rows)  # type: ignore[arg-type]
    else:
        with _needs_library(SchemaType.PROTOBUF):
            from deltabus.schema_protobuf import encode_protobuf
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


def wire_header(schema_id: int) -> bytes:
    """The 5 bytes Confluent's serializers put before a record's encoded bytes."""
    return WIRE_HEADER.pack(MAGIC_BYTE, schema_id)


def split_wire(data: bytes) -> tuple[int, memoryview]:
    """(schema id, the encoded bytes after the header); raises ValueError where `data` does
    not start with Confluent's wire header."""
    if len(data) < WIRE_HEADER.size or data[0] != MAGIC_BYTE:
        raise ValueError("the record does not start with the schema registry's magic byte 0 "
                         "and a schema id")
    _, schema_id = WIRE_HEADER.unpack_from(data)
    return schema_id, memoryview(data)[WIRE_HEADER.size:]


class SchemaRegistryError(Exception):
    """A request the registry refuses, with Confluent's error code and HTTP status, so REST
    clients (confluent-kafka's serializers among them) see what Confluent's registry answers."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message

    @property
    def http_status(self) -> int:
        """Confluent's codes start with their HTTP status (40401 -> 404, 409 -> 409)."""
        return int(str(self.error_code)[:3])


def subject_not_found(subject: str) -> SchemaRegistryError:
    return SchemaRegistryError(40401, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version: int | str) -> SchemaRegistryError:
    return SchemaRegistryError(40402, f"Version {version} not found for subject '{subject}'.")


def schema_not_found(schema_id: int | None = None) -> SchemaRegistryError:
    return SchemaRegistryError(
        40403, "Schema not found" if schema_id is None else f"Schema {schema_id} not found")


def subject_soft_deleted(subject: str) -> SchemaRegistryError:
    return SchemaRegistryError(
        40404, f"Subject '{subject}' was soft deleted. Set permanent=true to delete permanently")


def subject_not_soft_deleted(subject: str) -> SchemaRegistryError:
    return SchemaRegistryError(
        40405, f"Subject '{subject}' was not deleted first before being permanently deleted")


def version_soft_deleted(subject: str, version: int) -> SchemaRegistryError:
    return SchemaRegistryError(
        40406, f"Subject '{subject}' Version {version} was soft deleted. Set permanent=true "
        "to delete permanently")


def version_not_soft_deleted(subject: str, version: int) -> SchemaRegistryError:
    return SchemaRegistryError(
        40407, f"Subject '{subject}' Version {version} was not deleted first before being "
        "permanently deleted")


def invalid_schema(detail: str) -> SchemaRegistryError:
    return SchemaRegistryError(42201, f"Invalid schema: {detail}")


def invalid_version(version: object) -> SchemaRegistryError:
    return SchemaRegistryError(
        42202, f"The specified version '{version}' is not a valid version id. Allowed values "
        "are between [1, 2^31-1] and the string \"latest\"")


def check_version(version: int, given: object = None) -> int:
    """`version` if it may name a subject's version (1 to 2^31-1, or LATEST_VERSION); else
    INVALID_VERSION (42202) naming what was given."""
    if version != LATEST_VERSION and not 1 <= version <= VERSION_MAX:
        raise invalid_version(version if given is None else given)
    return version


def invalid_compatibility_level(level: object) -> SchemaRegistryError:
    return SchemaRegistryError(
        42203, f"Invalid compatibility level {level!r}. Valid values are none, backward, "
        "forward, full, backward_transitive, forward_transitive, and full_transitive")


def reference_exists(subject: str, version: int, ids: list[int]) -> SchemaRegistryError:
    return SchemaRegistryError(
        42206, f"One or more references exist to the schema {{subject={subject}, "
        f"version={version}}}: schema ids {ids}")


def incompatible_schema(subject: str, details: list[str]) -> SchemaRegistryError:
    return SchemaRegistryError(
        409, f"Schema being registered is incompatible with an earlier schema for subject "
        f"\"{subject}\", details: {details}")
