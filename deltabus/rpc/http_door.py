"""The HTTP doors' common part: a threaded HTTP(S) server that authenticates each request as the
cluster's client listener does, then hands it to an app (the schema registry's REST API,
the metrics and service discovery endpoints, the console), which authorizes and answers it.

Security follows the cluster's client listener, so one set of users and ACLs guards every door:
- TLS (security.protocol SSL, SASL_SSL): the door serves HTTPS with the listeners' certificate
  (and asks for client certificates with ssl.client.auth=required: the subject names the
  caller).
- SASL (SASL_PLAINTEXT, SASL_SSL): every request carries HTTP Basic credentials of a SCRAM user
  (Prometheus' `basic_auth`, confluent-kafka's `basic.auth.user.info`), or is answered 401.
- What a principal may see or do is the app's to decide, against the cluster's ACLs.

Runs in the driver and in broker tasks; a thread per request (`ThreadingHTTPServer`), so the
door keeps no state of its own.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol, Self

from deltabus import errors
from deltabus.config import ListenerSecurity
from deltabus.listeners import ListenerBindError
from deltabus.metrics import RequestMeters
from deltabus.rpc.access import Access
from deltabus.rpc.authentication import Authenticator, CredentialLookup
from deltabus.rpc.call_authentication import basic_credentials
from deltabus.rpc.tls import certificate_principal, server_ssl_context
from deltabus.security.acls import Authorizer
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 60  # a connection silent this long (mid-request or idle) is closed


@dataclass(frozen=True)
class HttpRequest:
    """A request the door authenticated: `path` has no trailing slash ("/" at least), `query`
    the last value of each parameter."""

    method: str
    path: str
    query: Mapping[str, str]
    body: bytes
    principal: KafkaPrincipal
    host: str  # the client's address
    authorizer: Authorizer | None  # the cluster's ACLs at this request (None: no authorizer)

    @property
    def access(self) -> Access:
        """What this principal may do, under the cluster's ACLs."""
        return Access(self.authorizer, self.principal, self.host)


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes
    content_type: str
    headers: Mapping[str, str] = field(default_factory=dict)


class HttpApp(Protocol):
    """What a door serves: its answer to each authenticated request, and how it words the
    door's own refusals (a body too large, no or wrong credentials)."""

    name: str  # in logs and thread names
    request_bytes_max: int

    def serve(self, request: HttpRequest) -> HttpResponse: ...

    def refusal(self, status: int, message: str) -> HttpResponse: ...


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: scrapers and serializers reuse connections
    timeout = REQUEST_TIMEOUT_S

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):  # on this request's thread, not accept's
            self.request.settimeout(self.timeout)
            self.request.do_handshake()
        super().setup()

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        app = self.server.app
        started = time.monotonic()
        url = urllib.parse.urlsplit(self.path)
        try:
            principal = self._principal()
            request = HttpRequest(
                method, url.path.rstrip("/") or "/",
                {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()},
                self._body(app.request_bytes_max), principal, self.client_address[0],
                self.server.authorizer())
            response = app.serve(request)
        except _Refused as e:
            response = app.refusal(e.status, e.message)
        except Exception as e:  # a bug: the client gets a 500, the log says why
            log.exception("%s: %s %s failed", app.name, method, self.path)
            response = app.refusal(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}")
        self.send_response(response.status)
        if response.status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", f'Basic realm="deltabus {app.name}"')
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        self.wfile.write(response.body)
        if self.server.meters is not None:  # by method: paths name subjects, without bound
            self.server.meters.answered(method, self.server.door, time.monotonic() - started)

    def _principal(self) -> KafkaPrincipal:
        """Who calls: a SCRAM user by HTTP Basic on a SASL cluster, a client certificate's
        subject, else anonymous."""
        authenticator = self.server.authenticator
        if authenticator is not None:
            header = self.headers.get("Authorization")
            try:
                if not header:
                    raise errors.SaslAuthenticationFailedError("no credentials")
                name, password = basic_credentials(header)
                return authenticator.check_password(name, password)
            except errors.DeltaBusError:
                raise _Refused(HTTPStatus.UNAUTHORIZED, "Unauthorized: send the credentials "
                               "of a SCRAM user as HTTP Basic") from None
        if isinstance(self.connection, ssl.SSLSocket):
            return certificate_principal(self.connection.getpeercert()) or ANONYMOUS
        return ANONYMOUS

    def _body(self, size_max: int) -> bytes:
        size = int(self.headers.get("Content-Length") or 0)
        if size > size_max:
            raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                           f"a request body may be at most {size_max} bytes")
        return self.rfile.read(size) if size else b""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s: " + format, self.server.app.name, self.client_address[0], *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    app: HttpApp
    door: str  # the app's name as the RequestMetrics' door label ("schema_registry", ...)
    meters: RequestMeters | None  # the node's, counting and timing every request
    authenticator: Authenticator | None  # SASL: every request names a SCRAM user
    authorizer: Callable[[], Authorizer | None]  # the cluster's, at each request

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (a TLS handshake refused, a client gone): a debug line,
        not a traceback on stderr."""
        log.debug("%s: connection from %s failed", self.app.name, client_address,
                  exc_info=True)


class HttpDoor:
    """`app` served on (host, port) (port 0: any free one), on threads of its own, secured as
    the cluster's client listener is (`security`: its TLS and SASL; `credentials`: the users'
    SCRAM credentials, for SASL; `authorizer`: the cluster's ACLs, None without; `meters`: the
    node's request metrics, which count and time each request by method)."""

    def __init__(self, app: HttpApp, host: str, port: int, *,
                 security: ListenerSecurity | None = None,
                 credentials: CredentialLookup | None = None,
                 authorizer: Callable[[], Authorizer | None] = lambda: None,
                 meters: RequestMeters | None = None) -> None:
        security = security or ListenerSecurity()
        if security.uses_sasl and credentials is None:
            raise ValueError(f"a SASL cluster's {app.name} needs the users' credentials")
        try:
            self._server = _Server((host, port), _Handler)
        except OSError as e:
            raise ListenerBindError(
                f"cannot serve the {app.name} on {host}:{port}: {e.strerror}") from None
        if security.uses_tls:
            self._server.socket = server_ssl_context(security).wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False)
        self._server.app = app
        self._server.door = app.name.replace(" ", "_")
        self._server.meters = meters
        self._server.authenticator = (Authenticator(credentials, security.sasl_enabled_mechanisms)
                                      if security.uses_sasl and credentials else None)
        self._server.authorizer = authorizer
        self.host = host
        self.port = int(self._server.server_address[1])
        self.scheme = "https" if security.uses_tls else "http"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=f"{app.name.replace(' ', '-')}-{self.port}",
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
