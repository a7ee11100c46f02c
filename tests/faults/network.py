"""Network faults between the processes of one machine, as Jepsen injects them between
machines: a cut (no packet passes, in either direction, between two processes; a partition is
cuts between every pair of its sides), and a slow link (tc netem's delay, jitter and loss).

Every process here talks over loopback from 127.0.0.1, so addresses cannot tell the sender.
A cut instead names the sender by its cgroup: each process a fault involves is moved into a
cgroup of its own (cgroup v2), and an iptables rule in OUTPUT drops what that cgroup sends to
the other process's listening ports. A socket keeps the cgroup it was created in, so the
connections a process already has are cut by their port pairs, both ways: the cut is silent
(no reset), as a real partition is, and a new connection never gets past its SYN.

What a cut does not see: connections the test's own process opens (its clients), and so those
the driver opens, which is the same process. That is Jepsen's arrangement (clients on a control
node, faults between the nodes); the driver's only connections to brokers besides the clients'
are the transaction coordinator's markers.

A slow link matches ports only: everything to and from the chosen listening ports is delayed
(packet_delay.py: this kernel has no tc netem) or dropped (iptables' statistic match), clients'
traffic included, as a slow network card would. Needs root, iptables (set-up installs it) and a
cgroup v2 mount.
Not thread-safe: one nemesis drives it."""

from __future__ import annotations

import itertools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.faults.packet_delay import PacketDelay

LISTEN = "0A"  # /proc/net/tcp's state of a listening socket
ESTABLISHED = "01"
MULTIPORT_MAX = 15  # ports one iptables multiport match takes


@dataclass(frozen=True)
class Host:
    """A simulated machine: a process and a name for the history."""

    name: str
    pid: int


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    folder = Path(f"/proc/{pid}/fd")
    for fd in folder.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _tcp_sockets(pid: int) -> list[tuple[str, int, int]]:
    """(state, local port, remote port) of every TCP socket `pid` holds; none once it is gone
    (a broker fenced and relaunched between choosing it and cutting it: the soak's nemesis
    died of that). IPv6 ones too: gRPC opens dual-stack sockets, whose traffic with 127.0.0.1
    is IPv4 on the wire (iptables sees it) though /proc lists it under tcp6."""
    sockets = []
    try:
        inodes = _socket_inodes(pid)
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[9] in inodes:
                        local, remote = fields[1], fields[2]
                        sockets.append((fields[3], int(local.rsplit(":", 1)[1], 16),
                                        int(remote.rsplit(":", 1)[1], 16)))
    except (FileNotFoundError, ProcessLookupError):  # /proc/PID went away meanwhile
        return []
    return sockets


def listening_ports(pid: int) -> set[int]:
    """The TCP ports a process listens on: its doors."""
    return {local for state, local, _ in _tcp_sockets(pid) if state == LISTEN}


def connections_to(pid: int, ports: set[int]) -> set[tuple[int, int]]:
    """(local port, remote port) of the connections `pid` opened to any of `ports`."""
    return {(local, remote) for state, local, remote in _tcp_sockets(pid)
            if state == ESTABLISHED and remote in ports}


