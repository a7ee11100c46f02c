"""Which address a broker binds: the driver's in local mode, its executor's own elsewhere
(`deltabus.cluster.executor_process`). The many-machine case end to end is
test_standalone_cluster.py; here a process named like Spark's executor JVM stands in for one,
so the /proc walk and the `--hostname` argument are checked on their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from deltabus.cluster.executor_process import broker_host, executor_host, local_host

CHILD = ("import json; from deltabus.cluster.executor_process import *; "
         "print(json.dumps([executor_host(), local_host(), broker_host('127.0.0.1'), "
         "broker_host('0.0.0.0')]))")
# A parent whose command line reads like an executor JVM's, running the child above.
PARENT = ("import subprocess, sys; "
          f"sys.exit(subprocess.run([sys.executable, '-c', {CHILD!r}]).returncode)")


def test_a_broker_in_local_mode_binds_the_clusters_host() -> None:
    assert executor_host() is None  # pytest runs under no executor JVM
    assert broker_host("127.0.0.5") == "127.0.0.5"
    assert broker_host("0.0.0.0") == "0.0.0.0"


def test_a_broker_under_an_executor_binds_the_executors_own_host() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DELTABUS_HOST"}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"  # the driver's, inherited: not this machine's
    out = subprocess.run(
        [sys.executable, "-c", PARENT, "org.apache.spark.executor.CoarseGrainedExecutorBackend",
         "--driver-url", "spark://CoarseGrainedScheduler@127.0.0.1:7078",
         "--hostname", "127.0.0.9", "--cores", "2"],
        env=env, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["127.0.0.9", "127.0.0.9", "127.0.0.9", "0.0.0.0"]


def test_deltabus_host_overrides_the_executors_host() -> None:
    env = dict(os.environ, DELTABUS_HOST="127.0.0.7")
    out = subprocess.run(
        [sys.executable, "-c", PARENT, "CoarseGrainedExecutorBackend", "--hostname", "127.0.0.9"],
        env=env, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["127.0.0.9", "127.0.0.7", "127.0.0.7", "0.0.0.0"]
    assert local_host()  # and here, in local mode, some address
