"""Schemas a client fetches from the cluster's registry (over gRPC) to encode records with:
the Spark sink writing a typed DataFrame to a typed topic, and anyone encoding as Confluent's
serializers do without their REST client.

A schema is fetched and parsed once per (cache, id): a Spark task encodes every batch with the
schema it fetched first, so a task's records do not change schema halfway through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deltabus import schemas
from deltabus.rpc.schema_codec import RegistryOverGrpc
from deltabus.schemas import ParsedSchema, SchemaReference, SchemaRegistryError, StoredSchema


class SchemaCache:
    """Parsed schemas of one registry, by id and by subject's latest version. Not
    thread-safe: one per task or thread."""

    def __init__(self, registry: RegistryOverGrpc) -> None:
        self._registry = registry
        self._by_id: dict[int, ParsedSchema] = {}
        self._latest: dict[str, int] = {}

    def latest(self, subject: str) -> tuple[int, ParsedSchema]:
        """The subject's latest live version's schema id and schema (fetched once)."""
        if subject not in self._latest:
            self._latest[subject] = self._registry.subject_version(subject, schemas.LATEST_VERSION,
                                                                   False).schema_id
        schema_id = self._latest[subject]
        return schema_id, self.schema(schema_id)

    def schema(self, schema_id: int) -> ParsedSchema:
        if schema_id not in self._by_id:
            stored = self._registry.schema_by_id(schema_id)
            self._by_id[schema_id] = schemas.parse(
                stored.schema_type, stored.text, self._texts(stored.references))
        return self._by_id[schema_id]

    def _texts(self, references: Sequence[SchemaReference]) -> dict[str, str]:
        def lookup(ref: SchemaReference) -> StoredSchema:
            held = self._registry.subject_version(ref.subject, ref.version, True)
            return self._registry.schema_by_id(held.schema_id)
        return schemas.referenced_texts(references, lookup)

    def encode_latest(self, subject: str, rows: Sequence[Any]) -> list[bytes]:
        """Rows encoded with the subject's latest schema, in Confluent's wire format; raises
        ValueError naming the first row that does not fit, SchemaRegistryError (40401) when
        the subject has no schema."""
        schema_id, schema = self.latest(subject)
        return schemas.encode(schema, schema_id, rows)


__all__ = ["SchemaCache", "SchemaRegistryError"]
