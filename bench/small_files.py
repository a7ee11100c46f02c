"""Bench step (k): a partition table after 10,000 small commits (by default), before and after
small-file compaction: how long the broker's log takes to open it, and how fast it reads the whole
log back (the fetch path from Parquet, no cache), both measured on the same table in the same run.

The commits are made by a PartitionLog one append at a time (group commit cannot merge them), as a
trickle of small produce requests would leave them; the merge is the log cleaner's
(`merge_small_files`, then vacuum with no delay).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from deltalake import DeltaTable

from deltabus.config import TopicConfig
from deltabus.log_tables.merge import merge_small_files
from deltabus.log_tables.partition_log import LogConfig, PartitionLog
from deltabus.log_tables.retention import vacuum
from deltabus.records import normalize_produce, produce_batch

RECORDS_PER_COMMIT = 10
OPEN_REPEATS = 3
READ_BYTES = 8 * 1024 * 1024  # per read, as a fetch of one partition


def small_commits_then_merge(path: str, commits: int, value_bytes: int) -> dict[str, Any]:
    log = PartitionLog(path, topic="bench-small", partition=0,
                       config=LogConfig(group_commit_linger_ms=0))
    batch = normalize_produce(produce_batch([b"x" * value_bytes] * RECORDS_PER_COMMIT))
    started = time.monotonic()
    for i in range(commits):
        log.append(batch, leader_epoch=0).result()
        if (i + 1) % 1000 == 0:
            print(f" {i + 1}", end="", file=sys.stderr, flush=True)
    commit_s = time.monotonic() - started
    log.close()
    before = _measure(path)
    started = time.monotonic()
    merged = merge_small_files(DeltaTable(path), target_bytes=TopicConfig().segment_bytes,
                               min_age_ms=0, high_watermark=commits * RECORDS_PER_COMMIT + 1,
                               delete_delay_ms=0)
    vacuumed = vacuum(DeltaTable(path))
    merge_s = time.monotonic() - started
    after = _measure(path)
    return {"commits": commits, "records": commits * RECORDS_PER_COMMIT,
            "commit_s": commit_s, "merge_s": merge_s, "files_before": merged.files_before,
            "files_after": merged.files_after, "vacuumed_files": vacuumed,
            "before": before, "after": after,
            "open_speedup": before["open_ms"] / after["open_ms"],
            "fetch_speedup": after["fetch_rps"] / before["fetch_rps"]}


def _measure(path: str) -> dict[str, float]:
    """Median open time of the broker's log over the table, and its read rate of the whole
    log from Parquet."""
    opens = []
    for _ in range(OPEN_REPEATS):
        started = time.monotonic()
        log = PartitionLog(path, topic="bench-small", partition=0)
        opens.append(time.monotonic() - started)
        log.close()
    log = PartitionLog(path, topic="bench-small", partition=0)
    try:
        started = time.monotonic()
        offset = log.log_start_offset
        while offset < log.high_watermark:
            offset += log.read(offset, READ_BYTES).num_rows
        read_s = time.monotonic() - started
        records = offset - log.log_start_offset
    finally:
        log.close()
    return {"open_ms": statistics.median(opens) * 1000, "fetch_rps": records / read_s}
