"""How big a bench run is: every count and duration the steps use, in one place.

The defaults are the full run (`make bench` with no flags), whose figures docs/performance.md
shows. Smaller sizes make the same steps quicker and their figures noisier: the smoke tests run
every step with tiny ones, so the steps keep working, not so their figures mean anything.
"""

from __future__ import annotations

from dataclasses import dataclass

VALUE_BYTES = 100  # every produced record's value, as Kafka's perf test's --record-size
SEND_RECORDS_MAX = 300_000  # per-record send() is slower: it gets at most this many by default


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """The knobs of one run; `check` says which is out of range."""

    records: int = 1_000_000  # (a), (b), (d), (f): bulk produce and fetch
    small_commit_rounds: int = 200  # (a): small commits made by each way of committing
    send_records: int = SEND_RECORDS_MAX  # (c) per-record send(), and (l)
    latency_run_s: float = 3.0  # (e), (g): how long one small record goes every ~2 ms
    committers: int = 100  # (h): consumers, each its own group, committing every 100 ms
    commit_run_s: float = 5.0  # (h)
    group_members: int = 10  # (i): members of a group on a topic of as many partitions
    drain_records: int = 10_000_000  # (j): the topic the streaming query drains
    # (j): timed rounds, after one warm-up round; the stream's rounds ranged from 64 to 116 %
    # of its ceiling in one quiet run (2026-11-27), so the median of 3 moved with one round
    drain_rounds: int = 5
    small_commits: int = 10_000  # (k): commits of 10 records before the merge
    secure_records: int = 300_000  # (m): produced and fetched per protocol and round
    secure_rounds: int = 3  # (m): rounds, alternating PLAINTEXT and SASL_SSL
    # (v): produced and fetched per side and round, and rounds: the two sides differ by a few
    # per cent at most, so rounds of a second or more and seven of them (300,000 records in 3
    # rounds put the ratios anywhere from 0.80 to 1.17 in one run, 2026-12-03)
    metrics_records: int = 1_000_000
    metrics_rounds: int = 7
    idle_connections: int = 5_000  # (n): idle Kafka connections held open at once
    quota_bytes_per_s: int = 1_000_000  # (o): the quota'd producer's producer_byte_rate
    quota_run_s: float = 44.0  # (o): both producers' run: four 11 s periods of the quota'd one
    partitions: int = 12_000  # (p): partitions created (replication factor 1), 4,000 a broker
    partitions_step: int = 1_000  # (p): created by topics of this many
    keyed_partitions: int = 1_000  # (p): keyed send() over this many, against one partition
    keyed_records: int = 100_000  # (p): records of each keyed round
    keyed_rounds: int = 3  # (p): rounds, alternating one partition and many
    hostile_run_s: float = 5.0  # (q): one round of the well-behaved producer
    hostile_rounds: int = 3  # (q): rounds of each, alone and beside the hostile client
    round_partitions: int = 1_000  # (t): partition logs of a commit round
    round_rounds: int = 5  # (t): timed rounds, after one warm-up round
    s3_records: int = 300_000  # (r): bulk produce and fetch on object storage (the emulator)
    s3_send_records: int = 100_000  # (r): per-record send() there
    s3_latency_run_s: float = 3.0  # (r): each latency phase there, acks=1 and acks=all
    scale_partitions: int = 60  # (u): partitions of the topic the scale moves
    scale_bytes: int = 1 << 30  # (u): what they hold before the scale
    scale_from: int = 3  # (u): brokers before the scale
    scale_to: int = 6  # (u): and after it
    scale_run_s: float = 10.0  # (u): the producer's run before the scale
    diskless_records: int = 200_000  # (w): bulk produced at acks=all, RF 3 and diskless
    diskless_latency_run_s: float = 5.0  # (w): each latency phase, RF 3 and diskless
    diskless_move_partitions: int = 100  # (w): partitions moved of each kind
    diskless_failovers: int = 5  # (w): kills of a diskless leader under a producer

    def check(self) -> list[str]:
        """What is out of range, one line each (empty when every knob is usable)."""
        counts = {"records": (self.records, 1),
                  "small-commit-rounds": (self.small_commit_rounds, 1),
                  "send-records": (self.send_records, 1),
                  "committers": (self.committers, 1),
                  "group-members": (self.group_members, 2),  # one leaves, one takes over
                  "drain-records": (self.drain_records, 1),
                  "drain-rounds": (self.drain_rounds, 1),
                  "small-commits": (self.small_commits, 2),  # a merge needs two files
                  "secure-records": (self.secure_records, 1),
                  "secure-rounds": (self.secure_rounds, 1),
                  "metrics-records": (self.metrics_records, 1),
                  "metrics-rounds": (self.metrics_rounds, 1),
                  "idle-connections": (self.idle_connections, 1),
                  "quota-bytes-per-s": (self.quota_bytes_per_s, 1),
                  "partitions": (self.partitions, 1),
                  "partitions-step": (self.partitions_step, 1),
                  "keyed-partitions": (self.keyed_partitions, 1),
                  "keyed-records": (self.keyed_records, 1),
                  "keyed-rounds": (self.keyed_rounds, 1),
                  "hostile-rounds": (self.hostile_rounds, 1),
                  "round-partitions": (self.round_partitions, 1),
                  "round-rounds": (self.round_rounds, 1),
                  "s3-records": (self.s3_records, 1),
                  "s3-send-records": (self.s3_send_records, 1),
                  "scale-partitions": (self.scale_partitions, 1),
                  "scale-bytes": (self.scale_bytes, 1),
                  "scale-from": (self.scale_from, 1),
                  "scale-to": (self.scale_to, self.scale_from + 1),
                  "diskless-records": (self.diskless_records, 1),
                  "diskless-move-partitions": (self.diskless_move_partitions, 1),
                  "diskless-failovers": (self.diskless_failovers, 1)}
        wrong = [f"--{name} must be at least {least}"
                 for name, (value, least) in counts.items() if value < least]
        wrong += [f"--{name} must be more than 0" for name, value in
                  (("latency-run-s", self.latency_run_s), ("commit-run-s", self.commit_run_s),
                   ("quota-run-s", self.quota_run_s), ("hostile-run-s", self.hostile_run_s),
                   ("s3-latency-run-s", self.s3_latency_run_s),
                   ("scale-run-s", self.scale_run_s),
                   ("diskless-latency-run-s", self.diskless_latency_run_s))
                  if not value > 0]
        return wrong
