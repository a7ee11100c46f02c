"""Replication holds when brokers live in separate executor processes (local-cluster) and whole
executors are killed with SIGKILL (see local_cluster_job.py for the scenario)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("local_cluster_job.py")


def job_log(stderr: str) -> str:
    """The job's stderr without the JVM's stack traces, whose flood (a local-cluster relaunching
    executors while it shuts down) would push the job's own progress and traceback out of view."""
    lines = [line for line in stderr.splitlines()
             if not line.startswith("\tat ") and "Shutdown hooks cannot be modified" not in line
             and "Failed to launch executor" not in line]
    return "\n".join(lines)[-20000:]


@pytest.mark.spark  # the job runs a local-cluster of its own
@pytest.mark.timeout(600)  # four JVMs on two cores: SIGKILLs, relaunches and catch-up jobs
def test_replicated_cluster_in_separate_executors_survives_executor_kills(tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_WORKER_DIR=str(tmp_path / "work"), SPARK_LOCAL_IP="127.0.0.1",
               PYTHONPATH=str(JOB.parents[2]))
    # The job dumps its threads' stacks and exits after 540 s, so a hang shows where it is.
    done = subprocess.run([sys.executable, str(JOB), str(tmp_path / "data"), "540"], env=env,
                          capture_output=True, text=True, timeout=570)
    assert done.returncode == 0, job_log(done.stderr)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    kill = result["leader_kill"]
    # Every record acknowledged with acks=all is there once, in send order, on every replica.
    assert kill["acked"] > 1000 and not kill["failed"], kill
    assert kill["lost"] == 0 and kill["duplicates"] == 0 and kill["in_order"], kill
    assert kill["new_leader_in_old_isr"] and kill["epoch_bumped"], kill
    # With a follower down, 2 in-sync replicas still satisfy min.insync.replicas=2.
    assert result["follower_kill"]["produced_while_follower_down"] == 200
    # With two of three down, acks=all is refused, and what was committed stays readable.
    down = result["two_down"]
    assert down["refused_with"] == "NOT_ENOUGH_REPLICAS"
    assert down["read_while_down"] == down["committed"] and down["refused_record_absent"]
    assert result["executors"] >= 4  # the driver's block manager plus separate executors
    assert result["pids"] == 3
