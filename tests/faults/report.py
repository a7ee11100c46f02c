"""A run's faults and what the clients saw during each, read from its history file, as Jepsen's
reports show them: one row per fault with how long it held, the sends acknowledged and failed
while it held, and the longest time any one partition went without an acknowledged send around
it (from its last acknowledgement before the fault to the first after its writes resumed): how
long the fault kept a partition from taking writes.

    python -m tests.faults.report build/soak/history-local.jsonl

prints the table (markdown); `make soak` prints it for each run."""

from __future__ import annotations

import collections
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.faults.history import FAIL, OK, read_history


@dataclass
class FaultRow:
    kind: str
    target: dict[str, Any]
    start_ms: float
    stop_ms: float | None = None
    acked: int = 0  # sends acknowledged while it held
    failed: int = 0  # sends failed while it held
    write_gap_ms: float = 0.0  # a partition's longest stretch with no send acknowledged, around it


def fault_rows(operations: list[dict[str, Any]]) -> list[FaultRow]:
    """Every fault of a history, with what the senders saw while it held."""
    rows: list[FaultRow] = []
    open_rows: dict[str, FaultRow] = {}
    for op in operations:
        if op["process"] != "nemesis":
            continue
        kind = op["f"].split("-", 1)[1]
        if op["f"].startswith("start-"):
            open_rows[kind] = FaultRow(kind, op["value"] or {}, op["time_ms"])
            rows.append(open_rows[kind])
        elif kind in open_rows:
            open_rows.pop(kind).stop_ms = op["time_ms"]
    acked = [op["time_ms"] for op in operations if op["f"] == "send" and op["type"] == OK]
    failed = [op["time_ms"] for op in operations if op["f"] == "send" and op["type"] == FAIL]
    by_partition: dict[int, list[float]] = collections.defaultdict(list)
    for op in operations:
        if op["f"] == "send" and op["type"] == OK:
            by_partition[op["value"][1]].append(op["time_ms"])
    end_ms = operations[-1]["time_ms"] if operations else 0.0
    for row in rows:
        stop = row.stop_ms if row.stop_ms is not None else end_ms
        row.acked = sum(1 for t in acked if row.start_ms <= t <= stop)
        row.failed = sum(1 for t in failed if row.start_ms <= t <= stop)
        row.write_gap_ms = max((_longest_gap(times, row.start_ms, stop)
                                for times in by_partition.values()), default=0.0)
    return rows


def failover_times(operations: list[dict[str, Any]], fault: str = "kill") -> list[float]:
    """Seconds from each `fault` (a leader's kill -9) to the first record its partition
    acknowledged after it: the new leader's first, the old one being dead (issue 44's
    failover time)."""
    times = []
    for i, op in enumerate(operations):
        if op["process"] != "nemesis" or op["f"] != f"start-{fault}":
            continue
        partition = op["value"]["partition"]
        first = next((later["time_ms"] for later in operations[i + 1:]
                      if later["f"] == "send" and later["type"] == OK
                      and later["value"][1] == partition), None)
        if first is not None:
            times.append((first - op["time_ms"]) / 1000)
    return times


def _longest_gap(times: list[float], start_ms: float, stop_ms: float) -> float:
    """The longest time between two acknowledgements (in order) that overlaps the fault."""
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b >= start_ms and a <= stop_ms]
    return max(gaps, default=0.0)


def table(rows: list[FaultRow]) -> str:
    """The rows as a markdown table, then a line of totals per kind."""
    lines = ["| at (s) | fault | target | held (s) | sends acked | sends failed | "
             "longest write gap, one partition (s) |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        held = "" if row.stop_ms is None else f"{(row.stop_ms - row.start_ms) / 1000:.1f}"
        lines.append(f"| {row.start_ms / 1000:.0f} | {row.kind} | {_target(row.target)} | "
                     f"{held} | {row.acked} | {row.failed} | {row.write_gap_ms / 1000:.1f} |")
    counts = collections.Counter(row.kind for row in rows)
    lines.append("")
    lines.append("faults: " + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())))
    return "\n".join(lines)


def _target(target: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in target.items())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.faults.report HISTORY.jsonl", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.is_file():
        print(f"no history file at {path}", file=sys.stderr)
        return 2
    print(table(fault_rows(read_history(path))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
