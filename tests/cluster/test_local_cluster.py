"""The cluster works the same when brokers live in separate executor processes (local-cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import free_port

JOB = Path(__file__).with_name("local_cluster_job.py")


def test_brokers_in_separate_executors_survive_a_kill(tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_WORKER_DIR=str(tmp_path / "work"), SPARK_LOCAL_IP="127.0.0.1",
               PYTHONPATH=str(JOB.parents[2]))
    done = subprocess.run([sys.executable, str(JOB), str(tmp_path / "data"), str(free_port())],
                          env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["records"] == 101  # 100 before the kill, 1 after, none lost
    assert result["executors"] >= 4  # the driver's block manager plus separate executors
    assert result["pids"] == 3
