"""Kafka's consumer protocol bytes: what Kafka clients put in JoinGroup and SyncGroup."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltabus import errors
from deltabus.client.consumer_protocol import Assignment, Subscription


def test_subscription_v0_bytes_are_kafkas():
    assert Subscription(["t"]).encode(0) == bytes.fromhex("0000" "00000001" "000174" "ffffffff")


def test_assignment_v0_bytes_are_kafkas():
    data = Assignment([("t", [0, 2])]).encode(0)
    assert data == bytes.fromhex("0000" "00000001" "000174" "00000002" "00000000" "00000002"
                                 "ffffffff")


def test_newer_versions_read_old_bytes_and_ignore_what_newer_ones_append():
    old = Subscription(["a", "b"], b"x").encode(0)
    assert Subscription.decode(old) == Subscription(["a", "b"], b"x")
    newer = Subscription(["a"], owned_partitions=[("a", [1])], generation_id=4,
                         rack_id="r").encode(3) + b"\x00\x01future"
    assert Subscription.decode(newer).generation_id == 4
    assert Assignment.decode(b"") == Assignment([])


@pytest.mark.parametrize("data", [b"\x00", b"\x00\x00\x00\x00\x00\x05\x00", b"\xff" * 12,
                                  Subscription(["topic"]).encode()[:-3]])
def test_truncated_or_garbage_bytes_are_refused(data):
    with pytest.raises(errors.InvalidRequestError):
        Subscription.decode(data)


names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
tps = st.lists(st.tuples(names, st.lists(st.integers(0, 2**31 - 1), max_size=5)), max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(names, max_size=5), st.none() | st.binary(max_size=20), tps,
       st.integers(-1, 2**31 - 1), st.none() | names)
def test_subscriptions_round_trip(topics, user_data, owned, generation, rack):
    s = Subscription(topics, user_data, owned, generation, rack)
    assert Subscription.decode(s.encode()) == s


@settings(max_examples=200, deadline=None)
@given(tps, st.none() | st.binary(max_size=20))
def test_assignments_round_trip(partitions, user_data):
    a = Assignment(partitions, user_data)
    assert Assignment.decode(a.encode()) == a
