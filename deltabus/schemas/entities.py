"""What Confluent Schema Registry's schemas are made of, with no library behind them: the
schema types and compatibility levels, references, stored schemas and subject versions, the
`ParsedSchema` each type's module returns, the wire format's header, and the registry's errors
with Confluent's codes. Every module of `deltabus.schemas` imports these; they import nothing of
it, so the package has no import cycle.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

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


def without_header(payloads: Sequence[bytes] | pa.Array, skip: int) -> list[bytes]:
    """Each payload past its first `skip` bytes, as Python bytes (the record-by-record paths
    read those)."""
    if isinstance(payloads, pa.Array):
        payloads = payloads.to_pylist()
    return [p[skip:] for p in payloads] if skip else list(payloads)


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
