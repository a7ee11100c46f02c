"""Long-polling Kafka fetches hold no threads (issue 17): a real broker in this process, with
its Kafka door, takes 300 Fetches waiting on 300 connections (more than the 64 threads the door
once gave long polls) with no thread made for them; a produce wakes every one with the record,
long before its max wait; fetches nothing wakes answer at their max wait, not before. No Spark:
the broker runs around a controller server (controller_server.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from deltabus import config as cfg
from deltabus.cluster.broker import Broker
from tests.cluster.controller_server import ControllerServer, leading_broker
from tests.conftest import wait_until
from tests.kafka.raw_frames import (
    FETCH,
    PRODUCE,
    fetch,
    produce,
    read_response,
    room_for_connections,
)
from tests.kafka.test_kafka_network import values

FETCHES = 300  # long polls at once, each on a connection of its own
LONG_WAIT_MS = 60_000  # the most a broker waits (cfg.FETCH_WAIT_MS_MAX)
SHORT_WAIT_MS = 3_000
# Threads the door and the broker may make while the fetches wait, whatever their number: the
# request handlers, the delayed fetches' completion threads, and a few more for what runs
# beside (heartbeats, the controller server's calls).
THREADS_MADE_MAX = (cfg.SocketServerConfig().num_io_threads + cfg.DELAYED_FETCH_COMPLETION_THREADS
                    + 8)


@pytest.fixture(scope="module", autouse=True)
def descriptors() -> None:
    """Room for the connections' two ends in this process."""
    room_for_connections(FETCHES)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[Broker, tuple[str, int]]]:
    """Broker 0, leading the test's topics, and its Kafka door's address."""
    server = ControllerServer(tmp_path, kafka_port=0)
    with leading_broker(server, ("woken", "expired")) as broker:
        node = server.controller.image().broker(0)
        assert node is not None and node.kafka_port > 0
        yield broker, (node.host, node.kafka_port)


def long_polls(address: tuple[str, int], topic: str, max_wait_ms: int,
               timeout_s: float) -> tuple[list[socket.socket], list[float]]:
    """FETCHES connections, each with a Fetch of `topic` from offset 0 waiting up to
    `max_wait_ms`; and when each was sent (time.monotonic())."""
    socks, sent = [], []
    for i in range(FETCHES):
        sock = socket.create_connection(address, timeout=timeout_s)
        socks.append(sock)
        sent.append(time.monotonic())
        sock.sendall(fetch(topic, 0, max_wait_ms, correlation_id=i))
    return socks, sent


def test_a_produce_wakes_every_waiting_fetch_and_no_thread_waits_for_them(broker) -> None:
    leader, address = broker
    before = threading.active_count()
    # Read well before their max wait, or the socket times out: an answer means it ended early.
    socks, _ = long_polls(address, "woken", LONG_WAIT_MS, timeout_s=LONG_WAIT_MS / 2000)
    try:
        wait_until(lambda: leader.fetches_waiting() == FETCHES, "every fetch waiting", 60)
        assert threading.active_count() - before <= THREADS_MADE_MAX
        with socket.create_connection(address, timeout=30) as producer:
            producer.sendall(produce("woken", [b"wake up"], correlation_id=1))
            _, answer = read_response(producer, PRODUCE, 9)
        assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none
        for i, sock in enumerate(socks):
            correlation_id, body = read_response(sock, FETCH, 12)
            (partition,) = body.responses[0].partitions
            assert correlation_id == i and partition.error_code == ErrorCode.none
            assert values(partition.records) == [b"wake up"]
        assert leader.fetches_waiting() == 0
    finally:
        for sock in socks:
            sock.close()


def test_waiting_fetches_answer_at_their_max_wait_and_not_before(broker) -> None:
    leader, address = broker
    before = threading.active_count()
    socks, sent = long_polls(address, "expired", SHORT_WAIT_MS, timeout_s=60)
    try:
        wait_until(lambda: leader.fetches_waiting() > 0, "fetches waiting", 60)
        assert threading.active_count() - before <= THREADS_MADE_MAX
        for i, sock in enumerate(socks):
            correlation_id, body = read_response(sock, FETCH, 12)
            waited_s = time.monotonic() - sent[i]
            (partition,) = body.responses[0].partitions
            assert correlation_id == i and partition.error_code == ErrorCode.none
            assert values(partition.records) == []
            # Not before the max wait; and late by no more than a loaded machine explains.
            assert SHORT_WAIT_MS / 1000 <= waited_s < 10 * SHORT_WAIT_MS / 1000
    finally:
        for sock in socks:
            sock.close()
