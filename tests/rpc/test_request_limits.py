"""What one Fetch or ListOffsets may name, on the gRPC door: at most REQUEST_PARTITIONS_MAX
partitions, none twice (a broker reads every entry before the answer's byte limits apply). The
refusal is INVALID_REQUEST naming the limit or the partition, and the broker goes on serving.
No Spark: the real gRPC server in front of in-memory brokers (tests/client/fake_cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from deltabus import config as cfg
from deltabus import errors
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from tests.client.fake_cluster import FakeCluster

TOPIC = "t"


@pytest.fixture
def stub() -> Iterator[pb_grpc.DeltaBusStub]:
    fake = FakeCluster(brokers=1)
    fake.create_topic(TOPIC, 2)
    fake.write(TOPIC, 0, [b"a", b"b"])
    with grpc.insecure_channel(fake.bootstrap_servers) as channel:
        yield pb_grpc.DeltaBusStub(channel)
    fake.close()


def fetch(stub: pb_grpc.DeltaBusStub, partitions: list[int]) -> pb.FetchResponse:
    return stub.Fetch(pb.FetchRequest(max_wait_ms=0, partitions=[
        pb.FetchPartition(topic=TOPIC, partition=p, fetch_offset=0) for p in partitions]),
        timeout=30)


def refusal(call: grpc.RpcError) -> errors.DeltaBusError:
    assert call.code() == grpc.StatusCode.INVALID_ARGUMENT
    return error_from_rpc(call)


def test_a_fetch_naming_a_partition_twice_is_refused_and_the_next_one_served(stub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        fetch(stub, [0] * 100_000)
    error = refusal(info.value)
    assert isinstance(error, errors.InvalidRequestError)
    assert f"{TOPIC}-0" in error.message
    with pytest.raises(grpc.RpcError) as info:
        fetch(stub, [1, 0, 1])
    assert f"{TOPIC}-1" in refusal(info.value).message
    (answer,) = fetch(stub, [0]).partitions
    assert answer.error_code == 0 and [r.value for r in answer.records] == [b"a", b"b"]


def test_a_fetch_naming_more_partitions_than_the_limit_is_refused(stub) -> None:
    request = pb.FetchRequest(max_wait_ms=0, partitions=[
        pb.FetchPartition(topic=f"t{i}", partition=0, fetch_offset=0)
        for i in range(cfg.REQUEST_PARTITIONS_MAX + 1)])
    with pytest.raises(grpc.RpcError) as info:
        stub.Fetch(request, timeout=30)
    error = refusal(info.value)
    assert isinstance(error, errors.InvalidRequestError)
    assert str(cfg.REQUEST_PARTITIONS_MAX) in error.message
    assert fetch(stub, [0, 1]).partitions[0].error_code == 0


def test_list_offsets_answers_each_entry_of_a_partition_named_twice_with_invalid_request(
        stub) -> None:
    """Kafka's answer (ListOffsetsRequest.duplicatePartitions); the other entries are served."""
    answer = stub.ListOffsets(pb.ListOffsetsRequest(partitions=[
        pb.ListOffsetsPartition(topic=TOPIC, partition=p) for p in (0, 1, 0)]), timeout=30)
    codes = [(p.partition, p.error_code, p.offset) for p in answer.partitions]
    invalid = errors.InvalidRequestError.code
    assert codes == [(0, invalid, -1), (1, 0, 0), (0, invalid, -1)]
    assert f"{TOPIC}-0" in answer.partitions[0].error_message


def test_list_offsets_naming_more_partitions_than_the_limit_is_refused(stub) -> None:
    request = pb.ListOffsetsRequest(partitions=[
        pb.ListOffsetsPartition(topic=f"t{i}", partition=0)
        for i in range(cfg.REQUEST_PARTITIONS_MAX + 1)])
    with pytest.raises(grpc.RpcError) as info:
        stub.ListOffsets(request, timeout=30)
    assert isinstance(refusal(info.value), errors.InvalidRequestError)
    (latest,) = stub.ListOffsets(pb.ListOffsetsRequest(partitions=[
        pb.ListOffsetsPartition(topic=TOPIC, partition=0)]), timeout=30).partitions
    assert (latest.error_code, latest.offset) == (0, 2)
