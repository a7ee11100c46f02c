"""The authorization checks both doors make, as Kafka's KafkaApis makes them.

One `Access` per request: who is calling (principal and host) and the handler's `Authorizer`
(None when the cluster runs without one: everything is allowed, as on a Kafka broker without
authorizer.class.name). Each check answers the refusal to put in the response, with Kafka's code
and message, or None; nothing is written for a refused partition, topic or group.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from typing import Any

from deltabus import errors
from deltabus.cluster.handler import DeltaBusHandler
from deltabus.metadata import TopicResult
from deltabus.rpc.call_authentication import current_principal
from deltabus.rpc.channel import CLIENT_ID_KEY
from deltabus.security.acls import CLUSTER_NAME, Authorizer, Operation, ResourceType
from deltabus.security.principal import ANONYMOUS, KafkaPrincipal

# What ACLs on a topic can allow (Kafka's AclEntry.supportedOperations(TOPIC)).
TOPIC_OPERATIONS = (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE,
                    Operation.ALTER, Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS,
                    Operation.ALTER_CONFIGS)


class Access:
    def __init__(self, authorizer: Authorizer | None, principal: KafkaPrincipal = ANONYMOUS,
                 host: str = "", client_id: str = "") -> None:
        """`client_id`: the client's own name (the Kafka request header's, the gRPC call's
        `deltabus-client-id`), which client quotas name."""
        self.principal = principal
        self.host = host
        self.client_id = client_id
        self._authorizer = authorizer

    def allows(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        return self._authorizer is None or self._authorizer.authorize(
            self.principal, self.host, operation, resource_type, name)

    def topic(self, operation: Operation, name: str) -> errors.DeltaBusError | None:
        if self.allows(operation, ResourceType.TOPIC, name):
            return None
        return errors.TopicAuthorizationFailedError(f"Not authorized to access topics: [{name}]")

    def group(self, operation: Operation, name: str) -> errors.DeltaBusError | None:
        if self.allows(operation, ResourceType.GROUP, name):
            return None
        return errors.GroupAuthorizationFailedError(f"Not authorized to access group: {name}")

    def cluster(self, operation: Operation) -> errors.DeltaBusError | None:
        if self.allows(operation, ResourceType.CLUSTER, CLUSTER_NAME):
            return None
        return errors.ClusterAuthorizationFailedError(
            f"Cluster authorization failed: {self.principal} may not {operation.name}")

    def topic_operations(self, name: str) -> int:
        """Kafka's topic_authorized_operations: a bit (1 << code) for each operation on the
        topic the caller may do, among those a topic has."""
        return sum(1 << op for op in TOPIC_OPERATIONS if self.allows(op, ResourceType.TOPIC, name))

    def transactional_id(self, operation: Operation, name: str) -> errors.DeltaBusError | None:
        if self.allows(operation, ResourceType.TRANSACTIONAL_ID, name):
            return None
        return errors.TransactionalIdAuthorizationFailedError(
            f"Transactional Id authorization failed: {name}")

    def init_producer_id(self, transactional_id: str) -> errors.DeltaBusError | None:
        """InitProducerId: WRITE on the transactional id; an idempotent producer needs
        IDEMPOTENT_WRITE on the cluster or WRITE on some topic (KIP-679)."""
        if transactional_id:
            return self.transactional_id(Operation.WRITE, transactional_id)
        if self._authorizer is None or self.allows(
                Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME) or (
                self._authorizer.allows_any(self.principal, self.host, Operation.WRITE,
                                            ResourceType.TOPIC)):
            return None
        return errors.ClusterAuthorizationFailedError(
            f"Cluster authorization failed: {self.principal} may not IDEMPOTENT_WRITE")

    def producer_id(self, handler: DeltaBusHandler,
                    producer_id: int) -> errors.DeltaBusError | None:
        """With an authorizer, an idempotent batch's producer id must have been issued to the
        caller: nobody writes under another producer's id (and so makes its real batches look
        like retries, or fences it with a higher epoch)."""
        if self._authorizer is None or producer_id < 0 or handler.producer_id_issued_to(
                producer_id, self.principal):
            return None
        return errors.ClusterAuthorizationFailedError(
            f"producer id {producer_id} was not issued to {self.principal}")

    def may_create_topic(self, name: str) -> bool:
        """CreateTopics (and auto-creation): CREATE on the cluster or on the topic."""
        return (self.allows(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME)
                or self.allows(Operation.CREATE, ResourceType.TOPIC, name))

    def describable_topics(self, names: Iterable[str]) -> list[str]:
        """The topics a listing shows: those the caller may DESCRIBE (Kafka hides the rest)."""
        return [n for n in names if self.allows(Operation.DESCRIBE, ResourceType.TOPIC, n)]

    @staticmethod
    def raise_if(refusal: errors.DeltaBusError | None) -> None:
        if refusal is not None:
            raise refusal


def grpc_client_id(context: Any) -> str:
    """A gRPC call's client id: its `deltabus-client-id` metadata, else the first word of its
    user agent (deltabus's clients send their client_id as both)."""
    agent = ""
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_KEY and isinstance(value, str):
            return value
        if key == "user-agent" and isinstance(value, str):
            agent = value
    word = agent.split(" ", 1)[0]
    return "" if word.startswith("grpc-") else word


def peer_host(context: Any) -> str:
    """The caller's address from a gRPC context's peer (`ipv4:10.0.0.1:5000`, `ipv6:[::1]:5000`),
    as ACLs name hosts."""
    peer = str(context.peer() or "")
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return rest.rpartition(":")[0] if kind == "ipv4" else peer


def merge_refusals(names: list[str], results: list[TopicResult],
                   refused: dict[str, errors.DeltaBusError]) -> list[TopicResult]:
    """Per-topic answers in the request's order: the handler's, and the refusals."""
    by_name = {r.name: r for r in results}
    return [TopicResult(n, refused[n]) if n in refused else by_name[n] for n in names
            if n in refused or n in by_name]


_CURRENT: contextvars.ContextVar[Access | None] = contextvars.ContextVar(
    "deltabus_access", default=None)
_ANYONE = Access(None)


def current_access() -> Access:
    """The Access of the Kafka request this thread is answering (`acting_as`); one that
    allows everything outside any request."""
    return _CURRENT.get() or _ANYONE


@contextlib.contextmanager
def acting_as(access: Access) -> Iterator[None]:
    """Answer a Kafka request as `access`'s caller (the Kafka door sets it per request)."""
    token = _CURRENT.set(access)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def requester() -> KafkaPrincipal:
    """Who made the request this thread is answering, on either door."""
    access = _CURRENT.get()
    return access.principal if access is not None else current_principal()
