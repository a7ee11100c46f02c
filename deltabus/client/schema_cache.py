"""Schemas a client fetches from the cluster's registry (over gRPC) to encode records with:
the Spark sink writing a typed DataFrame to a typed topic, and anyone encoding as Confluent's
serializers do without their REST client; and to decode them with (`SchemaDeserializer`, a
Consumer's deserializer for typed topics).

A schema is fetched and parsed once per (cache, id): a Spark task encodes every batch with the
schema it fetched first, so a task's records do not change schema halfway through it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any, Unpack

from deltabus import schemas
from deltabus.client.security import SecuritySettings
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


class SchemaDeserializer:
    """A Consumer's `key_deserializer` or `value_deserializer` for typed topics, what
    confluent-kafka's Avro, JSON and Protobuf deserializers are in one: a record in Confluent's
    wire format becomes the Python value its schema describes (a dict for an Avro record, a
    JSON object or a Protobuf message), decoded with the schema its header names, fetched from
    the cluster's registry over gRPC once. Raises ValueError for bytes not in the wire format or
    not matching their schema. Close it (or use `with`) when done.

    >>> with SchemaDeserializer("127.0.0.1:9192") as payment:
    ...     consumer = Consumer("127.0.0.1:9192", value_deserializer=payment)
    """

    def __init__(self, bootstrap_servers: str | Iterable[str],
                 **security: Unpack[SecuritySettings]) -> None:
        from deltabus.client.admin import AdminClient

        self._admin = AdminClient(bootstrap_servers, client_id="deltabus-deserializer",
                                  **security)
        self._cache = SchemaCache(self._admin.schema_registry)
        self._lock = threading.Lock()  # the cache is not thread-safe; a consumer may be shared

    def __call__(self, data: bytes) -> Any:
        schema_id, body = schemas.split_wire(data)
        with self._lock:
            schema = self._cache.schema(schema_id)
        return schemas.decode(schema, [bytes(body)]).to_pylist()[0]

    def close(self) -> None:
        self._admin.close()

    def __enter__(self) -> SchemaDeserializer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["SchemaCache", "SchemaDeserializer", "SchemaRegistryError"]
