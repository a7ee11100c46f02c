"""Group configs (deltabus/group_configs.py): a share group's own settings over the brokers'
group.share.* defaults, checked as Kafka checks them, and kept as records of the metadata log
that a restarted controller (and every broker) replays."""

from __future__ import annotations

import datetime as dt

import pytest

from deltabus import config as cfg
from deltabus import errors, group_configs
from deltabus.cluster.metadata_records import GroupConfigRecord
from deltabus.cluster.metadata_state import MetadataState

DEFAULTS = cfg.GroupConfig(group_share_record_lock_duration_ms=20_000)


def ops(*changes: tuple[str, str | None]) -> list[cfg.AlterConfigOp]:
    return [cfg.AlterConfigOp(k, cfg.DELETE if v is None else cfg.SET, v) for k, v in changes]


def test_a_groups_settings_are_its_overrides_over_the_brokers_defaults():
    settings = group_configs.share_group_settings(DEFAULTS, None)
    assert (settings.auto_offset_reset, settings.record_lock_duration_ms,
            settings.isolation_level) == ("latest", 20_000, "read_uncommitted")
    overrides = group_configs.altered(DEFAULTS, {}, ops(
        ("share.auto.offset.reset", "by_duration:PT1H30M"),
        ("share.record.lock.duration.ms", "1000"),
        ("share.isolation.level", "read_committed")))
    settings = group_configs.share_group_settings(DEFAULTS, overrides)
    assert settings.reset_duration() == dt.timedelta(hours=1, minutes=30)
    assert (settings.record_lock_duration_ms, settings.isolation_level) == (
        1000, "read_committed")
    described = {e.name: e for e in group_configs.describe(DEFAULTS, overrides)}
    assert described["share.record.lock.duration.ms"].source == "GROUP_CONFIG"
    assert described["share.session.timeout.ms"].source == "DEFAULT_CONFIG"
    assert described["share.session.timeout.ms"].value == str(
        DEFAULTS.group_share_session_timeout_ms)
    assert group_configs.altered(DEFAULTS, overrides, ops(
        ("share.record.lock.duration.ms", None))) == {
        "share.auto.offset.reset": "by_duration:PT1H30M",
        "share.isolation.level": "read_committed"}


@pytest.mark.parametrize("key, value, message", [
    ("share.auto.offset.reset", "oldest", "The value must be either 'earliest', 'latest' or"),
    ("share.auto.offset.reset", "by_duration:1h", "The value must be either"),
    ("share.record.lock.duration.ms", "999", "Value must be in [1000, 3600000]"),
    ("share.record.lock.duration.ms", "soon", "Not a number of type INT"),
    ("share.heartbeat.interval.ms", "50000", "must be greater than share.heartbeat"),
    ("share.isolation.level", "serializable", "String must be one of"),
    ("share.delivery.count.limit", "3", "Unknown group config name"),
])
def test_a_bad_value_is_refused_naming_it(key: str, value: str, message: str):
    with pytest.raises(errors.InvalidConfigError, match=message.replace("[", r"\[")):
        group_configs.altered(DEFAULTS, {}, ops((key, value)))


def test_group_configs_replay_from_the_metadata_log_and_its_snapshot():
    state = MetadataState()
    state.replay(GroupConfigRecord("workers", "share.auto.offset.reset", "earliest"))
    state.replay(GroupConfigRecord("workers", "share.record.lock.duration.ms", "5000"))
    state.replay(GroupConfigRecord("others", "share.auto.offset.reset", "earliest"))
    state.replay(GroupConfigRecord("others", "share.auto.offset.reset", None))
    assert state.group_configs == {"workers": {"share.auto.offset.reset": "earliest",
                                               "share.record.lock.duration.ms": "5000"}}
    again = MetadataState()
    for record in state.snapshot():
        again.replay(record)
    assert again.image(1, "").group_configs == state.group_configs
