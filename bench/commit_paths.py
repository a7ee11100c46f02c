"""Bench step (a): what one Delta commit of a small batch costs, by each way of committing, on one
table each, in the same run (issue 38's table, the baseline every append figure is read against).

    write_deltalake(path)        delta-rs's plain path: opens the table, writes, commits
    write_deltalake(held table)  a DeltaTable kept open, post-commit hooks off (the old broker path)
    create_write_transaction     a pyarrow data file, then delta-rs commits its add action
    bare commit                  a pyarrow data file, then the commit file put if absent
                                 (DeltaCommitWriter: the append path, and the physical limit)

Each way makes `commits` commits of `rows` records of `value_bytes` to a fresh table and reports
the median wall time of a commit and the process CPU time per commit (delta-rs's threads
included). `python -m bench.commit_paths [ROOT]` prints the table alone.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction, CommitProperties, PostCommitHookProperties

from deltabus.log_tables.delta_commit import DeltaCommitWriter
from deltabus.records import normalize_produce, produce_batch, to_log_batch
from deltabus.storage import Storage

COMMITS = 200
ROWS = 3
VALUE_BYTES = 100
WAYS = ("write_deltalake(path)", "write_deltalake(held table)", "create_write_transaction",
        "bare commit")


def _batches(commits: int, rows: int, value_bytes: int) -> list[pa.Table]:
    """The log batches a leader would append: `commits` batches of `rows` records."""
    batch = normalize_produce(produce_batch([b"x" * value_bytes] * rows))
    now_ms = int(time.time() * 1000)
    return [to_log_batch(batch, base_offset=i * rows, now_ms=now_ms, leader_epoch=0)
            for i in range(commits)]


def _timed(commit: Callable[[pa.Table], Any], batches: list[pa.Table]) -> dict[str, float]:
    """Median wall ms of a commit and CPU ms per commit over `batches`."""
    walls = []
    cpu_start = time.process_time()
    for batch in batches:
        start = time.perf_counter()
        commit(batch)
        walls.append(time.perf_counter() - start)
    cpu = time.process_time() - cpu_start
    return {"p50_ms": statistics.median(walls) * 1000, "cpu_ms": cpu / len(batches) * 1000}


def _plain(path: str, first: pa.Table) -> Callable[[pa.Table], Any]:
    write_deltalake(path, first, mode="append")
    return lambda batch: write_deltalake(path, batch, mode="append")


def _held(path: str, first: pa.Table) -> Callable[[pa.Table], Any]:
    write_deltalake(path, first, mode="append")
    table = DeltaTable(path)
    hooks_off = CommitProperties(), PostCommitHookProperties(create_checkpoint=False,
                                                             cleanup_expired_logs=False)
    return lambda batch: write_deltalake(table, batch, mode="append",
                                         commit_properties=hooks_off[0],
                                         post_commithook_properties=hooks_off[1])


def _transaction(path: str, first: pa.Table) -> Callable[[pa.Table], Any]:
    write_deltalake(path, first, mode="append")
    table = DeltaTable(path)
    writer = DeltaCommitWriter(Storage(path), path, table.version())
    schema = table.schema()

    def commit(batch: pa.Table) -> None:
        data = writer.write_file(batch)
        table.create_write_transaction(
            [AddAction(data.path, data.size, {}, int(time.time() * 1000), True, data.stats)],
            mode="append", schema=schema)
    return commit


def _bare(path: str, first: pa.Table) -> Callable[[pa.Table], Any]:
    write_deltalake(path, first, mode="append")
    writer = DeltaCommitWriter(Storage(path), path, DeltaTable(path).version())
    return lambda batch: writer.commit(adds=[writer.write_file(batch)])


def commit_paths(root: str, commits: int = COMMITS, rows: int = ROWS,
                 value_bytes: int = VALUE_BYTES) -> dict[str, Any]:
    """Each way's figures, on tables under the local folder `root`; the bare commit's rows
    are also checked: delta-rs must read every record back."""
    batches = _batches(commits + 1, rows, value_bytes)
    ways = {"write_deltalake(path)": _plain, "write_deltalake(held table)": _held,
            "create_write_transaction": _transaction, "bare commit": _bare}
    figures: dict[str, Any] = {"commits": commits, "rows": rows, "value_bytes": value_bytes}
    for i, (way, start) in enumerate(ways.items()):
        path = os.path.join(root, f"way-{i}")
        figures[way] = _timed(start(path, batches[0]), batches[1:])
        print(f" {way}: {figures[way]['p50_ms']:.2f} ms", end="", file=sys.stderr, flush=True)
    read = DeltaTable(os.path.join(root, f"way-{len(ways) - 1}")).to_pyarrow_table()
    if read.num_rows != (commits + 1) * rows:
        raise AssertionError(f"the bare commits' table reads {read.num_rows} rows back, "
                             f"not {(commits + 1) * rows}")
    figures["bare_vs_held"] = (figures["write_deltalake(held table)"]["cpu_ms"]
                               / figures["bare commit"]["cpu_ms"])
    return figures


def table(figures: dict[str, Any]) -> str:
    """The figures as issue 38's table."""
    lines = [f"{figures['commits']} commits of {figures['rows']} records of "
             f"{figures['value_bytes']} bytes to one local table",
             f"{'way of committing':<30} {'p50 per commit':>15} {'CPU per commit':>15}"]
    for way in WAYS:
        lines.append(f"{way:<30} {figures[way]['p50_ms']:>12.2f} ms "
                     f"{figures[way]['cpu_ms']:>12.2f} ms")
    return "\n".join(lines)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(dir=sys.argv[1] if len(sys.argv) > 1 else None) as folder:
        figures = commit_paths(folder)
        print(file=sys.stderr)
        print(table(figures))
