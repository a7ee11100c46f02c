"""The Kafka listener under load and hostile input (issue 17), with raw frames and kafka-python
against the real listener in front of in-memory brokers (no Spark):
- a thousand idle connections hold no threads, and clients produce and consume beside them;
- max.connections and max.connections.per.ip close the extra connection at once, and only it;
- a connection idle for connections.max.idle.ms is closed, one owed an answer is not;
- pipelined requests are handled while a long poll waits and answered in request order;
- pipelined produce requests are all appended while their acks wait;
- long polls on many connections leave the request handler threads to everyone else;
- past queued.max.requests or queued.max.request.bytes nothing more is read until handlers catch up;
- requests read before the client closed are still handled;
- SASL requests before authentication are taken one at a time; a stalled TLS handshake holds
  nothing and is closed after its time.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator

import kafka
import pytest
import trustme
from kafka.record.memory_records import MemoryRecords
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from deltabus import config as cfg
from deltabus.rpc.kafka import network
from deltabus.rpc.kafka.frames import make, peek
from deltabus.security.scram import make_credential
from tests.client.fake_cluster import FakeCluster
from tests.kafka.raw_frames import (
    API_VERSIONS,
    FETCH,
    METADATA,
    PRODUCE,
    api_versions,
    closed,
    connect_to,
    fetch,
    frame,
    metadata,
    produce,
    read_response,
    recv_exactly,
    room_for_connections,
)

TOPIC = "net"
IDLE_CONNECTIONS = 1_000
LONG_POLL_MS = 30_000  # longer than any socket timeout here: an answer means it ended early


@pytest.fixture(scope="module", autouse=True)
def descriptors() -> None:
    """Room for the idle connections' two ends in this process."""
    room_for_connections(IDLE_CONNECTIONS)


@contextlib.contextmanager
def door(socket_server: cfg.SocketServerConfig | None = None,
         **secured) -> Iterator[tuple[FakeCluster, str]]:
    """A one-broker fake with topic TOPIC behind a Kafka listener of `socket_server`."""
    fake = FakeCluster(brokers=1)
    try:
        fake.create_topic(TOPIC, 1)
        yield fake, fake.serve_kafka(0, socket_server=socket_server, **secured)
    finally:
        fake.close()


def answered(sock: socket.socket, correlation_id: int) -> bool:
    sock.sendall(api_versions(correlation_id))
    got, body = read_response(sock, API_VERSIONS, 3)
    return got == correlation_id and body.error_code == ErrorCode.none


def values(records: bytes) -> list[bytes]:
    out, batches = [], MemoryRecords(records)
    while (batch := batches.next_batch()) is not None:
        out += [record.value for record in batch]
    return out


def test_a_thousand_idle_connections_hold_no_threads_while_clients_produce_and_consume() -> None:
    io_threads = 2
    with door(cfg.SocketServerConfig(num_io_threads=io_threads)) as (_, address):
        before = threading.active_count()
        idle: list[socket.socket] = []
        try:
            for i in range(IDLE_CONNECTIONS):
                idle.append(connect_to(address))
                assert answered(idle[-1], i)  # accepted and served before the next one
            # the request handler threads, made as requests came: none per connection
            assert threading.active_count() - before <= io_threads
            producer = kafka.KafkaProducer(bootstrap_servers=address, request_timeout_ms=10_000)
            for i in range(10):
                producer.send(TOPIC, b"v%d" % i)
            producer.flush(30)
            producer.close()
            consumer = kafka.KafkaConsumer(bootstrap_servers=address, consumer_timeout_ms=10_000,
                                           auto_offset_reset="earliest")
            consumer.assign([kafka.TopicPartition(TOPIC, 0)])
            received = iter(consumer)
            assert [next(received).value for _ in range(10)] == [b"v%d" % i for i in range(10)]
            consumer.close()
            for i, sock in enumerate(idle):  # every idle connection is still open and served
                assert answered(sock, i)
        finally:
            for sock in idle:
                sock.close()


