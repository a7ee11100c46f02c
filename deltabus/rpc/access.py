"""The authorization checks both doors make, as Kafka's KafkaApis makes them.

One `Access` per request: who is calling (principal and host) and the handler's `Authorizer`
(None when the cluster runs without one: everything is allowed, as on a Kafka broker without
authorizer.class.name). Each check answers the refusal to put in the response, with Kafka's code
and message, or None; nothing is written for a refused partition, topic or group.
"""

from __future__ import annotations

from collections.abc import Iterable

from deltabus import errors
from deltabus.acls import CLUSTER_NAME, Authorizer, Operation, ResourceType
from deltabus.principal import ANONYMOUS, KafkaPrincipal


class Access:
    def __init__(self, authorizer: Authorizer | None, principal: KafkaPrincipal = ANONYMOUS,
                 host: str = "") -> None:
        self.principal = principal
        self.host = host
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

    def transactional_id(self, operation: Operation, name: str) -> errors.DeltaBusError | None:
        if self.allows(operation, ResourceType.TRANSACTIONAL_ID, name):
            return None
        return errors.TransactionalIdAuthorizationFailedError(
            f"Transactional Id authorization failed: {name}")

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
