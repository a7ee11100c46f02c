"""Bench step (t): a broker's commit round over many partitions, against the bare commit.

A broker leading N partitions that each take a small produce batch makes N group commits, one
Delta commit per partition, on its `log.append.threads` pool. Issue 38's target: such a round
costs at most 1.5 x N bare commits (step (a)'s bare commit, a pyarrow file and its commit
file alone, measured in the same run). With 16 threads the pool may beat N x bare on a machine
with the cores for it; on two cores it cannot do much better than N.

The round is measured on N partition logs of this process on local disk (the logs a broker
keeps, sharing the process's append pool as a broker's do): one batch of step (a)'s small
commit (3 records of 100 bytes) queued to each, from the first append until the last is
committed; the median of `rounds` rounds after one warm-up round.
`python -m bench.commit_round [PARTITIONS]` prints it beside a bare commit measured there.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from typing import Any

from bench.commit_paths import ROWS, VALUE_BYTES
from bench.report import TARGETS
from deltabus.config import LogConfig
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.records import normalize_produce, produce_batch


def commit_round(root: str, partitions: int, rounds: int, bare_commit_ms: float
                 ) -> dict[str, Any]:
    """The round's figures on `partitions` new logs under the local folder `root`, against
    `bare_commit_ms` (the bare commit's median of the same run)."""
    logs = [PartitionLog(f"{root}/p-{p}", topic="bench-round", partition=p,
                         config=LogConfig()) for p in range(partitions)]
    batch = normalize_produce(produce_batch([b"x" * VALUE_BYTES] * ROWS))
    try:
        times = [_round(logs, batch) for _ in range(rounds + 1)][1:]  # the first warms up
        for log in logs:
            if log.log_end_offset != (rounds + 1) * ROWS:
                raise AssertionError(f"{log.topic}-{log.partition} ends at "
                                     f"{log.log_end_offset}, not {(rounds + 1) * ROWS}")
    finally:
        for log in logs:
            log.close()
    round_ms = statistics.median(times) * 1000
    return {"partitions": partitions, "rounds": rounds, "round_ms": round_ms,
            "per_partition_ms": round_ms / partitions, "bare_commit_ms": bare_commit_ms,
            "vs_bare": round_ms / (partitions * bare_commit_ms)}


def _round(logs: list[PartitionLog], batch: Any) -> float:
    """Seconds from queueing a batch to every log until every commit is done."""
    start = time.perf_counter()
    futures = [log.append(batch, leader_epoch=0) for log in logs]
    for future in futures:
        future.result()
    return time.perf_counter() - start


if __name__ == "__main__":
    from bench.commit_paths import commit_paths

    with tempfile.TemporaryDirectory() as folder:
        bare = commit_paths(f"{folder}/paths", 100)["bare commit"]["p50_ms"]
        figures = commit_round(f"{folder}/round", int(sys.argv[1]) if len(sys.argv) > 1
                               else 1_000, 5, bare)
    print(file=sys.stderr)
    print(f"commit round over {figures['partitions']:,} partitions: "
          f"{figures['round_ms']:.1f} ms ({figures['per_partition_ms']:.3f} ms a partition); "
          f"bare commit {bare:.3f} ms; round / (N x bare) = {figures['vs_bare']:.2f} "
          f"(target <= {TARGETS['commit_round_vs_bare']})")
