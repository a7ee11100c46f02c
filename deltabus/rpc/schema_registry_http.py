"""The schema registry's REST door: Confluent Schema Registry's API, so existing serializers
(confluent-kafka's AvroSerializer, JSONSerializer, ProtobufSerializer, Java's KafkaAvroSerializer)
and tools (curl scripts written for Confluent) work unchanged against deltabus.

Served in the driver beside the controller, on a thread per request (`ThreadingHTTPServer`):
every call goes to the registry (`SchemaRegistryHandler`), which runs under the controller's
lock, so the door keeps no state. Answers are Confluent's: JSON bodies of
`application/vnd.schemaregistry.v1+json`, errors as {"error_code", "message"} with the HTTP status
the code starts with (40401 -> 404).

Security follows the cluster's client listener, so one set of users and ACLs guards the
registry on every door:
- TLS (security.protocol SSL, SASL_SSL): the door serves HTTPS with the listeners' certificate
  (and asks for client certificates with ssl.client.auth=required: the subject names the
  caller).
- SASL (SASL_PLAINTEXT, SASL_SSL): every request carries HTTP Basic credentials of a SCRAM user
  (confluent-kafka's `basic.auth.user.info`), or is answered 401.
- With an authorizer, reading needs DESCRIBE on the cluster and changing (registering,
  deleting, setting a level) ALTER on the cluster, as over gRPC: else 403 (error code 40301).

What it does not serve (answered 404 with error code 404, as an unknown path): modes other than
READWRITE, contexts, data-contract rule sets and metadata (accepted on register and ignored),
exporters.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from deltabus import errors
from deltabus.cluster.handler import SchemaRegistryHandler
from deltabus.config import ListenerSecurity
from deltabus.listeners import ListenerBindError
from deltabus.rpc.access import Access
from deltabus.rpc.authentication import Authenticator, CredentialLookup
from deltabus.rpc.call_authentication import basic_credentials
from deltabus.rpc.tls import certificate_principal, server_ssl_context
from deltabus.schemas import (
    LATEST_VERSION,
    SchemaReference,
    SchemaRegistryError,
    SchemaType,
    StoredSchema,
    SubjectVersion,
    check_version,
    invalid_version,
)
from deltabus.security.acls import Authorizer, Operation
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
REQUEST_BYTES_MAX = 16 * 1024 * 1024  # a schema request's body, at most
REQUEST_TIMEOUT_S = 60  # a connection silent this long (mid-request or idle) is closed

Query = dict[str, str]
Route = tuple[str, re.Pattern[str], Callable[..., Any]]


class RestError(Exception):
    """A request the door itself refuses (bad JSON, unknown path), with Confluent's code."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.error_code, self.message = status, error_code, message


def _version(text: str) -> int:
    """A version in a path: "latest", -1, or 1 to 2^31-1 (INVALID_VERSION 42202)."""
    if text == "latest":
        return LATEST_VERSION
    try:
        return check_version(int(text), text)
    except ValueError:
        raise invalid_version(text) from None


def _flag(query: Query, name: str) -> bool:
    return query.get(name, "false").lower() == "true"


def _schema_body(stored: StoredSchema) -> dict[str, Any]:
    body: dict[str, Any] = {"schema": stored.text}
    if stored.schema_type != SchemaType.AVRO:  # Confluent leaves Avro's type out
        body["schemaType"] = stored.schema_type.value
    if stored.references:
        body["references"] = [{"name": r.name, "subject": r.subject, "version": r.version}
                              for r in stored.references]
    return body


def _references(body: dict[str, Any]) -> tuple[SchemaReference, ...]:
    items = body.get("references") or []
    if not isinstance(items, list):
        raise SchemaRegistryError(42201, "Invalid schema: references must be a list")
    out = []
    for item in items:
        try:
            out.append(SchemaReference(str(item["name"]), str(item["subject"]),
                                       int(item["version"])))
        except (KeyError, TypeError, ValueError):
            raise SchemaRegistryError(
                42201, f"Invalid schema: a reference needs a name, a subject and a version: "
                f"{item}") from None
    return tuple(out)


