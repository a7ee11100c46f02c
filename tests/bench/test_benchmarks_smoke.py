"""Smoke tests of `make bench`: every step runs, with tiny sizes, and gives figures of the
expected shape, so a change cannot break the bench unnoticed.

One run of every step, (a) to (r), against the session's shared cluster and Spark (what
`make bench` does against its embedded cluster), in a few seconds; each benchmark's figures are
then checked by a test of their own. Figures of so small a run mean nothing: the tests check
that each is there and positive, and the counts that must hold whatever the machine.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

import pytest

from bench import commit_paths, latency_trace, run
from bench.diskless import COMMIT_INTERVALS_MS
from bench.report import TARGETS, judge, report
from bench.sizes import VALUE_BYTES, Sizes

# The first test waits for every step's figures (the module's fixture): past the suite's 300 s
# default on a loaded machine, now that steps (r), (u) and (w) start clusters of their own.
pytestmark = pytest.mark.timeout(900)

TINY = Sizes(records=2_000, small_commit_rounds=5, send_records=200, latency_run_s=0.3,
             committers=3, commit_run_s=0.5, group_members=3, drain_records=2_000, drain_rounds=1,
             small_commits=5, secure_records=500, secure_rounds=1, metrics_records=500,
             metrics_rounds=1, idle_connections=50,
             quota_bytes_per_s=50_000_000, quota_run_s=1.0, partitions=20, partitions_step=10,
             keyed_partitions=5, keyed_records=200, keyed_rounds=1, hostile_run_s=0.5,
             hostile_rounds=1, round_partitions=3, round_rounds=1, s3_records=2_000,
             s3_send_records=200, s3_latency_run_s=0.3, scale_partitions=4, scale_bytes=400_000,
             scale_from=1, scale_to=2, scale_run_s=0.5, diskless_records=2_000,
             diskless_latency_run_s=0.3, diskless_move_partitions=2, diskless_failovers=1)


@pytest.fixture(scope="module")
def figures(cluster: Any, spark: Any, latency_trace_dir: str,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = str(tmp_path_factory.mktemp("bench"))
    out = run.measure(cluster.bootstrap_servers, spark, cluster.kafka_bootstrap_servers, root,
                      TINY, cluster=cluster, trace_dir=latency_trace_dir)
    run.measure_object_storage(out, spark, root, TINY)  # beside the cluster: the slots allow
    run.measure_diskless(out, spark, root, TINY)  # after (r): its cluster's slots are free
    run.measure_scaling(out, spark, root, TINY)  # after (r): its cluster's slots are free
    run.measure_small_files(out, root, TINY)
    run.measure_commit_round(out, root, TINY)
    out["elapsed_s"] = sum(out["step_s"].values())
    return out


def positive(section: dict[str, Any], *keys: str) -> None:
    for key in keys:
        value = section[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (key, value)


def test_every_step_ran_and_took_time(figures: dict[str, Any]) -> None:
    assert sorted(figures["step_s"]) == list("abcdefghijklmnopqrstuvw")
    positive(figures["step_s"], *figures["step_s"])
    assert (figures["records"], figures["send_records"], figures["value_bytes"]) == (
        TINY.records, TINY.send_records, VALUE_BYTES)


def test_produce_and_fetch(figures: dict[str, Any]) -> None:
    positive(figures, "straight_write_rps", "bare_write_rps", "bulk_rps", "bulk_vs_straight",
             "bulk_vs_bare", "send_rps",
             "fetch_rps", "replicated_rps", "replicated_vs_bulk")
    # (d) reads back (b)'s and (c)'s records and each one's warm-up record
    assert figures["fetched_records"] == TINY.records + TINY.send_records + 2


def test_a_small_commit_each_way(figures: dict[str, Any]) -> None:
    paths = figures["commit_paths"]
    assert (paths["commits"], paths["rows"]) == (TINY.small_commit_rounds, 3)
    for way in commit_paths.WAYS:
        positive(paths[way], "p50_ms", "cpu_ms")
    assert "(a) small commit, bare commit" in report(figures, judge(figures))


def test_a_commit_round_over_partitions(figures: dict[str, Any]) -> None:
    rounds = figures["commit_round"]
    assert (rounds["partitions"], rounds["rounds"]) == (TINY.round_partitions, TINY.round_rounds)
    positive(rounds, "round_ms", "per_partition_ms", "bare_commit_ms", "vs_bare")
    assert rounds["bare_commit_ms"] == figures["commit_paths"]["bare commit"]["p50_ms"]
    assert rounds["vs_bare"] == pytest.approx(
        rounds["round_ms"] / (rounds["partitions"] * rounds["bare_commit_ms"]))
    assert "(t) commit round, 3 partitions" in report(figures, judge(figures))


@pytest.mark.parametrize("step", ["latency_ms", "replicated_latency_ms"])
def test_latency(figures: dict[str, Any], step: str) -> None:
    latency = figures[step]
    positive(latency, "sent", "received", "p50", "p95", "p99", "max")
    assert latency["received"] <= latency["sent"]
    assert latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]


@pytest.mark.parametrize("step", ["latency_ms", "replicated_latency_ms"])
def test_latency_breakdown_follows_every_record_stage_by_stage(figures: dict[str, Any],
                                                               step: str) -> None:
    breakdown = figures[step]["breakdown"]
    assert breakdown["records"] == figures[step]["received"]  # every trip stamped whole
    replicated = {"to the follower", "follower commit", "high watermark"}
    expected = [s for s in latency_trace.STAGES
                if step == "replicated_latency_ms" or s not in replicated]
    assert list(breakdown["stages"]) == expected
    for stage, pct in breakdown["stages"].items():  # each a gap between moments in order
        assert 0 <= pct["p50"] <= pct["p99"], stage


def test_offset_commits(figures: dict[str, Any]) -> None:
    commits = figures["offset_commits"]
    positive(commits, "commits_per_s", "p50_ms", "p99_ms")
    assert commits["committers"] == TINY.committers
    assert commits["asked_per_s"] == pytest.approx(TINY.committers * 10)  # each every 100 ms


def test_rebalance(figures: dict[str, Any]) -> None:
    positive(figures, "rebalance_s")
    assert figures["group_members"] == TINY.group_members


def test_typed_produce(figures: dict[str, Any]) -> None:
    typed = figures["typed_produce"]
    positive(typed, "typed_rps", "untyped_rps", "typed_vs_untyped")
    assert typed["records"] == TINY.records
    assert len(typed["rounds"]["typed"]) == len(typed["rounds"]["untyped"]) == 3
    behind = typed["behind_head"]  # the design not taken: decoding in the cleaner's job
    positive(behind, "files", "rewrite_rps", "decode_rewrite_rps")
    assert len(behind["rounds"]["decode_rewrite_s"]) == 3


def test_stream_drain(figures: dict[str, Any]) -> None:
    drain = figures["drain"]
    positive(drain, "direct_rps", "memory_rps", "stream_rps", "stream_wall_rps",
             "stream_vs_direct", "memory_vs_direct", "micro_batches", "sql_rps",
             "sql_vs_direct", "stream_vs_memory", "memory_stream_rps", "stream_vs_memory_stream",
             "parquet_floor_rps", "stream_vs_parquet_floor")
    assert drain["records"] == TINY.drain_records
    assert len(drain["rounds"]) == TINY.drain_rounds


def test_small_files(figures: dict[str, Any]) -> None:
    small = figures["small_files"]
    positive(small, "commit_s", "merge_s", "files_after", "open_speedup", "fetch_speedup")
    assert (small["commits"], small["records"]) == (TINY.small_commits, TINY.small_commits * 10)
    assert small["files_before"] >= TINY.small_commits > small["files_after"]
    for measured in (small["before"], small["after"]):
        positive(measured, "open_ms", "fetch_rps")


def test_kafka_clients(figures: dict[str, Any]) -> None:
    kafka = figures["kafka"]
    positive(kafka, "kafka_produce_rps", "grpc_produce_rps", "kafka_consume_rps",
             "grpc_consume_rps")
    assert kafka["records"] == TINY.send_records
    latency = kafka["kafka_latency_ms"]
    assert latency["received"] == latency["sent"] > 0  # every record came back through the door
    assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
    for delivery in (kafka["kafka_delivery_ms"], kafka["kafka_txn_delivery_ms"]):
        assert 0 < delivery["min_ms"] <= delivery["mean_ms"] <= delivery["max_ms"]
    assert kafka["kafka_txn_delivery_ms"]["commit_mean_ms"] > 0  # each record was committed


def test_sasl_ssl_beside_plaintext(figures: dict[str, Any]) -> None:
    secure = figures["sasl_ssl"]
    for protocol in ("plaintext", "sasl_ssl"):
        positive(secure[protocol], "produce_rps", "fetch_rps")
    positive(secure, "produce_ratio", "fetch_ratio")
    assert secure["produce_ratio"] == pytest.approx(
        secure["sasl_ssl"]["produce_rps"] / secure["plaintext"]["produce_rps"])
    assert (secure["records"], secure["rounds"], secure["mechanism"], secure["brokers"]) == (
        TINY.secure_records, TINY.secure_rounds, "SCRAM-SHA-256", 2)


def test_metrics_overhead(figures: dict[str, Any]) -> None:
    v = figures["metrics_overhead"]
    for side in ("metrics_on", "metrics_off"):
        positive(v[side], "produce_rps", "fetch_rps", "send_rps")
    assert v["send_ratio"] == pytest.approx(
        v["metrics_on"]["send_rps"] / v["metrics_off"]["send_rps"])
    assert (v["records"], v["send_records"], v["rounds"]) == (
        TINY.metrics_records, TINY.send_records, TINY.metrics_rounds)


def test_idle_connections(figures: dict[str, Any]) -> None:
    idle = figures["idle_connections"]
    assert idle["connections"] == TINY.idle_connections
    positive(idle, "rss_before_bytes", "rss_after_bytes", "threads_before", "threads_after")
    assert idle["bytes_per_connection"] >= 0
    assert idle["threads_added"] == idle["threads_after"] - idle["threads_before"]
    assert idle["threads_added"] < TINY.idle_connections  # no thread per connection


def test_quotas(figures: dict[str, Any]) -> None:
    """Tiny: too short to reach the quota (the first burst is ten windows' worth, 500 MB),
    but both producers wrote, and the figures are the step's. A loaded machine may take the
    whole second to start a producer, so the rates within it may be 0; the records acked in
    all may not."""
    quotas = figures["quotas"]
    assert quotas["quota_bytes_per_s"] == TINY.quota_bytes_per_s
    positive(quotas, "held_records", "unquotad_records")
    assert quotas["held_with_first_burst_bytes_per_s"] >= 0
    assert quotas["unquotad_bytes_per_s"] >= 0
    assert quotas["held_vs_quota"] == quotas["held_bytes_per_s"] / TINY.quota_bytes_per_s


def test_hostile_clients(figures: dict[str, Any]) -> None:
    hostile = figures["hostile"]
    assert len(hostile["rounds"]["alone"]) == len(hostile["rounds"]["beside"]) == 1
    positive(hostile, "alone_rps", "beside_rps", "share", "hostile_requests")
    assert hostile["share"] == hostile["beside_rps"] / hostile["alone_rps"]


def test_partition_count(figures: dict[str, Any]) -> None:
    """Tiny: two topics of 10 partitions, every one led and taking a record, a broker killed
    and back; the figures are the step's."""
    pc = figures["partition_count"]
    assert pc["partitions"] == TINY.partitions
    assert [s["partitions"] for s in pc["steps"]] == [10, 20]
    assert pc["partitions_per_broker"] == TINY.partitions / 3
    for step in pc["steps"]:
        assert sorted(step["brokers"]) == [0, 1, 2]
        for broker in step["brokers"].values():
            positive(broker, "threads", "rss_mib")
    positive(pc, "threads_per_broker_max", "rss_mib_per_broker_max")
    positive(pc["relaunch"], "back_s", "leading_again_s")
    assert pc["relaunch"]["leading_again_s"] >= pc["relaunch"]["back_s"]
    keyed = pc["keyed"]
    assert (keyed["partitions"], keyed["records"]) == (TINY.keyed_partitions, TINY.keyed_records)
    positive(keyed, "one_partition_rps", "many_partitions_rps", "many_vs_one")


def test_diskless(figures: dict[str, Any]) -> None:
    """Tiny: the figures of step (w), and what holds whatever the machine: a diskless topic
    stores one table where RF 3 stores three, so fewer bytes and requests per produced MB;
    every moved partition took a record at its new leader; a failover was measured."""
    w = figures["diskless"]
    assert (w["records"], w["brokers"], w["move_partitions"]) == (TINY.diskless_records, 3,
                                                                  TINY.diskless_move_partitions)
    diskless, rf3 = w["diskless"], w["replicated"]
    for kind in (diskless, rf3):
        positive(kind, "produce_rps", "requests_per_mb_total", "stored_bytes_per_mb", "move_s")
        for latency in kind["latency_ms"].values():
            assert latency["p50"] <= latency["p99"] <= latency["max"]
    assert diskless["stored_bytes_per_mb"] < rf3["stored_bytes_per_mb"]
    assert diskless["requests_per_mb"]["PUT"] < rf3["requests_per_mb"]["PUT"]
    positive(diskless, "move_one_s")
    assert diskless["failover_s"]["rounds"] == TINY.diskless_failovers
    positive(diskless["failover_s"], "p50", "max")
    # the sweep behind the default commit interval: each interval applied to the open
    # partition, measured, and its commits counted
    sweep = w["commit_intervals"]
    assert list(sweep) == [str(ms) for ms in COMMIT_INTERVALS_MS]
    for measured in sweep.values():
        positive(measured, "puts_per_s")
        assert measured["produce"]["p50"] <= measured["produce"]["p99"]


def test_object_storage(figures: dict[str, Any]) -> None:
    """Tiny: the figures of step (r), and the request counts that hold whatever the machine:
    the idle cluster asks nothing, every produce commits (a PUT at least), the tail fetch reads
    no data file (the brokers' memory serves it), the fetch after the leader's restart reads
    the bucket."""
    s3 = figures["object_storage"]
    assert (s3["records"], s3["send_records"], s3["brokers"]) == (
        TINY.s3_records, TINY.s3_send_records, 3)
    positive(s3, "bulk_rps", "send_rps", "fetch_rps", "replicated_rps", "cold_fetch_rps",
             "restart_s")
    assert s3["fetched_records"] == TINY.s3_records + TINY.s3_send_records + 2  # and warm-ups
    for step in ("latency_ms", "replicated_latency_ms"):
        assert s3[step]["p50"] <= s3[step]["p99"] <= s3[step]["max"]
    requests = s3["requests"]
    assert requests["idle"]["topic_total"] == requests["idle"]["other_total"] == 0
    assert requests["produce"]["bytes"] == TINY.s3_records * VALUE_BYTES
    for phase in ("produce", "send", "replicated_produce"):
        assert requests[phase]["topic"]["PUT"] >= 1, phase
        assert requests[phase]["per_mb"]["PUT"] > 0, phase
    # Served from the tail cache: no data file read. (The produce phase's last checkpoint may
    # still be read back in the background meanwhile: Delta log requests, not the fetch's.)
    assert requests["fetch"]["data_files_total"] == 0, requests["fetch"]
    # Followers at the tail write the records they are sent: no server-side copy to read back.
    for phase in ("replicated_produce", "replicated_latency"):
        assert requests[phase]["topic"].get("HEAD", 0) == 0, requests[phase]
    assert requests["cold_fetch"]["topic"]["GET"] >= 1
    assert requests["cold_fetch"]["topic"]["PUT"] == 0
    assert set(requests["cold_fetch"]["per_mb"]) == {"PUT", "GET", "HEAD", "LIST", "DELETE",
                                                     "POST"}


def test_scaling(figures: dict[str, Any]) -> None:
    """Tiny: 1 -> 2 brokers; the new one takes its share, the producer ran before and during
    the scale and was never refused, and the time from the scale to balanced is there."""
    u = figures["scaling"]
    assert (u["brokers"], u["partitions"], u["replication_factor"]) == ([1, 2], 4, 1)
    assert u["state"] == "done" and u["balanced"] and u["producer_failed"] == 0, u
    assert sorted(u["spread_after"]) == [0, 1] and u["replicas_moved"] == 2, u
    assert u["bytes"] >= TINY.scale_bytes * 0.9
    positive(u, "scale_s", "fill_s", "producer_before_bps", "bytes_moved")
    assert u["latency_before_ms"]["p50"] <= u["latency_before_ms"]["p99"]
    assert judge(figures)["scaling"]


def test_steps_m_and_n_are_judged_only_where_they_ran(figures: dict[str, Any]) -> None:
    """With --bootstrap-server there is no embedded Spark session to start (m)'s, (r)'s or
    (u)'s cluster on, and the Kafka listener (n) measures is not in this process."""
    remote = {key: value for key, value in figures.items()
              if key not in ("sasl_ssl", "idle_connections", "partition_count", "object_storage",
                             "scaling", "metrics_overhead")}
    verdicts = judge(remote)
    assert not {"sasl_ssl", "idle_connections", "partitions", "keyed_partitions",
                "object_storage_latency", "scaling", "metrics_overhead"} & set(verdicts)
    for letter in "mnpruv":
        assert f"({letter}) " not in report(remote, verdicts)


def test_results_json_and_report(figures: dict[str, Any], tmp_path: pathlib.Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bench" / "results.json"
    verdicts = run.finish(figures, str(path))
    written = json.loads(path.read_text())
    assert written["targets"] == TARGETS
    assert written["pass"] == verdicts
    assert set(verdicts) == {"bulk", "send", "fetch", "latency", "replicated",
                             "replicated_latency", "commits", "rebalance", "drain",
                             "small_files", "sasl_ssl", "idle_connections", "quotas",
                             "partitions", "keyed_partitions", "hostile",
                             "object_storage_latency", "kafka_produce", "kafka_consume",
                             "kafka_latency", "kafka_txn_delivery", "drain_sql",
                             "typed_produce", "bulk_vs_bare", "commit_round", "scaling",
                             "metrics_overhead", "diskless_latency", "diskless_cost",
                             "diskless_move", "diskless_failover"}
    assert written["drain"]["records"] == TINY.drain_records
    table = capsys.readouterr().out
    for letter in "abcdefghijklmnopqrstuvw":
        assert f"({letter}) " in table
    assert f"figures written to {path}" in table


def test_the_flags_default_to_the_full_run() -> None:
    args = run.build_parser().parse_args([])
    assert run.sizes_from(args) == Sizes()
    assert args.json == "bench/results.json"


def test_tiny_flags_make_tiny_sizes() -> None:
    args = run.build_parser().parse_args(
        ["--records", "2000", "--small-commit-rounds", "5", "--send-records", "200",
         "--latency-run-s", "0.3",
         "--committers", "3", "--commit-run-s", "0.5", "--group-members", "3",
         "--drain-records", "2000", "--drain-rounds", "1", "--small-commits", "5",
         "--secure-records", "500", "--secure-rounds", "1", "--metrics-records", "500",
         "--metrics-rounds", "1", "--idle-connections", "50",
         "--quota-bytes-per-s", "50000000", "--quota-run-s", "1", "--partitions", "20",
         "--partitions-step", "10", "--keyed-partitions", "5", "--keyed-records", "200",
         "--keyed-rounds", "1", "--hostile-run-s", "0.5", "--hostile-rounds", "1",
         "--round-partitions", "3", "--round-rounds", "1", "--s3-records", "2000",
         "--s3-send-records", "200", "--s3-latency-run-s", "0.3", "--scale-partitions", "4",
         "--scale-bytes", "400000", "--scale-from", "1", "--scale-to", "2",
         "--scale-run-s", "0.5", "--diskless-records", "2000",
         "--diskless-latency-run-s", "0.3", "--diskless-move-partitions", "2",
         "--diskless-failovers", "1"])
    assert run.sizes_from(args) == TINY
    assert run.sizes_from(run.build_parser().parse_args(["--records", "50"])).send_records == 50


@pytest.mark.parametrize("argv, message", [
    (["--records", "0"], "--records must be at least 1"),
    (["--send-records", "0"], "--send-records must be at least 1"),
    (["--group-members", "1"], "--group-members must be at least 2"),
    (["--small-commits", "1"], "--small-commits must be at least 2"),
    (["--small-commit-rounds", "0"], "--small-commit-rounds must be at least 1"),
    (["--latency-run-s", "0"], "--latency-run-s must be more than 0"),
    (["--secure-rounds", "0"], "--secure-rounds must be at least 1"),
    (["--metrics-rounds", "0"], "--metrics-rounds must be at least 1"),
    (["--idle-connections", "0"], "--idle-connections must be at least 1"),
    (["--partitions-step", "0"], "--partitions-step must be at least 1"),
    (["--hostile-run-s", "0"], "--hostile-run-s must be more than 0"),
    (["--s3-records", "0"], "--s3-records must be at least 1"),
    (["--s3-latency-run-s", "0"], "--s3-latency-run-s must be more than 0"),
    (["--scale-to", "3"], "--scale-to must be at least 4"),
])
def test_sizes_out_of_range_exit_2_before_anything_starts(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
