"""docs/performance.md as `make bench` writes it (bench.performance_page), from figures shaped as
a run's, without running the bench: each figure beside its target and verdict, the run's date,
cores and command, and nothing of earlier runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench import performance_page, run
from bench.report import TARGETS, judge


def figures() -> dict[str, Any]:
    """The figures of the steps every run has, (a) to (k), as bench.run.measure gives them."""
    latency = {"sent": 1500, "received": 1500, "p50": 20.0, "p95": 41.0, "p99": 55.0,
               "max": 80.0}
    return {
        "records": 1_000_000, "send_records": 300_000, "value_bytes": 100, "elapsed_s": 3600.0,
        "straight_write_rps": 2_000_000.0, "bulk_rps": 1_500_000.0, "bulk_vs_straight": 0.75,
        "send_rps": 320_000.0, "fetch_rps": 1_100_000.0, "latency_ms": dict(latency),
        "replicated_rps": 1_100_000.0, "replicated_vs_bulk": 0.73,
        "replicated_latency_ms": {**latency, "p50": 60.0, "p95": 120.0, "p99": 150.0},
        "offset_commits": {"committers": 100, "commits_per_s": 960.0, "asked_per_s": 1000.0,
                           "p50_ms": 40.0, "p99_ms": 300.0},
        "group_members": 10, "rebalance_s": 0.97,
        "drain": {"records": 10_000_000, "rounds": [{}, {}, {}, {}, {}],
                  "stream_rps": 2_100_000.0, "stream_vs_memory": 0.93, "memory_rps": 2_280_000.0,
                  "memory_vs_direct": 0.7, "stream_wall_rps": 1_800_000.0,
                  "stream_vs_memory_stream": 0.87, "memory_stream_rps": 2_460_000.0,
                  "stream_vs_parquet_floor": 0.98, "parquet_floor_rps": 2_140_000.0,
                  "parquet_floor_vs_memory_stream": 0.86, "sql_rps": 3_500_000.0,
                  "sql_vs_direct": 1.04, "direct_rps": 3_400_000.0},
        "small_files": {"commits": 10_000, "files_before": 10_000, "files_after": 2,
                        "merge_s": 7.7, "open_speedup": 13.5, "fetch_speedup": 150.0,
                        "before": {"open_ms": 1123.0, "fetch_rps": 18_000.0},
                        "after": {"open_ms": 83.0, "fetch_rps": 2_810_000.0}}}


def written(tmp_path: Path, f: dict[str, Any], argv: list[str]) -> str:
    """The page `make bench` writes for these figures: bench.run.finish's JSON, then the page
    from it (the Makefile's two commands)."""
    results, page = tmp_path / "results.json", tmp_path / "performance.md"
    run.finish(f, str(results), argv)
    assert performance_page.main([str(results), str(page)]) == 0
    return page.read_text(encoding="utf-8")


def test_each_figure_stands_beside_its_target_and_verdict(tmp_path: Path) -> None:
    page = written(tmp_path, figures(), ["--records", "1000000"])
    assert page.startswith(f"# Performance\n\n{performance_page.MARKER}\n")
    assert "| step | measured | target | result |" in page
    assert ("| (b) bulk produce, send_batch | 1,500,000 rec/s (75% of a) | "
            ">= 500,000 and >= 70% of a | PASS |") in page
    assert ("| (e) produce-to-consume latency | p50 20.0 / p95 41.0 / p99 55.0 ms "
            "(1500/1500 back) | p50 <= 12, p99 <= 40 ms | MISS |") in page
    assert "| (a) straight write_deltalake | 2,000,000 rec/s | the physical limit |  |" in page
    rows = [line for line in page.splitlines() if line.startswith("| (")]
    assert len(rows) == 14  # (a)-(k): the steps every run has; the others only where they ran
    assert "(l) " not in page and "(r) " not in page
    assert "[How the bench measures, and where the time goes](performance-notes.md)" in page


def test_the_page_says_when_on_what_machine_and_with_which_command(tmp_path: Path) -> None:
    page = written(tmp_path, figures(), ["--records", "1000000", "--drain-rounds", "5"])
    stamp = json.loads((tmp_path / "results.json").read_text())["run"]
    assert stamp["cores"] == os.cpu_count()
    assert (f"The latest `make bench` run: {stamp['date']}, on {os.cpu_count()} cores "
            f"({stamp['platform']}, Python {stamp['python']}), 3,600 s, with") in page
    assert "\n```text\npython -m bench --records 1000000 --drain-rounds 5\n```\n" in page
    assert "Bulk steps: 1,000,000 records of 100 bytes, per-record `send()` 300,000" in page


def test_the_verdicts_and_targets_are_the_runs_own(tmp_path: Path) -> None:
    """A page rendered again from an older run's JSON shows what that run was judged by."""
    f = figures()
    results = {**f, "targets": {**TARGETS, "send_rps": 400_000},
               "pass": {**judge(f), "send": False}, "run": run.run_stamp([])}
    page = performance_page.render(json.loads(json.dumps(results)))
    assert "| (c) per-record send() | 320,000 rec/s | >= 400,000 | MISS |" in page


def test_where_a_records_time_goes_when_the_run_traced_it() -> None:
    f = figures()
    f["latency_ms"]["breakdown"] = {"records": 1500, "stages": {
        "client send": {"p50": 9.0, "p99": 55.0}, "Delta commit": {"p50": 10.2, "p99": 50.8}}}
    f["replicated_latency_ms"]["breakdown"] = {"records": 1500, "stages": {
        "client send": {"p50": 20.5, "p99": 84.8}, "follower commit": {"p50": 15.5, "p99": 61.4}}}
    page = performance_page.render({**f, "targets": TARGETS, "pass": judge(f),
                                     "run": run.run_stamp([])})
    table = page[page.index("## Where a record's time goes"):]
    assert "| stage | acks=1 | acks=all, RF 3 |" in table
    assert "| client send | 9.0 / 55.0 | 20.5 / 84.8 |" in table
    assert "| follower commit |  | 15.5 / 61.4 |" in table


def test_a_tree_no_run_measured_gets_the_targets_alone(tmp_path: Path) -> None:
    page_path = tmp_path / "performance.md"
    assert performance_page.main(["--no-run", "missing.json", str(page_path)]) == 0
    page = page_path.read_text(encoding="utf-8")
    assert "No `make bench` run has written this page on this tree yet." in page
    assert "| `latency_p50_ms` | 12.0 |" in page and "| step |" not in page


def test_without_figures_it_says_to_run_the_bench(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    page_path = tmp_path / "performance.md"
    assert performance_page.main([str(tmp_path / "none.json"), str(page_path)]) == 1
    assert "Error: no figures at" in capsys.readouterr().err
    assert not page_path.exists()
