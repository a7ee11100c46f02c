"""SASL on the Kafka door (KIP-43, KIP-152): SaslHandshake picks a mechanism, SaslAuthenticate
carries its tokens, and until the exchange succeeds a SASL listener answers nothing else but
ApiVersions, as Kafka's broker does. A failed exchange is answered with
SASL_AUTHENTICATION_FAILED and the connection then closes; so does any other request sent before
authentication. Each connection has its own `KafkaSession`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deltabus import errors
from deltabus.rpc.authentication import Authenticator, SaslExchange
from deltabus.rpc.kafka.frames import error_code, load_response_schema, make
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal

SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS = 17, 36, 18
# SaslHandshake is advertised from v0, as Kafka's broker does: librdkafka before 2.x (kcat's, on
# Debian) uses SASL only where the advertised range takes in v0, though it then sends v1. A v0
# handshake itself is refused and its connection closed: v0 sends the tokens raw, outside
# Kafka's framing, and deltabus reads only SaslAuthenticate (v1 on).
SUPPORTED: dict[int, tuple[int, int]] = {SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}


@dataclass(slots=True)
class KafkaSession:
    """One Kafka connection: who is on the other end, and how far its SASL exchange got."""

    host: str
    principal: KafkaPrincipal = ANONYMOUS
    sasl_required: bool = False
    exchange: SaslExchange | None = None
    authenticated: bool = False
    close_after_answer: bool = False  # the answer being sent is the connection's last

    def may_send(self, api_key: int) -> bool:
        return (not self.sasl_required or self.authenticated
                or api_key in (API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE))


def handshake(version: int, request: Any, session: KafkaSession,
              authenticator: Authenticator | None) -> Any:
    cls = load_response_schema(SASL_HANDSHAKE, version)
    enabled = authenticator.mechanisms if authenticator is not None else ()
    error: errors.DeltaBusError | None = None
    if version == 0:
        error = errors.UnsupportedVersionError(
            "SaslHandshake v0 (raw SASL tokens) is not supported: use v1 with SaslAuthenticate")
    elif authenticator is None or not session.sasl_required:
        error = errors.IllegalSaslStateError("this listener does not use SASL")
    elif session.authenticated or session.exchange is not None:
        error = errors.IllegalSaslStateError("SASL handshake already done on this connection")
    elif request.mechanism not in enabled:
        error = errors.UnsupportedSaslMechanismError(
            f"Unsupported SASL mechanism {request.mechanism}")
    else:
        session.exchange = authenticator.exchange(request.mechanism)
    if error is not None:
        session.close_after_answer = True
    return make(cls, error_code=error_code(error), mechanisms=tuple(enabled))


def authenticate(version: int, request: Any, session: KafkaSession) -> Any:
    cls = load_response_schema(SASL_AUTHENTICATE, version)
    error: errors.DeltaBusError | None = None
    answer = b""
    if session.exchange is None or session.authenticated:
        error = errors.IllegalSaslStateError(
            "SaslAuthenticate needs a SaslHandshake first, and only until authentication ends")
    else:
        try:
            answer = session.exchange.step(request.auth_bytes)
        except errors.DeltaBusError as e:
            error = e
        else:
            if session.exchange.principal is not None:
                session.principal = session.exchange.principal
                session.authenticated = True
    if error is not None:
        session.close_after_answer = True
    return make(cls, error_code=error_code(error),
                error_message=None if error is None else error.message, auth_bytes=answer)
