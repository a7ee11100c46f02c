"""Brokers spread over the machines of a Spark standalone cluster, their data on object storage
(issue 18): a master and three workers, each simulated machine on a loopback address of its own
(tests/cluster/standalone.py), the root on the S3 emulator, and one worker's JVM SIGKILLed
under acks=all load (standalone_job.py runs the driver). Before, every broker bound and
advertised the driver's address, whatever machine it ran on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.standalone import standalone_cluster
from tests.cluster.test_local_cluster import job_log

JOB = Path(__file__).with_name("standalone_job.py")
MACHINES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


@pytest.mark.spark  # a standalone cluster and a driver of its own
@pytest.mark.timeout(900)  # five JVMs on two cores, an executor lost and brokers relaunched
def test_brokers_on_other_machines_advertise_their_own_address_and_survive_a_worker_kill(
        tmp_path: Path, s3: Any) -> None:
    root = s3.create_bucket("standalone") + "/deltabus"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(JOB.parents[2]))
    with standalone_cluster(tmp_path / "spark", MACHINES, cores=2) as spark:
        args = {"root": root, "storage_options": s3.options(),
                "master_url": spark.master_url, "workers": spark.workers}
        # The job dumps its threads' stacks and exits after 780 s, so a hang shows where.
        done = subprocess.run([sys.executable, str(JOB), json.dumps(args), "780"], env=env,
                              capture_output=True, text=True, timeout=840)
        assert done.returncode == 0, job_log(done.stderr) + spark.tail()
        # What the brokers said of the topic's partitions, read before the machines go.
        brokers_log = spark.executor_lines(
            "t-0", "t-1", "t-2", "registered", "fenced", "not started", "attempt",
            skip=("NOT_LEADER_OR_FOLLOWER",))  # a follower's retries while leaders change
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # Every broker listener is on a worker's own address, none on the driver's.
    hosts = {e.rsplit(":", 1)[0] for listeners in result["listeners"].values()
             for e in listeners}
    assert hosts <= set(MACHINES) and len(hosts) >= 2, result["listeners"]
    kill = result["worker_kill"]
    # The killed machine's brokers came back on the machines left.
    assert kill["lost_brokers"], kill
    assert all(kill["hosts_after"][str(b)] != kill["killed_machine"]
               for b in kill["lost_brokers"]), kill
    # Every record acknowledged with acks=all is there once, in send order.
    assert kill["acked"] > 400 and not kill["failed"], kill
    assert kill["lost"] == 0 and kill["duplicates"] == 0 and kill["in_order"], (
        loss_evidence(kill, done.stderr, brokers_log))
    assert kill["new_leader_in_old_isr"], kill


def loss_evidence(kill: dict[str, Any], job_stderr: str, brokers_log: str) -> str:
    """A failed loss check's message: the findings (per partition, where the missing records
    were and what the read found: acked_load.loss_by_partition; how the read ended; the
    metadata's history), then the driver's log (the controller's elections and ISR changes,
    the catch-up jobs) and the brokers' lines on the topic, whatever the job's exit code."""
    history = kill.pop("history", [])
    return "\n".join([json.dumps(kill, indent=1), "== metadata history", *history,
                      "== the job's stderr", job_log(job_stderr)[-15000:],
                      "== the brokers' lines on the topic", brokers_log])
