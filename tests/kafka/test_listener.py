"""The Kafka listener with raw frames: versions outside the advertised ones are answered with
UNSUPPORTED_VERSION (ApiVersions in its v0 form), and garbage, truncated or oversized frames and
unknown APIs close only their own connection while the broker keeps serving everyone else."""

from __future__ import annotations

import socket
import struct
from datetime import timedelta
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import AdminClient, NewTopic
from deltabus.rpc.kafka.apis import SUPPORTED
from deltabus.rpc.kafka.frames import make, nested
from tests.kafka.raw_frames import closed, connect_to, frame, read_response


def connect(cluster) -> socket.socket:
    return connect_to(cluster.kafka_bootstrap_servers)


def api_versions(cluster) -> dict[int, tuple[int, int]]:
    """A well-behaved client on its own connection: the advertised versions."""
    with connect(cluster) as sock:
        sock.sendall(frame(18, 3, make(load_request_schema(18, 3), client_software_name="t",
                                       client_software_version="1")))
        _, body = read_response(sock, 18, 3)
    assert body.error_code == ErrorCode.none
    return {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}


def test_api_versions_lists_what_is_advertised_and_answers_a_newer_client_in_v0(cluster):
    assert api_versions(cluster) == SUPPORTED
    with connect(cluster) as sock:  # a client newer than us: KIP-511's v0 answer
        body_v4 = make(load_request_schema(18, 4), client_software_name="t",
                       client_software_version="1")
        sock.sendall(frame(18, 4, body_v4, correlation_id=11))
        correlation_id, body = read_response(sock, 18, 0)
    assert correlation_id == 11 and body.error_code == ErrorCode.unsupported_version
    assert {k.api_key for k in body.api_keys} == set(SUPPORTED)


def test_an_unsupported_version_or_api_gets_unsupported_version(cluster, topic_name):
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    produce = load_request_schema(0, 10)  # kio has it; we advertise up to 9
    body = make(produce, transactional_id=None, acks=1, timeout=timedelta(seconds=5),
                topic_data=(nested(produce, "TopicProduceData")(
                    name=topic_name, partition_data=(nested(produce, "PartitionProduceData")(
                        index=0, records=None),)),))
    features = load_request_schema(57, 0)  # UpdateFeatures: not implemented
    with connect(cluster) as sock:
        sock.sendall(frame(0, 10, body, correlation_id=1))
        _, produced = read_response(sock, 0, 10)
        sock.sendall(frame(57, 0, make(features, timeout=timedelta(seconds=5),
                                       feature_updates=()), correlation_id=2))
        correlation_id, listed = read_response(sock, 57, 0)
    (partition,) = produced.responses[0].partition_responses
    assert partition.error_code == ErrorCode.unsupported_version
    assert correlation_id == 2 and listed.error_code == ErrorCode.unsupported_version


@pytest.mark.parametrize("bad", [
    struct.pack(">i", 10) + b"\x99" * 10,  # garbage: no such API
    struct.pack(">i", 12) + struct.pack(">hhi", 3, 12, 1) + b"\xff\xff\xff\xff",  # bad header
    struct.pack(">i", 1 << 30),  # larger than socket.request.max.bytes
    struct.pack(">i", -5),  # a negative size
])
def test_bad_frames_close_their_connection_and_nobody_elses(cluster, bad):
    bystander = connect(cluster)
    try:
        with connect(cluster) as sock:
            sock.sendall(bad)
            assert closed(sock)
        with connect(cluster) as sock:  # a frame that stops in the middle
            sock.sendall(frame(18, 3, make(load_request_schema(18, 3), client_software_name="t",
                                           client_software_version="1"))[:9])
        # the bystander's connection, opened before, still gets its answers
        bystander.sendall(frame(18, 3, make(load_request_schema(18, 3), client_software_name="t",
                                            client_software_version="1")))
        _, body = read_response(bystander, 18, 3)
        assert body.error_code == ErrorCode.none
    finally:
        bystander.close()
    assert api_versions(cluster) == SUPPORTED


def test_offset_for_leader_epoch_tells_consumers_where_an_epoch_ends(cluster, topic_name):
    """KIP-320's request, as a consumer sends it after a leader change: the leader answers where
    the asked epoch ends in its log (its log end for its latest epoch), and refuses a client whose
    leader epoch it does not know, so it refreshes metadata before it trusts the answer."""
    from deltabus import Producer
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(5):
            producer.send(topic_name, b"v%d" % i, partition=0)
    image = cluster.controller.image()
    partition = image.partition(topic_name, 0)
    broker = image.broker(partition.leader)
    request = load_request_schema(23, 4)
    topic_cls, partition_cls = (nested(request, n) for n in ("OffsetForLeaderTopic",
                                                             "OffsetForLeaderPartition"))

    def ask(current_leader_epoch: int) -> Any:
        body = make(request, replica_id=-1, topics=(topic_cls(topic=topic_name, partitions=(
            partition_cls(partition=0, current_leader_epoch=current_leader_epoch,
                          leader_epoch=partition.leader_epoch),)),))
        with socket.create_connection((broker.host, broker.kafka_port), timeout=10) as sock:
            sock.sendall(frame(23, 4, body))
            _, answer = read_response(sock, 23, 4)
        return answer.topics[0].partitions[0]

    found = ask(partition.leader_epoch)
    assert found.error_code == ErrorCode.none
    assert (found.leader_epoch, found.end_offset) == (partition.leader_epoch, 5)
    assert ask(partition.leader_epoch + 1).error_code == ErrorCode.unknown_leader_epoch
