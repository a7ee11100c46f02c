"""delta-rs loads a table that is being appended to every fraction of a millisecond: on a local
disk its listing of `_delta_log` can miss a commit file written during the listing and see a gap
("Expected contiguous commit files, but found gap"); deltabus's loads then load the version
before the gap, which the listing saw whole. A commit file really missing still fails a load."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake.exceptions import TableNotFoundError

from deltabus.log_tables import delta_reads
from deltabus.log_tables.delta_commit import DeltaCommitWriter
from deltabus.log_tables.partition_log import create_log_table
from deltabus.storage import Storage

# Enough commits that the directory takes several reads to list (loads straight through
# delta-rs failed 9 and 54 times over this many commits, in two runs on a loaded two-core
# machine).
COMMITS = 10_000


def test_loads_of_a_table_appended_to_as_fast_as_possible_never_see_a_gap(
        tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    create_log_table(path, topic="t", partition=0, checkpoint_interval=1 << 30)
    writer = DeltaCommitWriter(Storage(path), path, 0)
    done = threading.Event()
    failure: list[BaseException] = []

    def append() -> None:
        try:
            data = writer.write_file(pa.table({"offset": pa.array([0], pa.int64())}))
            while writer.version < COMMITS:
                writer.commit(adds=[data])
        except BaseException as e:  # the reader's loop ends and the test says why
            failure.append(e)
        finally:
            done.set()

    held = delta_reads.open_table(path)
    appender = threading.Thread(target=append)
    appender.start()
    loads = 0
    seen = held.version()
    try:
        while not done.is_set():
            fresh = delta_reads.open_table(path)
            delta_reads.update(held)
            assert fresh.version() >= seen and held.version() >= fresh.version()
            seen = held.version()
            loads += 2
    finally:
        done.set()
        appender.join()
    assert not failure, failure
    assert loads > 0
    delta_reads.update(held)
    assert held.version() == COMMITS
    assert len(delta_reads.history(held, 5)) == 5


def test_other_errors_are_not_retried(tmp_path: Path) -> None:
    calls = []

    def missing() -> None:
        calls.append(1)
        raise TableNotFoundError("no log files")

    with pytest.raises(TableNotFoundError):
        delta_reads.retry_gaps(missing)
    assert calls == [1]
    with pytest.raises(TableNotFoundError):
        delta_reads.open_table(str(tmp_path / "nothing-here"))



def _table_with_a_gap(path: str) -> tuple[str, Exception]:
    """A table at version 4 whose commit file 2 is moved aside; the load's error, and where
    the file went."""
    create_log_table(path, topic="t", partition=0, checkpoint_interval=1 << 30)
    writer = DeltaCommitWriter(Storage(path), path, 0)
    data = writer.write_file(pa.table({"offset": pa.array([0], pa.int64())}))
    while writer.version < 4:
        writer.commit(adds=[data])
    commit_2 = os.path.join(path, "_delta_log", f"{2:020d}.json")
    aside = commit_2 + ".aside"
    os.rename(commit_2, aside)
    with pytest.raises(Exception) as gap:
        delta_reads.DeltaTable(path)
    assert delta_reads.listing_gap(gap.value)
    return aside, gap.value


def test_a_gap_whose_commit_file_is_on_disk_loads_the_version_before_it(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    aside, gap = _table_with_a_gap(path)
    os.rename(aside, aside.removesuffix(".aside"))  # what a listing that raced a commit missed

    def listing_that_missed_a_file() -> None:
        raise gap

    def load_at(version: int) -> int:
        return delta_reads.open_table(path, version=version).version()

    assert delta_reads.retry_gaps(listing_that_missed_a_file, table_uri=path,
                                  at_version=load_at) == 1
    assert delta_reads.open_table(path).version() == 4


def test_a_commit_file_really_missing_fails_the_load(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "log")
    _table_with_a_gap(path)
    monkeypatch.setattr(delta_reads, "GAP_RETRY_S", 0.2)
    with pytest.raises(Exception, match="contiguous"):
        delta_reads.open_table(path)
    held = delta_reads.open_table(path, version=1)
    with pytest.raises(Exception, match="contiguous"):
        delta_reads.update(held)
    assert held.version() == 1
