"""Transactions under faults (issue 40): a consume-transform-produce loop with confluent-kafka's
transactions (tests/faults/transactions.py) reads the harness's acks=all load while the nemesis
kills a leader and then cuts a leader from the controller, each once and briefly. Exactly once:
every acknowledged input is in the output once, no aborted record (on purpose or by a fault)
reaches a read_committed consumer, and the group's committed offsets never go backwards; and
the harness's own checks (nothing acknowledged lost, no position reset, replicas agree) hold.
`make soak` runs the same loop beside every nemesis for longer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.nemesis import KillLeader, LeaderFromController
from tests.faults.network import LoopbackNetwork
from tests.soak.fault_injection import FaultPlan, run

HOLD_S = 7  # past the brokers' 6 s session timeout: the controller elects another leader


@pytest.mark.timeout(600)
def test_a_transactional_loop_is_exactly_once_through_a_kill_and_a_cut_leader(
        cluster, topic_name, all_brokers_back, tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    with LoopbackNetwork() as network:
        faults = [KillLeader(), LeaderFromController(network, HOLD_S)]
        plan = FaultPlan(topic_name, partitions=2, deltabus_producers=1, records_per_s=50,
                         members=1, acked_before_nemesis=100, nemesis_s=600, fault_rounds=1,
                         fault_every_s=1, fault_jitter_s=1, transactions=True,
                         history=str(history))
        report = run(cluster, plan, faults)
    print(report.summary(), f"\nhistory: {history}")
    assert {f.kind for f in report.faults} == {f.kind for f in faults}, report.summary()
    report.assert_nothing_lost_or_reset()
