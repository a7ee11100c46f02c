"""A Spark standalone cluster of simulated machines, for tests: a master on 127.0.0.1 and
workers each on a loopback address of its own (127.0.0.2, .3, ...), with its own local and
work directories, started with pip's PySpark (`bin/spark-class`, as pip has no sbin/ scripts).
Every JVM binds its own address only (SPARK_LOCAL_IP, which Spark's web UIs bind too), so
executors, and the brokers they run, see the address of "their machine"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark

from bench.moto_server import stop_process
from tests.conftest import free_port_block

MASTER_HOST = "127.0.0.1"
START_TIMEOUT_S = 180.0  # four JVMs starting on two cores


@dataclass(frozen=True)
class Standalone:
    """A running master and its workers."""

    master_url: str  # spark://127.0.0.1:PORT
    workers: dict[str, int]  # each worker's host and JVM process id
    logs: Path  # where every JVM's output goes

    def tail(self, chars: int = 6000) -> str:
        """The end of every JVM's log, for an assertion's message."""
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-chars:]}"
                         for p in sorted(self.logs.glob("*.log")))

    def executor_lines(self, *words: str, skip: tuple[str, ...] = (),
                       chars: int = 30000) -> str:
        """The lines of every executor's stderr (where its brokers log) holding one of
        `words` and none of `skip`, merged in time order (each line starts with its time
        stamp), at most the last `chars` of them."""
        lines = [line for path in self.logs.parent.glob("*/work/*/*/stderr")
                 for line in path.read_text(errors="replace").splitlines()
                 if any(w in line for w in words) and not any(w in line for w in skip)]
        return "\n".join(sorted(lines))[-chars:]


def _spark_class(name: str, args: list[str], host: str, log: Path,
                 extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
    home = os.path.dirname(pyspark.__file__)
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP=host, **extra_env)
    env.pop("SPARK_WORKER_DIR", None)
    with open(log, "wb") as out:
        return subprocess.Popen([os.path.join(home, "bin", "spark-class"), name, *args],
                                env=env, stdout=out, stderr=subprocess.STDOUT)


def _alive_workers(webui: str) -> set[str]:
    with urllib.request.urlopen(f"{webui}/json/", timeout=5) as answer:
        state = json.load(answer)
    return {w["host"] for w in state.get("workers", ()) if w.get("state") == "ALIVE"}


@contextmanager
def standalone_cluster(base: Path, hosts: list[str], *, cores: int,
                       memory: str = "2g") -> Iterator[Standalone]:
    """A master and one worker per host in `hosts`, each with `cores` cores, until the block
    ends; yields once every worker has registered with the master."""
    logs = base / "logs"
    logs.mkdir(parents=True)
    # Below the ephemeral range: no other test's bind(0) or outgoing connection can take them
    # before the master binds (one did: its /json/ answered another server's page).
    port = free_port_block(2)
    webui_port = port + 1
    master_url = f"spark://{MASTER_HOST}:{port}"
    webui = f"http://{MASTER_HOST}:{webui_port}"
    # Python workers on the executors run this interpreter and import this checkout.
    python_env = {"PYSPARK_PYTHON": sys.executable,
                  "PYTHONPATH": str(Path(__file__).parents[2])}
    with ExitStack() as stack:
        master = _spark_class(
            "org.apache.spark.deploy.master.Master",
            ["--host", MASTER_HOST, "--port", str(port), "--webui-port", str(webui_port)],
            MASTER_HOST, logs / "master.log", {})
        stack.callback(stop_process, master)
        workers: dict[str, int] = {}
        for host in hosts:
            machine = base / host
            (machine / "local").mkdir(parents=True)
            worker = _spark_class(
                "org.apache.spark.deploy.worker.Worker",
                ["--host", host, "--port", "0", "--webui-port", "0", "--cores", str(cores),
                 "--memory", memory, "--work-dir", str(machine / "work"), master_url],
                host, logs / f"worker-{host}.log",
                {**python_env, "SPARK_LOCAL_DIRS": str(machine / "local")})
            stack.callback(stop_process, worker)
            workers[host] = worker.pid
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if _alive_workers(webui) >= set(hosts):
                    break
            except (OSError, ValueError):  # not serving yet, or not JSON yet
                pass
            if master.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the standalone cluster did not come up:\n"
                                   + Standalone(master_url, workers, logs).tail())
            time.sleep(0.2)
        yield Standalone(master_url, workers, logs)
