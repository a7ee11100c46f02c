"""gRPC Fetch long polls are bounded on a broker's server (issue 17, an interim until the gRPC
door waits without threads): grpcio's sync server holds a thread for each waiting Fetch, so at
most grpc_long_polls_max of them wait at once; a Fetch past that answers at once with what there
is, and the server's other threads stay free for every other call. And a waiting Fetch is woken
by the append it waits for, not by a timer (issue 20).

A real broker runs in this process around a controller server (tests/cluster/controller_server
.py) with a client pool of 4 threads, at most 2 of them for long polls."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from deltabus.cluster.broker import Broker
from deltabus.records import ProducerState
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc
from tests.cluster.controller_server import ControllerServer, leading_broker
from tests.cluster.test_replica_fetch_threads import client_address
from tests.conftest import client_pool_is_full, wait_until

TOPIC = "polled"
CLIENT_THREADS = 4
LONG_POLLS_MAX = 2
LONG_WAIT_MS = 60_000  # the most a broker waits: an answer before it ended early
# How long a waiting fetch is watched with nothing appended: room for code on a timer to read the
# log again. It bounds nothing: event-driven code reads nothing however long or loaded it is.
IDLE_WINDOW_S = 1.0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[Broker, pb_grpc.DeltaBusStub]]:
    server = ControllerServer(tmp_path, grpc_threads=CLIENT_THREADS,
                              grpc_long_polls_max=LONG_POLLS_MAX)
    with leading_broker(server, (TOPIC,)) as broker, \
            grpc.insecure_channel(client_address(server, 0)) as channel:
        yield broker, pb_grpc.DeltaBusStub(channel)


def long_poll(stub: pb_grpc.DeltaBusStub, min_bytes: int = 1) -> pb.FetchResponse:
    """A Fetch of TOPIC from offset 0 waiting up to LONG_WAIT_MS; it fails (DEADLINE_EXCEEDED)
    unless answered well before."""
    return stub.Fetch(pb.FetchRequest(
        max_wait_ms=LONG_WAIT_MS, min_bytes=min_bytes,
        partitions=[pb.FetchPartition(topic=TOPIC, partition=0, fetch_offset=0)]),
        timeout=LONG_WAIT_MS / 2000)


def in_background(call: object) -> Future[pb.FetchResponse]:
    answer: Future[pb.FetchResponse] = Future()

    def run() -> None:
        try:
            answer.set_result(call())  # type: ignore[operator]
        except Exception as e:
            answer.set_exception(e)

    threading.Thread(target=run, daemon=True).start()
    return answer


def values(response: pb.FetchResponse) -> list[bytes]:
    (partition,) = response.partitions
    assert partition.error_code == 0, partition.error_message
    return [r.value for r in partition.records]


def test_a_fetch_past_the_long_polls_max_answers_at_once_and_threads_stay_free(broker) -> None:
    leader, stub = broker
    parked = [in_background(lambda: long_poll(stub)) for _ in range(LONG_POLLS_MAX)]
    wait_until(lambda: leader.fetches_waiting() == LONG_POLLS_MAX, "the long polls waiting", 30)
    # Past the bound: answered at once (well before its max wait), with nothing yet.
    assert values(long_poll(stub)) == []
    assert not client_pool_is_full(stub)
    assert leader.fetches_waiting() == LONG_POLLS_MAX
    leader.produce(TOPIC, 0, pa.table({"value": [b"wake up"]}), acks=1,
                   producer=ProducerState()).result(30)
    assert [values(answer.result(30)) for answer in parked] == [[b"wake up"]] * LONG_POLLS_MAX
    # The slots are free again: the next long poll waits, and wakes on a produce too.
    waiting = in_background(lambda: long_poll(stub, min_bytes=10_000))
    wait_until(lambda: leader.fetches_waiting() == 1, "the next long poll waiting", 30)
    leader.produce(TOPIC, 0, pa.table({"value": [b"x" * 20_000]}), acks=1,
                   producer=ProducerState()).result(30)
    assert values(waiting.result(30))[0] == b"wake up"


def test_a_waiting_fetch_reads_the_log_again_only_when_an_append_wakes_it(broker) -> None:
    """The long poll's wake-up is the append itself: the fetch reads the log when it comes
    (nothing there) and once more after the append, never while it waits. Code that polls
    reads again during the idle window; code that waits out the fetch's max wait (60 s) misses
    the call's deadline (30 s)."""
    leader, stub = broker
    log = leader._partitions[(TOPIC, 0)].log
    reads: list[int] = []
    read = log.read

    def counted(offset: int, *args: object, **kwargs: object) -> pa.Table:
        reads.append(offset)
        return read(offset, *args, **kwargs)  # type: ignore[arg-type]

    log.read = counted  # type: ignore[method-assign]
    waiting = in_background(lambda: long_poll(stub))
    wait_until(lambda: leader.fetches_waiting() == 1, "the long poll waiting", 30)
    assert reads == [0]
    time.sleep(IDLE_WINDOW_S)
    assert reads == [0], "the waiting fetch read the log again with nothing appended"
    leader.produce(TOPIC, 0, pa.table({"value": [b"wake up"]}), acks=1,
                   producer=ProducerState()).result(30)
    assert values(waiting.result(30)) == [b"wake up"]
    assert reads == [0, 0]
