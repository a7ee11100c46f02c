"""delta-rs loads a table that is being appended to every fraction of a millisecond: on a local
disk its listing of `_delta_log` can miss a commit file written during the listing and see a gap
("Expected contiguous commit files, but found gap"); deltabus's loads list again."""

from __future__ import annotations

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

