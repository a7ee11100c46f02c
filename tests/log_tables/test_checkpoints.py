"""Open time must not grow with the number of commits: the log writes Delta checkpoints."""

from __future__ import annotations

import os

from deltalake import DeltaTable

from deltabus.log_tables import LogConfig, PartitionLog, commit_ranges
from deltabus.log_tables.partition_log import create_log_table
from deltabus.records import normalize_produce, produce_batch
from tests.conftest import wait_until


def test_checkpoints_are_written_and_reopen_recovers_from_them(tmp_path):
    path = str(tmp_path / "log")
    config = LogConfig(checkpoint_interval=20, group_commit_linger_ms=0)
    log = PartitionLog(path, topic="t", partition=0, config=config)
    batch = normalize_produce(produce_batch([b"x"]))
    log_dir = os.path.join(path, "_delta_log")
    for i in range(45):  # the log reloads its table objects at checkpoints: it goes on the same
        log.append(batch, leader_epoch=0).result(10)
        if i == 24:  # a commit takes a millisecond: let the first checkpoint land (off the
            # commit path) before the next 20 commits call for the second
            wait_until(lambda: "_last_checkpoint" in os.listdir(log_dir), "the first checkpoint")
    assert log.read(0, 1 << 20).column("offset").to_pylist() == list(range(45))
    log.close()
    names = os.listdir(os.path.join(path, "_delta_log"))
    assert "_last_checkpoint" in names
    assert sum(n.endswith(".checkpoint.parquet") for n in names) >= 2
    reopened = PartitionLog(path, topic="t", partition=0, config=config)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (0, 45)
    assert reopened.read(40, 1 << 20).column("offset").to_pylist() == [40, 41, 42, 43, 44]
    reopened.close()


def test_every_commit_maps_a_delta_version_to_its_offset_range(tmp_path):
    path = str(tmp_path / "log")
    log = PartitionLog(path, topic="t", partition=0, config=LogConfig(group_commit_linger_ms=0))
    sizes = [3, 1, 5]
    for n in sizes:
        log.append(normalize_produce(produce_batch([b"v"] * n)), leader_epoch=0).result(10)
    log.close()
    ranges = commit_ranges(DeltaTable(path))
    assert [(r.base_offset, r.last_offset) for r in reversed(ranges)] == [(0, 2), (3, 3), (4, 8)]
    table = DeltaTable(path)
    for r in ranges:  # the version holds exactly the offsets up to its range's end
        table.load_as_version(r.version)
        assert table.to_pyarrow_table().num_rows == r.last_offset + 1


def test_a_table_made_with_another_interval_is_checkpointed_at_the_brokers(tmp_path):
    """A commit's time grows with the commits since the last checkpoint, so tables created
    before the interval changed (delta.checkpointInterval 100) follow the broker's too."""
    path = str(tmp_path / "log")
    create_log_table(path, topic="t", partition=0, checkpoint_interval=100)
    log = PartitionLog(path, topic="t", partition=0,
                       config=LogConfig(checkpoint_interval=10, group_commit_linger_ms=0))
    batch = normalize_produce(produce_batch([b"x"]))
    log_dir = os.path.join(path, "_delta_log")
    for i in range(45):
        log.append(batch, leader_epoch=0).result(10)
        if i == 14:  # a commit takes a millisecond: let the first checkpoint land (off the
            # commit path) before the next commits call for the second
            wait_until(lambda: "_last_checkpoint" in os.listdir(log_dir), "the first checkpoint")
    log.close()
    names = os.listdir(os.path.join(path, "_delta_log"))
    checkpoints = sorted(int(n.split(".")[0]) for n in names
                         if n.endswith(".checkpoint.parquet"))
    # The first at the broker's interval; the next once that one is written (not 100)
    assert checkpoints[0] == 10 and len(checkpoints) >= 2 and checkpoints[-1] < 100