@pytest.mark.parametrize("limit", ["max_connections", "max_connections_per_ip"])
def test_a_connection_past_the_limit_is_closed_at_once_and_the_others_stay(
        limit: str, caplog: pytest.LogCaptureFixture) -> None:
    name = limit.replace("_", ".")
    with door(cfg.SocketServerConfig(**{limit: 3})) as (_, address), \
            caplog.at_level(logging.INFO, logger=network.__name__):
        kept = [connect_to(address) for _ in range(3)]
        try:
            assert all(answered(sock, i) for i, sock in enumerate(kept))
            with connect_to(address) as extra:
                with contextlib.suppress(OSError):  # it may be gone before the request
                    extra.sendall(api_versions(99))
                assert closed(extra)
            assert f"{name}=3" in caplog.text
            assert all(answered(sock, i) for i, sock in enumerate(kept))
            kept.pop().close()  # room for one more, once the listener has seen it go
            deadline = time.monotonic() + 10
            while True:
                with connect_to(address) as again:
                    with contextlib.suppress(OSError):
                        if answered(again, 7):
                            break
                assert time.monotonic() < deadline, "a freed connection slot was never reused"
        finally:
            for sock in kept:
                sock.close()


def test_an_idle_connection_is_closed_after_connections_max_idle_ms_but_not_one_owed_an_answer(
        caplog: pytest.LogCaptureFixture) -> None:
    with door(cfg.SocketServerConfig(connections_max_idle_ms=300)) as (_, address), \
            caplog.at_level(logging.INFO, logger=network.__name__), \
            connect_to(address) as idle, connect_to(address) as polling:
        asked = time.monotonic()  # the idle time starts at the answer, which comes after this
        assert answered(idle, 1)
        polling.sendall(fetch(TOPIC, 0, max_wait_ms=1_500, correlation_id=2))
        assert closed(idle)  # within the socket's 10 s timeout
        assert time.monotonic() - asked >= 0.3
        assert "connections.max.idle.ms=300" in caplog.text
        # the long poll outlived the idle time and still got its answer
        correlation_id, body = read_response(polling, FETCH, 12)
        assert correlation_id == 2 and body.responses[0].partitions[0].error_code == ErrorCode.none


def test_pipelined_requests_are_handled_while_a_long_poll_waits_and_answered_in_order() -> None:
    """Five requests back to back on one connection: the Produce behind the long-polling Fetch
    is handled while the Fetch waits (so the Fetch returns its record at once, not after 30 s),
    and the answers come in request order."""
    with door() as (fake, address), connect_to(address) as sock:
        sock.sendall(api_versions(1) + fetch(TOPIC, 0, LONG_POLL_MS, 2) + metadata([TOPIC], 3)
                     + produce(TOPIC, [b"pipelined"], 4) + metadata([TOPIC], 5))
        answers = [read_response(sock, key, version) for key, version in (
            (API_VERSIONS, 3), (FETCH, 12), (METADATA, 12), (PRODUCE, 9), (METADATA, 12))]
    assert [correlation_id for correlation_id, _ in answers] == [1, 2, 3, 4, 5]
    fetched = answers[1][1].responses[0].partitions[0]
    assert values(fetched.records) == [b"pipelined"]
    assert answers[3][1].responses[0].partition_responses[0].base_offset == 0
    assert fake.values(TOPIC, 0) == [b"pipelined"]


def test_pipelined_produce_requests_all_reach_the_log_while_their_acks_wait() -> None:
    """librdkafka at linger.ms=0 sends a request a record, pipelined: every one must be
    appended while the first waits for its commit, so one commit takes them all (read five
    at a time, a log committing every ~10 ms acknowledged 500 records/s seconds late)."""
    requests = 60
    with door() as (fake, address), connect_to(address) as sock:
        with fake.acks_held():
            sock.sendall(b"".join(produce(TOPIC, [b"r%d" % i], i) for i in range(requests)))
            fake.wait_until(lambda: len(fake.produce_calls) == requests, "every produce appended")
        answers = [read_response(sock, PRODUCE, 9) for _ in range(requests)]
    assert [correlation_id for correlation_id, _ in answers] == list(range(requests))
    assert fake.values(TOPIC, 0) == [b"r%d" % i for i in range(requests)]


