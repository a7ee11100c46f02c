"""The controller's metadata log: a Delta table of JSON records under the cluster root.

Runs on the driver; not thread-safe (the controller serialises writes under its lock).
Invariant: a record is applied to the in-memory state only after the commit holding it succeeded,
so a restarted controller replays exactly what it had acknowledged.

Appends are the Delta commit writer's (delta_commit.py: a millisecond, not delta-rs's 7-15), each
stamped with the app transaction METADATA_TXN_APP_ID = the log's end: a second controller writing
the same log (a driver started twice on one root) fences the other at its next commit instead
of interleaving offsets. delta-rs checkpoints the table every CHECKPOINT_COMMITS appends, so a
restarted controller opens it in time that does not grow with the cluster's age.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from deltabus import errors
from deltabus.log_tables.delta_commit import CommitConflict, DeltaCommitWriter, FencedWriter
from deltabus.log_tables.delta_reads import open_table, update
from deltabus.storage import Storage

METADATA_TXN_APP_ID = "deltabus.metadata"  # app transaction of every append: the log's end
CHECKPOINT_COMMITS = 100  # delta-rs's default checkpoint interval

log = logging.getLogger(__name__)

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
        self._writer = DeltaCommitWriter(Storage(path, storage_options), path,
                                         self._table.version(), fence_app_id=METADATA_TXN_APP_ID)

    def read_all(self) -> list[dict[str, Any]]:
        update(self._table)  # the appends go around the table object
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
            try:
                self._writer.commit(adds=[self._writer.write_file(batch)],
                                    txns={METADATA_TXN_APP_ID: self.next_offset + n},
                                    info={"deltabus.operation": "metadata"})
            except errors.KafkaStorageError:
                if not self._writer.landed():  # raises while the storage still fails
                    raise
        except FencedWriter as e:
            raise errors.KafkaStorageError(
                f"cannot write the metadata log: another controller writes it ({e})") from e
        except (CommitConflict, errors.KafkaStorageError) as e:
            raise errors.KafkaStorageError(f"cannot write the metadata log: {e}") from e
        self.next_offset += n
        if self._writer.version % CHECKPOINT_COMMITS == 0:
            self._checkpoint()

    def _checkpoint(self) -> None:
        """A delta-rs checkpoint of the latest version: off the acknowledgement (the records
        are committed already), and a failure only leaves the next one to do it."""
        try:
            update(self._table)
            self._table.create_checkpoint()
        except Exception as e:
            log.warning("cannot checkpoint the metadata log %s: %s", self.path, e)
