"""Brokers join and leave a cluster whose executors are separate JVMs (issue 41's proof):
3 -> 6 -> 3 brokers on local-cluster and on a standalone master with workers on 127.0.0.2-.4,
under acks=all producers on both doors and a consumer group (scaling_job.py runs the driver);
and, under Spark dynamic allocation, executors that come and go with the brokers
(dynamic_allocation_job.py).

Behind `make soak`, not `make test`: each run starts a Spark cluster of its own with seven
executor JVMs and takes five to eleven minutes on two cores, and beside the suite's other heavy
modules it starved them (a broker killer's session timeouts). `make test` scales a cluster
2 -> 3 -> 2 in its own process under the same load (tests/cluster/test_scaling.py). The file's
name is outside pytest's test_*.py pattern, so only `make soak`, naming it, collects it."""

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

JOB = Path(__file__).with_name("scaling_job.py")
MACHINES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


def run_job(master: str, root: Path, dump_after_s: int, job: Path = JOB) -> dict[str, Any]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(JOB.parents[2]))
    # The job dumps its threads' stacks and exits after `dump_after_s`, so a hang shows where.
    args = [master] if job == JOB else []
    done = subprocess.run([sys.executable, str(job), *args, str(root), str(dump_after_s)],
                          env=env, capture_output=True, text=True, timeout=dump_after_s + 60)
    assert done.returncode == 0, job_log(done.stderr)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps({step: result[step] for step in ("start", "out", "in")}))  # the spreads
    return result


def check(result: dict[str, Any]) -> None:
    for step, members in (("out", [0, 1, 2, 3, 4, 5]), ("in", [0, 1, 2])):
        done = result[step]
        assert done["members"] == members and done["racks_apart"], done
        # counts within 10 % of the mean wherever the racks leave room for it
        assert done["balanced"] or not done["even_racks"], done
        assert "replica count" not in done["unmet"] or not done["even_racks"], done
        assert "leader count" not in done["unmet"], done
    assert result["live"] == [0, 1, 2]
    grpc, kafka, group = result["grpc"], result["kafka"], result["group"]
    assert (grpc["lost"], grpc["duplicates"], grpc["in_order"]) == (0, 0, True), grpc
    assert not grpc["failed"] and grpc["acked"] > 500, grpc
    assert (kafka["lost"], kafka["failed"]) == (0, []) and kafka["acked"] > 100, kafka
    assert group["missing"] == 0 and group["read"] == group["distinct"], group
    assert group["resets"] == 0, group


@pytest.mark.spark  # the job runs a local-cluster of its own
@pytest.mark.timeout(1600)  # 670 s for local-cluster in a loaded full suite
def test_scaling_3_to_6_to_3_on_local_cluster(tmp_path: Path) -> None:
    check(run_job("local-cluster[4,2,1024]", tmp_path / "data", 1500))


@pytest.mark.spark  # a standalone cluster and a driver of its own
@pytest.mark.timeout(1600)
def test_scaling_3_to_6_to_3_on_a_standalone_master(tmp_path: Path) -> None:
    with standalone_cluster(tmp_path / "spark", MACHINES, cores=3) as spark:
        result = run_job(spark.master_url, tmp_path / "data", 1500)
    check(result)


@pytest.mark.spark  # a local-cluster of its own, under dynamic allocation
@pytest.mark.timeout(1000)
def test_executors_follow_the_brokers_under_dynamic_allocation(tmp_path: Path) -> None:
    """2 -> 4 -> 2 brokers, each on an executor of one core: Spark adds executors for the new
    brokers (and, for a while, for the moves' catch-up tasks), and gives back every executor
    no broker holds after its idle timeout."""
    result = run_job("", tmp_path / "data", 900, JOB.with_name("dynamic_allocation_job.py"))
    assert (result["start"], result["out"], result["in"]) == (2, 4, 2), result
    assert result["out_peak"] >= 4, result
    assert (result["out_status"], result["in_status"]) == ("done", "done"), result
    assert result["live"] == [0, 1]
    grpc = result["grpc"]
    assert (grpc["lost"], grpc["duplicates"], grpc["in_order"]) == (0, 0, True), grpc
    assert not grpc["failed"] and grpc["acked"] > 200, grpc
