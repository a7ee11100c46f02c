"""The controller's metadata log: a Delta table of JSON records under the cluster root.

Runs on the driver; not thread-safe (the controller serialises writes under its lock).
Invariant: a record is applied to the in-memory state only after the commit holding it succeeded,
so a restarted controller replays exactly what it had acknowledged; and the records of an append
whose outcome was unknown (its commit may have landed though the store's answer was lost, and
the store could not be read to tell) are applied when `reload` finds them landed, before any
other append, so the in-memory state never differs from the log past that one append.

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
        # The records (as stored) of the append whose outcome is unknown, until `reload`.
        self._unknown: list[dict[str, Any]] | None = None

    @property
    def outcome_unknown(self) -> bool:
        """Whether the last append failed without knowing if it landed: `reload` first."""
        return self._unknown is not None

    def read_all(self) -> list[dict[str, Any]]:
        update(self._table)  # the appends go around the table object
        table = self._table.to_pyarrow_dataset().to_table().sort_by("offset")
        records = [json.loads(r) for r in table.column("record").to_pylist()]
        if records:
            self.next_offset = int(table.column("offset")[-1].as_py()) + 1
        return records

    def reload(self) -> list[dict[str, Any]]:
        """After an append whose outcome was unknown: its records if its commit is in the log
        (as `read_all` gives them; the log's end moves past them), else none; the outcome is
        known from then on. Nothing to do (none) when no outcome is unknown. Raises
        KafkaStorageError while the store still cannot tell.

        Why: the writer's version stays before such a commit, so an append after it would
        find it at that version and fail (CommitConflict) every time; and the caller, which
        applied none of it, must apply what landed before deciding its next records, as KRaft's
        controller reloads its state from the log when it cannot know whether its append was
        committed. Only this writer's own commit can be there (another controller's would
        fence this one at its next append), and only the one append: none is made while the
        outcome is unknown."""
        if self._unknown is None:
            return []
        try:
            landed = self._writer.landed()
        except errors.KafkaStorageError as e:
            raise errors.KafkaStorageError(
                f"cannot reload the metadata log after an append whose outcome was unknown: "
                f"{e}") from e
        records, self._unknown = (self._unknown if landed else []), None
        self.next_offset += len(records)
        return records

    def append(self, records: list[dict[str, Any]]) -> None:
        """Durably append records in one Delta commit; raises KafkaStorageError on failure
        (`outcome_unknown` then says whether the commit may have landed all the same)."""
        if not records:
            return
        if self._unknown is not None:
            raise errors.KafkaStorageError(
                "cannot write the metadata log: the outcome of an earlier append is unknown "
                "(reload it first)")
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
                if not self._landed(batch):
                    raise
        except FencedWriter as e:
            raise errors.KafkaStorageError(
                f"cannot write the metadata log: another controller writes it ({e})") from e
        except (CommitConflict, errors.KafkaStorageError) as e:
            raise errors.KafkaStorageError(f"cannot write the metadata log: {e}") from e
        self.next_offset += n
        if self._writer.version % CHECKPOINT_COMMITS == 0:
            self._checkpoint()

    def _landed(self, batch: pa.Table) -> bool:
        """After the commit of `batch` failed in the store: whether it landed all the same.
        While the store cannot tell, the outcome is unknown until `reload`: raises."""
        try:
            return self._writer.landed()
        except errors.KafkaStorageError:
            self._unknown = [json.loads(r) for r in batch.column("record").to_pylist()]
            raise

    def _checkpoint(self) -> None:
        """A delta-rs checkpoint of the latest version: off the acknowledgement (the records
        are committed already), and a failure only leaves the next one to do it."""
        try:
            update(self._table)
            self._table.create_checkpoint()
        except Exception as e:
            log.warning("cannot checkpoint the metadata log %s: %s", self.path, e)
