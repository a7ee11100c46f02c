"""The latency breakdown of steps (e) and (g): where one record's trip from `send()` to the
consumer's `poll()` spends its time, stage by stage, from the stamps deltabus.trace wrote.

Every process of the run (this one, each broker's) appended its stamps to a file in the trace
folder; the bench adds two of its own per record: when `send()` was called and when `poll()`
returned it. A record's stage times are the gaps between consecutive moments of its trip:

    client send         send() -> its produce request sent (the producer's queue and linger)
    to the leader       request sent -> queued at the leader's log (network, decoding, checks)
    commit queue        queued -> taken by a commit round (group commit gathering, an earlier
                        commit still running)
    log batch           taken -> its log batch built (offsets and the broker's fields)
    Delta commit        built -> its Parquet file and Delta commit written (the bare commit)
    leader apply        committed -> offsets, cache and high watermark (acks=1) updated
  with replication (the follower whose copy the high watermark waited for):
    to the follower     leader applied -> queued at the follower (its fetch's wait and answer)
    follower commit     queued -> the follower's commit applied (the same four stages as above)
    high watermark      follower applied -> the leader's high watermark past it (the
                        follower's next fetch telling the leader)
  then:
    fetch wake-up       high watermark moved -> read for the consumer's waiting fetch
    to the consumer     read -> the answer decoded in the consumer
    poll loop           decoded -> poll() returned it
    total               send() -> poll() returned it
    ack                 high watermark moved -> the producer got the answer (not in total)

Each stage's p50 and p99 are over the records traced, in milliseconds.
"""

from __future__ import annotations

import bisect
import collections
import glob
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STAGES = ("client send", "to the leader", "commit queue", "log batch", "Delta commit",
          "leader apply", "to the follower", "follower commit", "high watermark",
          "fetch wake-up", "to the consumer", "poll loop", "total", "ack")
NS_PER_MS = 1_000_000
WALK_BACK_MAX = 64


@dataclass
class _Ranges:
    """Stamps of one stage (and process) by their first offset, to find the one covering an
    offset."""

    firsts: list[int] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def add(self, event: dict[str, Any]) -> None:
        self.firsts.append(event["first"])
        self.events.append(event)

    def sort(self) -> None:
        order = sorted(range(len(self.firsts)), key=lambda i: (self.firsts[i],
                                                               _first_moment(self.events[i])))
        self.firsts = [self.firsts[i] for i in order]
        self.events = [self.events[i] for i in order]

    def covering(self, offset: int) -> dict[str, Any] | None:
        """The earliest stamp whose range holds `offset` (among the WALK_BACK_MAX stamps
        starting at or before it: ranges of one stage seldom overlap more)."""
        end = bisect.bisect_right(self.firsts, offset)
        holding = [e for e in self.events[max(0, end - WALK_BACK_MAX):end] if e["last"] >= offset]
        return min(holding, key=_first_moment, default=None)


def _first_moment(event: dict[str, Any]) -> int:
    return min(v for k, v in event.items()
               if isinstance(v, int) and k not in ("first", "last", "partition", "pid",
                                                   "replica") and v > 0)


def load(folder: str, topic: str) -> dict[tuple[str, int], _Ranges]:
    """Every stamp of `topic` in `folder`, by (stage, process id); "read" stamps by (stage,
    fetching replica) instead."""
    ranges: dict[tuple[str, int], _Ranges] = collections.defaultdict(_Ranges)
    for path in glob.glob(os.path.join(folder, "trace-*.jsonl")):
        with open(path) as f:
            for line in f:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:  # a line still being written
                    continue
                if event.get("topic") != topic:
                    continue
                who = event["replica"] if event["stage"] == "read" else event["pid"]
                ranges[(event["stage"], who)].add(event)
    for r in ranges.values():
        r.sort()
    return ranges


def record_stages(ranges: Mapping[tuple[str, int], _Ranges], offset: int, sent_ns: int,
                  polled_ns: int) -> dict[str, float] | None:
    """One record's stage times (ms), or None when a stamp of its trip is missing."""
    def find(stage: str, who: int) -> dict[str, Any] | None:
        r = ranges.get((stage, who))
        return r.covering(offset) if r is not None else None

    leaders = [pid for stage, pid in ranges if stage == "append"]
    append = next((e for e in (find("append", pid) for pid in leaders) if e), None)
    if append is None:
        return None
    produce = next((e for e in (find("produce", pid) for stage, pid in ranges
                                if stage == "produce") if e), None)
    hw = find("hw", append["pid"])
    read = find("read", -1)
    fetched = next((e for e in (find("fetched", pid) for stage, pid in ranges
                                if stage == "fetched") if e), None)
    if produce is None or hw is None or read is None or fetched is None:
        return None
    copies = [e for e in (find("copy", pid) for stage, pid in ranges if stage == "copy") if e]
    moments = [("client send", produce["sent"]), ("to the leader", append["queued"]),
               ("commit queue", append["taken"]), ("log batch", append["built"]),
               ("Delta commit", append["committed"])]
    if copies:  # the follower the high watermark waited for: the last to apply before it
        copy = max((c for c in copies if c["applied"] <= hw["moved"]),
                   key=lambda c: c["applied"], default=max(copies, key=lambda c: c["applied"]))
        moments += [("leader apply", append["applied"]), ("to the follower", copy["queued"]),
                    ("follower commit", copy["applied"]), ("high watermark", hw["moved"])]
    else:  # the leader's apply moves the high watermark
        moments.append(("leader apply", hw["moved"]))
    moments += [("fetch wake-up", read["read"]), ("to the consumer", fetched["received"]),
                ("poll loop", polled_ns)]
    out = {stage: (moment - previous) / NS_PER_MS for (stage, moment), previous
           in zip(moments, [sent_ns] + [m for _, m in moments[:-1]], strict=True)}
    out["total"] = (polled_ns - sent_ns) / NS_PER_MS
    out["ack"] = (produce["acked"] - hw["moved"]) / NS_PER_MS
    return out


