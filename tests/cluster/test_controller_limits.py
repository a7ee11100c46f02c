"""The controller against requests a hostile or broken client can send, on both doors: a real
controller, metadata log (a Delta table under tmp_path), gRPC server and Kafka listener, as the
driver runs them, with brokers registered by hand (no Spark).

What the controller writes stays in its metadata log for ever and in driver memory, under the
lock every broker heartbeat needs: a request past a limit is refused with Kafka's error for it,
naming the limit, before anything is written, and the controller serves the next request."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from deltalake import DeltaTable
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import Producer, errors
from deltabus import config as cfg
from deltabus.cluster.controller import Controller
from deltabus.log_tables.layout import metadata_path
from deltabus.rpc.channel import open_channel
from deltabus.rpc.controller_channel import ControllerChannel
from deltabus.rpc.kafka.frames import make, nested
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from tests.cluster.controller_server import ControllerServer
from tests.kafka import raw_frames

INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION = 22, 4
METADATA, METADATA_VERSION = 3, 12


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ControllerServer]:
    server = ControllerServer(tmp_path, kafka=True)
    server.start_brokers(3)
    yield server
    server.stop()


@pytest.fixture
def stub(server: ControllerServer) -> Iterator[pb_grpc.DeltaBusStub]:
    channel = open_channel(server.address, "test")
    yield pb_grpc.DeltaBusStub(channel)
    channel.close()


def refusal(call: object) -> errors.DeltaBusError:
    """The deltabus error a gRPC call that must fail failed with."""
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    return error_from_rpc(info.value)


def restarted(server: ControllerServer) -> Controller:
    """A controller replaying the log from scratch: what the log holds."""
    return Controller(server.config)


# ---- InitProducerId ----------------------------------------------------------------------------

def test_a_transactional_id_past_the_limit_is_refused_and_never_persisted(server, stub):
    limit = cfg.TRANSACTIONAL_ID_LENGTH_MAX
    huge = "x" * 2_000_000
    error = refusal(lambda: stub.InitProducerId(
        pb.InitProducerIdRequest(transactional_id=huge), timeout=30))
    assert isinstance(error, errors.InvalidRequestError), error
    assert "transactional.id" in error.message and str(limit) in error.message
    assert len(error.message) < 1000
    forwarding = ControllerChannel(server.address, 0,
                                   broker_secret=server.config.inter_broker_secret)
    try:  # as a broker forwards its client's request
        with pytest.raises(errors.InvalidRequestError):
            forwarding.init_producer_id("y" * (limit + 1))
    finally:
        forwarding.close()
    longest = "z" * limit
    served = stub.InitProducerId(pb.InitProducerIdRequest(transactional_id=longest), timeout=30)
    assert served.error_code == 0 and served.producer_id >= 0
    assert set(restarted(server)._state.transactional_ids) == {longest}


def test_the_kafka_door_refuses_a_transactional_id_past_the_limit(server):
    cls = load_request_schema(INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION)

    def init(transactional_id: str | None) -> object:
        return raw_frames.call(server.kafka_address, INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION,
                               make(cls, transactional_id=transactional_id,
                                    transaction_timeout=timedelta(seconds=60), producer_id=-1,
                                    producer_epoch=-1))

    refused = init("x" * (cfg.TRANSACTIONAL_ID_LENGTH_MAX + 1))
    assert refused.error_code == ErrorCode.invalid_request  # type: ignore[attr-defined]
    served = init(None)  # an idempotent producer: served as before
    assert served.error_code == ErrorCode.none  # type: ignore[attr-defined]
    assert restarted(server)._state.transactional_ids == {}


# ---- Metadata's auto-creation, and the cluster's topics and partitions -------------------------

def grpc_metadata(stub: pb_grpc.DeltaBusStub, topics: list[str], auto_create: bool = True
                  ) -> dict[str, tuple[int, str]]:
    """Each named topic's (error code, message)."""
    response = stub.Metadata(pb.MetadataRequest(
        topics=topics, allow_auto_topic_creation=auto_create), timeout=60)
    return {t.name: (t.error_code, t.error_message) for t in response.topics}


def kafka_metadata(server: ControllerServer, topics: list[str], auto_create: bool = True
                   ) -> dict[str, int]:
    """Metadata v12 as raw frames to the controller's Kafka door: each named topic's code."""
    cls = load_request_schema(METADATA, METADATA_VERSION)
    topic_cls = nested(cls, "MetadataRequestTopic")
    answer = raw_frames.call(server.kafka_address, METADATA, METADATA_VERSION, make(
        cls, topics=tuple(topic_cls(topic_id=None, name=t) for t in topics),
        allow_auto_topic_creation=auto_create, include_topic_authorized_operations=False))
    return {t.name: int(t.error_code) for t in answer.topics}


def create(stub: pb_grpc.DeltaBusStub, **partitions: int) -> dict[str, tuple[int, str]]:
    """CreateTopics of topic=partition count (replication factor 1): each one's answer."""
    response = stub.CreateTopics(pb.CreateTopicsRequest(topics=[
        pb.CreatableTopic(name=n, num_partitions=p, replication_factor=1)
        for n, p in partitions.items()], timeout_ms=0), timeout=60)
    return {t.name: (t.error_code, t.error_message) for t in response.topics}


