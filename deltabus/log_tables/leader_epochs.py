"""The leader epochs of a partition log and where each starts: Kafka's LeaderEpochFileCache.

A follower that last fetched epoch E asks its new leader where E ends (OffsetsForLeaderEpoch) and
truncates there, so diverging records written by an old leader go. deltabus keeps no epoch file:
every record holds its leader epoch, and each data file's statistics give the epochs when a log
opens without reading the records (`recover_epochs`): the add actions' own, which the table's
log already holds, for a file of one epoch (nearly all: a group commit is written at one
epoch), and the footer's per-row-group statistics for the rest (a merge across a leader change,
a file of a table created before its add actions carried leader epochs). On an object store a
footer costs a round trip, and a busy log holds thousands of small files between merges: read
for every file, they took a relaunched broker minutes to open its logs.

Not locked itself: the log's lock guards every call.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from deltabus.log_tables.log_reader import leaf_columns

log = logging.getLogger(__name__)


class LeaderEpochCache:
    """(leader epoch, first offset) of every epoch in one log, in increasing order."""

    def __init__(self, name: str, starts: list[tuple[int, int]]) -> None:
        self._name = name  # the log, in messages
        self._starts = starts

    @property
    def latest(self) -> int:
        """The epoch of the last record, -1 for an empty log."""
        return self._starts[-1][0] if self._starts else -1

    def assign(self, records: pa.Table) -> None:
        """Take in the epochs of records just appended (offset and leader_epoch columns)."""
        for epoch, start in epoch_starts(records):
            if not self._starts or epoch > self._starts[-1][0]:
                self._starts.append((epoch, start))
            elif epoch < self._starts[-1][0]:
                log.error("%s: epoch %d at offset %d is older than epoch %d",
                          self._name, epoch, start, self._starts[-1][0])

    def truncate_from(self, offset: int) -> None:
        """The log lost every record at or after `offset`: drop the epochs that started there."""
        self._starts = [(e, start) for e, start in self._starts if start < offset]

    def reset(self, starts: list[tuple[int, int]]) -> None:
        """Replace what is known (a reload after a failure, or an emptied log)."""
        self._starts = starts

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch: (the largest epoch at most `epoch`, the first offset
        after it). (-1, -1) when the log has no records; (`epoch`, start of the first epoch)
        when `epoch` is older than all."""
        if not self._starts:
            return -1, -1
        i = bisect.bisect_right([e for e, _ in self._starts], epoch) - 1
        if i < 0:
            return epoch, self._starts[0][1]
        end = self._starts[i + 1][1] if i + 1 < len(self._starts) else log_end_offset
        return self._starts[i][0], end


def recover_epochs(files: pa.Table, footers: Callable[[list[str]], Iterable[pq.ParquetFile]]
                   ) -> list[tuple[int, int]]:
    """(leader epoch, first offset) of every epoch in a log's data `files` (`data_files` rows
    with the leader epochs' statistics), from statistics: the add actions' where a file holds
    one epoch; else its footer's, from `footers` (the files at those paths, opened), where
    only a row group of several epochs is read."""
    starts: dict[int, int] = {}
    unknown: list[str] = []
    for path, first, low, high in zip(
            files.column("path").to_pylist(), files.column("min.offset").to_pylist(),
            files.column("min.leader_epoch").to_pylist(),
            files.column("max.leader_epoch").to_pylist(), strict=True):
        if low is not None and low == high:
            _merge(starts, int(low), int(first))
        else:
            unknown.append(path)
    for reader in footers(unknown) if unknown else ():
        columns = leaf_columns(reader)
        for group in range(reader.metadata.num_row_groups):
            meta = reader.metadata.row_group(group)
            epoch_stats = meta.column(columns["leader_epoch"]).statistics
            offset_stats = meta.column(columns["offset"]).statistics
            if (epoch_stats is not None and epoch_stats.has_min_max
                    and offset_stats is not None and offset_stats.has_min_max
                    and epoch_stats.min == epoch_stats.max):
                _merge(starts, int(epoch_stats.min), int(offset_stats.min))
                continue
            part = reader.read_row_group(group, columns=["offset", "leader_epoch"])
            for epoch, start in epoch_starts(part):
                _merge(starts, epoch, start)
    return sorted(starts.items())


def epoch_starts(records: pa.Table) -> list[tuple[int, int]]:
    """(leader epoch, smallest offset) of each epoch among a table's records."""
    epochs = records.column("leader_epoch").to_numpy()
    offsets = records.column("offset").to_numpy()
    return [(int(e), int(offsets[epochs == e].min())) for e in np.unique(epochs)]


def _merge(starts: dict[int, int], epoch: int, start: int) -> None:
    starts[epoch] = min(start, starts.get(epoch, start))
