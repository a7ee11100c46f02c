"""Small-file compaction on real Delta tables: runs of adjacent small files become one file with
the same records in offset order, while the broker's log keeps appending; readers, a reopened log
and a follower copying files see the same log."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltabus.log_tables.merge import merge_runs, merge_small_files
from deltabus.log_tables.partition_log import PartitionLog, commit_ranges
from deltabus.log_tables.retention import vacuum
from deltabus.records import normalize_produce, produce_batch
from deltabus.storage import Storage

MIB = 1024 * 1024


def _append(log: PartitionLog, n: int, tag: str) -> None:
    batch = normalize_produce(produce_batch([f"{tag}-{i}".encode() for i in range(n)],
                                            keys=[b"k"] * n))
    log.append(batch, leader_epoch=0).result(30)


def _files(sizes: list[int], ages_ms: list[int], now_ms: int = 10_000_000) -> pa.Table:
    firsts = [10 * i for i in range(len(sizes))]
    return pa.table({"size_bytes": sizes, "min.offset": firsts,
                     "max.offset": [f + 9 for f in firsts],
                     "modification_time": [now_ms - a for a in ages_ms]})


def test_runs_are_adjacent_small_old_files_packed_up_to_the_target() -> None:
    files = _files([10, 10, 60, 10, 10, 10, 10], [1000] * 7)
    # 60 is not small (>= target/2); the newest file is never merged; 10+10+10 > 25 splits
    assert merge_runs(files, target_bytes=100, min_age_ms=0, now_ms=10_000_000,
                      high_watermark=70) == [[0, 1], [3, 4, 5]]
    assert merge_runs(files, target_bytes=25, min_age_ms=0, now_ms=10_000_000,
                      high_watermark=70) == [[0, 1], [3, 4]]
    young = _files([10] * 4, [1000, 1000, 10, 10])
    assert merge_runs(young, target_bytes=100, min_age_ms=500, now_ms=10_000_000,
                      high_watermark=40) == [[0, 1]]
    assert merge_runs(files, target_bytes=100, min_age_ms=0, now_ms=10_000_000,
                      high_watermark=15) == []  # the second file reaches the high watermark


@pytest.fixture(params=["local", "s3", "azurite"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Storage]:
    """Where the tables live: a local folder, or a new bucket on an object-store emulator,
    where the cleaner's commit and the appender's race through the store's conditional
    writes (S3's If-None-Match, Azure's)."""
    if request.param == "local":
        return str(tmp_path), Storage(str(tmp_path))
    store = request.getfixturevalue(request.param)
    bucket = store.create_bucket(f"merge-{uuid.uuid4().hex[:8]}")
    return bucket, Storage(bucket, store.options())


def test_merge_keeps_every_record_in_order_while_the_log_appends(
        root: tuple[str, Storage]) -> None:
    base, storage = root
    options = storage.delta_options
    path = f"{base}/replica-0"
    log = PartitionLog(path, topic="t", partition=0, storage=storage)
    for i in range(30):
        _append(log, 7, f"b{i}")
    before = log.read(0, 1 << 30)
    stop = threading.Event()

    def keep_appending() -> None:
        i = 0
        while not stop.is_set():
            _append(log, 3, f"late{i}")
            i += 1

    table = DeltaTable(path, storage_options=options)  # the cleaner's view: 30 files
    appender = threading.Thread(target=keep_appending)
    appender.start()
    try:
        merged = merge_small_files(table, target_bytes=MIB, min_age_ms=0, high_watermark=210,
                                   delete_delay_ms=60_000, storage=storage)
    finally:
        stop.set()
        appender.join()
    assert merged.merged_files == 29 and merged.records == 203  # all but the newest of the 30
    log.refresh()
    assert log.read(0, 1 << 30).slice(0, 210).equals(before)
    end = log.log_end_offset
    log.close()

    table = DeltaTable(path, storage_options=options)
    assert vacuum(table, storage) == 0  # the inputs stay for readers until file.delete.delay.ms
    # The merge appended nothing: the map of appends' versions to offsets leaves it out.
    appends = sorted((r.base_offset, r.last_offset) for r in commit_ranges(table))
    assert appends[:30] == [(7 * i, 7 * i + 6) for i in range(30)]
    reopened = PartitionLog(path, topic="t", partition=0, storage=storage)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (0, end)
    everything = reopened.read(0, 1 << 30)
    assert everything.column("offset").to_pylist() == list(range(end))
    assert everything.slice(0, 210).equals(before)
    # a follower copies the merged file whole, statistics and all
    files = reopened.files_from(0, 1 << 30)
    assert files[0].base_offset == 0 and files[0].last_offset == 202
    follower = PartitionLog(f"{base}/replica-1", topic="t", partition=0, replicated=True,
                            storage=storage)
    follower.append_files(files[:1]).result(30)
    assert follower.log_end_offset == 203
    assert follower.read(0, 1 << 30, to_log_end=True).equals(everything.slice(0, 203))
    follower.close()
    reopened.close()


def test_a_log_not_told_of_a_merge_reads_past_the_inputs_vacuum_deleted(
        root: tuple[str, Storage]) -> None:
    """A broker whose log missed the controller's word of a cleaner run (a diskless partition's
    leader elected while the run was under way) still lists the merge's inputs; once vacuum
    deleted them, a read there takes the table's newer commits in and reads the merged file,
    rather than failing every fetch of those offsets."""
    base, storage = root
    path = f"{base}/replica-0"
    writer = PartitionLog(path, topic="t", partition=0, storage=storage)
    for i in range(10):
        _append(writer, 5, f"b{i}")
    writer.close()
    log = PartitionLog(path, topic="t", partition=0, storage=storage)  # no tail cached
    assert log.read(20, 10).column("offset").to_pylist()[0] == 20  # its file list, as of now
    merged = merge_small_files(DeltaTable(path, storage_options=storage.delta_options),
                               target_bytes=MIB, min_age_ms=0, high_watermark=50,
                               delete_delay_ms=0, storage=storage)
    assert merged.merged_files == 9
    assert vacuum(DeltaTable(path, storage_options=storage.delta_options), storage) == 9
    records = log.read(0, 1 << 30)
    assert records.column("offset").to_pylist() == list(range(50))
    assert records.column("value").to_pylist()[:6] == [b"b0-0", b"b0-1", b"b0-2", b"b0-3",
                                                      b"b0-4", b"b1-0"]
    log.close()
