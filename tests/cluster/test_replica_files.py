"""A follower copies only files of its leader's own replica table, whatever an answer names."""

from __future__ import annotations

from deltabus.cluster.replica_fetcher import files_outside
from deltabus.log_tables.partition_log import LogFile

LEADER = "/data/topics/t/0/replica-1"


def _file(uri: str) -> LogFile:
    return LogFile(uri, 10, "{}", 0, 0)


def test_only_parquet_files_directly_in_the_leaders_replica_are_copied() -> None:
    good = [_file(f"{LEADER}/part-00000-a-c000.snappy.parquet"),
            _file(f"{LEADER}/part-00000-b-c000.merged.parquet")]
    assert files_outside(good, LEADER) == []
    bad = ["/etc/passwd", f"{LEADER}/../replica-2/part-0.parquet",
           "/data/topics/t/0/replica-2/part-0.parquet", f"{LEADER}/_delta_log/00000.json",
           f"{LEADER}/sub/part-0.parquet", "s3://elsewhere/topics/t/0/replica-1/part-0.parquet"]
    assert files_outside([_file(u) for u in bad] + good, LEADER) == bad
