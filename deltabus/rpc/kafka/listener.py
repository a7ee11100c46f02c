"""The Kafka protocol listener: the door Kafka's clients use, on the broker's Kafka port.

What Kafka's broker does with bad input, this does too:
- an API or version outside the advertised ones gets UNSUPPORTED_VERSION in a response of that
  API (ApiVersions answers in its v0 form, so any client can read the versions it may use);
- a frame larger than `socket.request.max.bytes`, a negative size, a header or body that does not
  parse, or an API kio has no schema for closes that connection, with a log line saying why;
- one connection's trouble never touches the others, nor the broker.

With TLS (SSL, SASL_SSL) each connection starts with the TLS handshake; a client certificate
names an SSL connection's principal. With SASL (SASL_PLAINTEXT, SASL_SSL) a connection may send
only ApiVersions, SaslHandshake and SaslAuthenticate until it has authenticated (`sasl`).

Threads, per listener and never per connection (cfg.SocketServerConfig sizes them):
- one network thread (`network.Processor`) accepts, reads and writes every connection, and keeps
  each connection's answers in request order;
- up to num.io.threads request handler threads parse, check and answer requests, one of a
  connection at a time, so their effects land in request order as on Kafka's broker: a thread
  takes a run of a connection's requests and handles them one after the other;
- a request that waits by design holds no thread: Produce waiting for its acks, JoinGroup and
  SyncGroup waiting for the group, and a Fetch long-polling for records are delayed responses
  (`delayed`), which no thread waits for; a waiting Fetch's future is the broker's delayed
  fetch (`cluster.delayed_fetch`), completed by an append or at its max wait. So however many
  consumers long-poll, the handler threads stay free for everyone else and no thread is made
  for them;
- the purgatory's expiration thread completes delayed responses whose time ran out.
The connection's next request is handled as soon as the previous one is released: a Produce
behind a waiting Fetch is appended at once, and its answer still goes out after the Fetch's.

The group and transaction coordinators live in the driver, whose listeners Metadata does not
list: a broker's listener passes their APIs on to the driver's listener of the same name
(`forward`, Kafka's Envelope, KIP-590), as the client sent them, with the principal it
authenticated; the driver answers them as its own (`answer_forwarded`), and the broker sends
the answer back unchanged. A forwarded request holds its handler thread until the driver
answers, so the connection's requests still take effect in order, except JoinGroup and
SyncGroup, which wait for the rest of the group and hold no thread. A driver that does not
answer closes the client's connection: the client looks its coordinator up again.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import socket
import threading
import time
import types
import typing
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import DeltaBusHandler, TransactionHandler
from deltabus.config import ListenerSecurity
from deltabus.listeners import ListenerBindError
from deltabus.metrics import RequestMeters
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.rpc.access import Access, acting_as
from deltabus.rpc.authentication import Authenticator, CredentialLookup
from deltabus.rpc.kafka import apis, groups, sasl, share_apis, txn_apis
from deltabus.rpc.kafka.delayed import DelayedResponse, Purgatory
from deltabus.rpc.kafka.frames import (
    NO_TIME,
    BadRequest,
    UnknownAPIKey,
    UnknownEntity,
    encode_response,
    load_response_schema,
    parse_request,
    peek,
)
from deltabus.rpc.kafka.network import Processor, Request
from deltabus.rpc.kafka.sasl import KafkaSession
from deltabus.rpc.throttling import throttle_time_ms
from deltabus.rpc.tls import server_ssl_context
from deltabus.security.principal import KafkaPrincipal

log = logging.getLogger(__name__)

PLAINTEXT = ListenerSecurity()
STOP_TIMEOUT_S = 5.0  # how long `stop` waits for the network thread to close everything


class HandlerPool:
    """Up to `threads_max` daemon threads running submitted work in submission order, made as
    work comes (an idle listener has none) and kept. Thread-safe."""

    def __init__(self, name: str, threads_max: int) -> None:
        self._name = name
        self._threads_max = threads_max
        self._work: queue.SimpleQueue[tuple[Callable[..., object], tuple[Any, ...]] | None] = \
            queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for work and not yet claimed by a submit
        self._stopped = False

    def submit(self, work: Callable[..., object], *args: Any) -> None:
        """Queue `work(*args)`; after `stop` it is dropped (its listener is closed)."""
        with self._lock:
            if self._stopped:
                return
            start = not self._idle and self._threads < self._threads_max
            if self._idle:
                self._idle -= 1
            if start:
                self._threads += 1
        self._work.put((work, args))
        if start:
            threading.Thread(target=self._run, name=f"{self._name}-{self._threads}",
                             daemon=True).start()

    def stop(self) -> None:
        """Let every thread end once the work before it is done."""
        with self._lock:
            threads, self._stopped = self._threads, True
        for _ in range(threads):
            self._work.put(None)

    def _run(self) -> None:
        while (item := self._work.get()) is not None:
            work, args = item
            try:
                work(*args)
            except Exception:  # a bug in the work: logged, and the thread carries on
                log.exception("%s: a request handler failed", self._name)
            with self._lock:
                self._idle += 1


# Passes a request's frame on to the driver's listener, for the client at a host with a
# principal: the driver's answer (its frame, b"" where none is due) and its throttle time in ms.
Forward = Callable[[bytes, str, KafkaPrincipal], "Future[tuple[bytes, int]]"]
# The forwarded requests that wait for the rest of their group, holding no handler thread.
FORWARDED_WAITING = frozenset({groups.JOIN_GROUP, groups.SYNC_GROUP})


def for_coordinator(key: int, request: Any) -> bool:
    """Whether a request is the group or transaction coordinator's to answer."""
    if key == apis.INIT_PRODUCER_ID:
        return request.transactional_id is not None
    return key != groups.FIND_COORDINATOR and (key in groups.SUPPORTED
                                                or key in txn_apis.SUPPORTED
                                                or key in share_apis.COORDINATOR_APIS)


