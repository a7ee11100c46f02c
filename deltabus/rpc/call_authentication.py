"""Who makes each gRPC call on the public API, as the listener's security protocol says.

- SASL_PLAINTEXT, SASL_SSL: every call carries `authorization: Basic base64(user:password)`
  (RFC 7617), checked against the user's SCRAM credentials, the same users the Kafka door's SASL
  checks; a call without it, or with a wrong one, fails UNAUTHENTICATED with Kafka's
  SASL_AUTHENTICATION_FAILED before it reaches a servicer.
- SSL with ssl.client.auth=required: the verified client certificate's subject names the caller.
- Otherwise the caller is User:ANONYMOUS, as on Kafka's PLAINTEXT listeners.
- A broker forwarding its client's admin call to the controller (Kafka's envelope) carries the
  cluster's broker credential and names that client: the call acts as that client.

The principal is known to the servicer's code for the length of the call (`current_principal`).
The internal API is the inter-broker door's business (`inter_broker`), not this one's.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
from collections.abc import Callable
from typing import Any

import grpc

from deltabus import errors
from deltabus.config import ListenerSecurity
from deltabus.rpc.authentication import Authenticator
from deltabus.rpc.inter_broker import INTERNAL_METHODS, vouched_principal
from deltabus.rpc.status import abort
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal

AUTHORIZATION_KEY = "authorization"
_PRINCIPAL: contextvars.ContextVar[KafkaPrincipal] = contextvars.ContextVar(
    "deltabus_principal", default=ANONYMOUS)


def current_principal() -> KafkaPrincipal:
    """The principal of the gRPC call being served on this thread."""
    return _PRINCIPAL.get()


def basic_credentials(header: str) -> tuple[str, str]:
    """(user, password) of an `authorization: Basic ...` value; raises on anything else."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        raise errors.SaslAuthenticationFailedError(
            "a call must carry 'authorization: Basic base64(user:password)'")
    try:
        name, sep, password = base64.b64decode(encoded.strip(), validate=True).decode(
            "utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise errors.SaslAuthenticationFailedError(
            "the authorization header is not base64 of user:password") from None
    if not sep or not name:
        raise errors.SaslAuthenticationFailedError(
            "the authorization header is not base64 of user:password")
    return name, password


class CallAuthenticator(grpc.ServerInterceptor):
    """Finds (and on SASL listeners checks) the principal of every public call."""

    def __init__(self, security: ListenerSecurity, authenticator: Authenticator | None,
                 broker_secret: str | None = None) -> None:
        """`broker_secret`: the cluster's broker credential; a call carrying it is a broker
        forwarding its client's admin call, on behalf of the principal it names."""
        if security.uses_sasl and authenticator is None:
            raise ValueError("a SASL listener needs the users' credentials")
        self._security = security
        self._authenticator = authenticator
        self._broker_secret = broker_secret or ""

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if (handler is None or handler.unary_unary is None
                or handler_call_details.method.startswith(INTERNAL_METHODS)):
            return handler
        behavior = handler.unary_unary

        def authenticated(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                principal = self._principal(context)
            except errors.DeltaBusError as e:
                abort(context, e)
            token = _PRINCIPAL.set(principal)
            try:
                return behavior(request, context)
            finally:
                _PRINCIPAL.reset(token)

        return grpc.unary_unary_rpc_method_handler(
            authenticated, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)

    def _principal(self, context: grpc.ServicerContext) -> KafkaPrincipal:
        forwarded = vouched_principal(context.invocation_metadata(), self._broker_secret)
        if forwarded is not None:
            return forwarded
        if self._security.uses_sasl:
            assert self._authenticator is not None
            header = next((v for k, v in context.invocation_metadata() or ()
                           if k == AUTHORIZATION_KEY), None)
            if not isinstance(header, str):
                raise errors.SaslAuthenticationFailedError(
                    "this listener authenticates every call: send 'authorization: Basic "
                    "base64(user:password)'")
            name, password = basic_credentials(header)
            return self._authenticator.check_password(name, password)
        if self._security.uses_tls and self._security.ssl_client_auth == "required":
            auth = context.auth_context() or {}
            subject = (auth.get("x509_subject") or auth.get("x509_common_name") or [b""])[0]
            if subject:
                return KafkaPrincipal("User", subject.decode())
        return ANONYMOUS
