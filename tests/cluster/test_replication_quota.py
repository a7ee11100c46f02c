"""Replication throttles (deltabus/cluster/replication_quota.py): the rate a broker's moving
replicas may copy at, measured over Kafka's replication quota windows, and the shares of it
each catch-up task of a reassignment gets."""

from __future__ import annotations

import pytest

from deltabus import config as cfg
from deltabus.cluster.catch_up import CatchUpTask
from deltabus.cluster.replication_quota import UNTHROTTLED, ReplicationQuota, move_rates
from deltabus.storage import Storage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_quota_is_exceeded_past_its_rate_and_recovers_as_the_windows_pass() -> None:
    clock = Clock()
    quota = ReplicationQuota(1000, clock)
    # Kafka's Rate measures over at least ten windows of a second: 10,000 bytes at once is
    # the rate, not past it
    quota.record(10_000)
    assert not quota.exceeded()
    quota.record(1)
    assert quota.exceeded()
    clock.now += 5  # the same bytes over more time: still past it until the windows roll
    assert quota.exceeded()
    clock.now += 11  # the window holding them is gone
    assert not quota.exceeded()


def test_an_unthrottled_quota_is_never_exceeded() -> None:
    quota = ReplicationQuota(UNTHROTTLED, Clock())
    quota.record(1 << 40)
    assert not quota.throttles and not quota.exceeded()
    assert quota.fetch_bytes(8 << 20) == 8 << 20


def test_a_throttled_fetch_carries_at_most_a_second_of_the_rate() -> None:
    assert ReplicationQuota(1000, Clock()).fetch_bytes(8 << 20) == 1000
    assert ReplicationQuota(1 << 30, Clock()).fetch_bytes(8 << 20) == 8 << 20


def test_catch_up_tasks_share_their_leaders_and_new_brokers_rates() -> None:
    storage = Storage("/tmp/unused")
    tasks = [CatchUpTask(storage, "t", p, source, target)
             for p, source, target in ((0, 0, 3), (1, 0, 4), (2, 1, 3), (3, 2, 5))]
    paced = move_rates(tasks, leader_rate=1000, follower_rate=3000)
    # broker 0 leads two moving partitions (500 each); broker 3 takes two (1500 each)
    assert [t.bytes_per_s for t in paced] == [500, 500, 1000, 1000]
    # one slot: one task at a time, each at its brokers' whole rates
    assert [t.bytes_per_s for t in move_rates(tasks, 1000, 3000, parallel=1)] == [1000] * 4
    assert move_rates(tasks, UNTHROTTLED, UNTHROTTLED) == tasks  # 0: unpaced
    assert all(t.bytes_per_s == 0 for t in move_rates(tasks, UNTHROTTLED, UNTHROTTLED))


def test_the_rates_are_broker_configs_with_kafkas_names() -> None:
    settings = cfg.broker_settings({"leader.replication.throttled.rate": "1048576",
                                    "follower.replication.throttled.rate": str(UNTHROTTLED)})
    config = cfg.ClusterConfig(root="/tmp/unused", **settings)
    assert config.leader_replication_throttled_rate == 1 << 20
    assert config.follower_replication_throttled_rate == UNTHROTTLED
    assert cfg.BROKER_CONFIGS["leader.replication.throttled.rate"].type == "LONG"
    with pytest.raises(ValueError, match="leader.replication.throttled.rate must be at least 1"):
        cfg.ClusterConfig(root="/tmp/unused", leader_replication_throttled_rate=0)
