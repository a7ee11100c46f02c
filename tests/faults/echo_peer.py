"""A process for the network nemesis's own tests (test_network.py): it serves an echo port and,
told so on stdin, talks to another peer's echo port, answering each command on stdout:

    listen            -> "port <n>"
    connect <port>    -> "ok" or "error ..." (the connection it keeps)
    echo <text>       -> "echo <seconds>" or "timeout" (over the kept connection)
    new <port>        -> "ok <seconds>" or "timeout" (a fresh connection, echo, close)
Each wait is at most WAIT_S."""

from __future__ import annotations

import socket
import socketserver
import sys
import threading
import time

WAIT_S = 2.0


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


def round_trip(conn: socket.socket, text: bytes) -> str:
    started = time.monotonic()
    conn.settimeout(WAIT_S)
    try:
        conn.sendall(text)
        received = b""
        while text not in received:  # after a timeout, the late answer comes first
            chunk = conn.recv(4096)
            if not chunk:
                return ""
            received += chunk
        return f"{time.monotonic() - started:.3f}"
    except OSError:
        return ""


def main() -> None:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kept: socket.socket | None = None
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command == "listen":
            answer = f"port {server.server_address[1]}"
        elif command == "connect":
            kept = socket.create_connection(("127.0.0.1", int(arg)), timeout=WAIT_S)
            answer = "ok"
        elif command == "echo" and kept is not None:
            took = round_trip(kept, arg.encode() + b"\n")
            answer = f"echo {took}" if took else "timeout"
        elif command == "new":
            try:
                with socket.create_connection(("127.0.0.1", int(arg)), timeout=WAIT_S) as c:
                    took = round_trip(c, b"new\n")
                answer = f"ok {took}" if took else "timeout"
            except OSError:
                answer = "timeout"
        else:
            answer = f"error unknown command {line.strip()!r}"
        print(answer, flush=True)


if __name__ == "__main__":
    main()
