"""Bench step (q): a well-behaved producer's rate beside a hostile client (issue 17).

One deltabus Producer sends records of VALUE_BYTES with send() (acks=1) as fast as it can, for
`run_s` a round; rounds alternate between running alone and running while a hostile client, in
a process of its own (its own interpreter: it must not share this one's GIL with the producer),
sends without pause what issue 17's review found: a produce declaring a billion rows, a Kafka
batch of 101 MiB of zeros gzipped, a Fetch naming one partition 100,000 times on each door, a
Metadata naming 100,000 new topics. Every one of them is refused; what it costs the cluster to
refuse them is what the well-behaved producer loses. The share is the median attacked round's
rate over the median lone round's.
"""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

from deltabus import AdminClient, NewTopic, Producer
from deltabus.rpc.channel import open_channel
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc

MANY = 100_000  # entries of the hostile Fetch and Metadata requests
BOMB_MIB = 101  # what the gzip bomb unpacks to: past socket.request.max.bytes


def _produce_rate(bootstrap: str, topic: str, value: bytes, run_s: float) -> float:
    """Records a second that send() got acknowledged over `run_s`."""
    acked = 0
    lock = threading.Lock()

    def done(_: Any) -> None:
        nonlocal acked
        with lock:
            acked += 1

    with Producer(bootstrap, acks=1, linger_ms=5) as producer:
        started = time.monotonic()
        until = started + run_s
        while time.monotonic() < until:
            producer.send(topic, value, partition=0).add_done_callback(done)
        producer.flush()
        elapsed = time.monotonic() - started
    return acked / elapsed


def _leader(bootstrap: str, topic: str) -> tuple[str, str]:
    """The gRPC and Kafka addresses of the leader of `topic`'s partition 0."""
    channel = open_channel(bootstrap, "bench-hostile")
    try:
        meta = pb_grpc.DeltaBusStub(channel).Metadata(pb.MetadataRequest(topics=[topic]),
                                                      timeout=60)
    finally:
        channel.close()
    leader = meta.topics[0].partitions[0].leader
    (broker,) = [b for b in meta.brokers if b.broker_id == leader]
    return f"{broker.host}:{broker.port}", f"{broker.host}:{broker.kafka_port}"