@dataclasses.dataclass(frozen=True)
class _Parsed:
    """A request that passed the checks, for an API of KafkaApis."""

    key: int
    version: int
    correlation_id: int
    client_id: str
    body: Any


class _RequestHandlers:
    """Answers the requests the network thread hands over (`on_request`), on the handler
    threads. Thread-safe."""

    def __init__(self, kafka_apis: apis.KafkaApis, authenticator: Authenticator | None,
                 config: cfg.SocketServerConfig, name: str, forward: Forward | None,
                 meters: RequestMeters | None = None) -> None:
        self.apis = kafka_apis
        self.authenticator = authenticator
        self.forward = forward
        self._io = HandlerPool(f"{name}-request-handler", config.num_io_threads)
        self.purgatory = Purgatory(f"{name}-purgatory")
        self._meters = meters
        self._threads = config.num_io_threads
        if meters is not None:
            meters.add_handler_threads(self._threads)

    def stop(self) -> None:
        self.purgatory.stop()
        self._io.stop()
        if self._meters is not None:
            self._meters.add_handler_threads(-self._threads)
            self._meters = None

    def _respond(self, request: Request, key: int, encoded: bytes | None, *,
                 last: bool = False, throttle_ms: int = 0, busy_s: float = 0.0) -> None:
        """Send an answer, counting and timing it (RequestMetrics, door "kafka") from the
        request's arrival; `busy_s`: the handler thread's time on it."""
        request.respond(encoded, last=last, throttle_ms=throttle_ms)
        if self._meters is not None:
            self._meters.answered(api_name(key), "kafka", time.monotonic() - request.received_s,
                                  throttle_ms, busy_s)

    def on_request(self, run: list[Request]) -> None:
        """On the network thread: queue a run of a connection's requests for a handler
        thread, which handles them in their order."""
        self._io.submit(self._handle_run, run)

    def _handle_run(self, run: list[Request]) -> None:
        """On a request handler thread: each request of the run in turn, until one leaves the
        connection failed, throttled or closing; the rest are given back (a muted connection
        handles nothing until its throttle time is over)."""
        for i, request in enumerate(run):
            if not self._handle(request):
                for rest in run[i + 1:]:
                    rest.give_back()
                return

    def _handle(self, request: Request) -> bool:
        """Answer the request, or hand it on where it waits. Returns whether the connection's
        next request may be handled at once."""
        session = request.session
        frame, request.frame = request.frame, b""  # not kept while the answer waits
        started = time.monotonic()
        try:
            parsed = self._parse(frame, session)
            if (isinstance(parsed, _Parsed) and self.forward is not None
                    and for_coordinator(parsed.key, parsed.body)):
                return self._forward(request, parsed, frame)
            answer = self._call(parsed, session) if isinstance(parsed, _Parsed) else parsed
        except BadRequest as e:
            request.fail(str(e))
            return False
        if isinstance(answer, DelayedResponse):
            assert isinstance(parsed, _Parsed)
            request.release()
            delayed, key = answer, parsed.key
            busy_s = time.monotonic() - started
            self.purgatory.watch(delayed, lambda: self._io.submit(
                self._complete, request, key, parsed.correlation_id, delayed, busy_s))
            return True
        encoded, throttle_ms = answer if isinstance(answer, tuple) else (answer, 0)
        self._respond(request, peek(frame)[0], encoded, last=session.close_after_answer,
                      throttle_ms=throttle_ms, busy_s=time.monotonic() - started)
        return throttle_ms <= 0 and not session.close_after_answer

    def _forward(self, request: Request, parsed: _Parsed, frame: bytes) -> bool:
        """Pass a coordinator's request on to the driver; answer it when the driver does."""
        assert self.forward is not None
        answer = self.forward(frame, request.session.host, request.session.principal)
        if parsed.key not in FORWARDED_WAITING:
            return self._send_forwarded(request, parsed.key, answer)
        request.release()
        answer.add_done_callback(lambda done: self._io.submit(self._send_forwarded, request,
                                                              parsed.key, done))
        return True

    def _send_forwarded(self, request: Request, key: int,
                        answer: Future[tuple[bytes, int]]) -> bool:
        try:
            encoded, throttle_ms = answer.result()
        except errors.DeltaBusError as e:
            request.fail(f"the coordinator in the driver did not answer: {e.message}")
            return False
        self._respond(request, key, encoded or None, last=request.session.close_after_answer,
                      throttle_ms=throttle_ms)
        return throttle_ms <= 0 and not request.session.close_after_answer

    def answer_forwarded(self, frame: bytes, principal: KafkaPrincipal, host: str,
                         node: int) -> tuple[bytes, int]:
        """On the driver: the answer to a request broker `node` forwards for a client it
        authenticated (`forward`), and its throttle time in ms. Waits for a delayed answer:
        the caller is the forwarding call's own thread."""
        session = KafkaSession(host=host, principal=principal, authenticated=True)
        try:
            parsed = self._parse(frame, session)
            if not isinstance(parsed, _Parsed):
                return parsed, 0
            answer = self._call(parsed, session, node)
        except BadRequest as e:
            raise errors.InvalidRequestError(str(e)) from None
        if isinstance(answer, DelayedResponse):
            futures.wait(answer.waiting_on, max(0.0, answer.deadline_s - time.monotonic()))
            with acting_as(Access(self.apis.authorizer(), principal, host, parsed.client_id)):
                response = answer.complete()
            return (encode_response(parsed.correlation_id, response),
                    throttle_time_ms(response))
        encoded, throttle_ms = answer or (None, 0)
        return encoded or b"", throttle_ms

    def _complete(self, request: Request, key: int, correlation_id: int,
                  delayed: DelayedResponse, busy_s: float) -> None:
        """On a request handler thread: a delayed response whose wait is over."""
        session = request.session
        started = time.monotonic()
        try:
            with acting_as(Access(self.apis.authorizer(), session.principal, session.host)):
                response = delayed.complete()
        except Exception as e:  # a bug: the client gets a closed connection, the log says why
            log.exception("a delayed Kafka response failed")
            request.fail(f"a delayed response failed: {type(e).__name__}: {e}")
            return
        self._respond(request, key, encode_response(correlation_id, response),
                      throttle_ms=throttle_time_ms(response),
                      busy_s=busy_s + time.monotonic() - started)

    def _parse(self, frame: bytes, session: KafkaSession) -> bytes | _Parsed:
        """The request in a frame, or the answer where the door answers it itself (SASL,
        versions and APIs it does not serve)."""
        key, version, correlation_id = peek(frame)
        if not session.may_send(key):
            raise BadRequest(f"API {key} sent before SASL authentication")
        if key == apis.API_VERSIONS and not (
                apis.SUPPORTED[key][0] <= version <= apis.SUPPORTED[key][1]):
            # KIP-511: a client newer than us learns our versions from a v0 answer
            refused = errors.UnsupportedVersionError(f"ApiVersions v{version} is not supported")
            return encode_response(correlation_id, self.apis.api_versions(0, None, refused))
        try:
            header, request = parse_request(frame)
        except (UnknownAPIKey, UnknownEntity):
            raise BadRequest(f"API {key} version {version} is unknown") from None
        if key in sasl.SUPPORTED:
            lo, hi = sasl.SUPPORTED[key]
            if not lo <= version <= hi:
                return encode_response(correlation_id, unsupported(key, version))
            response = (sasl.handshake(version, request, session, self.authenticator)
                        if key == sasl.SASL_HANDSHAKE else sasl.authenticate(version, request,
                                                                            session))
            return encode_response(correlation_id, response)
        if not self.apis.knows(key):
            return encode_response(correlation_id, unsupported(key, version))
        return _Parsed(key, version, correlation_id, header.client_id or "", request)

    def _call(self, parsed: _Parsed, session: KafkaSession, node: int | None = None
              ) -> tuple[bytes | None, int] | DelayedResponse | None:
        """KafkaApis' answer, encoded, and its throttle time in ms (the connection is muted
        that long once it is sent); None where none is due (acks=0). `node`: the broker that
        forwarded the request."""
        key, version = parsed.key, parsed.version
        try:
            with acting_as(Access(self.apis.authorizer(), session.principal, session.host,
                                  parsed.client_id)):
                response = self.apis.handle(key, version, parsed.body,
                                            (parsed.client_id, f"/{session.host}"), node)
        except Exception as e:  # a bug: the client gets a closed connection, the log says why
            log.exception("Kafka API %d v%d failed", key, version)
            raise BadRequest(f"API {key} v{version} failed: {type(e).__name__}: {e}") from None
        if isinstance(response, apis.Unanswered):
            return None, response.throttle_ms
        if response is None or isinstance(response, DelayedResponse):
            return response
        return encode_response(parsed.correlation_id, response), throttle_time_ms(response)


