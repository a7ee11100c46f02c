"""The slow and failing object storage nemesis: an HTTP proxy on loopback in front of moto's S3
server that passes requests through, but answers some of them with a fault, chosen per request
by rules (the method, a pattern of the key, a probability or the next N matches).

Why a proxy and not moto's own fault settings: moto can fail a request before it acts, never
after, and the fault that matters most to a commit protocol is the one after: a put that landed
whose answer never came back (`ANSWER_LOST`), so the writer cannot tell a commit it made from
one it did not. The proxy has moto act on the request and then drops the connection. The faults:

- `SLOW_DOWN`: 503 with S3's SlowDown error body (S3's answer to too high a request rate);
- `INTERNAL_ERROR`: 500 with S3's InternalError body;
- `DELAY`: the request waits `seconds`, then goes through;
- `TIMEOUT`: the connection is held without an answer for `seconds` (or until the proxy
  stops), then closed; moto never sees the request;
- `ANSWER_LOST`: moto acts on the request, then the connection is closed unanswered.

Each fault injected is a start and a stop line in the History, if one is given (the stop line
says what moto answered, for a lost answer). Rules may change while requests flow; the proxy is
thread-safe, a context manager, and keeps no state of moto's. Clients reach it through
`options`: the server's storage options with the proxy as the endpoint.
"""

from __future__ import annotations

import fnmatch
import http.client
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.faults.history import History

SLOW_DOWN = "slow-down"
INTERNAL_ERROR = "internal-error"
DELAY = "delay"
TIMEOUT = "timeout"
ANSWER_LOST = "answer-lost"
FAULTS = (SLOW_DOWN, INTERNAL_ERROR, DELAY, TIMEOUT, ANSWER_LOST)
COMMIT_FILES = "*_delta_log/*.json"  # the key pattern of Delta commit files
HOLD_S_MAX = 600.0  # a TIMEOUT holds its connection at most this long
# Connections served at once; more wait their turn. A thread for every connection, unbounded,
# melted an S3 soak's test process: a burst of table loads left 8,000 proxy threads waiting for
# the interpreter, the controller's heartbeat handling and the clients among them, until every
# broker was fenced.
PROXY_THREADS = 64
UPSTREAM_TIMEOUT_S = 60.0
# Headers of one connection, not of the request or answer (RFC 9110, 7.6.1).
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer",
               "transfer-encoding", "upgrade"}
_ERRORS = {SLOW_DOWN: (503, "SlowDown", "Please reduce your request rate."),
           INTERNAL_ERROR: (500, "InternalError",
                            "We encountered an internal error. Please try again.")}


@dataclass
class Rule:
    """Which requests get `fault`: those of `method` (an HTTP method, "LIST" for a GET of a
    bucket, None for any) whose key matches `key` (fnmatch: `*` crosses slashes), each with
    `probability`; only the next `times` of them when set. `seconds`: a DELAY's wait, a
    TIMEOUT's hold."""

    fault: str
    key: str = "*"
    method: str | None = None
    probability: float = 1.0
    times: int | None = None
    seconds: float = 0.0
    injected: int = field(default=0, init=False)  # how many requests it faulted so far

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; one of {FAULTS}")

    def describe(self) -> dict[str, Any]:
        return {"fault": self.fault, "key": self.key, "method": self.method,
                "probability": self.probability, "times": self.times, "seconds": self.seconds}


class S3FaultProxy:
    """A threaded HTTP proxy on 127.0.0.1 forwarding to `upstream` (moto's endpoint,
    http://host:port) with the faults its rules choose. Thread-safe."""

    def __init__(self, upstream: str, *, history: History | None = None, seed: int = 40) -> None:
        split = urlsplit(upstream)
        self.upstream_host, self.upstream_port = split.hostname or "127.0.0.1", split.port or 80
        self.history = history
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._open: set[socket.socket] = set()  # client connections, closed at `stop`
        self.injected: dict[str, int] = {}  # fault -> how many requests got it
        self.forwarded = 0  # requests moto answered (lost answers included)

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "the proxy is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def options(self, server_options: dict[str, str]) -> dict[str, str]:
        """Storage options reaching moto through this proxy: `server_options` (S3Server's)
        with the endpoint replaced."""
        return {**server_options, "AWS_ENDPOINT_URL": self.endpoint}

    # ---- the rules (any thread) ---------------------------------------------------------------

    def add(self, rule: Rule) -> Rule:
        """Apply `rule` from the next request on (after the rules added before it)."""
        with self._lock:
            self._rules.append(rule)
        if self.history is not None:
            self.history.info("nemesis", "s3-rule", rule.describe())
        return rule

    def remove(self, rule: Rule) -> None:
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)

    def clear(self) -> None:
        """No faults from the next request on; held TIMEOUTs are let go."""
        with self._lock:
            self._rules.clear()
        if self.history is not None:
            self.history.info("nemesis", "s3-rules-cleared")

    def count(self, fault: str) -> int:
        with self._lock:
            return self.injected.get(fault, 0)

    def _choose(self, method: str, key: str) -> Rule | None:
        """The first rule this request matches and its dice allow; used up by one more."""
        with self._lock:
            for rule in self._rules:
                if rule.method is not None and rule.method != method:
                    continue
                if not fnmatch.fnmatchcase(key, rule.key):
                    continue
                if rule.times is not None and rule.injected >= rule.times:
                    continue
                if rule.probability < 1.0 and self._random.random() >= rule.probability:
                    continue
                rule.injected += 1
                self.injected[rule.fault] = self.injected.get(rule.fault, 0) + 1
                return rule
        return None

    # ---- the server ---------------------------------------------------------------------------

    def start(self) -> S3FaultProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._stopping.clear()
        self._server = _BoundedServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="s3-fault-proxy")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every client connection (held ones too)."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self._lock:
            connections, self._open = list(self._open), set()
        for connection in connections:
            _drop(connection)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> S3FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _note(self, f: str, start: bool, value: dict[str, Any]) -> None:
        if self.history is not None:
            (self.history.fault if start else self.history.heal)(f"s3-{f}", value)


