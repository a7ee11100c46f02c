"""The bench's targets, its PASS/MISS verdicts, and the table it prints at the end.

The targets are the project's (docs/performance.md shows them beside the latest figures): the
bulk target is relative as well as absolute, because what a 2-core laptop can write to Delta
bounds every figure, and step (a) says what that bound was on the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench import commit_paths, latency_trace

TARGETS = {"bulk_rps": 500_000, "bulk_vs_straight": 0.70,
           # (b) against (a)'s bare commit of the same batches (issue 38)
           "bulk_vs_bare": 0.85,
           "send_rps": 150_000,
           "fetch_rps": 1_000_000,
           # (e) and (g), issue 20: one record every ~2 ms, 100-byte values
           "latency_p50_ms": 12.0, "latency_p99_ms": 40.0,
           "replicated_latency_p50_ms": 25.0, "replicated_latency_p99_ms": 60.0,
           "replicated_vs_bulk": 0.5,
           # (h), issue 38: 100 consumers each committing every 100 ms
           "commits_vs_asked": 0.99, "commit_p99_ms": 50.0,
           "rebalance_s": 3.0,
           # (j), issue 21: the stream against the Python data source path's own ceiling (an
           # in-memory source), SQL on Spark's Parquet reader against Spark reading the files
           "stream_vs_memory": 0.9, "sql_vs_direct": 0.9,
           "merged_open_speedup": 1.0, "merged_fetch_speedup": 1.0,
           # (t), issue 38: a commit round over N partitions against N bare commits of (a)
           "commit_round_vs_bare": 1.5,
           "sasl_ssl_vs_plaintext": 0.8,
           # (v), issue 42: produce, fetch and send() with metrics kept and served, against
           # without, at least this share
           "metrics_vs_none": 0.97,
           # (n): resident bytes per idle Kafka connection, and threads the listener may add
           # while they are open (its request handler threads, num.io.threads, made on demand:
           # none per connection)
           "idle_connection_bytes": 16 * 1024, "idle_connections_threads_added": 8,
           # (o): the quota'd producer's steady rate, as a share of its quota, either way
           "quota_held_within": 0.10,
           # (p): partitions created and led with no broker fenced (nor while one is killed
           # and back), threads a broker may gain from its first 1,000 to its last, and keyed
           # send() over 1,000 partitions against one partition, in the same run
           "partitions": 12_000, "partition_threads_added": 16, "keyed_many_vs_one": 0.5,
           # (q): a well-behaved producer's send() rate beside a hostile client, as a share of
           # its rate alone
           "hostile_share": 0.5,
           # (s), issue 21: bulk produce to a typed topic (values decoded into typed columns)
           # as a share of the same records to an untyped one, in the same run
           "typed_vs_untyped": 0.70,
           # (r): produce-to-consume latency at acks=all, RF 3, with the root on object storage
           # (issue 18; moto's S3 server on loopback)
           "object_storage_replicated_latency_p99_ms": 400.0,
           # (w), issue 44: diskless topics on moto's S3 against the anchors' published figures
           # (WarpStream, Bufstream, AutoMQ): produce and end-to-end latency at acks=all, the
           # share of RF 3's requests and stored bytes per MB, a partition's move, a failover
           "diskless_produce_p50_ms": 250.0, "diskless_produce_p99_ms": 500.0,
           "diskless_e2e_p50_ms": 400.0, "diskless_e2e_p99_ms": 800.0,
           # RF 3's requests and stored bytes per MB at least this many times diskless's
           "rf3_vs_diskless_cost": 3, "diskless_move_s": 1.5, "diskless_failover_p50_s": 10.0,
           # (l), issue 19: confluent-kafka through the Kafka door against the gRPC figures
           "kafka_produce_rps": 500_000, "kafka_produce_vs_bulk": 0.40,
           "kafka_consume_rps": 800_000, "kafka_consume_vs_fetch": 0.80,
           "kafka_latency_p50_over_grpc_ms": 5.0,
           # (l), issue 36: librdkafka's latency check in transactions (linger.ms=35, a record
           # a transaction): its accepted mean from produce() to the delivery report, 35-85 ms
           # plus 5 ms (its round-trip allowance is left out: loopback's is under 1 ms)
           "kafka_txn_delivery_mean_ms": 90.0}


def judge(f: dict[str, Any]) -> dict[str, bool]:
    """PASS/MISS per target; steps (m)'s, (n)'s and (r)'s only where they ran (the embedded
    cluster)."""
    verdicts = {
        "bulk": f["bulk_rps"] >= TARGETS["bulk_rps"]
        and f["bulk_vs_straight"] >= TARGETS["bulk_vs_straight"],
        "send": f["send_rps"] >= TARGETS["send_rps"],
        "fetch": f["fetch_rps"] >= TARGETS["fetch_rps"],
        "latency": (f["latency_ms"]["p50"] <= TARGETS["latency_p50_ms"]
                    and f["latency_ms"]["p99"] <= TARGETS["latency_p99_ms"]),
        "replicated": f["replicated_vs_bulk"] >= TARGETS["replicated_vs_bulk"],
        "replicated_latency": (
            f["replicated_latency_ms"]["p50"] <= TARGETS["replicated_latency_p50_ms"]
            and f["replicated_latency_ms"]["p99"] <= TARGETS["replicated_latency_p99_ms"]),
        "commits": (f["offset_commits"]["commits_per_s"]
                    >= TARGETS["commits_vs_asked"] * f["offset_commits"]["asked_per_s"]
                    and f["offset_commits"]["p99_ms"] <= TARGETS["commit_p99_ms"]),
        "rebalance": f["rebalance_s"] <= TARGETS["rebalance_s"],
        "drain": f["drain"]["stream_vs_memory"] >= TARGETS["stream_vs_memory"],
        "drain_sql": f["drain"]["sql_vs_direct"] >= TARGETS["sql_vs_direct"],
        "small_files": (f["small_files"]["open_speedup"] >= TARGETS["merged_open_speedup"]
                        and f["small_files"]["fetch_speedup"] >= TARGETS["merged_fetch_speedup"]),
    }
    if "bare_write_rps" in f:
        verdicts["bulk_vs_bare"] = f["bulk_vs_bare"] >= TARGETS["bulk_vs_bare"]
    if "commit_round" in f:
        verdicts["commit_round"] = (f["commit_round"]["vs_bare"]
                                    <= TARGETS["commit_round_vs_bare"])
    if "kafka" in f:
        k = f["kafka"]
        verdicts["kafka_produce"] = (
            k["kafka_produce_rps"] >= TARGETS["kafka_produce_rps"]
            and k["kafka_produce_rps"] >= TARGETS["kafka_produce_vs_bulk"] * f["bulk_rps"])
        verdicts["kafka_consume"] = (
            k["kafka_consume_rps"] >= TARGETS["kafka_consume_rps"]
            and k["kafka_consume_rps"] >= TARGETS["kafka_consume_vs_fetch"] * f["fetch_rps"])
        verdicts["kafka_latency"] = (k["kafka_latency_ms"]["p50"] <= f["latency_ms"]["p50"]
                                     + TARGETS["kafka_latency_p50_over_grpc_ms"])
        verdicts["kafka_txn_delivery"] = (k["kafka_txn_delivery_ms"]["mean_ms"]
                                          <= TARGETS["kafka_txn_delivery_mean_ms"])
    if "sasl_ssl" in f:
        secure = f["sasl_ssl"]
        verdicts["sasl_ssl"] = (secure["produce_ratio"] >= TARGETS["sasl_ssl_vs_plaintext"]
                                and secure["fetch_ratio"] >= TARGETS["sasl_ssl_vs_plaintext"])
    if "idle_connections" in f:
        idle = f["idle_connections"]
        verdicts["idle_connections"] = (
            idle["bytes_per_connection"] <= TARGETS["idle_connection_bytes"]
            and idle["threads_added"] <= TARGETS["idle_connections_threads_added"])
    if "quotas" in f:
        verdicts["quotas"] = (abs(f["quotas"]["held_vs_quota"] - 1)
                              <= TARGETS["quota_held_within"])
    if "partition_count" in f:
        pc = f["partition_count"]
        verdicts["partitions"] = (pc["partitions"] >= TARGETS["partitions"] and pc["fenced"] == 0
                                  and pc["relaunch"]["others_fenced"] == 0
                                  and pc["threads_added_max"]
                                  <= TARGETS["partition_threads_added"])
        verdicts["keyed_partitions"] = (pc["keyed"]["many_vs_one"]
                                        >= TARGETS["keyed_many_vs_one"])
    if "hostile" in f:
        verdicts["hostile"] = f["hostile"]["share"] >= TARGETS["hostile_share"]
    if "typed_produce" in f:
        verdicts["typed_produce"] = (f["typed_produce"]["typed_vs_untyped"]
                                     >= TARGETS["typed_vs_untyped"])
    if "metrics_overhead" in f:
        v = f["metrics_overhead"]
        verdicts["metrics_overhead"] = all(v[k] >= TARGETS["metrics_vs_none"] for k in (
            "produce_ratio", "fetch_ratio", "send_ratio"))
    if "scaling" in f:  # balanced after the scale, the producer never refused
        verdicts["scaling"] = f["scaling"]["balanced"] and not f["scaling"]["producer_failed"]
    if "diskless" in f:
        d, r3 = f["diskless"]["diskless"], f["diskless"]["replicated"]
        lat = d["latency_ms"]
        verdicts["diskless_latency"] = (
            lat["produce"]["p50"] <= TARGETS["diskless_produce_p50_ms"]
            and lat["produce"]["p99"] <= TARGETS["diskless_produce_p99_ms"]
            and lat["end_to_end"]["p50"] <= TARGETS["diskless_e2e_p50_ms"]
            and lat["end_to_end"]["p99"] <= TARGETS["diskless_e2e_p99_ms"])
        verdicts["diskless_cost"] = all(
            d[k] * TARGETS["rf3_vs_diskless_cost"] <= r3[k]
            for k in ("requests_per_mb_total", "stored_bytes_per_mb"))
        # all moved in one request: each partition moved, and serving, within the whole
        verdicts["diskless_move"] = d["move_one_s"] <= TARGETS["diskless_move_s"]
        verdicts["diskless_failover"] = (d["failover_s"]["p50"]
                                         <= TARGETS["diskless_failover_p50_s"])
    if "object_storage" in f:
        verdicts["object_storage_latency"] = (
            f["object_storage"]["replicated_latency_ms"]["p99"]
            <= TARGETS["object_storage_replicated_latency_p99_ms"])
    return verdicts


Row = tuple[str, str, str, Any]  # step, measured, target, verdict (True/False; "" for none)


def report(f: dict[str, Any], ok: dict[str, bool]) -> str:
    """The table printed at the end: measured figure, target, PASS/MISS."""
    title = (f"deltabus bench: {f['records']:,} records of {f['value_bytes']} bytes "
             f"(send() {f['send_records']:,}), 1 partition, {f['elapsed_s']:.0f} s")
    lines = [title,
             f"{'step':<38}{'measured':<60}{'target':<34}result"]
    for name, measured, target, passed in rows(f, ok):
        lines.append(f"{name:<38}{measured:<60}{target:<34}{verdict(passed)}".rstrip())
    for step, figures in (("(e)", f["latency_ms"]), ("(g)", f["replicated_latency_ms"])):
        if "breakdown" in figures:
            lines.append(f"{step} where a record's time goes (bench/latency_trace.py):")
            lines += latency_trace.table_lines(figures["breakdown"])
    return "\n".join(lines)


def verdict(passed: Any) -> str:
    """A row's result column: PASS, MISS, or nothing for a figure only reported."""
    return "" if passed == "" else ("PASS" if passed else "MISS")


