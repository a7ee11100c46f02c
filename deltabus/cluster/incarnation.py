"""A broker's last incarnation ends before its next one starts: Kafka's lock on log.dirs, which
keeps a second broker process off the same logs.

Why it is needed: when the controller fences a broker, its supervisor's Spark job ends at once,
but the Python worker that ran the broker may live on: Spark kills the worker of a cancelled
task no sooner than `spark.python.task.killTimeout`, and a broker cut off from the controller
(a network partition) does not hear it was fenced until the network heals. Relaunched
meanwhile, the next incarnation bound other ports beside the old one and opened the same
replica tables, and the catch-up job before it wrote them, while the old one still led its
partitions and its followers still fetched from it: two writers of one table, and acknowledged
records truncated when the new one led (the network partition test found it).

So the supervisor (Cluster._supervise) waits, before the catch-up job and the relaunch, until
nothing accepts connections at the broker's registered inter-broker address. Where it ran on
this machine (local mode, local-cluster, the tests' simulated machines on loopback addresses)
its process is killed first, as Spark would, once it is sure it is the broker's: a Python worker
of Spark, still serving that address. Elsewhere it can only wait, for at most `timeout_s`, then
goes on: the put-if-absent commits still fence the old incarnation's writes.

Runs on the driver, in a broker's supervisor thread.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import socket
import time

from deltabus.metadata import BrokerEndpoint

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 1.0
POLL_S = 0.1
# How long a relaunch waits for the last process to stop serving where it cannot kill it
# (another machine): past it the next one starts anyway.
END_TIMEOUT_S = 30.0


def end_last_incarnation(endpoint: BrokerEndpoint | None, pid: int | None,
                         timeout_s: float = END_TIMEOUT_S) -> bool:
    """Wait until broker `endpoint`'s last incarnation no longer serves; kill its process
    (`pid`) where it runs on this machine. True once it is gone, False after `timeout_s`."""
    if endpoint is None or not _serving(endpoint):
        return True
    if pid is not None and _on_this_machine(endpoint.host) and _spark_worker(pid):
        log.warning("broker %d's last incarnation (pid %d) still serves %s:%d; killing it "
                    "before its next one starts", endpoint.broker_id, pid, endpoint.host,
                    endpoint.port)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while _serving(endpoint):
        if time.monotonic() > deadline:
            log.warning("broker %d's last incarnation still serves %s:%d after %.0f s; "
                        "starting the next one beside it", endpoint.broker_id, endpoint.host,
                        endpoint.port, timeout_s)
            return False
        time.sleep(POLL_S)
    return True


def _serving(endpoint: BrokerEndpoint) -> bool:
    """Something accepts connections at the broker's inter-broker address (refused, or no
    answer: nothing to wait for that a connection can tell)."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _on_this_machine(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _spark_worker(pid: int) -> bool:
    """`pid` runs on this machine and is one of Spark's Python workers (not a process that
    took the number since)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"pyspark" in f.read()
    except OSError:
        return False
