"""Issue 14's fault-injection run, short enough for `make test`: two deltabus producers and a
confluent-kafka producer at acks=all (idempotent) load a 4-partition topic (RF 3,
min.insync.replicas=2) while a nemesis SIGKILLs the leader of a partition the group reads about
every 10 s for 75 s. The two members use auto_offset_reset="latest", the setting under which a
reset after a failover skips records silently; they commit after processing.

What issue 14 found broken: a new leader whose high watermark lagged the member's position
answered OFFSET_OUT_OF_RANGE and the member reset its position with no rebalance. Here that
shows as a position moving (backwards or forwards) without a rebalance, as acknowledged records
never processed, and as the consumer's own reset warnings (a reset may land where it started).
`make soak` runs the same harness for longer (tests/soak/soak_fault_injection.py)."""

from __future__ import annotations

import pytest

from tests.soak.fault_injection import FaultPlan, run

NEMESIS_S = 75
DISKLESS_NEMESIS_S = 45  # three or four kills; `make soak` runs them for minutes on S3, Azurite


# Cluster start-up (when this test is the session's first), 75 s of kills, then the drain: over
# the suite's 300 s default.
@pytest.mark.timeout(900)
def test_acks_all_load_and_a_latest_group_through_leader_kills_lose_and_skip_nothing(
        cluster, topic_name, all_brokers_back) -> None:
    report = run(cluster, FaultPlan(topic_name, nemesis_s=NEMESIS_S, fault_every_s=10,
                                    fault_jitter_s=3))
    print(report.summary())
    report.assert_nothing_lost_or_reset()


@pytest.mark.timeout(900)
def test_acks_all_load_and_a_group_through_kills_of_diskless_leaders(
        cluster, topic_name, all_brokers_back) -> None:
    """Issue 44's proof in small: the same load and checker on a diskless topic, whose
    leaders' kills move partitions in metadata only (the next leader opens the partition's
    one table): nothing acknowledged is lost, written twice or out of order."""
    report = run(cluster, FaultPlan(topic_name, nemesis_s=DISKLESS_NEMESIS_S, fault_every_s=10,
                                    fault_jitter_s=3, diskless=True))
    print(report.summary())
    report.assert_nothing_lost_or_reset()
