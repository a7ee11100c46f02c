"""The internal API answers only the cluster's own brokers (issue 16's attacks, which each
succeeded before): a client that reaches a port cannot register an impostor, heartbeat one
unfenced, change an ISR, or fetch as a follower to move the high watermark. Each is refused with
CLUSTER_AUTHORIZATION_FAILED, nothing changes, and the real brokers carry on."""

from __future__ import annotations

import grpc
import pytest

from deltabus import AdminClient, NewTopic, Producer
from deltabus.rpc.inter_broker import CREDENTIAL_KEY
from deltabus.rpc.status import ERROR_CODE_KEY
from deltabus.rpc.v1 import internal_pb2 as ipb
from deltabus.rpc.v1 import internal_pb2_grpc as ipb_grpc

CLUSTER_AUTHORIZATION_FAILED = 31
WRONG = ((CREDENTIAL_KEY, "guessed"),)


def _refused(call, request, metadata=()) -> None:
    """The call fails PERMISSION_DENIED with Kafka's CLUSTER_AUTHORIZATION_FAILED."""
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30, metadata=metadata)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    trailers = dict(info.value.trailing_metadata() or ())
    assert trailers.get(ERROR_CODE_KEY) == str(CLUSTER_AUTHORIZATION_FAILED)


def _leader_and_follower(cluster, topic: str) -> tuple[int, int]:
    state = cluster.controller.image().partition(topic, 0)
    return state.leader, next(r for r in state.replicas if r != state.leader)


def test_an_impostor_cannot_register_or_heartbeat_and_the_real_broker_carries_on(
        cluster, topic_name):
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    leader, _ = _leader_and_follower(cluster, topic_name)
    pids = cluster.broker_pids()
    impostor = ipb.RegisterBrokerRequest(broker_id=leader, host="127.0.0.1", port=1, pid=1,
                                         incarnation_id="impostor")
    # The bootstrap (the clients' listener) does not serve the lifecycle API at all: it has
    # a listener of its own, CONTROLLER, whose threads no client call can take.
    with grpc.insecure_channel(cluster.bootstrap_servers) as channel:
        with pytest.raises(grpc.RpcError) as info:
            ipb_grpc.BrokerLifecycleStub(channel).RegisterBroker(impostor, timeout=30)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with grpc.insecure_channel(cluster.listener_address("CONTROLLER")) as channel:
        lifecycle = ipb_grpc.BrokerLifecycleStub(channel)
        for metadata in ((), WRONG):
            _refused(lifecycle.RegisterBroker, impostor, metadata)
            _refused(lifecycle.BrokerHeartbeat, ipb.BrokerHeartbeatRequest(
                broker_id=leader, broker_epoch=1 << 40, metadata_version=1 << 40), metadata)
            _refused(lifecycle.AlterPartition, ipb.AlterPartitionRequest(
                broker_id=leader, broker_epoch=1 << 40, topic=topic_name, partition=0,
                leader_epoch=0, isr=[leader], new_isr=[leader]), metadata)
    # The real broker is still registered as it was, leads, and takes acks=all records.
    assert cluster.broker_pids() == pids
    state = cluster.controller.image().partition(topic_name, 0)
    assert state.leader == leader and len(state.isr) == 3
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        assert producer.send(topic_name, b"still-here").get(30).offset == 0


def test_a_client_cannot_fetch_as_a_follower_to_move_the_high_watermark(cluster, topic_name):
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
    leader, follower = _leader_and_follower(cluster, topic_name)
    address = cluster.controller.image().broker(leader).address
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        producer.send(topic_name, b"replicated").get(30)
    fake_follower = ipb.ReplicaFetchRequest(
        replica_id=follower, max_wait_ms=0, max_bytes=1 << 20,
        partitions=[ipb.ReplicaFetchPartition(topic=topic_name, partition=0,
                                              fetch_offset=1_000_000, partition_max_bytes=1 << 20,
                                              current_leader_epoch=-1, last_fetched_epoch=-1)])
    with grpc.insecure_channel(address) as channel:
        replica_fetch = ipb_grpc.ReplicaFetchStub(channel)
        for metadata in ((), WRONG):
            _refused(replica_fetch.Fetch, fake_follower, metadata)
    # Followers and ISR are as they were: acks=all still waits for real copies, and every
    # replica holds both records.
    state = cluster.controller.image().partition(topic_name, 0)
    assert state.leader == leader and len(state.isr) == 3
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        assert producer.send(topic_name, b"after").get(30).offset == 1


def test_the_spark_ui_cannot_kill_brokers(spark):
    """A session deltabus makes turns the Spark UI's kill links off."""
    assert spark.sparkContext.getConf().get("spark.ui.killEnabled") == "false"
