"""A replica whose table was lost is never served as an empty log: its broker reports it
offline, the controller keeps it out of the ISR and leadership, and the other replicas keep
their records (they would truncate to an empty leader).

Real brokers run in this process (their gRPC servers, heartbeats and replica fetchers, as in a
Spark task) around a controller server (controller_server.py); tables are real Delta tables
under tmp_path.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltabus import NewTopic, Producer
from deltabus.cluster.broker import Broker, BrokerSpec
from deltabus.log_tables.layout import replica_path
from tests.cluster.controller_server import ControllerServer, serve
from tests.conftest import read_records, wait_until

TOPIC = "orders"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ControllerServer]:
    yield from serve(tmp_path)


@pytest.fixture
def brokers(server: ControllerServer) -> Iterator[dict[int, Broker]]:
    running: dict[int, Broker] = {}
    yield running
    for broker in running.values():
        broker.close()


def start(server: ControllerServer, brokers: dict[int, Broker], broker_id: int) -> None:
    """Start a broker and wait until it is registered and caught up (unfenced)."""
    broker = brokers[broker_id] = Broker(BrokerSpec(broker_id, server.node, server.config))
    broker.start()
    wait_until(lambda: broker_id in server.controller.live_brokers(),
               f"broker {broker_id} to be live", 30)


def stop(server: ControllerServer, brokers: dict[int, Broker], broker_id: int) -> None:
    """Stop a broker as a crash would end it: no controlled shutdown, then fenced."""
    brokers.pop(broker_id).close()
    server.controller.fence_broker(broker_id, "stopped by the test")


def test_a_leader_whose_table_was_lost_does_not_lead_and_followers_keep_their_records(
        server: ControllerServer, brokers: dict[int, Broker]) -> None:
    controller = server.controller
    for b in (0, 1):
        start(server, brokers, b)
    controller.create_topics([NewTopic(TOPIC, replica_assignment={0: [0, 1]})],
                             timeout_ms=10_000)
    with Producer(server.address, acks="all") as producer:  # both replicas hold them
        for i in range(10):
            producer.send(TOPIC, f"v{i}".encode(), partition=0).get(30)
    stop(server, brokers, 1)  # leaves the ISR
    stop(server, brokers, 0)  # the last in-sync replica: the partition goes offline
    shutil.rmtree(replica_path(server.config.root, TOPIC, 0, 0))  # and its table is lost

    start(server, brokers, 0)  # it cannot open its replica, and says so
    start(server, brokers, 1)
    state = controller.image().partition(TOPIC, 0)
    assert (state.leader, state.isr) == (-1, (0,))  # not an empty log led by 0
    follower = DeltaTable(replica_path(server.config.root, TOPIC, 0, 1))
    assert follower.to_pyarrow_table().num_rows == 10  # nothing truncated

    # The operator accepts what the out-of-sync replica holds, as Kafka's unclean election:
    # 1 is elected, never 0, and every record is there.
    assert controller.elect_leaders("unclean", [(TOPIC, 0)]) == {(TOPIC, 0): None}
    assert controller.image().partition(TOPIC, 0).leader == 1
    records = read_records(server.address, TOPIC, 1, 10, timeout_s=30)
    assert [r.value for r in records] == [f"v{i}".encode() for i in range(10)]