def _commit_paths(figures: dict[str, Any] | None) -> list[Row]:
    """Step (a)'s small commit by each way of committing (bench.commit_paths): reported, the
    bare commit as the limit of a commit (a results file from before it has none)."""
    if figures is None:
        return []
    return [(f"(a) small commit, {way}",
             f"p50 {figures[way]['p50_ms']:.2f} ms, CPU {figures[way]['cpu_ms']:.2f} ms",
             "the limit of a commit" if way == "bare commit" else "", "")
            for way in commit_paths.WAYS]


def _bulk_vs_bare(f: dict[str, Any], ok: dict[str, bool], t: Mapping[str, Any]
                  ) -> list[Row]:
    """Step (a)'s bare-commit write of the bulk batches, and (b) against it (a results file
    from before it has neither)."""
    if "bare_write_rps" not in f:
        return []
    return [("(a) bare commit of the same batches", f"{f['bare_write_rps']:,.0f} rec/s",
             "the limit of the append path", ""),
            ("(b) bulk produce against the bare commit", f"{f['bulk_vs_bare']:.0%} of it",
             f">= {t['bulk_vs_bare']:.0%}", ok["bulk_vs_bare"])]


def rows(f: dict[str, Any], ok: dict[str, bool],
         targets: Mapping[str, Any] = TARGETS) -> list[Row]:
    """The table's rows, (step, measured, target, verdict), for the steps that ran, with the
    targets the figures were judged by (a results file's own, when one is rendered)."""
    t = targets
    lat, rlat, oc, dr, sf = (f["latency_ms"], f["replicated_latency_ms"], f["offset_commits"],
                             f["drain"], f["small_files"])
    out: list[Row] = [
        ("(a) straight write_deltalake", f"{f['straight_write_rps']:,.0f} rec/s",
         "the physical limit", ""),
        *_commit_paths(f.get("commit_paths")),
        ("(b) bulk produce, send_batch",
         f"{f['bulk_rps']:,.0f} rec/s ({f['bulk_vs_straight']:.0%} of a)",
         f">= {t['bulk_rps']:,} and >= {t['bulk_vs_straight']:.0%} of a", ok["bulk"]),
        *_bulk_vs_bare(f, ok, t),
        ("(c) per-record send()", f"{f['send_rps']:,.0f} rec/s",
         f">= {t['send_rps']:,}", ok["send"]),
        ("(d) fetch, poll_batch", f"{f['fetch_rps']:,.0f} rec/s",
         f">= {t['fetch_rps']:,}", ok["fetch"]),
        ("(e) produce-to-consume latency", _latency(lat),
         f"p50 <= {t['latency_p50_ms']:.0f}, p99 <= {t['latency_p99_ms']:.0f} ms",
         ok["latency"]),
        ("(f) bulk, acks=all, RF 3",
         f"{f['replicated_rps']:,.0f} rec/s ({f['replicated_vs_bulk']:.0%} of b)",
         f">= {t['replicated_vs_bulk']:.0%} of b", ok["replicated"]),
        ("(g) latency, acks=all, RF 3", _latency(rlat),
         (f"p50 <= {t['replicated_latency_p50_ms']:.0f}, "
          f"p99 <= {t['replicated_latency_p99_ms']:.0f} ms"), ok["replicated_latency"]),
        (f"(h) offset commits, {oc['committers']} consumers",
         (f"{oc['commits_per_s']:,.0f}/s of {oc['asked_per_s']:,.0f} asked, latency p50 "
          f"{oc['p50_ms']:.0f} / p99 {oc['p99_ms']:.0f} ms"),
         (f">= {t['commits_vs_asked']:.0%} of asked"
          + (f", p99 <= {t['commit_p99_ms']:.0f} ms" if "commit_p99_ms" in t else "")),
         ok["commits"]),
        (f"(i) rebalance, {f['group_members']} members, 1 leaves", f"{f['rebalance_s']:.2f} s",
         f"<= {t['rebalance_s']:.0f} s", ok["rebalance"]),
        (f"(j) stream drain, {dr['records'] / 1e6:g} M records",
         (f"{dr['stream_rps']:,.0f} rec/s ({dr['stream_vs_memory']:.0%} of the Python source "
          f"ceiling {dr['memory_rps']:,.0f}, itself {dr['memory_vs_direct']:.0%} of direct "
          f"Parquet; {dr['stream_wall_rps']:,.0f} with start-up; "
          f"medians of {len(dr['rounds'])})"),
         f">= {t['stream_vs_memory']:.0%} of the Python-source ceiling", ok["drain"]),
        ("(j) the same, Python streaming ceiling",
         (f"{dr['stream_vs_memory_stream']:.0%} of a Python streaming source serving the same "
          f"records from memory ({dr['memory_stream_rps']:,.0f} rec/s)"), "reported", ""),
        ("(j) the same, Parquet floor",
         (f"{dr['stream_vs_parquet_floor']:.0%} of a Python streaming source decoding the same "
          f"files with pyarrow alone ({dr['parquet_floor_rps']:,.0f} rec/s, "
          f"{dr['parquet_floor_vs_memory_stream']:.0%} of the streaming ceiling)"),
         "reported", ""),
        (f"(j) SQL, Parquet reader, {dr['records'] / 1e6:g} M rec",
         (f"{dr['sql_rps']:,.0f} rec/s ({dr['sql_vs_direct']:.0%} of direct Parquet "
          f"{dr['direct_rps']:,.0f}; medians of {len(dr['rounds'])})"),
         f">= {t['sql_vs_direct']:.0%} of direct Parquet", ok["drain_sql"]),
        (f"(k) {sf['commits']:,} small commits, merged",
         (f"open {sf['before']['open_ms']:,.0f} -> {sf['after']['open_ms']:,.0f} ms, fetch "
          f"{sf['before']['fetch_rps']:,.0f} -> {sf['after']['fetch_rps']:,.0f} rec/s; "
          f"{sf['files_before']:,} -> {sf['files_after']} files in {sf['merge_s']:.1f} s"),
         "faster after the merge", ok["small_files"]),
    ]
    if "commit_round" in f:
        cr = f["commit_round"]
        out.append((f"(t) commit round, {cr['partitions']:,} partitions",
                     (f"{cr['round_ms']:,.1f} ms ({cr['per_partition_ms']:.2f} ms a partition; "
                      f"{cr['vs_bare']:.2f} x N bare commits of {cr['bare_commit_ms']:.2f} ms)"),
                     f"<= {t['commit_round_vs_bare']:g} x N bare commits", ok["commit_round"]))
    if "kafka" in f:
        k = f["kafka"]
        out += [
            (f"(l) Kafka door produce, {k['records']:,} rec",
             (f"{k['kafka_produce_rps']:,.0f} rec/s ({k['kafka_produce_rps'] / f['bulk_rps']:.0%}"
              f" of b; gRPC send() {k['grpc_produce_rps']:,.0f})"),
             (f">= {t['kafka_produce_rps']:,} and >= "
              f"{t['kafka_produce_vs_bulk']:.0%} of b"), ok["kafka_produce"]),
            (f"(l) Kafka door consume, {k['records']:,} rec",
             (f"{k['kafka_consume_rps']:,.0f} rec/s ({k['kafka_consume_rps'] / f['fetch_rps']:.0%}"
              f" of d; gRPC poll() {k['grpc_consume_rps']:,.0f})"),
             (f">= {t['kafka_consume_rps']:,} and >= "
              f"{t['kafka_consume_vs_fetch']:.0%} of d"), ok["kafka_consume"]),
            ("(l) Kafka door latency", _latency(k["kafka_latency_ms"]),
             f"p50 <= e's + {t['kafka_latency_p50_over_grpc_ms']:.0f} ms",
             ok["kafka_latency"]),
            ("(l) delivery in transactions, linger.ms=35",
             (f"mean {k['kafka_txn_delivery_ms']['mean_ms']:.0f} ms (commit "
              f"{k['kafka_txn_delivery_ms']['commit_mean_ms']:.0f} ms); plain "
              f"{k['kafka_delivery_ms']['mean_ms']:.0f} ms"),
             f"mean <= {t['kafka_txn_delivery_mean_ms']:.0f} ms (librdkafka's range)",
             ok["kafka_txn_delivery"])]
    if "sasl_ssl" in f:
        m = f["sasl_ssl"]
        tls, plain = m["sasl_ssl"], m["plaintext"]
        out.append((f"(m) SASL_SSL vs PLAINTEXT, {m['records']:,} rec",
                     (f"produce {tls['produce_rps']:,.0f} vs {plain['produce_rps']:,.0f} rec/s "
                      f"({m['produce_ratio']:.0%}); fetch {tls['fetch_rps']:,.0f} vs "
                      f"{plain['fetch_rps']:,.0f} ({m['fetch_ratio']:.0%}); "
                      f"{m['mechanism']}, medians of {m['rounds']}"),
                     f">= {t['sasl_ssl_vs_plaintext']:.0%} of PLAINTEXT, both",
                     ok["sasl_ssl"]))
    if "idle_connections" in f:
        n = f["idle_connections"]
        grown_mib = (n["rss_after_bytes"] - n["rss_before_bytes"]) / 2**20
        out.append((f"(n) {n['connections']:,} idle Kafka connections",
                     (f"{n['bytes_per_connection'] / 1024:,.1f} KiB each ({grown_mib:,.1f} MiB "
                      f"resident); threads {n['threads_before']} -> {n['threads_after']}"),
                     (f"<= {t['idle_connection_bytes'] // 1024} KiB each, <= "
                      f"{t['idle_connections_threads_added']} threads added"),
                     ok["idle_connections"]))
    if "quotas" in f:
        q = f["quotas"]
        out.append((f"(o) producer_byte_rate {q['quota_bytes_per_s']:,} B/s",
                     (f"quota'd {q['held_bytes_per_s']:,.0f} B/s after its first burst "
                      f"({q['held_vs_quota']:.1%}), unquota'd beside it "
                      f"{q['unquotad_bytes_per_s']:,.0f} B/s"),
                     f"within {t['quota_held_within']:.0%} of the quota",
                     ok["quotas"]))
    if "partition_count" in f:
        pc = f["partition_count"]
        r, k = pc["relaunch"], pc["keyed"]
        out.append((f"(p) {pc['partitions']:,} partitions, 3 brokers",
                     (f"{pc['fenced']} fenced; threads <= {pc['threads_per_broker_max']} a broker "
                      f"(+{pc['threads_added_max']}), {pc['rss_mib_per_broker_max']:,.0f} MiB; "
                      f"killed broker back {r['back_s']:.0f} s, leading {r['leading_again_s']:.0f}"
                      f" s, {r['others_fenced']} others fenced"),
                     (f">= {t['partitions']:,} led, none fenced, <= "
                      f"{t['partition_threads_added']} threads added"),
                     ok["partitions"]))
        out.append((f"(p) keyed send(), {k['partitions']:,} partitions vs 1",
                     (f"{k['many_partitions_rps']:,.0f} vs {k['one_partition_rps']:,.0f} rec/s "
                      f"({k['many_vs_one']:.0%}), medians of {len(k['rounds']['one'])}"),
                     f">= {t['keyed_many_vs_one']:.0%} of one partition",
                     ok["keyed_partitions"]))
    if "hostile" in f:
        h = f["hostile"]
        out.append(("(q) send() beside a hostile client",
                     (f"{h['beside_rps']:,.0f} vs {h['alone_rps']:,.0f} rec/s alone "
                      f"({h['share']:.0%}); {h['hostile_requests']:,} hostile requests"),
                     f">= {t['hostile_share']:.0%} of its rate alone", ok["hostile"]))
    if "typed_produce" in f:
        ty = f["typed_produce"]
        out.append(("(s) bulk produce of Avro records, typed topic",
                     (f"{ty['typed_rps']:,.0f} vs {ty['untyped_rps']:,.0f} rec/s untyped "
                      f"({ty['typed_vs_untyped']:.0%})"),
                     f">= {t['typed_vs_untyped']:.0%} of untyped", ok["typed_produce"]))
        if "behind_head" in ty:
            b = ty["behind_head"]
            out.append(("(s) the same decode behind the head",
                         (f"cleaner rewrite {b['decode_rewrite_rps']:,.0f} vs "
                          f"{b['rewrite_rps']:,.0f} rec/s without decoding: "
                          f"+{b['cleaner_decode_s_per_m']:.2f} s/M records, on produce "
                          f"+{ty['produce_decode_s_per_m']:.2f} s/M"), "", ""))
    if "object_storage" in f:
        out += _object_storage_rows(f["object_storage"], ok["object_storage_latency"], t)
    if "diskless" in f:
        out += _diskless_rows(f["diskless"], ok, t)
    if "scaling" in f:
        u = f["scaling"]
        out.append((f"(u) scale {u['brokers'][0]} -> {u['brokers'][1]} brokers, "
                     f"{u['partitions']} partitions, {u['bytes'] / 2**30:.2g} GiB",
                     (f"balanced in {u['scale_s']:.0f} s ({u['replicas_moved']} replicas, "
                      f"{u['bytes_moved'] / 2**30:.2g} GiB moved); producer at "
                      f"{u['producer_offered_bps'] / 1e6:g} MB/s: "
                      f"{u['producer_during_bps'] / 1e6:.1f} MB/s acked during the moves vs "
                      f"{u['producer_before_bps'] / 1e6:.1f} before, produce p99 "
                      f"{u['latency_during_ms']['p99']:,.0f} vs "
                      f"{u['latency_before_ms']['p99']:,.0f} ms"),
                     "balanced, no send refused; time reported", ok["scaling"]))
    if "metrics_overhead" in f:
        v = f["metrics_overhead"]
        on, off = v["metrics_on"], v["metrics_off"]
        out.append((f"(v) metrics kept and served vs none, {v['records']:,} rec",
                     (f"produce {on['produce_rps']:,.0f} vs {off['produce_rps']:,.0f} rec/s "
                      f"({v['produce_ratio']:.0%}); fetch {on['fetch_rps']:,.0f} vs "
                      f"{off['fetch_rps']:,.0f} ({v['fetch_ratio']:.0%}); send() "
                      f"{on['send_rps']:,.0f} vs {off['send_rps']:,.0f} ({v['send_ratio']:.0%});"
                      f" medians of {v['rounds']}"),
                     f">= {t['metrics_vs_none']:.0%} of none, each", ok["metrics_overhead"]))
    return out


