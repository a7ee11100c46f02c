"""Client quotas in the controller: AlterClientQuotas checked as Kafka's controller checks it,
one result per entry, records replayed into the state and read back from their stored form, and
DescribeClientQuotas from the image. Handlers change nothing; replaying their records does.
No Spark."""

from __future__ import annotations

import copy

from deltabus import errors
from deltabus.cluster import quota_control
from deltabus.cluster.metadata_records import from_stored, to_stored
from deltabus.cluster.metadata_state import MetadataState
from deltabus.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    QUOTA_ALTERATIONS_PER_REQUEST_MAX,
    REQUEST_PERCENTAGE,
    QuotaAlteration,
    QuotaEntity,
    resolve_quota,
)

ALICE, APP = QuotaEntity.user("alice"), QuotaEntity.client("app")
DEFAULT_USER = QuotaEntity.user(None)


def _alter(state: MetadataState, *alterations: QuotaAlteration) -> list:
    """Run the handler, check it changed nothing, then replay its records (through their
    stored form, as a restarted controller reads them); the results."""
    before = copy.deepcopy(state)
    result = quota_control.alter_client_quotas(state, list(alterations))
    assert state == before
    for record in result.records:
        state.replay(from_stored(to_stored(record)))
    return list(result.response)


def test_set_change_and_remove_quotas() -> None:
    state = MetadataState()
    assert _alter(state, QuotaAlteration(ALICE, ((PRODUCER_BYTE_RATE, 1024.0),
                                                 (REQUEST_PERCENTAGE, 200.0))),
                  QuotaAlteration(DEFAULT_USER, ((CONSUMER_BYTE_RATE, 2048.0),))) == [None, None]
    assert state.client_quotas == {ALICE: {PRODUCER_BYTE_RATE: 1024.0, REQUEST_PERCENTAGE: 200.0},
                                   DEFAULT_USER: {CONSUMER_BYTE_RATE: 2048.0}}
    assert _alter(state, QuotaAlteration(ALICE, ((PRODUCER_BYTE_RATE, 4096.0),
                                                 (REQUEST_PERCENTAGE, None)))) == [None]
    assert state.client_quotas[ALICE] == {PRODUCER_BYTE_RATE: 4096.0}
    assert _alter(state, QuotaAlteration(ALICE, ((PRODUCER_BYTE_RATE, None),))) == [None]
    assert ALICE not in state.client_quotas  # an entity with no quota left is gone
    resolved = resolve_quota(state.client_quotas_copy(), CONSUMER_BYTE_RATE, "alice", "x")
    assert resolved is not None and resolved.entity == DEFAULT_USER


def test_removing_a_quota_that_is_not_there_writes_nothing() -> None:
    state = MetadataState()
    result = quota_control.alter_client_quotas(
        state, [QuotaAlteration(APP, ((PRODUCER_BYTE_RATE, None),))])
    assert result.response == [None] and not result.records


def test_an_entry_applies_whole_or_not_at_all() -> None:
    state = MetadataState()
    results = _alter(state,
                     QuotaAlteration(ALICE, ((PRODUCER_BYTE_RATE, 10.0), ("bogus", 1.0))),
                     QuotaAlteration(APP, ((PRODUCER_BYTE_RATE, 10.5),)),
                     QuotaAlteration(QuotaEntity.of({"ip": "1.2.3.4"}),
                                     ((PRODUCER_BYTE_RATE, 1.0),)),
                     QuotaAlteration(DEFAULT_USER, ((CONSUMER_BYTE_RATE, 5.0),)))
    assert [type(r) for r in results[:3]] == [errors.InvalidRequestError] * 3
    assert results[3] is None
    assert state.client_quotas == {DEFAULT_USER: {CONSUMER_BYTE_RATE: 5.0}}


def test_an_entity_named_twice_is_refused_in_both_entries() -> None:
    state = MetadataState()
    results = _alter(state, QuotaAlteration(APP, ((PRODUCER_BYTE_RATE, 1.0),)),
                     QuotaAlteration(APP, ((CONSUMER_BYTE_RATE, 1.0),)))
    assert all(isinstance(r, errors.InvalidRequestError) for r in results)
    assert not state.client_quotas


def test_too_many_entries_are_refused_whole() -> None:
    alterations = [QuotaAlteration(QuotaEntity.client(f"c{i}"), ((PRODUCER_BYTE_RATE, 1.0),))
                   for i in range(QUOTA_ALTERATIONS_PER_REQUEST_MAX + 1)]
    result = quota_control.alter_client_quotas(MetadataState(), alterations)
    assert not result.records
    assert all(isinstance(r, errors.InvalidRequestError) for r in result.response)
