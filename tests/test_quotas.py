"""Client quotas without a cluster: Kafka's resolution order, entity and value checks, the
DescribeClientQuotas filter, and the rate and throttle arithmetic (on a given clock: no sleeps)."""

from __future__ import annotations

import pytest

from deltabus import errors
from deltabus.quotas import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    MATCH_DEFAULT,
    MATCH_EXACT,
    MATCH_SPECIFIED,
    PRODUCER_BYTE_RATE,
    QUOTA_WINDOW_NUM,
    REQUEST_PERCENTAGE,
    THROTTLE_TIME_MS_MAX,
    USER,
    ClientQuotaManager,
    QuotaEntity,
    QuotaFilterComponent,
    QuotaRate,
    check_entity,
    check_value,
    describe_client_quotas,
    resolve_quota,
    throttle_time_ms,
)

U, C, UC = QuotaEntity.user, QuotaEntity.client, QuotaEntity.user_client

# Kafka's eight levels, most specific first (the docs' /config/... paths), each with its own value.
LEVELS = [
    (UC("alice", "app"), 1.0),
    (UC("alice", None), 2.0),
    (U("alice"), 3.0),
    (UC(None, "app"), 4.0),
    (UC(None, None), 5.0),
    (U(None), 6.0),
    (C("app"), 7.0),
    (C(None), 8.0),
]


@pytest.mark.parametrize("level", range(len(LEVELS)))
def test_the_most_specific_entity_with_a_quota_wins(level: int) -> None:
    """With the levels above `level` removed, `level` is the one that applies."""
    quotas = {entity: {PRODUCER_BYTE_RATE: value} for entity, value in LEVELS[level:]}
    resolved = resolve_quota(quotas, PRODUCER_BYTE_RATE, "alice", "app")
    assert resolved is not None
    assert (resolved.entity, resolved.bound) == LEVELS[level]


def test_resolution_is_per_key_and_other_names_fall_to_defaults() -> None:
    quotas = {UC("alice", "app"): {PRODUCER_BYTE_RATE: 10.0},
              U(None): {CONSUMER_BYTE_RATE: 20.0}, C(None): {PRODUCER_BYTE_RATE: 30.0}}
    assert resolve_quota(quotas, CONSUMER_BYTE_RATE, "alice", "app").entity == U(None)
    assert resolve_quota(quotas, PRODUCER_BYTE_RATE, "alice", "app").bound == 10.0
    assert resolve_quota(quotas, PRODUCER_BYTE_RATE, "bob", "app").entity == C(None)
    assert resolve_quota(quotas, REQUEST_PERCENTAGE, "alice", "app") is None


def test_rates_are_kept_per_entity_with_defaults_filled_in() -> None:
    """A default user quota holds each user separately; a client id quota holds every user of
    that client id together (Kafka's metric tags)."""
    quotas = {U(None): {PRODUCER_BYTE_RATE: 1.0}, C("shared"): {CONSUMER_BYTE_RATE: 1.0}}
    a = resolve_quota(quotas, PRODUCER_BYTE_RATE, "alice", "x")
    b = resolve_quota(quotas, PRODUCER_BYTE_RATE, "bob", "x")
    assert a and b and a.sensor != b.sensor and a.sensor == (PRODUCER_BYTE_RATE, "alice", "")
    c = resolve_quota(quotas, CONSUMER_BYTE_RATE, "alice", "shared")
    d = resolve_quota(quotas, CONSUMER_BYTE_RATE, "bob", "shared")
    assert c and d and c.sensor == d.sensor == (CONSUMER_BYTE_RATE, "", "shared")


def test_entities_are_checked_as_kafka_checks_them() -> None:
    for entity in (U("alice"), C(None), UC("a", "b"), UC(None, None)):
        check_entity(entity)
    for bad in (QuotaEntity(()), QuotaEntity.of({"ip": "1.2.3.4"}),
                QuotaEntity.of({"group": "g"}), U("")):
        with pytest.raises(errors.InvalidRequestError):
            check_entity(bad)
    with pytest.raises(errors.InvalidRequestError):
        QuotaEntity.of([(USER, "a"), (USER, "b")])
    assert QuotaEntity.of({USER: "a", CLIENT_ID: "b"}) == UC("a", "b")


def test_values_are_checked_as_kafka_checks_them() -> None:
    check_value(PRODUCER_BYTE_RATE, 1024)
    check_value(REQUEST_PERCENTAGE, 12.5)
    for key, value in ((PRODUCER_BYTE_RATE, 0), (CONSUMER_BYTE_RATE, -5), ("unknown", 1),
                       (PRODUCER_BYTE_RATE, 10.5), (REQUEST_PERCENTAGE, float("inf"))):
        with pytest.raises(errors.InvalidRequestError):
            check_value(key, value)


