"""Which install a part of deltabus needs, and the one-line error when this one lacks it.

`pip install deltabus` is the client install: Producer, Consumer, AdminClient and what they
import (grpcio, protobuf, pyarrow, numpy). The rest comes with extras (setup.cfg's
`[options.extras_require]`):

    schemas   the schema types' libraries (fastavro, jsonschema, grpcio-tools' protoc):
              SchemaDeserializer, and the registry inside the cluster
    server    the cluster (PySpark, delta-rs, the Kafka door's codecs), schemas included

A part that needs an extra imports its libraries inside `needs(...)`, so a missing one is a
ModuleNotFoundError naming the part, the missing module and the command that installs it,
never a bare "No module named 'pyspark'" from deep inside the part.

Runs anywhere; pure (no I/O), thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

SCHEMAS = "schemas"
SERVER = "server"
EXTRAS = (SCHEMAS, SERVER)


def missing_extra_message(part: str, extra: str, missing: str) -> str:
    """The one line a user reads when `part` is asked for without `extra` installed."""
    assert extra in EXTRAS, extra
    return (f"{part} needs the {extra} install ({missing} is not installed): "
            f"pip install 'deltabus[{extra}]'")


@contextmanager
def needs(part: str, extra: str) -> Iterator[None]:
    """Run the imports of `part` (e.g. "deltabus.Cluster"); a third-party module missing
    among them becomes ModuleNotFoundError(missing_extra_message(...), name=<that module>).
    A deltabus module missing is no extra's doing (a broken install): it passes unchanged."""
    try:
        yield
    except ModuleNotFoundError as e:
        missing = e.name or "a module it imports"
        if missing.split(".")[0] == "deltabus":
            raise
        raise ModuleNotFoundError(missing_extra_message(part, extra, missing),
                                  name=e.name) from e
