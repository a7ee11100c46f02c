"""Network partitions and a slow leader under issue 14's load (tests/soak/fault_injection.py):
acks=all producers through both doors and a consumer group, while the nemesis cuts a leader
from the controller, a follower from its leader, the controller from every broker, and a leader
into a minority of its own, then slows a leader's traffic (delay and loss). Each fault holds
past the brokers' session timeout (6 s in tests), so the controller acts on it.

What must hold (the harness's checker): every acknowledged record is read once, at its
acknowledged offset, in order; no consumer position resets; replicas agree under the high
watermark; no leader epoch has two leaders. The run's history is written beside the test's
files and its path printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.nemesis import (
    ControllerFromBrokers,
    FollowerFromLeader,
    LeaderFromController,
    LeaderInMinority,
    SlowLeader,
)
from tests.faults.network import LoopbackNetwork
from tests.soak.fault_injection import FaultPlan, run

HOLD_S = 10  # past the 6 s session timeout and the 5 s replica lag time


@pytest.mark.timeout(1200)
def test_acks_all_load_and_a_group_through_partitions_and_a_slow_leader(
        cluster, topic_name, all_brokers_back, tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    with LoopbackNetwork() as network:
        faults = [LeaderFromController(network, HOLD_S), FollowerFromLeader(network, HOLD_S),
                  ControllerFromBrokers(network, HOLD_S), LeaderInMinority(network, HOLD_S),
                  SlowLeader(network, HOLD_S)]
        plan = FaultPlan(topic_name, nemesis_s=600, fault_rounds=1, fault_every_s=3,
                         fault_jitter_s=2, history=str(history))
        report = run(cluster, plan, faults)
    print(report.summary(), f"\nhistory: {history}")
    assert {f.kind for f in report.faults} == {f.kind for f in faults}, report.summary()
    report.assert_nothing_lost_or_reset()
