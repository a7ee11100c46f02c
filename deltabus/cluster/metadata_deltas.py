"""What brokers are sent of the metadata: the records since the version they have (issue 17).

Runs in the driver, inside the controller. Heartbeats once carried the whole image, every
version, to every broker: past REQUEST_MAX_BYTES no broker could get metadata at all. Now, as a
KRaft broker fetches the metadata log, a broker at `MetadataPosition` (version, index) is sent
the records after it, which it replays into its own state (`metadata_loader`) with the
controller's own `MetadataState.replay`. The controller keeps the records of its latest changes
in memory (`METADATA_DELTA_RECORDS_RETAINED_MAX` of them at most, serialized once); a broker
further behind, or new, or whose position this controller never gave out (it registered with
another one), is sent a snapshot instead, the records that rebuild the state from nothing, as
KRaft falls back to a snapshot. A snapshot is taken when one is needed and none held is recent
enough to go on from with the retained records, and kept until then, so brokers loading one in
several answers all load the same one; a broker loading one that became too old to go on from
starts again with a new one.

An answer holds at most `records_max` records and, past its first record, at most `bytes_max`
bytes of them; the broker asks again from where it ends. It ends at a version's end where it
can; one version with more records than an answer holds (a topic of 10,000 partitions created,
a broker leading thousands fenced) is sent over several, and the broker publishes its image
only once it has them all.

Invariants: the retained versions are consecutive and end at the controller's version (every
change brokers see is appended before anyone reads past it); an answer starting at a position
ends at a later one, with at least one record, or is None when the broker is current.

Not thread-safe: the controller holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deltabus import config as cfg
from deltabus.cluster.metadata_records import MetadataRecord, serialize
from deltabus.cluster.metadata_state import MetadataState
from deltabus.metadata import MetadataBatch, MetadataPosition


@dataclass(frozen=True)
class _Snapshot:
    version: int
    records: tuple[bytes, ...]


class MetadataDeltas:
    """The controller's recent metadata changes, by version, and the snapshot brokers load."""

    def __init__(self, version: int, *,
                 records_retained_max: int = cfg.METADATA_DELTA_RECORDS_RETAINED_MAX,
                 records_max: int = cfg.METADATA_FETCH_RECORDS_MAX,
                 bytes_max: int = cfg.METADATA_FETCH_BYTES_MAX) -> None:
        """`version`: the controller's, whose records it does not have (it replayed them
        from the metadata log): a broker behind it loads a snapshot."""
        assert 0 < records_max <= records_retained_max and bytes_max > 0
        self._records_retained_max = records_retained_max
        self._records_max = records_max
        self._bytes_max = bytes_max
        self._base_version = version  # the retained versions are the ones after it
        self._versions: list[tuple[bytes, ...]] = []  # [i]: version base + 1 + i
        self._records_retained = 0
        self._snapshot: _Snapshot | None = None

    @property
    def version(self) -> int:
        """The last version appended (the controller's)."""
        return self._base_version + len(self._versions)

    @property
    def base_version(self) -> int:
        """The oldest version a broker can catch up from without a snapshot."""
        return self._base_version

    def append(self, version: int, records: Sequence[MetadataRecord]) -> None:
        """The records of a new version, the ones that change the image (a version holds at
        least one), serialized once for every broker; the oldest versions go past the limit."""
        assert version == self.version + 1, (version, self.version)
        serialized = tuple(serialize(r) for r in records if r.changes_image)
        assert serialized, "a new version changes what brokers see"
        self._versions.append(serialized)
        self._records_retained += len(serialized)
        dropped = 0
        while self._records_retained > self._records_retained_max and dropped < len(
                self._versions):
            self._records_retained -= len(self._versions[dropped])
            dropped += 1
        if dropped:
            del self._versions[:dropped]
            self._base_version += dropped

    def read(self, position: MetadataPosition, state: MetadataState) -> MetadataBatch | None:
        """What a broker at `position` is sent next (None: it is current); `state` is the
        controller's, at `version`, for a snapshot."""
        if position.snapshot:
            held = self._snapshot
            if held is not None and held.version == position.version >= self._base_version and (
                    0 < position.index < len(held.records)):  # else: one to go on from
                return self._snapshot_batch(held, position.index)
        elif position.version == self.version and position.index == 0:
            return None
        elif self._base_version <= position.version < self.version and (
                position.index < len(self._versions[position.version - self._base_version])):
            return self._delta_batch(position)
        return self._snapshot_batch(self._current_snapshot(state), 0)

    def _delta_batch(self, position: MetadataPosition) -> MetadataBatch:
        """The records after `position`, whole versions while they fit; a version that does
        not fit an answer alone is split."""
        records: list[bytes] = []
        size = 0
        end = position
        for i in range(position.version - self._base_version, len(self._versions)):
            rest = self._versions[i][end.index:]
            rest_size = sum(map(len, rest))
            if self._fits(len(records) + len(rest), size + rest_size):
                records.extend(rest)
                size += rest_size
                end = MetadataPosition(self._base_version + i + 1)
                continue
            if not records:  # a version too big for one answer: as much of it as fits
                taken = self._take(rest)
                records.extend(taken)
                end = (MetadataPosition(end.version, end.index + len(taken))
                       if len(taken) < len(rest) else MetadataPosition(end.version + 1))
            break
        return MetadataBatch(position, end, tuple(records))

    def _snapshot_batch(self, snapshot: _Snapshot, index: int) -> MetadataBatch:
        taken = self._take(snapshot.records[index:])
        end_index = index + len(taken)
        end = (MetadataPosition(snapshot.version) if end_index == len(snapshot.records)
               else MetadataPosition(snapshot.version, end_index, snapshot=True))
        return MetadataBatch(MetadataPosition(snapshot.version, index, snapshot=True), end,
                             taken)

    def _current_snapshot(self, state: MetadataState) -> _Snapshot:
        """The snapshot held if a broker can go on from it with the retained versions, else a
        new one of `state`."""
        held = self._snapshot
        if held is None or held.version < self._base_version:
            held = self._snapshot = _Snapshot(self.version,
                                              tuple(serialize(r) for r in state.snapshot()))
        return held

    def _take(self, records: Sequence[bytes]) -> tuple[bytes, ...]:
        """The longest prefix of `records` an answer holds, at least one record."""
        size = 0
        for n, record in enumerate(records[:self._records_max]):
            size += len(record)
            if n and size > self._bytes_max:
                return tuple(records[:n])
        return tuple(records[:self._records_max])

    def _fits(self, records: int, size: int) -> bool:
        return records <= self._records_max and size <= self._bytes_max
