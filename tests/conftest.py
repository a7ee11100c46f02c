"""Shared fixtures: one SparkSession and one 3-broker deltabus cluster per test session.

Timeouts are shortened through the environment (DELTABUS_*_MS) before any cluster starts, so
failure detection in tests takes seconds, not Kafka's defaults.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("DELTABUS_BROKER_HEARTBEAT_INTERVAL_MS", "200")
os.environ.setdefault("DELTABUS_BROKER_SESSION_TIMEOUT_MS", "3000")
os.environ.setdefault("DELTABUS_STARTUP_TIMEOUT_MS", "90000")

# Shared cluster: 3 brokers; a second, short-lived cluster in restart tests: 3 more; 2 spare.
SPARK_TASK_SLOTS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from deltabus import local_spark

    session = local_spark(SPARK_TASK_SLOTS, app_name="deltabus-tests", ui=False)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(spark: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from deltabus import Cluster

    root = tmp_path_factory.mktemp("cluster")
    c = Cluster(spark, root=str(root), brokers=3, port=free_port()).start()
    yield c
    c.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test."""
    return "t-" + request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:100]