def _latency(lat: dict[str, Any]) -> str:
    """A latency step's percentiles, and how many of its records came back."""
    return (f"p50 {lat['p50']:.1f} / p95 {lat['p95']:.1f} / p99 {lat['p99']:.1f} ms "
            f"({lat['received']}/{lat['sent']} back)")


def _per_mb(phase: dict[str, Any]) -> str:
    """A phase's requests on its topic per MB, the methods it used: "0.40 PUT, 0.20 GET =
    0.60" ("none" without any)."""
    used = [(method, n) for method, n in phase["per_mb"].items() if n]
    if not used:
        return "none"
    return (", ".join(f"{n:.2f} {method}" for method, n in used)
            + f" = {sum(n for _, n in used):.2f}")


def _object_storage_rows(r: dict[str, Any], latency_ok: bool,
                         t: Mapping[str, Any]) -> list[Row]:
    """Step (r)'s rows: rates and latencies on S3, then each phase's requests per MB."""
    req = r["requests"]
    out: list[Row] = [
        (f"(r) S3 produce, {r['records']:,} records",
         (f"bulk {r['bulk_rps']:,.0f}, acks=all RF 3 {r['replicated_rps']:,.0f}, send() "
          f"{r['send_rps']:,.0f} rec/s"), "reported beside (b), (f), (c)", ""),
        ("(r) S3 fetch",
         (f"{r['fetch_rps']:,.0f} rec/s from the tail cache, {r['cold_fetch_rps']:,.0f} from "
          "S3"), "reported beside (d)", ""),
        ("(r) S3 latency, acks=1", _latency(r["latency_ms"]), "reported beside (e)", ""),
        ("(r) S3 latency, acks=all, RF 3", _latency(r["replicated_latency_ms"]),
         f"p99 <= {t['object_storage_replicated_latency_p99_ms']:.0f} ms", latency_ok)]
    for phase, name in (("produce", "bulk produce"), ("send", "send()"),
                        ("replicated_produce", "acks=all RF 3"), ("fetch", "fetch (tail)"),
                        ("cold_fetch", "fetch (bucket)")):
        out.append((f"(r) S3 requests/MB, {name}", _per_mb(req[phase]), "reported", ""))
    return out


