"""Produce and fetch through both doors on two trees of this repository, in alternating rounds:
whether a change moved the figures, measured in one run (`python -m bench.tree_ab REV_A REV_B`).

Figures on this machine move 20-40% between runs, so two trees are only compared within one run:
each round starts an embedded 3-broker cluster from one tree's code (a git worktree of the
revision, in a process of its own), runs the same steps as `make bench` (b), (c), (d) and (l) at
smaller sizes (bench.produce_fetch, bench.kafka_clients), and stops it; rounds go A, B, A, B, ...
and the medians of each tree's rounds are printed and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS, SEND_RECORDS, KAFKA_RECORDS = 300_000, 50_000, 50_000
FIGURES = ("bulk_rps", "fetch_rps", "send_rps", "kafka_produce_rps", "kafka_consume_rps",
           "latency_p50_ms", "latency_p99_ms")

# One round, run with a tree's checkout as its working directory and import path.
ROUND = f"""
import json, shutil, tempfile
from bench.kafka_clients import kafka_consume, kafka_produce
from bench.produce_fetch import bulk_produce, chunk_values, fetch_all, latency, send_each
from bench.sizes import VALUE_BYTES
from deltabus.cli.producer_performance import payload
from deltabus.client.admin import AdminClient, NewTopic
from deltabus.cluster.cluster import Cluster, local_spark

root = tempfile.mkdtemp()
spark = local_spark(5, app_name="tree-ab", ui=False)
spark.sparkContext.setLogLevel("ERROR")
cluster = Cluster(spark, root=root + "/cluster", brokers=3, port=0, kafka_port=0).start()
try:
    grpc, kafka = cluster.bootstrap_servers, cluster.kafka_bootstrap_servers
    with AdminClient(grpc) as admin:
        admin.create_topics([NewTopic(t, 1, 1) for t in ("bulk", "each", "kafka", "lat")])
    out = {{"bulk_rps": bulk_produce(grpc, "bulk", chunk_values({RECORDS}), {RECORDS})}}
    out["fetch_rps"] = fetch_all(grpc, "bulk")[1]
    out["send_rps"] = send_each(grpc, "each", {SEND_RECORDS})
    out["kafka_produce_rps"] = {KAFKA_RECORDS} / kafka_produce(
        kafka, "kafka", {KAFKA_RECORDS}, payload(VALUE_BYTES))
    out["kafka_consume_rps"] = {KAFKA_RECORDS} / kafka_consume(kafka, "kafka", {KAFKA_RECORDS})
    trip = latency(grpc, "lat", 3.0)
    out["latency_p50_ms"], out["latency_p99_ms"] = trip["p50"], trip["p99"]
finally:
    cluster.stop()
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)
print("ROUND " + json.dumps(out))
"""


def one_round(tree: Path) -> dict[str, float]:
    """A round's figures on the checkout at `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([sys.executable, "-c", ROUND], cwd=tree, env=env, text=True,
                          capture_output=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("ROUND ")]
    if done.returncode or not lines:
        raise RuntimeError(f"a round on {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("ROUND "))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tree_ab", description=__doc__)
    p.add_argument("before", help="a git revision (the baseline)")
    p.add_argument("after", help="a git revision")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each tree (default 3)")
    p.add_argument("--json", default="bench/tree_ab.json", metavar="FILE")
    args = p.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="tree-ab-"))
    trees = {}
    try:
        for name, rev in (("before", args.before), ("after", args.after)):
            trees[name] = scratch / name
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                            str(trees[name]), rev], check=True)
        rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for i in range(args.rounds):
            for name in ("before", "after"):
                figures = one_round(trees[name])
                rounds[name].append(figures)
                print(f"round {i + 1} {name}: " + ", ".join(
                    f"{k} {figures[k]:,.1f}" for k in FIGURES), flush=True)
        medians = {name: {k: statistics.median(r[k] for r in rs) for k in FIGURES}
                   for name, rs in rounds.items()}
        print(f"{'median of ' + str(args.rounds) + ' rounds':28} {'before':>14} {'after':>14}"
              f" {'after/before':>13}")
        for k in FIGURES:
            b, a = medians["before"][k], medians["after"][k]
            print(f"{k:28} {b:14,.1f} {a:14,.1f} {a / b:13.2f}")
        Path(args.json).write_text(json.dumps({"revisions": [args.before, args.after],
                                               "rounds": rounds, "medians": medians},
                                              indent=2) + "\n")
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(tree)], check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
