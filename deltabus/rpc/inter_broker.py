"""The inter-broker door: only the cluster's own brokers and controller may call the internal API.

Kafka answers RegisterBroker, BrokerHeartbeat, AlterPartition and follower fetches only for a
principal with ClusterAction, so a client that reaches a broker's port cannot register an
impostor, unfence one, or fetch as a follower (moving the high watermark with nothing
replicated). deltabus's brokers prove ClusterAction with a per-cluster credential: the driver
makes it (`ClusterConfig.inter_broker_secret`) and hands it to its broker tasks inside their
Spark task, never to a client. Every call to a `deltabus.internal.v1` service carries it in its
metadata; the servers check it (in constant time) before the call reaches a servicer, and refuse
any other with CLUSTER_AUTHORIZATION_FAILED. The internal API is served only on the controller's
and the inter-broker listeners (deltabus.listeners), which should be SSL beyond loopback: over
PLAINTEXT the credential crosses the network in clear, as a SASL PLAIN password would.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any

import grpc

from deltabus import errors
from deltabus.rpc.status import abort
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal

log = logging.getLogger(__name__)

CREDENTIAL_KEY = "deltabus-broker-credential"
FORWARDED_PRINCIPAL_KEY = "deltabus-forwarded-principal"
INTERNAL_METHODS = "/deltabus.internal.v1."


def credential_metadata(secret: str) -> tuple[tuple[str, str], ...]:
    """The metadata every internal call of a broker or the controller carries."""
    return ((CREDENTIAL_KEY, secret),)


def forwarded_for(principal: KafkaPrincipal) -> tuple[tuple[str, str], ...]:
    """The metadata naming the client a broker forwards an admin call for: trusted only
    beside a valid broker credential (`vouched_principal`)."""
    return ((FORWARDED_PRINCIPAL_KEY, str(principal)),)


def vouched_principal(metadata: Any, secret: str) -> KafkaPrincipal | None:
    """The client a call was forwarded for, if the call carries this cluster's broker
    credential; None for any other call (a client cannot name a principal)."""
    values = dict(metadata or ())
    presented = values.get(CREDENTIAL_KEY, "")
    if not secret or not hmac.compare_digest(
            presented.encode() if isinstance(presented, str) else presented, secret.encode()):
        return None
    named = values.get(FORWARDED_PRINCIPAL_KEY)
    return KafkaPrincipal.parse(named) if isinstance(named, str) else ANONYMOUS


class InterBrokerAuthorizer(grpc.ServerInterceptor):
    """Refuses internal-API calls that do not carry the cluster's broker credential; with
    `every_method` (a controller-only listener, deltabus.listeners) every call."""

    def __init__(self, secret: str, *, every_method: bool = False) -> None:
        if not secret:
            raise ValueError("the internal API needs a broker credential")
        self._secret = secret.encode()
        self._every_method = every_method

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: Any) -> Any:
        method: str = handler_call_details.method
        if not (self._every_method or method.startswith(INTERNAL_METHODS)):
            return continuation(handler_call_details)
        presented = next((value for key, value in handler_call_details.invocation_metadata or ()
                          if key == CREDENTIAL_KEY), "")
        if isinstance(presented, str):
            presented = presented.encode()
        if hmac.compare_digest(presented, self._secret):
            return continuation(handler_call_details)
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: _refuse(method, context))


def _refuse(method: str, context: grpc.ServicerContext) -> Any:
    log.warning("refused %s from %s: the caller is not a broker of this cluster", method,
                context.peer())
    what = ("is an inter-broker call" if method.startswith(INTERNAL_METHODS)
            else "came in on a controller listener, which serves brokers only")
    abort(context, errors.ClusterAuthorizationFailedError(
        f"{method.rsplit('/', 1)[-1]} {what}: the caller is not authorized for ClusterAction"))