def test_describe_filters_match_as_kafkas() -> None:
    quotas = {U("alice"): {PRODUCER_BYTE_RATE: 1.0}, U(None): {PRODUCER_BYTE_RATE: 2.0},
              UC("alice", "app"): {CONSUMER_BYTE_RATE: 3.0}, C("app"): {PRODUCER_BYTE_RATE: 4.0}}
    every = describe_client_quotas(quotas, [])
    assert set(every) == set(quotas)
    exact = describe_client_quotas(quotas, [QuotaFilterComponent(USER, MATCH_EXACT, "alice")])
    assert set(exact) == {U("alice"), UC("alice", "app")}
    strict = describe_client_quotas(quotas, [QuotaFilterComponent(USER, MATCH_EXACT, "alice")],
                                    strict=True)
    assert set(strict) == {U("alice")}
    default = describe_client_quotas(quotas, [QuotaFilterComponent(USER, MATCH_DEFAULT)])
    assert set(default) == {U(None)}
    users = describe_client_quotas(quotas, [QuotaFilterComponent(USER, MATCH_SPECIFIED)],
                                   strict=True)
    assert set(users) == {U("alice"), U(None)}
    with pytest.raises(errors.InvalidRequestError):
        describe_client_quotas(quotas, [QuotaFilterComponent(USER, MATCH_EXACT, None)])
    with pytest.raises(errors.InvalidRequestError):
        describe_client_quotas(quotas, [QuotaFilterComponent(USER), QuotaFilterComponent(USER)])


def test_rate_spans_at_least_num_minus_one_windows() -> None:
    """Kafka's Rate: a first burst is spread over (samples - 1) windows, not the time since."""
    rate = QuotaRate()
    rate.record(1000, now_s=100.0)
    assert rate.window_s(100.0) == QUOTA_WINDOW_NUM - 1
    assert rate.measure(100.0) == pytest.approx(1000 / (QUOTA_WINDOW_NUM - 1))
    for second in range(1, 30):  # a steady 1000/s for long enough fills the window
        rate.record(1000, now_s=100.0 + second)
    assert rate.measure(129.5) == pytest.approx(1000 * QUOTA_WINDOW_NUM / 10.5, rel=0.01)


def test_throttle_time_brings_the_rate_back_to_the_quota() -> None:
    assert throttle_time_ms(100, 100, 10) == 0
    assert throttle_time_ms(150, 100, 10) == 5000  # 50% over for 10 s: 5 s without sending
    assert throttle_time_ms(1e12, 1, 10) == THROTTLE_TIME_MS_MAX


def test_manager_throttles_only_the_quotad_client() -> None:
    manager = ClientQuotaManager()
    manager.update({C("slow"): {PRODUCER_BYTE_RATE: 1000.0}})
    now = 50.0
    assert manager.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "slow", 5000, now) == 0  # 500/s
    throttle = manager.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "slow", 10_000, now)
    assert throttle == 5000  # 1500/s over 10 s windows against 1000/s
    assert manager.throttled_ms("ANONYMOUS", "slow", now + 1) == 4000
    assert manager.throttled_ms("ANONYMOUS", "slow", now + 6) == 0
    assert manager.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "fast", 10**9, now) == 0


def test_a_throttled_fetch_is_not_counted() -> None:
    manager = ClientQuotaManager()
    manager.update({U(None): {CONSUMER_BYTE_RATE: 100.0}})
    assert manager.record(CONSUMER_BYTE_RATE, "bob", "c", 5000, 10.0,
                          unrecord_if_throttled=True) > 0
    assert manager.record(CONSUMER_BYTE_RATE, "bob", "c", 500, 10.0,
                          unrecord_if_throttled=True) == 0  # the 5000 did not count


def test_new_quotas_start_the_rates_again_and_sensors_are_bounded() -> None:
    manager = ClientQuotaManager(sensors_max=3)
    manager.update({C(None): {PRODUCER_BYTE_RATE: 10.0}})
    for i in range(10):  # a client id per request: at most 3 rates are kept
        manager.record(PRODUCER_BYTE_RATE, "u", f"c{i}", 1, 1.0)
    assert len(manager._rates) == 3
    assert manager.record(PRODUCER_BYTE_RATE, "u", "c9", 1000, 1.0) > 0
    manager.update({C(None): {PRODUCER_BYTE_RATE: 10**6}})
    assert manager.record(PRODUCER_BYTE_RATE, "u", "c9", 1000, 1.0) == 0
