"""The controller's metadata log: a Delta table of JSON records under the cluster root.

Runs on the driver; not thread-safe (the controller serialises writes under its lock).
Invariant: a record is applied to the in-memory state only after the commit holding it succeeded,
so a restarted controller replays exactly what it had acknowledged.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from deltabus import errors
from deltabus.log_tables.delta_reads import open_table
from deltabus.log_tables.delta_writes import commit_properties

SCHEMA = pa.schema([
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("type", pa.string(), nullable=False),
    pa.field("record", pa.string(), nullable=False),
])


class MetadataLog:
    """Append-only log of metadata records, replayed in offset order at start."""

    def __init__(self, path: str, storage_options: dict[str, str] | None = None) -> None:
        self.path = path
        try:
            self._table = open_table(path, storage_options=storage_options)
        except TableNotFoundError:
            self._table = DeltaTable.create(
                path, SCHEMA, mode="ignore", name="__cluster_metadata",
                description="deltabus controller metadata log", storage_options=storage_options)
        self.next_offset = 0

    def read_all(self) -> list[dict[str, Any]]:
        table = self._table.to_pyarrow_dataset().to_table().sort_by("offset")
        records = [json.loads(r) for r in table.column("record").to_pylist()]
        if records:
            self.next_offset = int(table.column("offset")[-1].as_py()) + 1
        return records

    def append(self, records: list[dict[str, Any]]) -> None:
        """Durably append records in one Delta commit; raises KafkaStorageError on failure."""
        if not records:
            return
        now = int(time.time() * 1_000_000)
        n = len(records)
        batch = pa.table({
            "offset": pa.array(range(self.next_offset, self.next_offset + n), pa.int64()),
            "timestamp": pa.array([now] * n, pa.int64()).cast(SCHEMA.field("timestamp").type),
            "type": pa.array([r["type"] for r in records], pa.string()),
            "record": pa.array([json.dumps(r, sort_keys=True) for r in records], pa.string()),
        }, schema=SCHEMA)
        try:
            write_deltalake(self._table, batch, mode="append",
                            commit_properties=commit_properties({"deltabus.operation": "metadata"}))
        except Exception as e:
            raise errors.KafkaStorageError(f"cannot write the metadata log: {e}") from e
        self.next_offset += n
