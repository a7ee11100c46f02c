"""Group configs (Kafka's GroupConfig, `kafka-configs.sh --entity-type groups`): a share
group's own settings, over the brokers' `group.share.*` defaults.

A group's overrides are records of the metadata log (GroupConfigRecord), so the coordinator in
the driver and every leader hold the same. `altered` checks a change as a whole, as Kafka does,
before anything is written; `share_group_settings` is what a leader and the coordinator apply.

- `share.auto.offset.reset`: where a group starts in a partition it has no state in: `latest`
  (Kafka's default), `earliest`, or `by_duration:<ISO-8601 duration>` (the first record at most
  that old);
- `share.record.lock.duration.ms`: how long a member holds an acquired record (at least 1,000,
  at most 3,600,000, as the broker's bounds);
- `share.session.timeout.ms`, `share.heartbeat.interval.ms`: the coordinator's, for the
  group's members (the interval below the timeout);
- `share.isolation.level`: `read_uncommitted` (Kafka's default) or `read_committed` (records of
  open transactions wait, those of aborted ones are never delivered).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass

from deltabus import config as cfg
from deltabus import errors

AUTO_OFFSET_RESET = "share.auto.offset.reset"
RECORD_LOCK_DURATION_MS = "share.record.lock.duration.ms"
SESSION_TIMEOUT_MS = "share.session.timeout.ms"
HEARTBEAT_INTERVAL_MS = "share.heartbeat.interval.ms"
ISOLATION_LEVEL = "share.isolation.level"
NAMES = (AUTO_OFFSET_RESET, HEARTBEAT_INTERVAL_MS, ISOLATION_LEVEL, RECORD_LOCK_DURATION_MS,
         SESSION_TIMEOUT_MS)
GROUP_CONFIG_SOURCE = "GROUP_CONFIG"  # DescribeConfigs' source of a group's own value
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
_DURATION = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?")
_DOCS = {
    AUTO_OFFSET_RESET: "Where a share group starts in a partition it has no state in: latest, "
                       "earliest or by_duration:<ISO-8601 duration>.",
    RECORD_LOCK_DURATION_MS: "How long a member holds a record it acquired.",
    SESSION_TIMEOUT_MS: "How long a silent member stays in the share group.",
    HEARTBEAT_INTERVAL_MS: "How often members heartbeat.",
    ISOLATION_LEVEL: "read_committed: records of open or aborted transactions are not "
                     "delivered.",
}


@dataclass(frozen=True)
class ShareGroupSettings:
    """A share group's settings: its overrides, else the brokers' group.share.* defaults."""

    auto_offset_reset: str
    record_lock_duration_ms: int
    session_timeout_ms: int
    heartbeat_interval_ms: int
    isolation_level: str

    def reset_duration(self) -> dt.timedelta | None:
        """by_duration's duration (None: latest or earliest)."""
        if not self.auto_offset_reset.startswith("by_duration:"):
            return None
        return _duration(self.auto_offset_reset.removeprefix("by_duration:"))


def share_group_settings(defaults: cfg.GroupConfig,
                         overrides: Mapping[str, str] | None) -> ShareGroupSettings:
    values = _values(defaults, overrides or {})
    return ShareGroupSettings(
        auto_offset_reset=values[AUTO_OFFSET_RESET],
        record_lock_duration_ms=int(values[RECORD_LOCK_DURATION_MS]),
        session_timeout_ms=int(values[SESSION_TIMEOUT_MS]),
        heartbeat_interval_ms=int(values[HEARTBEAT_INTERVAL_MS]),
        isolation_level=values[ISOLATION_LEVEL])


