"""The schema registry over gRPC: its requests and answers as the DeltaBus service carries them,
both ways.

- `RegistryOverGrpc` is the registry (`SchemaRegistryHandler`, structurally) as a caller sees
  it through any gRPC hop: deltabus's AdminClient and CLI, and a broker forwarding to the
  controller. A refusal comes back as `SchemaRegistryError` with Confluent's code.
- `serve` answers one request with a registry: the servicer of every server (broker or
  controller) calls it, so the two ends cannot disagree on a field.

A refusal is carried in the answer's error_code and error_message, never as a gRPC error, so a
broker forwards the controller's answer unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.schemas import (
    Compatibility,
    SchemaReference,
    SchemaRegistryError,
    SchemaType,
    StoredSchema,
    SubjectVersion,
)

# The DeltaBus methods the registry uses, and their request classes.
METHODS = {"RegisterSchema": pb.RegisterSchemaRequest, "GetSchema": pb.GetSchemaRequest,
           "ListSchemas": pb.ListSchemasRequest, "DeleteSchemas": pb.DeleteSchemasRequest,
           "TestSchemaCompatibility": pb.TestSchemaCompatibilityRequest,
           "SchemaCompatibility": pb.SchemaCompatibilityRequest}

Call = Callable[[str, Any], Any]  # (method, request) -> response


def _references(refs: Sequence[SchemaReference]) -> list[pb.SchemaReference]:
    return [pb.SchemaReference(name=r.name, subject=r.subject, version=r.version) for r in refs]


def _from_references(refs: Sequence[pb.SchemaReference]) -> tuple[SchemaReference, ...]:
    return tuple(SchemaReference(r.name, r.subject, r.version) for r in refs)


def _version(v: SubjectVersion) -> pb.RegisteredSchema:
    return pb.RegisteredSchema(subject=v.subject, version=v.version, id=v.schema_id,
                               deleted=v.deleted)


def _check(response: Any) -> Any:
    if response.error_code:
        raise SchemaRegistryError(response.error_code, response.error_message)
    return response


class RegistryOverGrpc:
    """The registry's operations through `call` (a gRPC call of a DeltaBus method)."""

    def __init__(self, call: Call) -> None:
        self._call = call

    def _schema(self, method: str, request: Any) -> pb.RegisteredSchema:
        return _check(self._call(method, request)).schema

    def register_schema(self, subject: str, schema_type: str, text: str,
                        references: Sequence[SchemaReference]) -> SubjectVersion:
        held = self._schema("RegisterSchema", pb.RegisterSchemaRequest(
            subject=subject, schema_type=schema_type, schema=text,
            references=_references(references)))
        return SubjectVersion(held.subject, held.version, held.id, held.deleted)

    def lookup_schema(self, subject: str, schema_type: str, text: str,
                      references: Sequence[SchemaReference], deleted: bool) -> SubjectVersion:
        held = self._schema("RegisterSchema", pb.RegisterSchemaRequest(
            subject=subject, schema_type=schema_type, schema=text,
            references=_references(references), lookup_only=True, deleted=deleted))
        return SubjectVersion(held.subject, held.version, held.id, held.deleted)

    def schema_by_id(self, schema_id: int, fmt: str = "") -> StoredSchema:
        held = self._schema("GetSchema", pb.GetSchemaRequest(id=schema_id, format=fmt))
        return StoredSchema(held.id, SchemaType(held.schema_type), held.schema,
                            _from_references(held.references))

    def schema_versions(self, schema_id: int, deleted: bool) -> list[SubjectVersion]:
        answer = _check(self._call("ListSchemas", pb.ListSchemasRequest(id=schema_id,
                                                                        deleted=deleted)))
        return [SubjectVersion(v.subject, v.version, v.id, v.deleted) for v in answer.versions]

    def subjects(self, deleted: bool, prefix: str) -> list[str]:
        answer = _check(self._call("ListSchemas", pb.ListSchemasRequest(
            deleted=deleted, subject_prefix=prefix)))
        return list(answer.subjects)

    def subject_versions(self, subject: str, deleted: bool) -> list[SubjectVersion]:
        answer = _check(self._call("ListSchemas", pb.ListSchemasRequest(subject=subject,
                                                                        deleted=deleted)))
        return [SubjectVersion(v.subject, v.version, v.id, v.deleted) for v in answer.versions]

    def subject_version(self, subject: str, version: int, deleted: bool) -> SubjectVersion:
        held = self._schema("GetSchema", pb.GetSchemaRequest(subject=subject, version=version,
                                                             deleted=deleted))
        return SubjectVersion(held.subject, held.version, held.id, held.deleted)

    def referenced_by(self, subject: str, version: int) -> list[int]:
        answer = _check(self._call("ListSchemas", pb.ListSchemasRequest(
            subject=subject, version=version, referenced_by=True)))
        return list(answer.ids)

    def test_compatibility(self, subject: str, version: int | None, schema_type: str,
                           text: str, references: Sequence[SchemaReference]) -> list[str]:
        answer = _check(self._call("TestSchemaCompatibility", pb.TestSchemaCompatibilityRequest(
            subject=subject, version=version or 0, schema_type=schema_type, schema=text,
            references=_references(references))))
        return list(answer.messages)

    def delete_schema_version(self, subject: str, version: int, permanent: bool) -> int:
        answer = _check(self._call("DeleteSchemas", pb.DeleteSchemasRequest(
            subject=subject, version=version, permanent=permanent)))
        return int(answer.versions[0])

    def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        answer = _check(self._call("DeleteSchemas", pb.DeleteSchemasRequest(
            subject=subject, permanent=permanent)))
        return list(answer.versions)

    def compatibility_level(self, subject: str, default_to_global: bool) -> Compatibility:
        answer = _check(self._call("SchemaCompatibility", pb.SchemaCompatibilityRequest(
            subject=subject, default_to_global=default_to_global)))
        return Compatibility(answer.level)

    def set_compatibility_level(self, subject: str, level: str | None) -> Compatibility:
        request = (pb.SchemaCompatibilityRequest(subject=subject, remove=True) if level is None
                   else pb.SchemaCompatibilityRequest(subject=subject, level=level))
        return Compatibility(_check(self._call("SchemaCompatibility", request)).level)