def _diskless_rows(w: dict[str, Any], ok: Mapping[str, bool], t: Mapping[str, Any]) -> list[Row]:
    """Step (w)'s rows: diskless against replication factor 3 on S3, same run."""
    d, r3 = w["diskless"], w["replicated"]
    lat, lat3 = d["latency_ms"], r3["latency_ms"]
    failover = d["failover_s"]
    return [
        (f"(w) S3 acks=all produce, {w['records']:,} records",
         f"diskless {d['produce_rps']:,.0f} vs RF 3 {r3['produce_rps']:,.0f} rec/s",
         "reported", ""),
        ("(w) S3 cost per produced MB, diskless vs RF 3",
         (f"{d['requests_per_mb_total']:.2f} vs {r3['requests_per_mb_total']:.2f} requests, "
          f"{d['stored_bytes_per_mb'] / 1e6:.2f} vs {r3['stored_bytes_per_mb'] / 1e6:.2f} MB "
          "stored"), f"<= 1/{t['rf3_vs_diskless_cost']} of RF 3's, each",
         ok["diskless_cost"]),
        ("(w) S3 acks=all latency, diskless",
         (f"produce {_latency(lat['produce'])}; end to end {_latency(lat['end_to_end'])}"),
         (f"produce p50 <= {t['diskless_produce_p50_ms']:.0f} / p99 <= "
          f"{t['diskless_produce_p99_ms']:.0f} ms, end to end p50 <= "
          f"{t['diskless_e2e_p50_ms']:.0f} / p99 <= {t['diskless_e2e_p99_ms']:.0f} ms"),
         ok["diskless_latency"]),
        ("(w) S3 acks=all latency, RF 3",
         (f"produce {_latency(lat3['produce'])}; end to end {_latency(lat3['end_to_end'])}"),
         "reported beside diskless", ""),
        ("(w) move one diskless partition, serving after",
         f"{d['move_one_s']:.2f} s (median of {d['move_one_rounds']})",
         f"<= {t['diskless_move_s']:g} s", ok["diskless_move"]),
        (f"(w) move {w['move_partitions']} partitions in one request, serving after",
         f"diskless {d['move_s']:.2f} s vs replicated (RF 1, copied) {r3['move_s']:.1f} s",
         "reported: metadata only against copies", ""),
        (f"(w) diskless failover, kill -9, {failover['rounds']} rounds",
         f"to the first ack at the new leader: p50 {failover['p50']:.1f} s, max "
         f"{failover['max']:.1f} s", f"p50 <= {t['diskless_failover_p50_s']:g} s",
         ok["diskless_failover"])] + [
        (f"(w) diskless.append.commit.interval.ms={ms}",
         (f"produce {_latency(sweep['produce'])}; end to end "
          f"{_latency(sweep['end_to_end'])}; {sweep['puts_per_s']:.1f} PUTs/s"),
         "reported: the trade behind the default", "")
        for ms, sweep in w.get("commit_intervals", {}).items()]
