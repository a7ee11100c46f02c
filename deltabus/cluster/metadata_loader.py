"""A broker's metadata: the records the controller sends it, replayed (Kafka's MetadataLoader).

Runs on executors, in the broker's heartbeat thread; only that thread replays, and only
`schema_of` is called from others (produce requests checking records against their schemas).
The controller sends the records after the broker's position (`metadata_deltas`), or a
snapshot's; the loader replays them with the controller's own `MetadataState.replay` and builds
the image with its `MetadataState.image`, so the broker's image at a version is the
controller's at that version: there is no second apply path to drift.

A snapshot is replayed into a state of its own, and replaces the broker's only once whole; a
version sent over several answers is published only once all its records are replayed. Until
then the broker keeps serving the image it has.

Invariants: a batch is replayed only from the position the loader is at (or from a snapshot's
first record); `image` is the last image published, at a version's end. A record that does
not replay (a bug: the controller replayed it) raises, and the broker starts over with a new
loader, whose first answer is a snapshot.
"""

from __future__ import annotations

import threading

from deltabus.cluster.metadata_records import deserialize
from deltabus.cluster.metadata_state import MetadataState
from deltabus.metadata import MetadataBatch, MetadataImage, MetadataPosition
from deltabus.schemas import ParsedSchema


class MetadataLoader:
    """One broker's metadata state and where it is in the controller's records."""

    def __init__(self, log_root: str) -> None:
        self._log_root = log_root
        # Held while records are replayed, and by produce requests reading the schema
        # registry's state (`schema_of`): the only part of the state read outside an image.
        self._lock = threading.Lock()
        self._state = MetadataState()
        self._loading: MetadataState | None = None  # a snapshot not yet whole
        self.position = MetadataPosition(0)  # nowhere yet: the first answer is a snapshot
        self.image: MetadataImage | None = None  # the last one published

    def replay(self, batch: MetadataBatch) -> MetadataImage | None:
        """Replay `batch`; the new image when it ends a version (None: not yet). A batch that
        does not start where this loader is was not asked for: it raises ValueError."""
        if batch.start.snapshot and batch.start.index == 0:
            self._loading = MetadataState()  # a snapshot from its start: begin afresh
        elif batch.start != self.position:
            raise ValueError(f"metadata records from {batch.start}, but the broker is at "
                             f"{self.position}")
        state = self._loading if batch.start.snapshot else self._state
        assert state is not None
        with self._lock:
            for record in batch.records:
                state.replay(deserialize(record))
            self.position = batch.end
            if batch.start.snapshot and not batch.end.snapshot:  # the snapshot is whole
                self._state, self._loading = state, None
        if not batch.end.at_version_end:
            return None
        self.image = self._state.image(batch.end.version, self._log_root)
        return self.image

    def schema_of(self, subject: str, schema_id: int) -> ParsedSchema | None:
        """The schema with `schema_id`, parsed, if it is registered under `subject` (a
        soft-deleted version too: producers may still write with it); None if not."""
        with self._lock:
            registry = self._state.schema_registry
            if not any(v.schema_id == schema_id
                       for v in registry.subjects.get(subject, {}).values()):
                return None
            return registry.parsed(schema_id)

    @property
    def applied_version(self) -> int:
        """The version of the last image published (0: none yet)."""
        return self.image.version if self.image is not None else 0