def metadata_commits(server: ControllerServer) -> int:
    """The metadata log's Delta version: one more for every commit the controller made."""
    return DeltaTable(metadata_path(server.config.root)).version()


def topics(server: ControllerServer) -> dict[str, int]:
    return {n: len(t.partitions) for n, t in server.controller.image().topics.items()}


def test_with_auto_create_topics_enable_false_missing_topics_stay_unknown(tmp_path):
    server = ControllerServer(tmp_path, kafka=True, auto_create_topics_enable=False)
    server.start_brokers(1)
    channel = open_channel(server.address, "test")
    try:
        stub = pb_grpc.DeltaBusStub(channel)
        assert grpc_metadata(stub, ["new"])["new"][0] == pb.UNKNOWN_TOPIC_OR_PARTITION
        assert kafka_metadata(server, ["new"]) == {"new": ErrorCode.unknown_topic_or_partition}
        assert topics(server) == {}
        assert create(stub, new=2) == {"new": (0, "")}  # CreateTopics is not auto-creation
        assert topics(server) == {"new": 2}
    finally:
        channel.close()
        server.stop()


def test_a_metadata_request_auto_creates_at_most_the_limit_or_nothing(server, stub):
    limit = server.config.auto_create_topics_per_request_max
    assert create(stub, existing=1) == {"existing": (0, "")}
    names = ["existing"] + [f"new-{i}" for i in range(limit + 1)]
    commits = metadata_commits(server)
    answers = grpc_metadata(stub, names)
    assert answers["existing"] == (0, "")
    assert {answers[n][0] for n in names[1:]} == {pb.POLICY_VIOLATION}
    message = answers["new-0"][1]
    assert "auto.create.topics.per.request.max" in message and str(limit) in message
    kafka = kafka_metadata(server, names)
    assert kafka["existing"] == ErrorCode.none
    assert {kafka[n] for n in names[1:]} == {ErrorCode.policy_violation}
    forwarding = ControllerChannel(server.address, 0,
                                   broker_secret=server.config.inter_broker_secret)
    try:  # a broker's clients get the refusal too: the broker asks the controller
        with pytest.raises(errors.PolicyViolationError):
            forwarding.metadata(names, allow_auto_create=True)
    finally:
        forwarding.close()
    assert metadata_commits(server) == commits and topics(server) == {"existing": 1}
    assert grpc_metadata(stub, names[:limit])["new-0"] == (0, "")  # within the limit: served
    assert len(topics(server)) == limit


def test_topics_created_by_one_request_are_one_metadata_commit(server, stub):
    commits = metadata_commits(server)
    answers = grpc_metadata(stub, [f"auto-{i}" for i in range(50)])
    assert {code for code, _ in answers.values()} == {0}
    assert metadata_commits(server) == commits + 1
    assert create(stub, **{f"made-{i}": 2 for i in range(20)}) == {
        f"made-{i}": (0, "") for i in range(20)}
    assert metadata_commits(server) == commits + 2 and len(topics(server)) == 70


def test_the_cluster_holds_at_most_max_topics_and_max_partitions(tmp_path):
    server = ControllerServer(tmp_path, kafka=True, max_topics=3, max_partitions=6)
    server.start_brokers(1)
    channel = open_channel(server.address, "test")
    try:
        stub = pb_grpc.DeltaBusStub(channel)
        made = create(stub, a=2, b=2, c=3)
        assert (made["a"], made["b"]) == ((0, ""), (0, ""))
        assert made["c"][0] == pb.POLICY_VIOLATION
        assert "max.partitions" in made["c"][1] and "6" in made["c"][1]
        made = create(stub, c=1, d=1)
        assert made["c"] == (0, "") and made["d"][0] == pb.POLICY_VIOLATION
        assert "max.topics" in made["d"][1] and "3" in made["d"][1]
        grown = stub.CreatePartitions(pb.CreatePartitionsRequest(topics=[
            pb.CreatePartitionsTopic(name="b", count=3),
            pb.CreatePartitionsTopic(name="a", count=3)], timeout_ms=0), timeout=60)
        codes = {t.name: t.error_code for t in grown.topics}
        assert codes == {"b": 0, "a": pb.POLICY_VIOLATION}
        assert grpc_metadata(stub, ["e"])["e"][0] == pb.POLICY_VIOLATION
        assert kafka_metadata(server, ["e"]) == {"e": ErrorCode.policy_violation}
        assert topics(server) == {"a": 2, "b": 3, "c": 1}
    finally:
        channel.close()
        server.stop()


def test_a_producer_refused_auto_creation_fails_at_once_naming_the_limit(tmp_path):
    """A refusal that will not change by waiting (POLICY_VIOLATION) fails the send at once, as
    Kafka's producer does for a non-retriable topic error, not after max.block.ms."""
    server = ControllerServer(tmp_path, kafka=True, max_topics=1)
    server.start_brokers(1)
    try:
        with Producer(server.address, max_block_ms=3_600_000) as producer:
            producer.partitions_for("first")  # auto-created: the cluster's one topic
            with pytest.raises(errors.PolicyViolationError, match="max.topics"):
                producer.send("second", b"refused")
        assert topics(server) == {"first": 1}
    finally:
        server.stop()
