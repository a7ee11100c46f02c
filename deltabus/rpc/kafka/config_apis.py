"""Kafka's config-changing APIs over the handler call gRPC's IncrementalAlterConfigs makes
(`alter_configs`): IncrementalAlterConfigs (44, v0-1) and the legacy AlterConfigs (33, v0-2),
as kafka-configs.sh, kafka-python's and librdkafka's admin clients send them.

Only topics have dynamic configs in deltabus: any other resource (a BROKER, BROKER_LOGGER...)
is answered INVALID_REQUEST naming why, as a Kafka broker answers a resource it cannot alter.
Each topic is checked against ALTER_CONFIGS on it (TOPIC_AUTHORIZATION_FAILED); a topic named
twice in one request, or a key twice for one topic, is INVALID_REQUEST, as in Kafka. The
controller checks every topic's changes as a whole (INVALID_CONFIG naming the key, and nothing
changes) and honours validate_only.
"""

from __future__ import annotations

from typing import Any

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import DeltaBusHandler
from deltabus.rpc import codec
from deltabus.rpc.access import current_access
from deltabus.rpc.admin_requests import TOPIC_RESOURCE, AdminRequests, ConfigChange
from deltabus.rpc.kafka.frames import NO_TIME, error_code, load_response_schema, make, nested
from deltabus.security.acls import Operation

ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 33, 44
SUPPORTED: dict[int, tuple[int, int]] = {
    ALTER_CONFIGS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
}
_OPS = {number: name for name, number in codec.CONFIG_OPS.items()}
Changes = dict[tuple[int, str], list[cfg.AlterConfigOp]]  # (resource type, name) -> ops
Results = dict[tuple[int, str], errors.DeltaBusError | None]


def _ops(resource: Any, changes: Changes) -> list[cfg.AlterConfigOp]:
    """A resource's changes, for the request layer; as named on the wire where a key is named
    twice or the resource is neither a topic nor a group (the layer refuses those before any
    change)."""
    named = [c.name for c in resource.configs]
    key = (resource.resource_type, resource.resource_name)
    if key not in changes or len(set(named)) < len(named):
        return [cfg.AlterConfigOp(name) for name in named]
    return changes[key]


class KafkaConfigApis:
    """Thread-safe: it holds nothing but the handler."""

    def __init__(self, handler: DeltaBusHandler, requests: AdminRequests) -> None:
        self._handler = handler
        self._requests = requests
        self.apis = {ALTER_CONFIGS: self.alter_configs,
                     INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs}

    def incremental_alter_configs(self, version: int, request: Any,
                                  refused: errors.DeltaBusError | None = None) -> Any:
        """SET, DELETE (back to the default), APPEND and SUBTRACT (list configs) per key."""
        cls = load_response_schema(INCREMENTAL_ALTER_CONFIGS, version)
        changes = {(r.resource_type, r.resource_name): [
            cfg.AlterConfigOp(c.name, _OPS.get(c.config_operation, str(c.config_operation)),
                              c.value) for c in r.configs]
            for r in request.resources
            if r.resource_type in (codec.TOPIC_RESOURCE, codec.GROUP_RESOURCE)}
        results = self._alter(request, changes, refused)
        return self._response(cls, request, results)

    def alter_configs(self, version: int, request: Any,
                      refused: errors.DeltaBusError | None = None) -> Any:
        """The legacy whole-set form: a topic's overrides become exactly the configs named, the
        ones not named go back to their defaults, as in Kafka. The current overrides are read
        from the controller first, so two whole-set changes racing on one topic may interleave
        (Kafka's admin clients send IncrementalAlterConfigs wherever a broker has it)."""
        cls = load_response_schema(ALTER_CONFIGS, version)
        named = {r.resource_name: {c.name: c.value for c in r.configs}
                 for r in request.resources if r.resource_type == codec.TOPIC_RESOURCE}
        access = current_access()
        readable = [t for t in named if access.topic(Operation.ALTER_CONFIGS, t) is None]
        current = (self._handler.describe_configs(readable) if readable and refused is None
                   else {})
        changes: Changes = {}
        for topic, configs in named.items():
            entries = current.get(topic)
            overrides = ([] if not isinstance(entries, list) else
                         [e.name for e in entries if e.source == "DYNAMIC_TOPIC_CONFIG"])
            changes[(TOPIC_RESOURCE, topic)] = [cfg.AlterConfigOp(k, cfg.SET, v)
                                                for k, v in configs.items()]
            changes[(TOPIC_RESOURCE, topic)] += [cfg.AlterConfigOp(k, cfg.DELETE)
                                                 for k in overrides if k not in configs]
        results = self._alter(request, changes, refused)
        return self._response(cls, request, results)

    def _alter(self, request: Any, changes: Changes,
               refused: errors.DeltaBusError | None) -> Results:
        """Each resource's answer (the request layer's, rpc/admin_requests.py)."""
        if refused is not None:
            return {(r.resource_type, r.resource_name): refused for r in request.resources}
        return self._requests.alter_configs(current_access(), [
            ConfigChange(r.resource_type, r.resource_name, _ops(r, changes))
            for r in request.resources], bool(request.validate_only))

    @staticmethod
    def _response(cls: Any, request: Any, results: Results) -> Any:
        result_cls = nested(cls, "AlterConfigsResourceResponse")
        return make(cls, throttle_time=NO_TIME, responses=tuple(
            make(result_cls, error_code=error_code(e), error_message=e.message if e else None,
                 resource_type=t, resource_name=n) for (t, n), e in results.items()))