class _BoundedServer(ThreadingHTTPServer):
    """An HTTP server whose connections are served by at most PROXY_THREADS threads."""

    request_queue_size = 1024  # a burst of connections waits in the backlog, not refused

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._pool = ThreadPoolExecutor(PROXY_THREADS, thread_name_prefix="s3-fault-proxy")

    def process_request(self, request: Any, client_address: Any) -> None:
        self._pool.submit(self.process_request_thread, request, client_address)

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Handler(BaseHTTPRequestHandler):
    """One client connection: each request forwarded, or faulted."""

    owner: S3FaultProxy
    protocol_version = "HTTP/1.1"
    # A client that sends nothing gives its thread back after this long (the others wait).
    timeout = 10

    def setup(self) -> None:
        super().setup()
        with self.owner._lock:
            self.owner._open.add(self.connection)

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:  # the client went (its timeout, or the proxy stopping): none to answer
            self.close_connection = True

    def finish(self) -> None:
        with self.owner._lock:
            self.owner._open.discard(self.connection)
        try:
            super().finish()
        except OSError:  # the connection was dropped on purpose
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the History says what matters

    def do_GET(self) -> None:
        self._serve()

    do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

    def _serve(self) -> None:
        body = self._body()
        path = urlsplit(self.path).path
        key = unquote(path.lstrip("/").partition("/")[2])
        method = "LIST" if self.command == "GET" and not key else self.command
        rule = self.owner._choose(method, key)
        if rule is None:
            self._forward(body)
            return
        what = {"method": method, "key": key}
        self.owner._note(rule.fault, True, what)
        if rule.fault in _ERRORS:
            status, code, message = _ERRORS[rule.fault]
            self._answer(status, _error_body(code, message, key), {
                "Content-Type": "application/xml"})
            self.owner._note(rule.fault, False, {**what, "status": status})
        elif rule.fault == DELAY:
            self.owner._stopping.wait(rule.seconds)
            status = self._forward(body)
            self.owner._note(rule.fault, False, {**what, "status": status})
        elif rule.fault == TIMEOUT:
            self.owner._stopping.wait(min(rule.seconds or HOLD_S_MAX, HOLD_S_MAX))
            self.close_connection = True
            _drop(self.connection)
            self.owner._note(rule.fault, False, what)
        else:  # ANSWER_LOST: it takes effect, its answer does not arrive
            status, _, _ = self._upstream(body)
            self.close_connection = True
            _drop(self.connection)
            self.owner._note(rule.fault, False, {**what, "status": status})

    def _body(self) -> bytes:
        """The request's body: Content-Length's bytes, or the chunks of a chunked one."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline().strip():  # trailers
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _upstream(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """The request sent to moto as it came (its Host header too: the signature covers
        it); moto's status, headers and body."""
        connection = http.client.HTTPConnection(self.owner.upstream_host,
                                                self.owner.upstream_port,
                                                timeout=UPSTREAM_TIMEOUT_S)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
            with self.owner._lock:
                self.owner.forwarded += 1
            return response.status, response.getheaders(), data
        finally:
            connection.close()

    def _forward(self, body: bytes) -> int:
        status, headers, data = self._upstream(body)
        self._answer(status, data, {k: v for k, v in headers
                                    if k.lower() not in _HOP_BY_HOP | {"content-length"}},
                     length=headers_length(headers, data) if self.command == "HEAD" else None)
        return status

    def _answer(self, status: int, data: bytes, headers: dict[str, str], *,
                length: int | None = None) -> None:
        self.send_response_only(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        # One request a connection: a kept-alive connection held one of the PROXY_THREADS
        # while idle in its client's pool, and with more pooled connections than threads
        # (every delta-rs table object pools its own) requests waited for minutes: the S3
        # soak's brokers stopped opening their tables and were fenced one after another.
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()


def headers_length(headers: list[tuple[str, str]], data: bytes) -> int:
    """A HEAD answer's Content-Length: the object's size moto stated (it sends no body)."""
    for name, value in headers:
        if name.lower() == "content-length":
            return int(value)
    return len(data)


def _error_body(code: str, message: str, key: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><Resource>{key}</Resource>"
            f"<RequestId>deltabus-fault-{time.monotonic_ns()}</RequestId></Error>").encode()


def _drop(connection: socket.socket) -> None:
    """Close a client connection at once, unanswered."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()