def breakdown(folder: str, topic: str, sent_ns: Mapping[int, int],
              polled_ns: Mapping[int, int]) -> dict[str, Any]:
    """Each stage's p50 and p99 (ms) over the records both sent and polled, and how many
    records were traced whole."""
    ranges = load(folder, topic)
    per_stage: dict[str, list[float]] = collections.defaultdict(list)
    traced = 0
    for offset, polled in polled_ns.items():
        sent = sent_ns.get(offset)
        if sent is None:
            continue
        stages = record_stages(ranges, offset, sent, polled)
        if stages is None:
            continue
        traced += 1
        for stage, ms in stages.items():
            per_stage[stage].append(ms)
    return {"records": traced, "stages": {
        stage: {"p50": _pct(per_stage[stage], 0.5), "p99": _pct(per_stage[stage], 0.99)}
        for stage in STAGES if per_stage.get(stage)}}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * q), len(ordered) - 1)]


def table_lines(figures: Mapping[str, Any]) -> list[str]:
    """The breakdown as the bench prints it."""
    lines = [f"    {'stage':<18} {'p50 ms':>8} {'p99 ms':>8}   ({figures['records']} records)"]
    for stage, pct in figures["stages"].items():
        lines.append(f"    {stage:<18} {pct['p50']:>8.2f} {pct['p99']:>8.2f}")
    return lines


def main(argv: list[str]) -> int:
    """Steps (e) and (g) alone: `python -m bench.latency_trace [rounds [run_s]]` (defaults 2
    and 3 s), each round on topics of its own, on an embedded 3-broker cluster in a local Spark
    session of its own; prints each round's figures and breakdown, then the medians."""
    import argparse
    import shutil
    import statistics
    import tempfile

    from bench.produce_fetch import latency
    from deltabus import trace
    from deltabus.client.admin import AdminClient
    from deltabus.cluster.cluster import Cluster, local_spark
    from deltabus.metadata import NewTopic

    parser = argparse.ArgumentParser(prog="python -m bench.latency_trace",
                                     description="bench steps (e) and (g) alone, traced")
    parser.add_argument("rounds", nargs="?", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("run_s", nargs="?", type=float, default=3.0,
                        help="seconds each step sends for (default 3)")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="deltabus-bench-latency-")
    folder = f"{root}/trace"
    trace.start(folder, ("latency-e-", "latency-g-"))  # before Spark: its brokers stamp too
    spark = local_spark(5, app_name="deltabus-bench-latency", ui=False)
    spark.sparkContext.setLogLevel("WARN")
    p50s: dict[str, list[float]] = collections.defaultdict(list)
    p99s: dict[str, list[float]] = collections.defaultdict(list)
    try:
        cluster = Cluster(spark, root=f"{root}/cluster", brokers=3, port=0).start()
        try:
            with AdminClient(cluster.bootstrap_servers) as admin:
                for r in range(args.rounds):
                    admin.create_topics([
                        NewTopic(f"latency-e-{r}", 1, 1),
                        NewTopic(f"latency-g-{r}", 1, 3, {"min.insync.replicas": "2"})])
                    for step, acks in (("e", 1), ("g", "all")):
                        figures = latency(cluster.bootstrap_servers, f"latency-{step}-{r}",
                                          args.run_s, acks=acks, trace_dir=folder)
                        p50s[step].append(figures["p50"])
                        p99s[step].append(figures["p99"])
                        print(f"({step}) round {r}: p50 {figures['p50']:.1f} ms, p99 "
                              f"{figures['p99']:.1f} ms")
                        print("\n".join(table_lines(figures["breakdown"])), flush=True)
        finally:
            cluster.stop()
    finally:
        spark.stop()
        trace.stop()
        shutil.rmtree(root, ignore_errors=True)
    for step in p50s:
        print(f"({step}) medians of {len(p50s[step])} rounds: p50 "
              f"{statistics.median(p50s[step]):.1f} ms, p99 {statistics.median(p99s[step]):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
