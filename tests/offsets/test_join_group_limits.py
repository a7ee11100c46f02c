"""JoinGroup from a hostile or broken client, on both doors (gRPC and Kafka's protocol) of the
real group coordinator, in front of in-memory brokers (no Spark): member ids handed out count
toward group.max.size, so asking for ids again and again cannot fill driver memory, and a member
asking for a 30-minute rebalance timeout holds a server thread no longer than
group.max.rebalance.timeout.ms."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import config as cfg
from deltabus.rpc.channel import open_channel
from deltabus.rpc.kafka.frames import make, nested
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from tests.client.fake_cluster import FakeCluster
from tests.kafka import raw_frames

JOIN_GROUP, JOIN_GROUP_VERSION = 11, 7
REBALANCE_MAX_MS = 2_000
LONG_MS = 1_800_000  # what a hostile member asks for: group.max.session.timeout.ms


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    fake = FakeCluster(brokers=1, group_config=cfg.GroupConfig(
        group_min_session_timeout_ms=100, group_initial_rebalance_delay_ms=0, group_max_size=2,
        group_max_rebalance_timeout_ms=REBALANCE_MAX_MS))
    fake.serve_kafka(0)  # opens the coordinator's Kafka door too
    yield fake
    fake.close()


@pytest.fixture
def stub(fake: FakeCluster) -> Iterator[pb_grpc.DeltaBusStub]:
    channel = open_channel(fake.brokers[0].address, "test")
    yield pb_grpc.DeltaBusStub(channel)
    channel.close()


def grpc_join(stub: pb_grpc.DeltaBusStub, group: str, member_id: str = "", *,
              session_ms: int = 60_000, rebalance_ms: int = LONG_MS,
              deadline_s: float = 20) -> pb.JoinGroupResponse:
    return stub.JoinGroup(pb.JoinGroupRequest(
        group_id=group, member_id=member_id, session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms, protocol_type="consumer",
        protocols=[pb.JoinGroupProtocol(name="range", metadata=b"")]), timeout=deadline_s)


def kafka_join(fake: FakeCluster, group: str) -> ErrorCode:
    """A first JoinGroup v7 (no member id yet) as raw frames to the coordinator's Kafka door."""
    cls = load_request_schema(JOIN_GROUP, JOIN_GROUP_VERSION)
    protocol = nested(cls, "JoinGroupRequestProtocol")(name="range", metadata=b"")
    assert fake.kafka_coordinator is not None
    answer = raw_frames.call(fake.kafka_coordinator, JOIN_GROUP, JOIN_GROUP_VERSION, make(
        cls, group_id=group, session_timeout=timedelta(seconds=60),
        rebalance_timeout=timedelta(seconds=60), member_id="", group_instance_id=None,
        protocol_type="consumer", protocols=(protocol,)))
    return answer.error_code  # type: ignore[no-any-return]


def test_member_ids_handed_out_count_toward_group_max_size_on_both_doors(fake, stub):
    assert grpc_join(stub, "g").error_code == pb.MEMBER_ID_REQUIRED
    assert kafka_join(fake, "g") == ErrorCode.member_id_required
    refused = grpc_join(stub, "g")
    assert refused.error_code == pb.GROUP_MAX_SIZE_REACHED and refused.member_id == ""
    assert "group.max.size (2)" in refused.error_message
    assert kafka_join(fake, "g") == ErrorCode.group_max_size_reached
    assert grpc_join(stub, "other").error_code == pb.MEMBER_ID_REQUIRED  # others are served


def test_a_join_waits_no_longer_than_group_max_rebalance_timeout(stub):
    """Member a never joins again after b arrives asking for 30 minutes: b's JoinGroup is
    answered once the limit has passed, with a out of the group."""
    a_id = grpc_join(stub, "r").member_id
    a = grpc_join(stub, "r", a_id)
    assert a.error_code == 0, a.error_message
    synced = stub.SyncGroup(pb.SyncGroupRequest(group_id="r", generation_id=a.generation_id,
                                                member_id=a_id), timeout=20)
    assert synced.error_code == 0, synced.error_message
    b_id = grpc_join(stub, "r").member_id
    started = time.monotonic()
    b = grpc_join(stub, "r", b_id)
    waited = time.monotonic() - started
    assert b.error_code == 0, b.error_message
    assert [m.member_id for m in b.members] == [b_id]  # a did not join in time
    assert REBALANCE_MAX_MS / 1000 - 0.5 < waited < REBALANCE_MAX_MS / 1000 + 3