def altered(defaults: cfg.GroupConfig, overrides: Mapping[str, str],
            ops: list[cfg.AlterConfigOp]) -> dict[str, str]:
    """A group's overrides after `ops` (IncrementalAlterConfigs: SET and DELETE), checked as a
    whole: InvalidConfigError naming the problem, and nothing changes."""
    out = dict(overrides)
    for change in ops:
        if change.name not in NAMES:
            raise errors.InvalidConfigError(f"Unknown group config name: {change.name}")
        if change.op == cfg.DELETE:
            out.pop(change.name, None)
        elif change.op != cfg.SET:
            raise errors.InvalidConfigError(
                f"Config value {change.op.lower()} is not allowed for config key: {change.name}")
        elif change.value is None:
            raise errors.InvalidRequestError(f"Null value not supported for : {change.name}")
        else:
            out[change.name] = change.value
    _check(_values(defaults, out))
    return out


def describe(defaults: cfg.GroupConfig,
             overrides: Mapping[str, str] | None) -> list[cfg.ConfigEntry]:
    """Every group config with its value and source: the group's own (GROUP_CONFIG), else the
    broker's default (DEFAULT_CONFIG)."""
    overrides = overrides or {}
    values = _values(defaults, {})
    return [cfg.ConfigEntry(
        name, overrides.get(name, values[name]),
        GROUP_CONFIG_SOURCE if name in overrides else "DEFAULT_CONFIG",
        ((GROUP_CONFIG_SOURCE, name, overrides[name]),) if name in overrides else (),
        "INT" if name.endswith(".ms") else "STRING", _DOCS[name])
        for name in NAMES]


def _values(defaults: cfg.GroupConfig, overrides: Mapping[str, str]) -> dict[str, str]:
    return {
        AUTO_OFFSET_RESET: "latest",
        RECORD_LOCK_DURATION_MS: str(defaults.group_share_record_lock_duration_ms),
        SESSION_TIMEOUT_MS: str(defaults.group_share_session_timeout_ms),
        HEARTBEAT_INTERVAL_MS: str(defaults.group_share_heartbeat_interval_ms),
        ISOLATION_LEVEL: "read_uncommitted",
        **overrides,
    }


def _check(values: Mapping[str, str]) -> None:
    reset = values[AUTO_OFFSET_RESET]
    if reset not in ("latest", "earliest") and not (
            reset.startswith("by_duration:")
            and _DURATION.fullmatch(reset.removeprefix("by_duration:")) is not None
            and reset.removeprefix("by_duration:") not in ("P", "PT")):
        raise errors.InvalidConfigError(
            f"Invalid value `{reset}` for configuration {AUTO_OFFSET_RESET}. The value must "
            f"be either 'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'.")
    numbers = {}
    for name, low, high in ((RECORD_LOCK_DURATION_MS, 1_000, 3_600_000),
                            (SESSION_TIMEOUT_MS, 1, 2**31 - 1),
                            (HEARTBEAT_INTERVAL_MS, 1, 2**31 - 1)):
        try:
            numbers[name] = int(values[name])
        except ValueError:
            raise errors.InvalidConfigError(
                f"Invalid value {values[name]} for configuration {name}: Not a number of type "
                f"INT") from None
        if not low <= numbers[name] <= high:
            raise errors.InvalidConfigError(
                f"Invalid value {values[name]} for configuration {name}: Value must be in "
                f"[{low}, {high}]")
    if numbers[HEARTBEAT_INTERVAL_MS] >= numbers[SESSION_TIMEOUT_MS]:
        raise errors.InvalidConfigError(
            f"{SESSION_TIMEOUT_MS} must be greater than {HEARTBEAT_INTERVAL_MS}")
    if values[ISOLATION_LEVEL] not in ISOLATION_LEVELS:
        raise errors.InvalidConfigError(
            f"Invalid value {values[ISOLATION_LEVEL]} for configuration {ISOLATION_LEVEL}: "
            f"String must be one of: {', '.join(ISOLATION_LEVELS)}")


def _duration(text: str) -> dt.timedelta:
    match = _DURATION.fullmatch(text)
    if not match:
        raise errors.InvalidConfigError(f"{text!r} is no ISO-8601 duration (PnDTnHnMn.nS)")
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