def api_name(key: int) -> str:
    """Kafka's name of an API, as its RequestMetrics' `request` tag says it (a fetch on this
    door is a consumer's: followers fetch over gRPC)."""
    if key == apis.FETCH:
        return "FetchConsumer"
    snake = api_key_map.get(key)
    return "".join(part.capitalize() for part in snake.split("_")) if snake else str(key)


def unsupported(key: int, version: int) -> Any:
    """A response of an API deltabus does not implement: UNSUPPORTED_VERSION where the response
    has an error code, nothing in its lists."""
    cls = load_response_schema(key, version)
    values: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        kind = hints[f.name]
        if f.name == "error_code":
            values[f.name] = ErrorCode.unsupported_version
        elif kind is timedelta or "Timedelta" in getattr(kind, "__name__", ""):
            values[f.name] = NO_TIME
        elif typing.get_origin(kind) is tuple:
            values[f.name] = ()
        elif typing.get_origin(kind) in (typing.Union, types.UnionType):
            values[f.name] = None
        elif kind is bool:
            values[f.name] = False
        elif kind is str:
            values[f.name] = ""
        else:
            values[f.name] = -1
    return cls(**values)


class KafkaListener:
    """A Kafka protocol listener in front of `handler`, on host:port (0: any free port).
    Thread-safe; its threads are its own (see the module's docstring)."""

    def __init__(self, host: str, port: int, handler: DeltaBusHandler, *,
                 groups: GroupCoordinator | None = None, forward: Forward | None = None,
                 max_request_bytes: int | None = None,
                 security: ListenerSecurity = PLAINTEXT,
                 credentials: CredentialLookup | None = None, listener: str = "",
                 socket_server: cfg.SocketServerConfig | None = None,
                 transactions: TransactionHandler | None = None,
                 meters: RequestMeters | None = None) -> None:
        """`groups` and `transactions`: the group and transaction coordinators, on the
        listener that has them (the driver's); `forward`: how a broker's listener passes
        their requests on to the driver's; `security`: TLS and SASL; `credentials`: the
        users' SCRAM credentials a SASL listener checks; `listener`: its name (Metadata
        answers with the brokers' endpoints of it); `socket_server`: its threads and limits
        (`max_request_bytes`, where given, is its socket.request.max.bytes); `meters`: the
        node's request metrics, which count and time every answer."""
        config = socket_server or cfg.SocketServerConfig()
        if max_request_bytes is not None:
            config = dataclasses.replace(
                config, socket_request_max_bytes=max_request_bytes,
                queued_max_request_bytes=max(config.queued_max_request_bytes,
                                             max_request_bytes))
        kafka_apis = apis.KafkaApis(handler, groups, listener, transactions)
        authenticator = None
        if security.uses_sasl:
            if credentials is None:
                raise ValueError("a SASL listener needs the users' credentials")
            authenticator = Authenticator(credentials, security.sasl_enabled_mechanisms)
        ssl_context = server_ssl_context(security) if security.uses_tls else None
        try:
            server = socket.create_server((host, port),
                                          backlog=config.socket_listen_backlog_size)
        except OSError as e:
            raise ListenerBindError(
                f"cannot listen for Kafka clients on {host}:{port}: {e.strerror}") from None
        address = server.getsockname()
        self.host: str = str(address[0])
        self.port: int = int(address[1])
        self.bound_port = self.port
        self._handlers = _RequestHandlers(kafka_apis, authenticator, config,
                                          f"kafka-{self.port}", forward, meters)
        self._processor = Processor(server, self._handlers.on_request, config=config,
                                    ssl_context=ssl_context, sasl_required=security.uses_sasl)
        self._thread = threading.Thread(target=self._processor.run,
                                        name=f"kafka-network-{self.port}", daemon=True)

    def advertise(self, host: str, port: int) -> None:
        """Tell clients (host, port) for this listener rather than the bound address (Kafka's
        advertised.listeners)."""
        self.host, self.port = host, port

    def answer_forwarded(self, frame: bytes, principal: KafkaPrincipal, host: str,
                         node: int) -> tuple[bytes, int]:
        """On the driver: answer a request a broker's listener of this name forwards."""
        return self._handlers.answer_forwarded(frame, principal, host, node)

    def start(self) -> KafkaListener:
        self._handlers.purgatory.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listening socket and every connection; requests being handled finish on
        their threads and their answers are dropped."""
        self._processor.stop()
        if self._thread.is_alive():
            self._thread.join(STOP_TIMEOUT_S)
        elif self._thread.ident is None:
            self._processor.close()  # never started: its sockets are closed here
        self._handlers.stop()
