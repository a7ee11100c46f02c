"""Kafka request and response frames, with kio's schemas (every API's request and response at
every version, generated from Kafka's own JSON schemas) rather than hand-written codecs.

A frame is a 4-byte size and then a request header (v1, or v2 with tagged fields for flexible
versions) and body; a response is a header (v0, or v1 for flexible versions, but always v0 for
ApiVersions) and body. kio reads fast (native) and writes in Python.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import sys
from datetime import timedelta
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from deltabus import errors

__all__ = ["UnknownAPIKey", "UnknownEntity", "load_response_schema"]

HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id: fixed in every version


NO_TIME = timedelta(0)  # throttle_time: deltabus does not throttle


def millis(duration: timedelta | None, default: int = 0) -> int:
    """A kio duration field in milliseconds; `default` where it is null or zero."""
    return int(duration.total_seconds() * 1000) if duration else default


class BadRequest(Exception):
    """A frame that cannot be parsed: the connection is closed, as Kafka's broker does."""


def peek(frame: bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame (after its size)."""
    if len(frame) < HEADER.size:
        raise BadRequest(f"a request of {len(frame)} bytes has no header")
    key, version, correlation_id = HEADER.unpack_from(frame, 0)
    return key, version, correlation_id


def parse_request(frame: bytes) -> tuple[Any, Any]:
    """(header, body) of a request whose API and version kio knows. Trailing bytes are ignored
    (librdkafka's all-topics Metadata v12 request carries three, and Kafka's broker reads past
    them too); unknown tagged fields or a truncated body raise BadRequest."""
    key, version, _ = peek(frame)
    try:
        request_cls = load_request_schema(key, version)
        header, size = entity_reader(request_cls.__header_schema__)(frame, 0)
        body, _ = entity_reader(request_cls)(frame, size)
    except (UnknownAPIKey, UnknownEntity):
        raise
    except Exception as e:  # kio's DecodeError, its native reader's underflow, an unknown tag
        raise BadRequest(f"cannot read API {key} v{version}: {type(e).__name__}: {e}") from None
    return header, body


def encode_response(correlation_id: int, response: Any) -> bytes:
    """A size-prefixed response frame: its header version as the response class says."""
    header_cls = response.__header_schema__
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    entity_writer(header_cls)(out, header_cls(correlation_id=correlation_id))
    entity_writer(type(response))(out, response)
    data = out.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


def make(cls: type, **fields: Any) -> Any:
    """An instance of a kio class of any version from the fields it has: one code path builds
    a response for every version of an API (a version lacking a field just does not get it)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in names})


def nested(cls: type, name: str) -> Any:
    """A struct class of the same API version as `cls` (each version has its own)."""
    return getattr(sys.modules[cls.__module__], name)


def error_code(error: errors.DeltaBusError | None) -> ErrorCode:
    """kio's ErrorCode for one of ours (ours carry Kafka's codes)."""
    return ErrorCode.none if error is None else ErrorCode(error.code)
