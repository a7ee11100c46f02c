"""Kafka's client quota APIs over the same handler calls as gRPC's: DescribeClientQuotas (48) and
AlterClientQuotas (49), as kafka-configs.sh and Kafka's Admin client send them (v0 and v1).

A broker forwards AlterClientQuotas to the controller on the caller's behalf and answers
DescribeClientQuotas from its own metadata, as a KRaft broker does. The checks
(`KafkaApis._refusal`) are Kafka's: ALTER_CONFIGS on the cluster to alter, DESCRIBE_CONFIGS to
describe; a refusal answers every entry, or the whole DescribeClientQuotas, with
CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deltabus import errors
from deltabus.quotas import QuotaAlteration, QuotaEntity, QuotaFilterComponent
from deltabus.rpc.access import current_access
from deltabus.rpc.admin_requests import AdminRequests
from deltabus.rpc.kafka.frames import NO_TIME, error_code, load_response_schema, make, nested

DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49
SUPPORTED: dict[int, tuple[int, int]] = {
    DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ALTER_CLIENT_QUOTAS: (0, 1),
}


def _message(error: errors.DeltaBusError | None) -> str | None:
    return error.message if error is not None else None


def _entity(parts: Sequence[Any]) -> QuotaEntity | errors.DeltaBusError:
    try:
        return QuotaEntity.of([(p.entity_type, p.entity_name) for p in parts])
    except errors.DeltaBusError as e:
        return e


class KafkaQuotaApis:
    def __init__(self, requests: AdminRequests) -> None:
        self._requests = requests
        self.apis = {DESCRIBE_CLIENT_QUOTAS: self.describe_client_quotas,
                     ALTER_CLIENT_QUOTAS: self.alter_client_quotas}

    def describe_client_quotas(self, version: int, request: Any,
                               refused: errors.DeltaBusError | None = None) -> Any:
        """The quotas of the entities the filter matches, each with every key it has."""
        cls = load_response_schema(DESCRIBE_CLIENT_QUOTAS, version)
        entry_cls, entity_cls, value_cls = (nested(cls, n) for n in (
            "EntryData", "EntityData", "ValueData"))
        found: dict[QuotaEntity, dict[str, float]] = {}
        if refused is None:
            try:
                found = self._requests.describe_client_quotas(current_access(),
                    [QuotaFilterComponent(c.entity_type, c.match_type, c.match)
                     for c in request.components], bool(request.strict))
            except errors.DeltaBusError as e:
                refused = e
        entries = None if refused is not None else tuple(
            make(entry_cls, entity=tuple(make(entity_cls, entity_type=t, entity_name=n)
                                         for t, n in entity.entries),
                 values=tuple(make(value_cls, key=k, value=float(v))
                              for k, v in sorted(values.items())))
            for entity, values in found.items())
        return make(cls, throttle_time=NO_TIME, error_code=error_code(refused),
                    error_message=_message(refused), entries=entries)

    def alter_client_quotas(self, version: int, request: Any,
                            refused: errors.DeltaBusError | None = None) -> Any:
        """One result per entry, in order; the controller checks each (validate_only: and
        changes nothing)."""
        cls = load_response_schema(ALTER_CLIENT_QUOTAS, version)
        entry_cls, entity_cls = (nested(cls, n) for n in ("EntryData", "EntityData"))
        entities = [_entity(e.entity) for e in request.entries]
        results: list[errors.DeltaBusError | None] = [
            refused or (e if isinstance(e, errors.DeltaBusError) else None) for e in entities]
        asked = [(i, QuotaAlteration(e, tuple((op.key, None if op.remove else float(op.value))
                                              for op in entry.ops)))
                 for i, (e, entry) in enumerate(zip(entities, request.entries, strict=True))
                 if results[i] is None and isinstance(e, QuotaEntity)]
        if asked:
            try:
                answers = self._requests.alter_client_quotas(
                    current_access(), [a for _, a in asked], bool(request.validate_only))
            except errors.DeltaBusError as e:  # the controller could not be asked
                answers = [e for _ in asked]
            for (i, _), answer in zip(asked, answers, strict=True):
                results[i] = answer
        return make(cls, throttle_time=NO_TIME, entries=tuple(
            make(entry_cls, error_code=error_code(error), error_message=_message(error),
                 entity=tuple(make(entity_cls, entity_type=p.entity_type,
                                   entity_name=p.entity_name) for p in entry.entity))
            for entry, error in zip(request.entries, results, strict=True)))
