"""ClusterClient, the connections and metadata every client shares, against the FakeCluster:
bootstrap parsing and fail-over, cached metadata and its refresh, leaders, and errors from the
wire raised as their classes."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from deltabus import errors
from deltabus.client.cluster_client import ClusterClient, parse_bootstrap
from deltabus.metadata import NO_LEADER
from deltabus.records import produce_batch, to_ipc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from tests.client.fake_cluster import FakeCluster


@pytest.fixture
def client(fake: FakeCluster) -> Iterator[ClusterClient]:
    c = ClusterClient(fake.bootstrap_servers, retry_backoff_ms=10)
    yield c
    c.close()


def dead_address() -> str:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_bootstrap_servers_are_parsed_and_checked() -> None:
    assert parse_bootstrap(" a:1, b:2 ,") == ["a:1", "b:2"]
    assert parse_bootstrap(["a:1"]) == ["a:1"]
    with pytest.raises(errors.ClientError, match="empty"):
        parse_bootstrap(" , ")
    with pytest.raises(errors.ClientError, match="not host:port"):
        parse_bootstrap("localhost")
    with pytest.raises(errors.ClientError, match="not host:port"):
        parse_bootstrap("localhost:http")


def test_a_dead_bootstrap_server_is_skipped(fake: FakeCluster) -> None:
    fake.create_topic("t", 1)
    client = ClusterClient(f"{dead_address()},{fake.brokers[1].address}")
    try:
        assert "t" in client.refresh_metadata().topics
    finally:
        client.close()


def test_no_live_bootstrap_server_is_a_network_error() -> None:
    client = ClusterClient(dead_address(), request_timeout_ms=2000)
    try:
        with pytest.raises(errors.NetworkError):
            client.refresh_metadata()
    finally:
        client.close()


def test_metadata_is_cached_until_max_age_or_a_refresh(fake: FakeCluster,
                                                       client: ClusterClient) -> None:
    fake.create_topic("first", 1)
    assert set(client.metadata().topics) == {"first"}
    fake.create_topic("second", 1)
    assert set(client.metadata().topics) == {"first"}  # younger than metadata_max_age_ms
    assert set(client.metadata(max_age_ms=0).topics) == {"first", "second"}
    fake.create_topic("third", 1)
    assert set(client.refresh_metadata().topics) == {"first", "second", "third"}
    assert client.image.version == fake.image().version


def test_leaders_come_from_cached_metadata(fake: FakeCluster, client: ClusterClient) -> None:
    fake.create_topic("t", 2)
    client.refresh_metadata()
    broker, state = client.leader("t", 1)
    assert broker == fake.brokers[1] and state.leader_epoch == 0
    fake.move_leader("t", 1, 0)
    assert client.leader("t", 1)[0] == fake.brokers[1]  # stale until refreshed
    client.refresh_metadata()
    broker, state = client.leader("t", 1)
    assert broker == fake.brokers[0] and state.leader_epoch == 1
    fake.move_leader("t", 1, NO_LEADER)
    client.refresh_metadata()
    with pytest.raises(errors.LeaderNotAvailableError):
        client.leader("t", 1)
    with pytest.raises(errors.UnknownTopicOrPartitionError, match="it has 2"):
        client.leader("t", 2)
    with pytest.raises(errors.UnknownTopicOrPartitionError, match="'other'"):
        client.leader("other", 0)


def test_a_stale_leader_answers_not_leader_and_a_refresh_finds_the_new_one(
        fake: FakeCluster, client: ClusterClient) -> None:
    fake.create_topic("t", 1)
    client.refresh_metadata()
    fake.move_leader("t", 0, 1)
    old, _ = client.leader("t", 0)
    request = pb.ProduceRequest(acks=1, partitions=[pb.PartitionProduceData(
        topic="t", partition=0, arrow_records=to_ipc(produce_batch([b"v"])))])
    answer = client.call(old.address, "Produce", request).partitions[0]
    error = errors.error_for_code(answer.error_code, answer.error_message)
    assert isinstance(error, errors.NotLeaderOrFollowerError) and error.invalid_metadata
    client.refresh_metadata()
    new, _ = client.leader("t", 0)
    assert new != old
    assert client.call(new.address, "Produce", request).partitions[0].error_code == 0
    assert fake.values("t", 0) == [b"v"]


def test_partitions_for_waits_for_a_topic_then_gives_up(fake: FakeCluster,
                                                        client: ClusterClient) -> None:
    with pytest.raises(errors.UnknownTopicOrPartitionError, match="after 100 ms"):
        client.partitions_for("missing", wait_ms=100)
    assert client.partitions_for("created", wait_ms=100, allow_auto_create=True) == 1
    assert "created" in fake.image().topics


def test_a_request_level_error_is_raised_as_its_class(fake: FakeCluster,
                                                      client: ClusterClient) -> None:
    with pytest.raises(errors.InvalidRequiredAcksError, match="acks must be"):
        client.call(fake.brokers[0].address, "Produce", pb.ProduceRequest(acks=7))
    with pytest.raises(errors.InvalidRequiredAcksError):  # not retriable: no fail-over
        client.call_any("Produce", pb.ProduceRequest(acks=7))


def test_a_retriable_error_fails_over_to_the_next_server(fake: FakeCluster,
                                                         client: ClusterClient) -> None:
    fake.create_topic("t", 1)
    fault = fake.inject("metadata", errors.NotControllerError)  # retriable
    assert "t" in client.refresh_metadata().topics  # the second bootstrap server answered
    assert fault.times == 0


def test_a_closed_client_refuses_calls(client: ClusterClient) -> None:
    client.close()
    with pytest.raises(errors.ClientError, match="closed"):
        client.refresh_metadata()
