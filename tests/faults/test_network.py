"""The network nemesis on two plain processes (echo_peer.py), before any broker meets it: a
cut stops a connection that was open and a new one, both ways, without a reset; heal lets both
through again; a slow link adds its delay to every round trip."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.network import Host, LoopbackNetwork

PEER = Path(__file__).with_name("echo_peer.py")


class Peer:
    def __init__(self, name: str) -> None:
        self.process = subprocess.Popen([sys.executable, str(PEER)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.host = Host(name, self.process.pid)
        self.port = int(self.ask("listen").split()[1])

    def ask(self, command: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def peers() -> Iterator[tuple[Peer, Peer]]:
    a, b = Peer("a"), Peer("b")
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def eventually(ask, expected_prefix: str, timeout_s: float = 60) -> str:
    """Ask until the answer starts so (a healed connection resumes on a retransmission)."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = ask()
        if answer.startswith(expected_prefix) or time.monotonic() > deadline:
            return answer


def test_a_cut_stops_open_and_new_connections_both_ways_until_healed(peers) -> None:
    a, b = peers
    assert a.ask(f"connect {b.port}") == "ok" and b.ask(f"connect {a.port}") == "ok"
    assert a.ask("echo 1").startswith("echo") and b.ask("echo 1").startswith("echo")
    with LoopbackNetwork() as network:
        network.cut(a.host, b.host)
        assert a.ask("echo 2") == "timeout"  # the connection a opened
        assert b.ask("echo 2") == "timeout"  # the one b opened
        assert a.ask(f"new {b.port}") == "timeout" and b.ask(f"new {a.port}") == "timeout"
        network.heal()
        assert eventually(lambda: a.ask(f"new {b.port}"), "ok").startswith("ok")
        assert eventually(lambda: a.ask("echo 3"), "echo").startswith("echo")
        assert eventually(lambda: b.ask("echo 3"), "echo").startswith("echo")
    # closed: its rules are gone (another test worker's own chain may be there meanwhile)
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
    assert f"DELTABUS-NEMESIS-{os.getpid()}" not in rules


def test_a_cut_leaves_other_processes_alone(peers) -> None:
    a, b = peers
    c = Peer("c")
    try:
        with LoopbackNetwork() as network:
            network.cut(a.host, b.host)
            assert c.ask(f"new {b.port}").startswith("ok")
            assert a.ask(f"new {c.port}").startswith("ok")
    finally:
        c.close()


def test_a_slow_link_delays_every_round_trip_until_healed(peers) -> None:
    a, b = peers
    assert a.ask(f"connect {b.port}") == "ok"
    with LoopbackNetwork() as network:
        network.slow([b.host], delay_ms=300)
        # to b's port and back from it: two delays
        answer = a.ask("echo slow")
        assert answer.startswith("echo") and float(answer.split()[1]) >= 0.6, answer
        network.heal()
        fastest = min(float(a.ask(f"echo fast{i}").split()[1]) for i in range(5))
        assert fastest < 0.3

        network.slow([b.host], delay_ms=0, loss_percent=100)  # loss alone
        assert a.ask("echo lost") == "timeout"


def test_a_process_gone_before_it_is_cut_holds_no_connections() -> None:
    """A broker fenced and relaunched between the nemesis choosing it and cutting it: its
    /proc entry is gone, and cutting it finds nothing to cut instead of failing the nemesis."""
    from tests.faults.network import connections_to, listening_ports

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert connections_to(gone.pid, {1, 2}) == set()
    assert listening_ports(gone.pid) == set()
