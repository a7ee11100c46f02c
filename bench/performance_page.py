"""docs/performance.md, written from a run's figures: `python -m bench.performance_page`.

`make bench` runs the bench (bench.run, which writes bench/results.json) and then this, so the
documentation's performance page is always one run's table, regenerated rather than appended
to: each figure beside its target and verdict, with the date, the machine's cores and platform
and the exact command, as bench.report judged them. Earlier runs' pages are in git's history,
not in the page. The page carries MARKER, so a test can tell a written page from one edited by
hand; what the steps measure and why is docs/performance-notes.md, written by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.report import TARGETS, rows, verdict

MARKER = "<!-- Written by `make bench` (python -m bench.performance_page): do not edit by hand. -->"
NOTES = "[How the bench measures, and where the time goes](performance-notes.md)"
RESULTS_DEFAULT = "bench/results.json"
PAGE_DEFAULT = "docs/performance.md"


def render(results: Mapping[str, Any] | None) -> str:
    """The page for one run's results (bench/results.json, as bench.run.finish writes it), or,
    with None, the page of a tree no run has measured yet: the targets alone."""
    lines = ["# Performance", "", MARKER, ""]
    if results is None:
        lines += ["No `make bench` run has written this page on this tree yet. Run `make bench`",
                  "on a quiet machine, then commit the page it writes. The targets the run will",
                  "be judged by (`bench/report.py`):", "", "| target | value |", "| --- | --- |"]
        lines += [f"| `{name}` | {value:,} |" for name, value in TARGETS.items()]
    else:
        lines += _run_lines(results)
    lines += ["", f"What each step measures, and why the figures are what they are: {NOTES}.",
              "Earlier runs' figures are in git's history, not on this page."]
    return "\n".join(lines) + "\n"


def _run_lines(r: Mapping[str, Any]) -> list[str]:
    run = r["run"]
    lines = [f"The latest `make bench` run: {run['date']}, on {run['cores']} cores "
             f"({run['platform']}, Python {run['python']}), {r['elapsed_s']:,.0f} s, with",
             "", "```text", run["command"], "```", "",
             f"Bulk steps: {r['records']:,} records of {r['value_bytes']} bytes, per-record "
             f"`send()` {r['send_records']:,}, one partition unless a step says otherwise.", "",
             "| step | measured | target | result |", "| --- | --- | --- | --- |"]
    for step, measured, target, passed in rows(dict(r), r["pass"], r["targets"]):
        lines.append(f"| {_cell(step)} | {_cell(measured)} | {_cell(target)} | "
                     f"{verdict(passed)} |")
    return lines + _breakdown_lines(r)


def _breakdown_lines(r: Mapping[str, Any]) -> list[str]:
    """Steps (e) and (g) stage by stage (bench.latency_trace), where the run traced them."""
    steps = [(name, r[key]["breakdown"]) for name, key in (
        ("acks=1", "latency_ms"), ("acks=all, RF 3", "replicated_latency_ms"))
        if "breakdown" in r[key]]
    if not steps:
        return []
    lines = ["", "## Where a record's time goes", "",
             "Steps (e) and (g), stage by stage (`bench.latency_trace`), p50 / p99 ms:", "",
             "| stage | " + " | ".join(name for name, _ in steps) + " |",
             "| --- |" + " --- |" * len(steps)]
    stages = list(dict.fromkeys(s for _, b in steps for s in b["stages"]))
    for stage in stages:
        cells = [f"{b['stages'][stage]['p50']:.1f} / {b['stages'][stage]['p99']:.1f}"
                 if stage in b["stages"] else "" for _, b in steps]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def write(results_path: str | None, page_path: str) -> None:
    """Render the results at `results_path` (None: the page of no run) into `page_path`."""
    results = None if results_path is None else json.loads(Path(results_path).read_text())
    Path(page_path).write_text(render(results), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.performance_page",
                                description="write docs/performance.md from a bench run's JSON")
    p.add_argument("results", nargs="?", default=RESULTS_DEFAULT,
                   help=f"the run's figures (default {RESULTS_DEFAULT})")
    p.add_argument("page", nargs="?", default=PAGE_DEFAULT,
                   help=f"the page to write (default {PAGE_DEFAULT})")
    p.add_argument("--no-run", action="store_true",
                   help="write the page of a tree no run has measured: the targets alone")
    args = p.parse_args(argv)
    if not args.no_run and not Path(args.results).is_file():
        print(f"Error: no figures at {args.results}: run `make bench` first", file=sys.stderr)
        return 1
    write(None if args.no_run else args.results, args.page)
    print(f"{args.page} written" + ("" if args.no_run else f" from {args.results}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
