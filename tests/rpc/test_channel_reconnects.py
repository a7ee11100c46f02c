"""A channel whose server went away keeps trying to connect about once a second (Kafka's
reconnect.backoff.max.ms), so a follower finds its relaunched leader, or a broker its restarted
controller, soon after it is back: gRPC's own backoff grows to two minutes.

Real gRPC over loopback against a listening socket that takes each connection and closes it at
once (a server that is not there yet), counting how often the channel comes back."""

from __future__ import annotations

import socket
import threading
import time

import grpc

from deltabus.rpc.channel import open_channel

WATCH_S = 12.0  # gRPC's own backoff tries 6 times in this long (0, 1, 2.6, 5.2, 9.4 s, ...)


def test_a_channel_keeps_trying_its_server_about_once_a_second() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.2)
    attempts: list[float] = []
    stop = threading.Event()

    def refuse() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            attempts.append(time.monotonic())
            conn.close()

    refusing = threading.Thread(target=refuse, daemon=True)
    refusing.start()
    channel = open_channel(f"127.0.0.1:{listener.getsockname()[1]}", "test")
    call = channel.unary_unary("/deltabus.v1.DeltaBus/Metadata")
    start = time.monotonic()
    try:
        while time.monotonic() - start < WATCH_S:
            try:  # waits while the channel reconnects, as a replica fetcher's call does
                call(b"", timeout=1.0, wait_for_ready=True)
            except grpc.RpcError:
                pass
    finally:
        stop.set()
        refusing.join()
        channel.close()
        listener.close()
    assert len(attempts) >= 9, attempts  # ~12 at a second apart; 6 with gRPC's backoff
