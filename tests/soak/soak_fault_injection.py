"""`make soak`: every nemesis mixed (tests/faults/nemesis.py), each round of faults in a random
order, one every 10-15 s for DELTABUS_SOAK_S seconds (600 by default), under issue 14's load:
acks=all producers on both doors and a consumer group committing after processing. The faults:
leader kills, network partitions (a leader from the controller, a follower from its leader,
the controller from every broker, a leader in a minority of its own), a slow and lossy leader,
a leader paused past its session timeout, and a full disk.

Each run writes its history to build/soak/ and prints its faults as a table
(tests/faults/report.py). Collected only when named on the command line (`make soak` does): its
file name does not match pytest's test_*.py, so `make test` and a bare `pytest` leave it out
without a skip marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.history import read_history
from tests.faults.nemesis import (
    ControllerFromBrokers,
    DiskFull,
    Fault,
    FollowerFromLeader,
    KillLeader,
    LeaderFromController,
    LeaderInMinority,
    PauseLeader,
    SlowLeader,
)
from tests.faults.network import LoopbackNetwork
from tests.faults.report import fault_rows, table
from tests.soak.fault_injection import FaultPlan, Report, run

SOAK_S = float(os.environ.get("DELTABUS_SOAK_S", "600"))
HOLD_S = 10.0  # past the brokers' 6 s session timeout and the 5 s replica lag time
HISTORIES = Path(__file__).parents[2] / "build" / "soak"


def every_fault(network: LoopbackNetwork, *, local_disk: bool) -> list[Fault]:
    faults: list[Fault] = [
        KillLeader(), LeaderFromController(network, HOLD_S), FollowerFromLeader(network, HOLD_S),
        ControllerFromBrokers(network, HOLD_S), LeaderInMinority(network, HOLD_S),
        SlowLeader(network, HOLD_S), PauseLeader(HOLD_S)]
    if local_disk:
        faults.append(DiskFull(HOLD_S))
    return faults


def print_run(report: Report, history: Path) -> None:
    print(report.summary())
    print(f"history: {history}")
    print(table(fault_rows(read_history(history))))


@pytest.mark.timeout(int(SOAK_S) + 1800)  # start-up, the nemesis, the drain
def test_soak_every_nemesis_mixed_on_local_disk(cluster, topic_name, all_brokers_back) -> None:
    history = HISTORIES / "history-local.jsonl"
    with LoopbackNetwork() as network:
        faults = every_fault(network, local_disk=True)
        report = run(cluster, FaultPlan(topic_name, nemesis_s=SOAK_S, fault_every_s=10,
                                        fault_jitter_s=5, mixed=True, history=str(history)),
                     faults)
    print_run(report, history)
    assert {f.kind for f in report.faults} == {f.kind for f in faults}, (
        "a soak this short cannot inject every fault: make it longer (DELTABUS_SOAK_S)")
    report.assert_nothing_lost_or_reset()
