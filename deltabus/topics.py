"""Kafka's rules for topic names (Topic.validate), applied by the controller, the brokers, the
doors' Metadata and the CLI."""

from __future__ import annotations

import re
from collections.abc import Iterable

from deltabus import errors
from deltabus.config import TOPIC_NAME_LENGTH_MAX

_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__share_group_state"})


def validate_topic_name(name: str) -> None:
    """Raise InvalidTopicError with Kafka's message when `name` is not a legal topic name."""
    if not name:
        raise errors.InvalidTopicError("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise errors.InvalidTopicError("Topic name cannot be \".\" or \"..\"")
    if len(name) > TOPIC_NAME_LENGTH_MAX:
        raise errors.InvalidTopicError(
            f"Topic name is illegal, it can't be longer than {TOPIC_NAME_LENGTH_MAX} characters, "
            f"topic name: {name}"
        )
    if not _LEGAL.fullmatch(name):
        raise errors.InvalidTopicError(
            f"Topic name \"{name}\" is illegal, it contains a character other than ASCII "
            "alphanumerics, '.', '_' and '-'"
        )


def illegal_topic_name(name: str) -> errors.DeltaBusError | None:
    """INVALID_TOPIC_EXCEPTION, with Kafka's message, for a name no topic may have; else None.

    Kafka answers a request naming such a topic so rather than UNKNOWN_TOPIC_OR_PARTITION:
    clients fail it at once (it is not retriable), where an unknown topic has them wait for it
    until they time out, and this one can never appear."""
    try:
        validate_topic_name(name)
    except errors.InvalidTopicError as e:
        return e
    return None


def has_collision_chars(name: str) -> bool:
    """Kafka warns that '.' and '_' collide in metric names; the CLI repeats the warning."""
    return "." in name or "_" in name


def colliding_topic(name: str, existing: Iterable[str]) -> str | None:
    """A topic among `existing` whose name differs from `name` only in case, or None.

    Such names are one directory where the cluster root lives on a case-insensitive file system
    (the macOS and Windows defaults, a share or object-store mount), so creating one would open
    the other's tables. Kafka refuses names that collide in its metrics ('.' and '_') likewise.
    """
    folded = name.lower()  # legal names are ASCII
    return next((t for t in existing if t != name and t.lower() == folded), None)
