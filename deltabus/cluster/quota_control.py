"""Client quotas (KRaft's ClientQuotaControlManager). Runs in the driver, inside the controller.

`alter_client_quotas` is a handler: it checks each entry as Kafka's controller does and returns
the records and one result per entry, changing nothing itself. An entry's ops apply together or
not at all: the first one refused is that entry's result, and none of its records is written.
Removing a quota the entity does not have is a success that writes nothing, as in Kafka.
DescribeClientQuotas needs no handler: it reads an image (`quotas.describe_client_quotas`).

Invariants: every record written names an entity `quotas.check_entity` accepts and a key and
value `quotas.check_value` accepts (or removes a quota the entity has); no request writes more
than `QUOTA_ALTERATIONS_PER_REQUEST_MAX` entries.
Not thread-safe: the controller holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Sequence

from deltabus import errors, quotas
from deltabus.cluster.metadata_records import ClientQuotaRecord, ControllerResult
from deltabus.cluster.metadata_state import MetadataState
from deltabus.quotas import QuotaAlteration

AlterResults = list[errors.DeltaBusError | None]  # per entry: None (done) or why not


def alter_client_quotas(state: MetadataState, alterations: Sequence[QuotaAlteration]
                        ) -> ControllerResult[AlterResults]:
    """Kafka's AlterClientQuotas: the records of every entry whose ops all pass, and a result
    per entry, in order. An entity named by two entries is refused in both (Kafka's
    INVALID_REQUEST), so the outcome never depends on their order."""
    if len(alterations) > quotas.QUOTA_ALTERATIONS_PER_REQUEST_MAX:
        error = errors.InvalidRequestError(
            f"A request may alter at most {quotas.QUOTA_ALTERATIONS_PER_REQUEST_MAX} quota "
            f"entities, not {len(alterations)}")
        return ControllerResult([], [error for _ in alterations])
    seen = [a.entity for a in alterations]
    results: AlterResults = []
    records: list[ClientQuotaRecord] = []
    for alteration in alterations:
        try:
            if seen.count(alteration.entity) > 1:
                raise errors.InvalidRequestError(
                    f"Quota entity {alteration.entity} appears more than once in the request")
            records.extend(_records(state, alteration))
            results.append(None)
        except errors.DeltaBusError as e:
            results.append(e)
    return ControllerResult(records, results)


def _records(state: MetadataState, alteration: QuotaAlteration) -> list[ClientQuotaRecord]:
    entity = alteration.entity
    quotas.check_entity(entity)
    keys = [k for k, _ in alteration.ops]
    if len(set(keys)) != len(keys):
        raise errors.InvalidRequestError(f"A quota key appears twice for entity {entity}")
    held = state.client_quotas.get(entity, {})
    out = []
    for key, value in alteration.ops:
        if value is None:
            if key not in quotas.QUOTA_KEYS:
                raise errors.InvalidRequestError(f"Invalid configuration key {key}")
            if key in held:
                out.append(ClientQuotaRecord.of(entity, key, None))
            continue
        quotas.check_value(key, value)
        if held.get(key) != value:
            out.append(ClientQuotaRecord.of(entity, key, float(value)))
    return out