def serve(registry: Any, method: str, request: Any) -> Any:
    """The answer of `registry` (a SchemaRegistryHandler) to one request of `method`."""
    answer_cls = {"RegisterSchema": pb.SchemaResponse, "GetSchema": pb.SchemaResponse,
                  "ListSchemas": pb.ListSchemasResponse,
                  "DeleteSchemas": pb.DeleteSchemasResponse,
                  "TestSchemaCompatibility": pb.TestSchemaCompatibilityResponse,
                  "SchemaCompatibility": pb.SchemaCompatibilityResponse}[method]
    try:
        return _SERVE[method](registry, request)
    except SchemaRegistryError as e:
        return answer_cls(error_code=e.error_code, error_message=e.message)


def _full(registry: Any, held: SubjectVersion, fmt: str = "") -> pb.SchemaResponse:
    stored = registry.schema_by_id(held.schema_id, fmt)
    return pb.SchemaResponse(schema=pb.RegisteredSchema(
        subject=held.subject, version=held.version, id=held.schema_id,
        schema_type=stored.schema_type.value, schema=stored.text,
        references=_references(stored.references), deleted=held.deleted))


def _register(registry: Any, r: pb.RegisterSchemaRequest) -> pb.SchemaResponse:
    refs = _from_references(r.references)
    held = (registry.lookup_schema(r.subject, r.schema_type, r.schema, refs, r.deleted)
            if r.lookup_only else registry.register_schema(r.subject, r.schema_type, r.schema,
                                                           refs))
    return _full(registry, held)


def _get(registry: Any, r: pb.GetSchemaRequest) -> pb.SchemaResponse:
    if r.subject:
        return _full(registry, registry.subject_version(r.subject, r.version, r.deleted),
                     r.format)
    stored = registry.schema_by_id(r.id, r.format)
    return pb.SchemaResponse(schema=pb.RegisteredSchema(
        id=stored.schema_id, schema_type=stored.schema_type.value, schema=stored.text,
        references=_references(stored.references)))


def _list(registry: Any, r: pb.ListSchemasRequest) -> pb.ListSchemasResponse:
    if r.referenced_by:
        return pb.ListSchemasResponse(ids=registry.referenced_by(r.subject, r.version))
    if r.id:
        return pb.ListSchemasResponse(versions=[
            _version(v) for v in registry.schema_versions(r.id, r.deleted)])
    if r.subject:
        return pb.ListSchemasResponse(versions=[
            _version(v) for v in registry.subject_versions(r.subject, r.deleted)])
    return pb.ListSchemasResponse(subjects=registry.subjects(r.deleted, r.subject_prefix))


def _delete(registry: Any, r: pb.DeleteSchemasRequest) -> pb.DeleteSchemasResponse:
    if r.version:
        return pb.DeleteSchemasResponse(versions=[
            registry.delete_schema_version(r.subject, r.version, r.permanent)])
    return pb.DeleteSchemasResponse(versions=registry.delete_subject(r.subject, r.permanent))


def _test(registry: Any, r: pb.TestSchemaCompatibilityRequest
          ) -> pb.TestSchemaCompatibilityResponse:
    if r.version:
        registry.subject_version(r.subject, r.version, False)  # 40401 / 40402 first
    problems = registry.test_compatibility(r.subject, r.version or None, r.schema_type,
                                           r.schema, _from_references(r.references))
    return pb.TestSchemaCompatibilityResponse(is_compatible=not problems, messages=problems)


def _level(registry: Any, r: pb.SchemaCompatibilityRequest) -> pb.SchemaCompatibilityResponse:
    if r.remove:
        level = registry.set_compatibility_level(r.subject, None)
    elif r.HasField("level"):
        level = registry.set_compatibility_level(r.subject, r.level)
    else:
        level = registry.compatibility_level(r.subject, r.default_to_global)
    return pb.SchemaCompatibilityResponse(level=level.value)


_SERVE: dict[str, Callable[[Any, Any], Any]] = {
    "RegisterSchema": _register, "GetSchema": _get, "ListSchemas": _list,
    "DeleteSchemas": _delete, "TestSchemaCompatibility": _test, "SchemaCompatibility": _level}
