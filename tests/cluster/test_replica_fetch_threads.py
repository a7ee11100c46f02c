"""Follower fetches have threads of their own on a leader, which no client can take.

grpcio's server is one thread pool, and a client's Fetch long poll holds its thread up to its
max_wait_ms. Were follower fetches served by the pool that serves clients, enough clients
parked in long polls on a leader would starve its followers, which would drop out of the ISR
and stop acks=all produce. Brokers serve them on the inter-broker listener, a server of its
own, in the default configuration too (deltabus.listeners).

Real brokers run in this process around a controller server (controller_server.py), each
with a client pool of 4 threads: 4 clients parked in Fetch long polls take all of the leader's,
and records appended meanwhile still reach the follower (the high watermark moves) for longer
than replica.lag.time.max.ms, with the follower in the ISR all along.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from deltabus import NewTopic
from deltabus.cluster.broker import Broker, BrokerSpec
from deltabus.log_tables.partition_log import LATEST_TIMESTAMP
from deltabus.records import ProducerState
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from tests.cluster.controller_server import ControllerServer
from tests.conftest import client_pool_is_full, wait_until

TOPIC = "orders"
CLIENT_THREADS = 4  # each broker's gRPC pool for clients (grpc_threads)
LAG_TIME_MAX_MS = 3_000
PARKED_MS = 60_000  # the parked fetches' max_wait_ms (the most a broker waits): beyond the test


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ControllerServer]:
    server = ControllerServer(tmp_path, grpc_threads=CLIENT_THREADS,
                              replica_lag_time_max_ms=LAG_TIME_MAX_MS)
    yield server
    server.stop()


@pytest.fixture
def brokers(server: ControllerServer) -> Iterator[list[Broker]]:
    running = [Broker(BrokerSpec(b, server.node, server.config)) for b in (0, 1)]
    try:
        for broker in running:
            broker.start()
        wait_until(lambda: sorted(server.controller.live_brokers()) == [0, 1],
                   "both brokers to be live", 30)
        yield running
    finally:
        for broker in running:
            broker.close()


def client_address(server: ControllerServer, broker_id: int) -> str:
    """Where clients reach the broker: its endpoint of the cluster's client gRPC listener."""
    listener = server.config.listener_config().client_grpc()[0].name
    node = server.controller.image().broker(broker_id)
    assert node is not None
    seen = node.on_listener(listener)
    assert seen is not None
    return seen.address


def park(stub: pb_grpc.DeltaBusStub, offset: int, count: int) -> list[threading.Thread]:
    """`count` clients in Fetch long polls for more than will come, each holding a leader
    thread."""
    def parked() -> None:
        try:
            stub.Fetch(pb.FetchRequest(
                max_wait_ms=PARKED_MS, min_bytes=1 << 20, partitions=[pb.FetchPartition(
                    topic=TOPIC, partition=0, fetch_offset=offset)]), timeout=PARKED_MS / 1000)
        except grpc.RpcError:  # the broker stopped under it
            pass

    threads = [threading.Thread(target=parked, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def test_followers_keep_fetching_while_clients_hold_every_leader_thread(
        server: ControllerServer, brokers: list[Broker]) -> None:
    controller = server.controller
    controller.create_topics([NewTopic(TOPIC, replica_assignment={0: [0, 1]})],
                             timeout_ms=10_000)
    leader = brokers[0]
    wait_until(lambda: controller.image().partition(TOPIC, 0).isr == (0, 1),
               "the follower to join the ISR", 30)
    with grpc.insecure_channel(client_address(server, 0)) as channel:
        stub = pb_grpc.DeltaBusStub(channel)
        parked = park(stub, 0, CLIENT_THREADS)
        wait_until(lambda: client_pool_is_full(stub),
                   "the parked fetches to hold every client thread of the leader", 30)

        # For twice replica.lag.time.max.ms, each record appended on the leader reaches the
        # follower (the high watermark moves to it) and the follower stays in the ISR.
        until = time.monotonic() + 2 * LAG_TIME_MAX_MS / 1000
        appended = 0
        while time.monotonic() < until or appended < 2:
            leader.produce(TOPIC, 0, pa.table({"value": [b"v%d" % appended]}), acks=1,
                           producer=ProducerState()).result(30)
            appended += 1
            wait_until(lambda n=appended: leader.list_offsets(
                TOPIC, 0, LATEST_TIMESTAMP)[0] >= n,
                f"the follower to fetch record {appended - 1}", 30)
            assert controller.image().partition(TOPIC, 0).isr == (0, 1)
        assert all(thread.is_alive() for thread in parked)  # held all along
        assert client_pool_is_full(stub)
