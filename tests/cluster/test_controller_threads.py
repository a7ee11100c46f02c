"""Broker heartbeats have threads of their own on the driver, which no client can take.

grpcio's server is one thread pool, and a JoinGroup holds its thread until the rebalance ends
(up to the rebalance timeout). Were the brokers' lifecycle calls served by the pool that serves
clients, enough clients parked in JoinGroup would starve the heartbeats until every broker was
fenced. The driver serves them on its controller listener, a server of its own, in the default
configuration too (deltabus.listeners).

A real cluster (Spark broker tasks, the driver's doors, its session checker) with a short broker
session and a driver whose client pool holds 4 threads: 4 clients parked in JoinGroup take them
all, and the brokers go on heartbeating and taking in metadata for longer than their session
timeout, unfenced.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from deltabus import Cluster, NewTopic
from deltabus import config as cfg
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from tests.conftest import client_pool_is_full, wait_until

CLIENT_THREADS = 4  # the driver's client pool: max(grpc_threads, coordinator_threads)
SESSION_TIMEOUT_MS = 3_000  # as the shared cluster's (tests/conftest.py)
HEARTBEAT_INTERVAL_MS = 200
PARKED_MS = 120_000  # the parked joins' rebalance timeout: they outlast the test
GROUP = "parked"


def join(stub: pb_grpc.DeltaBusStub, member_id: str = "") -> pb.JoinGroupResponse:
    return stub.JoinGroup(pb.JoinGroupRequest(
        group_id=GROUP, member_id=member_id, session_timeout_ms=PARKED_MS,
        rebalance_timeout_ms=PARKED_MS, protocol_type="consumer",
        protocols=[pb.JoinGroupProtocol(name="range", metadata=b"")]),
        timeout=PARKED_MS / 1000)


def stable_member(stub: pb_grpc.DeltaBusStub) -> None:
    """One member that joins, syncs and then never comes back: every later JoinGroup of the
    group waits for it until the rebalance timeout."""
    member_id = join(stub).member_id  # MEMBER_ID_REQUIRED hands one out
    joined = join(stub, member_id)
    assert joined.error_code == 0, joined.error_message
    synced = stub.SyncGroup(pb.SyncGroupRequest(
        group_id=GROUP, generation_id=joined.generation_id, member_id=member_id), timeout=30)
    assert synced.error_code == 0, synced.error_message


def park(stub: pb_grpc.DeltaBusStub, count: int) -> list[threading.Thread]:
    """`count` clients in JoinGroup long polls, each holding a driver thread."""
    member_ids = [join(stub).member_id for _ in range(count)]
    assert all(member_ids)

    def parked(member_id: str) -> None:
        try:
            join(stub, member_id)
        except grpc.RpcError:  # the cluster stopped under it
            pass

    threads = [threading.Thread(target=parked, args=(m,), daemon=True) for m in member_ids]
    for thread in threads:
        thread.start()
    return threads


@pytest.mark.timeout(300)
def test_brokers_keep_heartbeating_while_clients_hold_every_driver_thread(
        spark, tmp_path: Path) -> None:
    cluster = Cluster(spark, root=str(tmp_path), brokers=2, port=0, kafka_port=-1,
                      grpc_threads=CLIENT_THREADS,
                      broker_heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
                      broker_session_timeout_ms=SESSION_TIMEOUT_MS,
                      group=cfg.GroupConfig(coordinator_threads=CLIENT_THREADS,
                                            group_min_session_timeout_ms=1_000,
                                            group_initial_rebalance_delay_ms=0)).start()
    try:
        controller = cluster.controller
        assert controller is not None
        with grpc.insecure_channel(cluster.bootstrap_servers) as channel:
            stub = pb_grpc.DeltaBusStub(channel)
            stable_member(stub)
            parked = park(stub, CLIENT_THREADS)
            wait_until(lambda: client_pool_is_full(stub),
                       "the parked joins to hold every client thread of the driver", 30)

            # For longer than a session timeout, the brokers take in each metadata change
            # (through their heartbeats) and stay live, never fenced nor relaunched.
            until = time.monotonic() + 2 * SESSION_TIMEOUT_MS / 1000
            created = 0
            while time.monotonic() < until or created < 2:
                controller.create_topics([NewTopic(f"t{created}", 1, 2)], timeout_ms=0)
                created += 1
                version = controller.image().version
                wait_until(lambda v=version: all(controller.applied_version(b) >= v
                                                 for b in (0, 1)),
                           f"both brokers to apply metadata version {version}", 30)
                assert sorted(controller.live_brokers()) == [0, 1]
            assert cluster.relaunches == {0: 0, 1: 0}
            assert all(thread.is_alive() for thread in parked)  # held all along
            assert client_pool_is_full(stub)
    finally:
        cluster.stop()