def test_long_polls_on_many_connections_leave_the_request_handlers_to_everyone_else() -> None:
    polls_n = 10
    config = cfg.SocketServerConfig(num_io_threads=2, queued_max_requests=2)
    with door(config) as (fake, address):
        polls = [connect_to(address) for _ in range(polls_n)]
        try:
            for i, sock in enumerate(polls):
                sock.sendall(fetch(TOPIC, 0, LONG_POLL_MS, i))
            fake.wait_until(lambda: fake.fetches_waiting == polls_n, "every fetch waiting")
            with connect_to(address) as other:
                other.sendall(metadata([TOPIC], 99))
                correlation_id, body = read_response(other, METADATA, 12)
            assert correlation_id == 99 and body.topics[0].error_code == ErrorCode.none
            fake.wait_until(lambda: fake.fetches_waiting == polls_n, "the fetches still waiting")
            fake.write(TOPIC, 0, [b"wake up"])
            for i, sock in enumerate(polls):
                correlation_id, body = read_response(sock, FETCH, 12)
                assert correlation_id == i
                assert values(body.responses[0].partitions[0].records) == [b"wake up"]
        finally:
            for sock in polls:
                sock.close()


def _sasl_frame(key: int, version: int, correlation_id: int, **fields) -> bytes:
    return frame(key, version, make(load_request_schema(key, version), **fields), correlation_id)


