"""Kafka's topic-name rules (Topic.validate): what Kafka refuses, deltabus refuses."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from deltabus import errors
from deltabus.config import TOPIC_NAME_LENGTH_MAX
from deltabus.topics import has_collision_chars, illegal_topic_name, validate_topic_name

LEGAL = [
    "a",
    "orders",
    "Orders.v1",
    "orders_v1",
    "orders-v1",
    "__consumer_offsets",
    "...",
    "-",
    "0123456789",
    "a" * TOPIC_NAME_LENGTH_MAX,
]

ILLEGAL = [
    "",
    ".",
    "..",
    "a" * (TOPIC_NAME_LENGTH_MAX + 1),
    "a" * 250,
    "with space",
    " leading",
    "trailing ",
    "slash/inside",
    "back\\slash",
    "colon:",
    "star*",
    "comma,",
    "tab\t",
    "newline\n",
    "\nleading-newline",
    "naïve",
    "日本語",
    "emoji🙂",
    "café",
    "a\u200bb",  # zero-width space
    "ｆｕｌｌｗｉｄｔｈ",
    "٣",  # Arabic-Indic digit: Unicode \d would match it, Kafka does not
]


@pytest.mark.parametrize("name", LEGAL)
def test_legal_names_pass(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize("name", ILLEGAL, ids=repr)
def test_illegal_names_raise_invalid_topic(name: str) -> None:
    with pytest.raises(errors.InvalidTopicError) as info:
        validate_topic_name(name)
    assert info.value.code == 17


@pytest.mark.parametrize("name", ILLEGAL + LEGAL, ids=repr)
def test_illegal_topic_name_is_the_error_a_request_naming_it_gets(name: str) -> None:
    """What Metadata answers for a name (INVALID_TOPIC_EXCEPTION, not retriable, so clients
    stop at once) is exactly what validate_topic_name refuses."""
    error = illegal_topic_name(name)
    if name in LEGAL:
        assert error is None
    else:
        assert isinstance(error, errors.InvalidTopicError) and not error.retriable


def test_length_limit_is_kafkas() -> None:
    assert TOPIC_NAME_LENGTH_MAX == 249


@given(st.text(alphabet="abcXYZ019._-", min_size=1, max_size=TOPIC_NAME_LENGTH_MAX))
def test_every_name_of_legal_characters_passes(name: str) -> None:
    if name in (".", ".."):
        with pytest.raises(errors.InvalidTopicError):
            validate_topic_name(name)
    else:
        validate_topic_name(name)


@given(st.text(min_size=1, max_size=40))
@example("orders\n")  # `$` in a Python regex also matches before a final newline
def test_any_name_with_an_illegal_character_raises(name: str) -> None:
    legal_chars = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    if set(name) <= legal_chars:
        return
    with pytest.raises(errors.InvalidTopicError):
        validate_topic_name(name)


def test_collision_chars() -> None:
    assert has_collision_chars("a.b")
    assert has_collision_chars("a_b")
    assert not has_collision_chars("a-b")
