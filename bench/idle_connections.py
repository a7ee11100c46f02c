"""Bench step (n): idle Kafka connections (issue 17): what each costs the process serving it.

A child process opens the connections to the embedded cluster's bootstrap Kafka listener (in
the Spark driver, this process) and sends ApiVersions on each, as every Kafka client does
first, so the listener has served each before it is counted; then they stay open and idle. The
figures are this process's resident memory and thread count before and after: the clients'
sockets live in the child, and the kernel's socket buffers are not resident memory, so the
growth is what the listener keeps per connection. Linux only (/proc/self/statm).
"""

from __future__ import annotations

import gc
import os
import resource
import subprocess
import sys
import threading
from typing import Any

# Connections opened (and closed) before the baseline, so the request handler threads that
# ApiVersions starts are counted in it and not as the idle connections' cost.
WARM_UP_CONNECTIONS = 20

# The child: open N connections to HOST:PORT, answer each ApiVersions, print "ready", and hold
# them until stdin closes.
_CLIENT = r"""
import resource, socket, struct, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < n + 100:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 100), hard))
body = struct.pack(">hhih", 18, 0, 1, 5) + b"bench"
request = struct.pack(">i", len(body)) + body
held = []
for _ in range(n):
    sock = socket.create_connection((host, port), timeout=30)
    sock.sendall(request)
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    answer = sock.recv(size, socket.MSG_WAITALL)
    if len(answer) != size:
        raise SystemExit(f"connection {len(held)}: the listener closed it")
    held.append(sock)
print("ready", flush=True)
sys.stdin.read()
"""


def idle_connections(kafka_bootstrap: str, connections: int) -> dict[str, Any]:
    """Resident bytes and threads this process gains while `connections` idle Kafka
    connections are open to its listener at `kafka_bootstrap` (host:port)."""
    _room_for(connections)
    host, port = kafka_bootstrap.rsplit(":", 1)
    _hold(host, port, WARM_UP_CONNECTIONS, lambda: None)
    gc.collect()
    rss_before, threads_before = _rss_bytes(), threading.active_count()
    measured: dict[str, int] = {}

    def measure() -> None:
        gc.collect()
        measured["rss"], measured["threads"] = _rss_bytes(), threading.active_count()

    _hold(host, port, connections, measure)
    grown = max(0, measured["rss"] - rss_before)
    return {"connections": connections, "rss_before_bytes": rss_before,
            "rss_after_bytes": measured["rss"], "bytes_per_connection": grown / connections,
            "threads_before": threads_before, "threads_after": measured["threads"],
            "threads_added": measured["threads"] - threads_before}


def _hold(host: str, port: str, connections: int, while_open: Any) -> None:
    """Open `connections` from a child process, call `while_open()` once they are all served,
    then close them."""
    child = subprocess.Popen([sys.executable, "-c", _CLIENT, host, port, str(connections)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the client process could not open {connections} connections "
                               f"(exit code {child.wait(30)})")
        while_open()
    finally:
        child.stdin.close()
        child.wait(60)


def _room_for(connections: int) -> None:
    """This process's file descriptor limit raised for the listener's end of each."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 4096  # and everything else the driver has open
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            raise RuntimeError(f"{connections} connections need {wanted} file descriptors; "
                               f"the hard limit is {hard} (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