def test_sasl_requests_before_authentication_are_taken_one_at_a_time() -> None:
    """Pipelined behind the SASL exchange, a Metadata is answered once the exchange succeeded,
    and one behind a failed exchange is never answered: the connection closes."""
    credentials = {("alice", m): make_credential(m, "secret")
                   for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")}
    security = cfg.ListenerSecurity(security_protocol="SASL_PLAINTEXT")
    with door(security=security,
              credentials=lambda user, mechanism: credentials.get((user, mechanism))) as (
            _, address):
        def exchange(password: bytes) -> bytes:
            return (_sasl_frame(17, 1, 1, mechanism="PLAIN")
                    + _sasl_frame(36, 2, 2, auth_bytes=b"\0alice\0" + password)
                    + metadata([TOPIC], 3))
        with connect_to(address) as sock:
            sock.sendall(exchange(b"secret"))
            assert read_response(sock, 17, 1)[0] == 1
            correlation_id, authenticated = read_response(sock, 36, 2)
            assert correlation_id == 2 and authenticated.error_code == ErrorCode.none
            correlation_id, body = read_response(sock, METADATA, 12)
            assert correlation_id == 3 and body.topics[0].error_code == ErrorCode.none
        with connect_to(address) as sock:
            sock.sendall(exchange(b"wrong"))
            assert read_response(sock, 17, 1)[0] == 1
            _, refused = read_response(sock, 36, 2)
            assert refused.error_code == ErrorCode.sasl_authentication_failed
            assert closed(sock)


def test_a_stalled_tls_handshake_holds_no_one_up_and_is_closed_after_its_time(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(network, "TLS_HANDSHAKE_TIMEOUT_S", 0.5)
    ca = trustme.CA()
    ca_file = str(tmp_path / "ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    server = ca.issue_cert("127.0.0.1")
    security = cfg.ListenerSecurity(
        security_protocol="SSL", ssl_key=server.private_key_pem.bytes(),
        ssl_certificate=b"".join(p.bytes() for p in server.cert_chain_pems))
    with door(security=security, credentials=None) as (fake, address), \
            connect_to(address) as silent, connect_to(address) as halfway:
        halfway.sendall(struct.pack(">BHH", 22, 0x0301, 200) + b"\x01")  # a ClientHello begun
        started = time.monotonic()
        producer = kafka.KafkaProducer(bootstrap_servers=address, security_protocol="SSL",
                                       ssl_cafile=ca_file, request_timeout_ms=10_000)
        assert producer.send(TOPIC, b"over tls").get(30).offset == 0
        producer.close()
        assert closed(silent) and closed(halfway)
        assert time.monotonic() - started >= 0.5
        context = ssl.create_default_context(cafile=ca_file)
        with connect_to(address) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert answered(tls, 5)  # a prompt handshake is served as before
    assert fake.values(TOPIC, 0) == [b"over tls"]


@contextlib.contextmanager
def processor(socket_server: cfg.SocketServerConfig
              ) -> Iterator[tuple[str, queue.SimpleQueue[network.Request]]]:
    """The network thread alone, its handler a queue the test takes requests from (each of a
    run in turn)."""
    handed: queue.SimpleQueue[network.Request] = queue.SimpleQueue()

    def hand(run: list[network.Request]) -> None:
        for request in run:
            handed.put(request)

    with bare_processor(hand, socket_server) as (_, address):
        yield address, handed


def nothing_more_handed(handed: queue.SimpleQueue[network.Request]) -> bool:
    """Nothing is handed over within a second, where the network thread hands a request over
    as soon as it has read it (milliseconds)."""
    try:
        handed.get(timeout=1)
    except queue.Empty:
        return True
    return False


@pytest.mark.parametrize("limit", ["queued_max_requests", "queued_max_request_bytes"])
def test_past_the_request_queue_limits_nothing_more_is_read_until_handlers_catch_up(
        limit: str) -> None:
    """queued.max.requests (requests handed to the handlers and not released) and
    queued.max.request.bytes (bytes read and not released): past either, the listener reads
    nothing more from anyone, so slow handlers bound what clients can pile up in a broker."""
    one_frame = len(api_versions(1)) - 4
    socket_server = cfg.SocketServerConfig(
        **{"queued_max_requests": 2, "num_io_threads": 2} if limit == "queued_max_requests"
        else {"queued_max_request_bytes": 2 * one_frame, "socket_request_max_bytes": one_frame})
    with processor(socket_server) as (address, handed):
        clients = [connect_to(address, timeout_s=30) for _ in range(3)]
        try:
            for i, sock in enumerate(clients):
                sock.sendall(api_versions(i))
            held = [handed.get(timeout=30), handed.get(timeout=30)]
            assert nothing_more_handed(handed)  # the third waits, though it was sent
            held[0].release()
            third = handed.get(timeout=30)  # one released: the third is read and handed over
            assert third.frame == api_versions(2)[4:]
            for request in held + [third]:
                request.respond(b"\0\0\0\0")
        finally:
            for sock in clients:
                sock.close()


def test_a_connection_opened_while_the_request_queue_is_full_is_read_once_there_is_room(
        ) -> None:
    """A client that connects while queued.max.requests is reached is read once a handler
    releases a request. It once was not: the network thread stopped watching the new socket
    for reads without counting it among the connections waiting for room, so nothing woke it
    (CI: a Metadata unanswered while ten long polls were still being released)."""
    socket_server = cfg.SocketServerConfig(queued_max_requests=2, num_io_threads=2)
    with processor(socket_server) as (address, handed):
        first, second = connect_to(address, timeout_s=30), connect_to(address, timeout_s=30)
        try:
            first.sendall(api_versions(1))
            second.sendall(api_versions(2))
            held = [handed.get(timeout=30), handed.get(timeout=30)]  # the queue is full
            with connect_to(address, timeout_s=30) as late:
                late.sendall(api_versions(3))
                assert nothing_more_handed(handed)
                held[0].release()
                assert handed.get(timeout=30).frame == api_versions(3)[4:]
            for request in held:
                request.respond(b"\0\0\0\0")
        finally:
            first.close()
            second.close()


def test_requests_read_before_the_client_closed_are_still_handled() -> None:
    """An acks=0 producer sends its requests and closes at once: requests the listener had
    read are handled all the same (Kafka's Selector processes staged receives before it closes
    a channel the peer closed), and nothing is sent back."""
    with door() as (fake, address):
        with connect_to(address) as sock:
            sock.sendall(b"".join(produce(TOPIC, [f"fire {i}".encode()], i, acks=0)
                                  for i in range(5)))
        fake.wait_until(lambda: len(fake.values(TOPIC, 0)) == 5, "all five requests handled")
        assert fake.values(TOPIC, 0) == [f"fire {i}".encode() for i in range(5)]


@contextlib.contextmanager
def bare_processor(handle: Callable[[list[network.Request]], None],
                   socket_server: cfg.SocketServerConfig | None = None
                   ) -> Iterator[tuple[network.Processor, str]]:
    """A network thread alone on a loopback port, its runs of requests handed to `handle`."""
    server = socket.create_server(("127.0.0.1", 0))
    p = network.Processor(server, handle, config=socket_server or cfg.SocketServerConfig(),
                          ssl_context=None, sasl_required=False)
    thread = threading.Thread(target=p.run, daemon=True)
    thread.start()
    try:
        yield p, f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        p.stop()
        thread.join(30)


def requests_read(p: network.Processor) -> int:
    """Requests the network thread has read and not yet answered (a peek at its state, to
    know frames sent are read before the test lets a run form)."""
    return sum(len(connection.slots) for connection in list(p._connections))


def test_requests_read_while_one_is_handled_are_handed_over_together_in_order() -> None:
    """librdkafka at linger.ms=0 sends a request a record: what arrives while one is handled
    goes to the handlers as one run, in request order (one hand-over between the threads per
    run: per request, a request each 2 ms fell behind without end on 2 busy cores)."""
    runs: queue.SimpleQueue[list[network.Request]] = queue.SimpleQueue()
    with bare_processor(runs.put) as (processor, address), connect_to(address) as sock:
        sock.sendall(api_versions(0))
        (first,) = runs.get(timeout=30)
        sock.sendall(b"".join(api_versions(i) for i in range(1, 6)))
        wait_for(lambda: requests_read(processor) == 6, "the five requests read")
        first.respond(answer(0))
        run = runs.get(timeout=30)
        assert [peek(r.frame)[2] for r in run] == [1, 2, 3, 4, 5]
        for i, request in enumerate(run, 1):
            request.respond(answer(i))
        assert [recv_answer(sock) for _ in range(6)] == list(range(6))


def test_requests_given_back_by_a_throttled_run_wait_out_the_mute_and_come_again() -> None:
    """A run's answer carries a throttle time: the handlers give the rest back, and the network
    thread hands them over again, in order, only once the connection's mute is over."""
    runs: queue.SimpleQueue[list[network.Request]] = queue.SimpleQueue()
    throttle_ms = 300
    with bare_processor(runs.put) as (processor, address), connect_to(address) as sock:
        sock.sendall(api_versions(0))
        (first,) = runs.get(timeout=30)
        sock.sendall(b"".join(api_versions(i) for i in range(1, 4)))
        wait_for(lambda: requests_read(processor) == 4, "the three requests read")
        first.respond(answer(0))
        run = runs.get(timeout=30)
        throttled_s = time.monotonic()
        run[0].respond(answer(1), throttle_ms=throttle_ms)
        for request in run[1:]:
            request.give_back()
        again = runs.get(timeout=30)
        assert time.monotonic() - throttled_s >= throttle_ms / 1000
        assert [peek(r.frame)[2] for r in again] == [2, 3]
        for request in again:
            request.respond(answer(peek(request.frame)[2]))
        assert [recv_answer(sock) for _ in range(4)] == list(range(4))


def wait_for(condition, what: str) -> None:
    """Wait until `condition()` holds; the suite's timeout bounds it."""
    while not condition():
        time.sleep(0.01)
    assert condition(), what


def answer(n: int) -> bytes:
    """A test handler's answer: a frame holding `n`."""
    return struct.pack(">ii", 4, n)


def recv_answer(sock: socket.socket) -> int:
    """The number in the next answer `answer` made."""
    size, n = struct.unpack(">ii", recv_exactly(sock, 8))
    assert size == 4
    return n
