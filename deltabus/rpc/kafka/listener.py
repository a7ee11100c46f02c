"""The Kafka protocol listener: TCP on the broker's Kafka port, a thread per connection.

Requests on one connection are answered one at a time, in order (Kafka's clients pipeline
requests and match responses by order and correlation id; a long-polling fetch holds its
connection as on a Kafka broker). What Kafka's broker does with bad input, this does too:
- an API or version outside the advertised ones gets UNSUPPORTED_VERSION in a response of that
  API (ApiVersions answers in its v0 form, so any client can read the versions it may use);
- a frame larger than `socket.request.max.bytes`, a negative size, a header or body that does not
  parse, or an API kio has no schema for closes that connection, with a log line saying why;
- one connection's trouble never touches the others, nor the broker.

With TLS (SSL, SASL_SSL) each connection starts with the TLS handshake; a client certificate
names an SSL connection's principal. With SASL (SASL_PLAINTEXT, SASL_SSL) a connection may send
only ApiVersions, SaslHandshake and SaslAuthenticate until it has authenticated (`sasl`).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import socketserver
import ssl
import struct
import threading
import types
import typing
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import DeltaBusHandler
from deltabus.config import ListenerSecurity
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.principal import ANONYMOUS
from deltabus.rpc.access import Access, acting_as
from deltabus.rpc.authentication import Authenticator, CredentialLookup
from deltabus.rpc.kafka import apis, sasl
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
from deltabus.rpc.kafka.sasl import KafkaSession
from deltabus.rpc.tls import certificate_principal, server_ssl_context

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
TLS_HANDSHAKE_TIMEOUT_S = 10
PLAINTEXT = ListenerSecurity()


class _Connection(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = f"{self.client_address[0]}:{self.client_address[1]}"
        session = KafkaSession(self.client_address[0],
                               sasl_required=self.server.security.uses_sasl)
        if self.server.ssl_context is not None:
            wrapped = self._start_tls(sock, peer)
            if wrapped is None:
                return
            sock = wrapped
            if not session.sasl_required:
                session.principal = certificate_principal(sock.getpeercert()) or ANONYMOUS
        while not self.server.closing.is_set():
            try:
                head = _read_exactly(sock, 4)
                if head is None:
                    return  # the client closed the connection
                (size,) = _SIZE.unpack(head)
                if not 0 < size <= self.server.max_request_bytes:
                    log.warning("closing Kafka connection from %s: a request of %d bytes (the "
                                "most is socket.request.max.bytes=%d)", peer, size,
                                self.server.max_request_bytes)
                    return
                frame = _read_exactly(sock, size)
                if frame is None:
                    log.info("closing Kafka connection from %s: it ended inside a request", peer)
                    return
                response = self.server.answer(frame, session)
            except BadRequest as e:
                log.warning("closing Kafka connection from %s: %s", peer, e)
                return
            except OSError:
                return
            if response is not None:
                try:
                    sock.sendall(response)
                except OSError:
                    return
            if session.close_after_answer:
                log.info("closing Kafka connection from %s (%s): SASL authentication failed",
                         peer, session.principal)
                return

    def _start_tls(self, sock: socket.socket, peer: str) -> ssl.SSLSocket | None:
        """The TLS handshake, within TLS_HANDSHAKE_TIMEOUT_S (a client that never finishes
        it does not hold the connection's thread)."""
        assert self.server.ssl_context is not None
        sock.settimeout(TLS_HANDSHAKE_TIMEOUT_S)
        try:
            wrapped = self.server.ssl_context.wrap_socket(sock, server_side=True)
        except (ssl.SSLError, OSError) as e:
            log.info("closing Kafka connection from %s: TLS handshake failed: %s", peer, e)
            return None
        wrapped.settimeout(None)
        return wrapped


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], kafka_apis: apis.KafkaApis,
                 max_request_bytes: int, security: ListenerSecurity,
                 authenticator: Authenticator | None) -> None:
        self.apis = kafka_apis
        self.max_request_bytes = max_request_bytes
        self.security = security
        self.ssl_context = server_ssl_context(security) if security.uses_tls else None
        self.authenticator = authenticator
        self.closing = threading.Event()
        super().__init__(address, _Connection)

    def answer(self, frame: bytes, session: KafkaSession | None = None) -> bytes | None:
        """The response frame to one request frame (None: none is due, as for acks=0)."""
        session = session or KafkaSession("")
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
        try:
            with acting_as(Access(self.apis.authorizer(), session.principal, session.host)):
                response = self.apis.handle(key, version, request,
                                            (header.client_id or "", f"/{session.host}"))
        except Exception as e:  # a bug: the client gets a closed connection, the log says why
            log.exception("Kafka API %d v%d failed", key, version)
            raise BadRequest(f"API {key} v{version} failed: {type(e).__name__}: {e}") from None
        return None if response is None else encode_response(correlation_id, response)


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


def _address(host_port: str) -> tuple[str, int] | None:
    if not host_port:
        return None
    host, port = host_port.rsplit(":", 1)
    return host, int(port)


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class KafkaListener:
    """A Kafka protocol listener in front of `handler`, on host:port (0: any free port)."""

    def __init__(self, host: str, port: int, handler: DeltaBusHandler, *,
                 groups: GroupCoordinator | None = None, coordinator: str = "",
                 max_request_bytes: int = cfg.REQUEST_MAX_BYTES,
                 security: ListenerSecurity = PLAINTEXT,
                 credentials: CredentialLookup | None = None, listener: str = "") -> None:
        """`groups`: the group coordinator, on the listener that has it (the bootstrap, which
        then tells clients to come to itself); `coordinator`: host:port of that listener, for
        the brokers' FindCoordinator answers; `security`: TLS and SASL; `credentials`: the
        users' SCRAM credentials a SASL listener checks; `listener`: its name (Metadata
        answers with the brokers' endpoints of it)."""
        kafka_apis = apis.KafkaApis(handler, groups, _address(coordinator), listener)
        authenticator = None
        if security.uses_sasl:
            if credentials is None:
                raise ValueError("a SASL listener needs the users' credentials")
            authenticator = Authenticator(credentials, security.sasl_enabled_mechanisms)
        try:
            self._server = _Server((host, port), kafka_apis, max_request_bytes, security,
                                   authenticator)
        except OSError as e:
            raise errors.BrokerNotAvailableError(
                f"cannot listen for Kafka clients on {host}:{port}: {e.strerror}") from None
        address = self._server.server_address
        self.host: str = str(address[0])
        self.port: int = int(address[1])
        self.bound_port = self.port
        if groups is not None:
            kafka_apis.groups.coordinator_address = (self.host, self.port)
        self._apis = kafka_apis
        self._coordinates = groups is not None  # this listener is the group coordinator's
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,),
                                        name=f"kafka-listener-{self.port}", daemon=True)

    def advertise(self, host: str, port: int) -> None:
        """Tell clients (host, port) for this listener rather than the bound address (Kafka's
        advertised.listeners); on the group coordinator's listener FindCoordinator names it."""
        self.host, self.port = host, port
        if self._coordinates:
            self._apis.groups.coordinator_address = (host, port)

    def start(self) -> KafkaListener:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.closing.set()
        self._server.shutdown()
        self._server.server_close()
