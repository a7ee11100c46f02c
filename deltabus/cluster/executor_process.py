"""What a broker task knows of the Spark executor it runs in, and of the machine under it.

A broker is a Python worker of an executor. On a cluster of many machines (standalone,
Databricks) each executor is a JVM of its own on its worker's machine, started by Spark as
`CoarseGrainedExecutorBackend ... --hostname HOST`: HOST is the address Spark itself reaches
that executor on, so it is the one address a broker on that machine can be sure other machines
reach too. In local mode there is no such JVM: the broker runs under the driver's, on the
driver's machine.

Linux only (/proc); elsewhere (a laptop on macOS) every broker counts as local mode.
"""

from __future__ import annotations

import functools
import os
import socket

from deltabus.listeners import WILDCARD_HOSTS


def executor_pid(worker_pid: int) -> int:
    """The executor JVM a Python worker runs under (its nearest CoarseGrainedExecutorBackend
    ancestor, from /proc). Raises ValueError in local mode, where the JVM is the driver, and
    where there is no /proc."""
    pid = worker_pid
    try:
        while pid > 1:
            if b"CoarseGrainedExecutorBackend" in _cmdline(pid):
                return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the parent's pid
    except OSError:  # no /proc (not Linux), or an ancestor gone meanwhile
        pass
    raise ValueError(f"process {worker_pid} runs in no separate executor (local mode?)")


@functools.cache
def executor_host() -> str | None:
    """The `--hostname` Spark started this process's executor with, or None in local mode."""
    try:
        args = _cmdline(executor_pid(os.getpid())).split(b"\0")
    except (ValueError, OSError):
        return None
    if b"--hostname" in args[:-1]:
        return args[args.index(b"--hostname") + 1].decode() or None
    return None


def local_host() -> str:
    """This machine's address, for what a node binds and advertises: DELTABUS_HOST where set
    (an override), else the executor's own (`executor_host`), else the one Spark was told
    (SPARK_LOCAL_IP), else the host name, as Kafka advertises its canonical host name."""
    return (os.environ.get("DELTABUS_HOST") or executor_host()
            or os.environ.get("SPARK_LOCAL_IP") or socket.getfqdn())


def broker_host(cluster_host: str) -> str:
    """Where a broker binds when the cluster names no listeners: the cluster's `host` (the
    driver's) in local mode or where it binds every interface; else its own machine's
    address, since a broker on another machine can neither bind the driver's address nor be
    reached on its own loopback."""
    if executor_host() is None or cluster_host.strip("[]") in WILDCARD_HOSTS:
        return cluster_host
    return local_host()


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()