def _run(*args: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")


def _cgroup2_root() -> Path:
    with open("/proc/mounts", encoding="ascii") as f:
        for line in f:
            _, mount_point, kind = line.split()[:3]
            if kind == "cgroup2":
                return Path(mount_point)
    raise RuntimeError("no cgroup v2 hierarchy is mounted: network cuts need one")


class LoopbackNetwork:
    """Cuts and slow links between processes on loopback; `heal` undoes them all, `close`
    also gives the processes back their cgroup. A context manager: whatever happens in the
    test, nothing of it outlives the block."""

    def __init__(self) -> None:
        self.chain = f"DELTABUS-NEMESIS-{os.getpid()}"
        self._cgroups = _cgroup2_root() / self.chain.lower()
        self._cgroups.mkdir(exist_ok=True)
        self._placed: dict[int, str] = {}  # pid -> its cgroup, relative to the root
        self._queue = 1000 + os.getpid() % 60_000  # netfilter queue of `slow`
        self._delay: PacketDelay | None = None
        _run("iptables", "-w", "-N", self.chain)
        _run("iptables", "-w", "-I", "OUTPUT", "-j", self.chain)

    def cut(self, a: Host, b: Host) -> None:
        """No packet between `a` and `b`, either way, until `heal`."""
        self._drop_from(a, b)
        self._drop_from(b, a)

    def partition(self, *sides: list[Host]) -> None:
        """A cut between every two hosts on different sides."""
        for one, other in itertools.combinations(sides, 2):
            for a, b in itertools.product(one, other):
                self.cut(a, b)

    def slow(self, hosts: list[Host], delay_ms: int, jitter_ms: int = 0,
             loss_percent: float = 0.0) -> None:
        """Delay (and drop `loss_percent` of) every packet to or from the listening ports of
        `hosts`, until `heal`: netfilter's queue and packet_delay.py, as netem would."""
        ports = sorted(set().union(*(listening_ports(h.pid) for h in hosts)))
        if self._delay is None and delay_ms:
            self._delay = PacketDelay(self._queue, delay_ms, jitter_ms).start()
        for i in range(0, len(ports), MULTIPORT_MAX):
            match = ["-p", "tcp", "-m", "multiport", "--ports",
                     ",".join(map(str, ports[i:i + MULTIPORT_MAX]))]
            if loss_percent:
                _run("iptables", "-w", "-A", self.chain, *match, "-m", "statistic", "--mode",
                     "random", "--probability", str(loss_percent / 100), "-j", "DROP")
            if delay_ms:
                _run("iptables", "-w", "-A", self.chain, *match, "-j", "NFQUEUE",
                     "--queue-num", str(self._queue), "--queue-bypass")

    def heal(self) -> None:
        """Every packet passes again (connections stalled by a cut resume on their own
        retransmissions)."""
        _run("iptables", "-w", "-F", self.chain)
        if self._delay is not None:
            self._delay.stop()
            self._delay = None

    def close(self) -> None:
        self.heal()
        _run("iptables", "-w", "-D", "OUTPUT", "-j", self.chain)
        _run("iptables", "-w", "-X", self.chain)
        root = self._cgroups.parent
        for pid in self._placed:
            try:
                (root / "cgroup.procs").write_text(str(pid))
            except OSError:  # gone
                pass
        for folder in self._cgroups.iterdir():
            if folder.is_dir():
                folder.rmdir()
        self._cgroups.rmdir()

    def __enter__(self) -> LoopbackNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _cgroup(self, host: Host) -> str:
        """The cgroup `host` is in from now on (created and joined on first use)."""
        if host.pid not in self._placed:
            folder = self._cgroups / f"{host.name}-{host.pid}"
            folder.mkdir(exist_ok=True)
            (folder / "cgroup.procs").write_text(str(host.pid))
            self._placed[host.pid] = str(folder.relative_to(self._cgroups.parent))
        return self._placed[host.pid]

    def _drop_from(self, a: Host, b: Host) -> None:
        """Drop what `a` sends to `b`'s listening ports: new connections by `a`'s cgroup,
        those open now by their port pairs (and what comes back on them)."""
        if a.pid == os.getpid():
            return  # the test's own process: its clients must go on (module docstring)
        ports = sorted(listening_ports(b.pid))
        cgroup = self._cgroup(a)
        for i in range(0, len(ports), MULTIPORT_MAX):
            chunk = ",".join(map(str, ports[i:i + MULTIPORT_MAX]))
            _run("iptables", "-w", "-A", self.chain, "-m", "cgroup", "--path", cgroup,
                 "-p", "tcp", "-m", "multiport", "--dports", chunk, "-j", "DROP")
        for local, remote in connections_to(a.pid, set(ports)):
            for sport, dport in ((local, remote), (remote, local)):
                _run("iptables", "-w", "-A", self.chain, "-p", "tcp", "--sport", str(sport),
                     "--dport", str(dport), "-j", "DROP")