def _kafka_requests(topic: str) -> list[tuple[str, int, int, Any]]:
    """(door, api key, version, body) of the hostile Kafka requests: the door is "leader" or
    "bootstrap"."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.index import load_request_schema

    from deltabus.rpc.kafka.frames import make, nested

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=1, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=2**31 - 1)
    for i in range(BOMB_MIB):
        builder.append(i, timestamp=None, key=None, value=bytes(2**20), headers=[])
    produce = load_request_schema(0, 9)
    bomb = make(produce, transactional_id=None, acks=1, timeout=timedelta(seconds=30),
                topic_data=(nested(produce, "TopicProduceData")(name=topic, partition_data=(
                    nested(produce, "PartitionProduceData")(
                        index=0, records=bytes(builder.build())),)),))
    fetch = load_request_schema(1, 12)
    partition = nested(fetch, "FetchPartition")(
        partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=1 << 20)
    many_fetch = make(fetch, replica_id=-1, max_wait=timedelta(0), min_bytes=0,
                      max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                      forgotten_topics_data=(), rack_id="", topics=(nested(fetch, "FetchTopic")(
                          topic=topic, partitions=(partition,) * MANY),))
    metadata = load_request_schema(3, 12)
    many_topics = make(metadata, topics=tuple(nested(metadata, "MetadataRequestTopic")(
        topic_id=None, name=f"{topic}-k{i}") for i in range(MANY)),
        allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    return [("leader", 0, 9, bomb), ("leader", 1, 12, many_fetch),
            ("bootstrap", 3, 12, many_topics)]


def _attack(bootstrap: str, kafka_bootstrap: str, topic: str, go: Any, done: Any,
            sent: Any) -> None:
    """The hostile client (a process of its own): while `go` is set, send every hostile
    request in turn, each on a new connection; `sent` counts them. Ends when `done` is set."""
    import io
    import socket
    import struct

    import pyarrow as pa
    from kio.index import load_request_schema
    from kio.serial import entity_writer

    from deltabus.rpc.kafka.frames import make

    leader, leader_kafka = _leader(bootstrap, topic)
    kafka = {"leader": leader_kafka, "bootstrap": kafka_bootstrap}
    frames = []
    for door, key, version, body in _kafka_requests(topic):
        header = load_request_schema(key, version).__header_schema__
        out = io.BytesIO()
        entity_writer(header)(out, make(header, request_api_key=key,
                                        request_api_version=version, correlation_id=1,
                                        client_id="hostile"))
        entity_writer(type(body))(out, body)
        frames.append((kafka[door], struct.pack(">i", out.tell()) + out.getvalue()))
    sink = pa.BufferOutputStream()
    nulls = pa.table({"value": pa.nulls(10**9, pa.null())})
    with pa.ipc.new_stream(sink, nulls.schema) as writer:
        writer.write_table(nulls)
    grpc_requests = [
        ("Produce", pb.ProduceRequest(acks=pb.ACKS_LEADER, partitions=[pb.PartitionProduceData(
            topic=topic, partition=0, arrow_records=sink.getvalue().to_pybytes())])),
        ("Fetch", pb.FetchRequest(max_wait_ms=0, partitions=[pb.FetchPartition(
            topic=topic, partition=0, fetch_offset=0)] * MANY))]
    channel = open_channel(leader, "hostile")
    stub = pb_grpc.DeltaBusStub(channel)
    while not done.is_set():
        if not go.wait(0.1):
            continue
        for address, frame in frames:
            if not go.is_set():
                break
            host, port = address.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=60) as sock:
                sock.sendall(frame)
                size = struct.unpack(">i", _recv(sock, 4))[0]
                _recv(sock, size)
            sent.value += 1
        for method, request in grpc_requests:
            if not go.is_set():
                break
            try:
                getattr(stub, method)(request, timeout=60)
            except Exception:  # noqa: BLE001 - refusals are what it gets; it goes on
                pass
            sent.value += 1
    channel.close()


def _recv(sock: Any, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return bytes(data)


def well_behaved_beside_hostile(bootstrap: str, kafka_bootstrap: str, value: bytes,
                                run_s: float, rounds: int) -> dict[str, Any]:
    """The well-behaved producer's rate alone and beside the hostile client, `rounds` of each,
    alternating."""
    run = uuid.uuid4().hex[:8]
    good, attacked = f"bench-good-{run}", f"bench-attacked-{run}"
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(good, 1, 1), NewTopic(attacked, 1, 1)])
    spawn = multiprocessing.get_context("spawn")
    go, done, sent = spawn.Event(), spawn.Event(), spawn.Value("q", 0)
    attacker = spawn.Process(target=_attack, args=(bootstrap, kafka_bootstrap, attacked, go,
                                                   done, sent), daemon=True)
    attacker.start()
    alone: list[float] = []
    beside: list[float] = []
    try:
        for _ in range(rounds):
            alone.append(_produce_rate(bootstrap, good, value, run_s))
            go.set()
            while sent.value == 0 and attacker.is_alive():  # its requests are built
                time.sleep(0.05)
            beside.append(_produce_rate(bootstrap, good, value, run_s))
            go.clear()
            if not attacker.is_alive():
                break
    finally:
        done.set()
        go.set()
        attacker.join(120)
    if attacker.exitcode not in (0, None) or not sent.value:
        raise RuntimeError(f"the hostile client failed (exit code {attacker.exitcode}, "
                           f"{sent.value} requests sent)")
    alone_rps, beside_rps = statistics.median(alone), statistics.median(beside)
    return {"run_s": run_s, "rounds": {"alone": alone, "beside": beside},
            "alone_rps": alone_rps, "beside_rps": beside_rps,
            "share": beside_rps / alone_rps, "hostile_requests": sent.value}
