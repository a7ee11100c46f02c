"""A broker's last incarnation ends before its next one starts (cluster/incarnation.py): a
process still serving the broker's registered address on this machine is killed when it is
one of Spark's Python workers, and only waited for when it is not; a broker whose process is
gone is not waited for at all."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from deltabus.cluster.incarnation import end_last_incarnation
from deltabus.metadata import BrokerEndpoint

SERVE = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    c.close()
"""


@pytest.fixture
def serving() -> Iterator[tuple[subprocess.Popen, int]]:
    """A process listening on a loopback port, named like one of Spark's Python workers
    (`-m pyspark.daemon` stands in its command line, as an argument the script ignores)."""
    process = subprocess.Popen([sys.executable, "-c", SERVE, "-m", "pyspark.daemon"],
                               stdout=subprocess.PIPE, text=True)
    port = int(process.stdout.readline())
    yield process, port
    process.kill()
    process.wait()


def test_a_spark_worker_still_serving_is_killed(serving) -> None:
    process, port = serving
    assert end_last_incarnation(BrokerEndpoint(1, "127.0.0.1", port), process.pid, 60)
    assert process.wait(30) != 0  # killed
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), 1)


def test_a_process_that_is_not_a_spark_worker_is_only_waited_for(serving) -> None:
    process, port = serving
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not end_last_incarnation(BrokerEndpoint(1, "127.0.0.1", port), other.pid, 0.5)
        assert process.poll() is None and other.poll() is None  # neither was killed
    finally:
        other.kill()
        other.wait()


def test_a_broker_whose_process_is_gone_is_not_waited_for(serving) -> None:
    process, port = serving
    process.kill()
    process.wait()
    assert end_last_incarnation(BrokerEndpoint(1, "127.0.0.1", port), process.pid, 0)
    assert end_last_incarnation(None, None, 0)