def _schema_request(body: Any) -> tuple[str, str, tuple[SchemaReference, ...]]:
    """(type, text, references) of a register, lookup or compatibility request's body."""
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise SchemaRegistryError(42201, "Invalid schema: the body must be a JSON object with "
                                  "the schema as a string under \"schema\"")
    return str(body.get("schemaType") or SchemaType.AVRO.value), body["schema"], \
        _references(body)


class SchemaRegistryApi:
    """Confluent's REST API over a `SchemaRegistryHandler`: one method per route, each taking
    the path's parts, the query and the JSON body, and returning the JSON answer."""

    def __init__(self, registry: SchemaRegistryHandler) -> None:
        self.registry = registry
        r = registry
        self.routes: list[Route] = [
            ("GET", re.compile(r"/"), lambda q, b: {}),
            ("GET", re.compile(r"/schemas/types"),
             lambda q, b: [t.value for t in SchemaType]),
            ("GET", re.compile(r"/schemas/ids/(\d+)"), self.schema_by_id),
            ("GET", re.compile(r"/schemas/ids/(\d+)/schema"),
             lambda i, q, b: r.schema_by_id(int(i), q.get("format", "")).text),
            ("GET", re.compile(r"/schemas/ids/(\d+)/subjects"),
             lambda i, q, b: sorted({v.subject for v in r.schema_versions(
                 int(i), _flag(q, "deleted"))})),
            ("GET", re.compile(r"/schemas/ids/(\d+)/versions"),
             lambda i, q, b: [{"subject": v.subject, "version": v.version}
                              for v in r.schema_versions(int(i), _flag(q, "deleted"))]),
            ("GET", re.compile(r"/subjects"),
             lambda q, b: r.subjects(_flag(q, "deleted"), q.get("subjectPrefix", ""))),
            ("GET", re.compile(r"/subjects/([^/]+)/versions"),
             lambda s, q, b: [v.version for v in r.subject_versions(s, _flag(q, "deleted"))]),
            ("GET", re.compile(r"/subjects/([^/]+)/versions/([^/]+)"), self.subject_version),
            ("GET", re.compile(r"/subjects/([^/]+)/versions/([^/]+)/schema"),
             lambda s, v, q, b: r.schema_by_id(r.subject_version(
                 s, _version(v), _flag(q, "deleted")).schema_id, q.get("format", "")).text),
            ("GET", re.compile(r"/subjects/([^/]+)/versions/([^/]+)/referencedby"),
             lambda s, v, q, b: r.referenced_by(s, _version(v))),
            ("POST", re.compile(r"/subjects/([^/]+)/versions"), self.register),
            ("POST", re.compile(r"/subjects/([^/]+)"), self.lookup),
            ("DELETE", re.compile(r"/subjects/([^/]+)"),
             lambda s, q, b: r.delete_subject(s, _flag(q, "permanent"))),
            ("DELETE", re.compile(r"/subjects/([^/]+)/versions/([^/]+)"),
             lambda s, v, q, b: r.delete_schema_version(s, _version(v),
                                                        _flag(q, "permanent"))),
            ("POST", re.compile(r"/compatibility/subjects/([^/]+)/versions"),
             lambda s, q, b: self.compatibility(s, None, q, b)),
            ("POST", re.compile(r"/compatibility/subjects/([^/]+)/versions/([^/]+)"),
             lambda s, v, q, b: self.compatibility(s, _version(v), q, b)),
            ("GET", re.compile(r"/config"),
             lambda q, b: {"compatibilityLevel": r.compatibility_level("", True).value}),
            ("PUT", re.compile(r"/config"), lambda q, b: self.set_config("", q, b)),
            ("GET", re.compile(r"/config/([^/]+)"),
             lambda s, q, b: {"compatibilityLevel": r.compatibility_level(
                 s, _flag(q, "defaultToGlobal")).value}),
            ("PUT", re.compile(r"/config/([^/]+)"), self.set_config),
            ("DELETE", re.compile(r"/config/([^/]+)"),
             lambda s, q, b: {"compatibilityLevel": r.set_compatibility_level(s, None).value}),
            ("GET", re.compile(r"/mode(?:/[^/]+)?"), lambda *a: {"mode": "READWRITE"}),
        ]

    @staticmethod
    def operation(method: str, path: str) -> Operation:
        """What a request does to the registry, for the cluster's ACLs: reads (GET, a lookup,
        a compatibility test) are DESCRIBE, every change ALTER."""
        if method == "GET" or (method == "POST" and (
                path.startswith("/compatibility/") or not path.endswith("/versions"))):
            return Operation.DESCRIBE
        return Operation.ALTER

    def answer(self, method: str, path: str, query: Query, body: Any) -> Any:
        """The JSON answer of a request; raises SchemaRegistryError or RestError."""
        known_path = False
        for route_method, pattern, call in self.routes:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            known_path = True
            if route_method == method:
                parts = [urllib.parse.unquote(p) for p in match.groups()]
                return call(*parts, query, body)
        if known_path:
            raise RestError(HTTPStatus.METHOD_NOT_ALLOWED, 405, "HTTP 405 Method Not Allowed")
        raise RestError(HTTPStatus.NOT_FOUND, 404, "HTTP 404 Not Found")

    def schema_by_id(self, schema_id: str, query: Query, body: Any) -> dict[str, Any]:
        return _schema_body(self.registry.schema_by_id(int(schema_id), query.get("format", "")))

    def _version_body(self, held: SubjectVersion, fmt: str = "") -> dict[str, Any]:
        return {"subject": held.subject, "version": held.version, "id": held.schema_id,
                **_schema_body(self.registry.schema_by_id(held.schema_id, fmt))}

    def subject_version(self, subject: str, version: str, query: Query,
                        body: Any) -> dict[str, Any]:
        held = self.registry.subject_version(subject, _version(version), _flag(query, "deleted"))
        return self._version_body(held, query.get("format", ""))

    def register(self, subject: str, query: Query, body: Any) -> dict[str, Any]:
        schema_type, text, references = _schema_request(body)
        held = self.registry.register_schema(subject, schema_type, text, references)
        return self._version_body(held)

    def lookup(self, subject: str, query: Query, body: Any) -> dict[str, Any]:
        schema_type, text, references = _schema_request(body)
        held = self.registry.lookup_schema(subject, schema_type, text, references,
                                           _flag(query, "deleted"))
        return self._version_body(held)

    def compatibility(self, subject: str, version: int | None, query: Query,
                      body: Any) -> dict[str, Any]:
        schema_type, text, references = _schema_request(body)
        if version is not None:
            self.registry.subject_version(subject, version, False)  # 40401 / 40402 first
        problems = self.registry.test_compatibility(subject, version, schema_type, text,
                                                    references)
        answer: dict[str, Any] = {"is_compatible": not problems}
        if _flag(query, "verbose"):
            answer["messages"] = problems
        return answer

    def set_config(self, subject: str, query: Query, body: Any) -> dict[str, str]:
        level = body.get("compatibility") if isinstance(body, dict) else None
        if not isinstance(level, str):
            raise SchemaRegistryError(42203, "Invalid compatibility level: the body must be "
                                      "{\"compatibility\": LEVEL}")
        return {"compatibility": self.registry.set_compatibility_level(subject, level).value}


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: serializers reuse their connection
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
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        path = url.path.rstrip("/") or "/"
        status: int
        try:
            self._authorize(method, path)
            body = self._body()
            status, answer = HTTPStatus.OK, self.server.api.answer(method, path, query, body)
        except SchemaRegistryError as e:
            status, answer = e.http_status, {"error_code": e.error_code, "message": e.message}
        except RestError as e:
            status, answer = e.status, {"error_code": e.error_code, "message": e.message}
        except Exception as e:  # a bug: the client gets Confluent's 50001, the log says why
            log.exception("schema registry: %s %s failed", method, self.path)
            status, answer = HTTPStatus.INTERNAL_SERVER_ERROR, {
                "error_code": 50001, "message": f"Error in the backend data store: {e}"}
        data = json.dumps(answer).encode()
        self.send_response(status)
        if status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", 'Basic realm="deltabus schema registry"')
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorize(self, method: str, path: str) -> None:
        """Who calls (HTTP Basic on a SASL cluster, a client certificate, else anonymous),
        and whether the cluster's ACLs let them: RestError 401 or 403 if not."""
        server = self.server
        principal: KafkaPrincipal = ANONYMOUS
        if server.authenticator is not None:
            header = self.headers.get("Authorization")
            try:
                if not header:
                    raise errors.SaslAuthenticationFailedError("no credentials")
                name, password = basic_credentials(header)
                principal = server.authenticator.check_password(name, password)
            except errors.DeltaBusError:
                raise RestError(HTTPStatus.UNAUTHORIZED, 401, "Unauthorized: send the "
                                "credentials of a SCRAM user as HTTP Basic "
                                "(basic.auth.user.info)") from None
        elif isinstance(self.connection, ssl.SSLSocket):
            principal = certificate_principal(self.connection.getpeercert()) or ANONYMOUS
        refusal = Access(server.authorizer(), principal, self.client_address[0]).cluster(
            server.api.operation(method, path))
        if refusal is not None:
            raise RestError(HTTPStatus.FORBIDDEN, 40301, f"{refusal.message}: "
                            f"{method} {path} needs "
                            f"{server.api.operation(method, path).name} on the cluster")

    def _body(self) -> Any:
        size = int(self.headers.get("Content-Length") or 0)
        if size > REQUEST_BYTES_MAX:
            raise RestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, 413,
                            f"a request body may be at most {REQUEST_BYTES_MAX} bytes")
        if not size:
            return None
        try:
            return json.loads(self.rfile.read(size))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RestError(HTTPStatus.BAD_REQUEST, 400, f"Unrecognized JSON: {e}") from None

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("schema registry %s: " + format, self.client_address[0], *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: SchemaRegistryApi
    authenticator: Authenticator | None  # SASL: every request names a SCRAM user
    authorizer: Callable[[], Authorizer | None]  # the cluster's, at each request

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (a TLS handshake refused, a client gone): a debug line,
        not a traceback on stderr."""
        log.debug("schema registry: connection from %s failed", client_address, exc_info=True)


class SchemaRegistryServer:
    """The REST door on (host, port) (port 0: any free one), on threads of its own, secured
    as the cluster's client listener is (`security`: its TLS and SASL; `credentials`: the
    users' SCRAM credentials, for SASL; `authorizer`: the cluster's ACLs, None without)."""

    def __init__(self, registry: SchemaRegistryHandler, host: str, port: int, *,
                 security: ListenerSecurity | None = None,
                 credentials: CredentialLookup | None = None,
                 authorizer: Callable[[], Authorizer | None] = lambda: None) -> None:
        security = security or ListenerSecurity()
        if security.uses_sasl and credentials is None:
            raise ValueError("a SASL cluster's registry needs the users' credentials")
        try:
            self._server = _Server((host, port), _Handler)
        except OSError as e:
            raise ListenerBindError(
                f"cannot serve the schema registry on {host}:{port}: {e.strerror}") from None
        if security.uses_tls:
            self._server.socket = server_ssl_context(security).wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False)
        self._server.api = SchemaRegistryApi(registry)
        self._server.authenticator = (Authenticator(credentials, security.sasl_enabled_mechanisms)
                                      if security.uses_sasl and credentials else None)
        self._server.authorizer = authorizer
        self.host = host
        self.port = int(self._server.server_address[1])
        self._scheme = "https" if security.uses_tls else "http"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=f"schema-registry-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"{self._scheme}://{self.host}:{self.port}"

    def start(self) -> SchemaRegistryServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
