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
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.controller import Controller
from deltabus.metadata import BrokerEndpoint
from deltabus.rpc.channel import open_channel
from deltabus.rpc.controller_channel import ControllerChannel
from deltabus.rpc.kafka.frames import make
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from tests.cluster.controller_server import ControllerServer
from tests.kafka import raw_frames

INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION = 22, 4


def start_brokers(controller: Controller, count: int) -> None:
    """Register and unfence brokers, as their first heartbeats would."""
    for b in range(count):
        epoch = controller.register_broker(BrokerEndpoint(b, "127.0.0.1", 9000 + b), 100 + b)
        controller.heartbeat(b, epoch, controller.image().version, 0)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ControllerServer]:
    server = ControllerServer(tmp_path, kafka=True)
    start_brokers(server.controller, 3)
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
