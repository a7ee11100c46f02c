"""A broker's last incarnation ends before its next one starts (cluster/incarnation.py): the
supervisor waits while a process still serves the broker's registered address, goes on once
it stops, and gives up after its timeout."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from deltabus.cluster.incarnation import await_last_incarnation
from deltabus.metadata import BrokerEndpoint

SERVE = """
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
while True:
    s.accept()[0].close()
"""


@pytest.fixture
def serving() -> Iterator[tuple[subprocess.Popen, int]]:
    """A process listening on a loopback port: the last incarnation of a broker."""
    process = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE,
                               text=True)
    port = int(process.stdout.readline())
    yield process, port
    process.kill()
    process.wait()


def test_the_next_incarnation_waits_until_the_last_stops_serving(serving) -> None:
    process, port = serving
    ended = threading.Event()
    waiter = threading.Thread(target=lambda: await_last_incarnation(
        BrokerEndpoint(1, "127.0.0.1", port), 120) and ended.set())
    waiter.start()
    assert not ended.wait(0.5)  # it still serves: the supervisor waits
    process.kill()  # as Spark kills the worker of a cancelled task
    waiter.join(60)
    assert ended.is_set()


def test_past_its_timeout_the_next_incarnation_starts_anyway(serving) -> None:
    process, port = serving
    assert not await_last_incarnation(BrokerEndpoint(1, "127.0.0.1", port), 0.3)
    assert process.poll() is None


def test_nothing_to_wait_for(serving) -> None:
    process, port = serving
    process.kill()
    process.wait()
    assert await_last_incarnation(BrokerEndpoint(1, "127.0.0.1", port), 0)
    assert await_last_incarnation(None, 0)


def test_an_incarnation_that_does_not_answer_is_waited_for() -> None:
    """No answer at its address (a network partition drops the probe; the old process may
    still lead and write its tables) is no end: the supervisor waits as while it serves, up
    to its timeout. Only a refused connection ends the wait."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        held = []
        for _ in range(3):  # the accept queue full: a further connection gets no answer
            client = socket.socket()
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", port))
            held.append(client)
        try:
            with pytest.raises(TimeoutError):
                socket.create_connection(("127.0.0.1", port), 1.0)
            assert not await_last_incarnation(BrokerEndpoint(1, "127.0.0.1", port), 2.0)
        finally:
            for client in held:
                client.close()
