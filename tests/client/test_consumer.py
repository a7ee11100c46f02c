"""The Consumer's own logic against the in-memory FakeCluster (real gRPC, no Spark): assignment,
polling in order, positions, seeks, auto.offset.reset, out-of-range and truncated positions,
leader changes, commits. Records are written straight into the fake's logs, so these tests do
not depend on the Producer. Consumer groups (subscribe) are in test_consumer_groups.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from deltabus import CommitFailedError, Consumer, OffsetAndMetadata, TopicPartition, errors
from deltabus.records import ConsumerRecord
from tests.client.fake_cluster import FakeCluster

TOPIC = "events"
TP = TopicPartition(TOPIC, 0)


@pytest.fixture
def consumers(fake: FakeCluster) -> Iterator[list[Consumer]]:
    """Consumers a test made with `make`; closed after it."""
    made: list[Consumer] = []
    yield made
    for consumer in made:
        consumer.close()


def make(consumers: list[Consumer], fake: FakeCluster, **settings: Any) -> Consumer:
    consumer = Consumer(fake.bootstrap_servers, retry_backoff_ms=10, **settings)
    consumers.append(consumer)
    return consumer


def write(fake: FakeCluster, count: int, partition: int = 0, first: int = 0) -> None:
    fake.write(TOPIC, partition, [f"{partition}-{i}".encode() for i in range(first, first + count)])


def poll_until(consumer: Consumer, count: int, timeout_s: float = 10) -> list[ConsumerRecord]:
    """Poll until `count` records came (or time is up: then fewer come back)."""
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count and time.monotonic() < deadline:
        records.extend(consumer.poll(200))
    return records


def test_poll_returns_each_partitions_records_in_offset_order(fake, consumers) -> None:
    fake.create_topic(TOPIC, 3)  # partitions on both brokers: one fetch to each
    for p in range(3):
        write(fake, 20, partition=p)
        write(fake, 20, partition=p, first=20)  # two appends per log
    consumer = make(consumers, fake, auto_offset_reset="earliest", max_poll_records=7)
    consumer.assign([TopicPartition(TOPIC, p) for p in range(3)])
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + 10
    while len(records) < 120 and time.monotonic() < deadline:
        batch = consumer.poll(200)
        assert len(batch) <= 7  # max_poll_records
        records.extend(batch)
    for p in range(3):
        mine = [r for r in records if r.partition == p]
        assert [r.offset for r in mine] == list(range(40))
        assert [r.value for r in mine] == [f"{p}-{i}".encode() for i in range(40)]
    assert consumer.poll(0) == []  # nothing more, nothing twice


def test_records_carry_key_headers_and_timestamp(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    fake.write(TOPIC, 0, [b"v"], keys=[b"k"], timestamps_ms=[1_700_000_000_123])
    consumer = make(consumers, fake, auto_offset_reset="earliest")
    consumer.assign([TP])
    [record] = poll_until(consumer, 1)
    assert (record.topic, record.partition, record.offset) == (TOPIC, 0, 0)
    assert (record.key, record.value, record.timestamp) == (b"k", b"v", 1_700_000_000_123)
    assert record.leader_epoch == 0


def test_position_counts_what_poll_returned_not_what_was_fetched_ahead(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 10)
    consumer = make(consumers, fake, auto_offset_reset="earliest")
    consumer.assign([TP])
    first = consumer.poll(5000, max_records=3)
    assert [r.offset for r in first] == [0, 1, 2]
    assert consumer.position(TP) == 3  # the other 7 were fetched but not returned
    assert [r.offset for r in consumer.poll(5000)] == list(range(3, 10))
    assert consumer.position(TP) == 10


@pytest.mark.parametrize(("reset", "first_offset"), [("earliest", 0), ("latest", 5)])
def test_auto_offset_reset_picks_where_a_new_position_starts(fake, consumers, reset: str,
                                                             first_offset: int) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 5)
    consumer = make(consumers, fake, auto_offset_reset=reset)
    consumer.assign([TP])
    assert consumer.position(TP) == first_offset
    write(fake, 3, first=5)
    assert [r.offset for r in poll_until(consumer, 8 - first_offset)] == list(
        range(first_offset, 8))


def test_auto_offset_reset_none_refuses_a_partition_with_no_position(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 5)
    consumer = make(consumers, fake, auto_offset_reset="none")
    consumer.assign([TP])
    with pytest.raises(errors.OffsetOutOfRangeError, match="auto_offset_reset is none"):
        consumer.poll(100)
    consumer.seek(TP, 2)  # an explicit position is fine
    assert [r.offset for r in poll_until(consumer, 3)] == [2, 3, 4]


def test_seeks_and_offset_lookups(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    fake.write(TOPIC, 0, [f"{i}".encode() for i in range(10)],
               timestamps_ms=[1_000_000 + i * 1000 for i in range(10)])
    consumer = make(consumers, fake)
    consumer.assign([TP])
    assert consumer.beginning_offsets([TP]) == {TP: 0}
    assert consumer.end_offsets([TP]) == {TP: 10}
    assert consumer.offsets_for_times({TP: 1_004_500}) == {TP: 5}
    assert consumer.offsets_for_times({TP: 9_999_999}) == {TP: -1}
    consumer.seek(TP, 7)
    assert [r.value for r in poll_until(consumer, 3)] == [b"7", b"8", b"9"]
    consumer.seek_to_beginning(TP)
    assert consumer.position(TP) == 0
    consumer.seek_to_end()
    assert consumer.position(TP) == 10
    with pytest.raises(errors.ClientError, match="not assigned"):
        consumer.seek(TopicPartition(TOPIC, 1), 0)
    with pytest.raises(errors.ClientError, match="negative"):
        consumer.seek(TP, -1)


def test_assigning_a_partition_that_does_not_exist_fails(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    consumer = make(consumers, fake)
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        consumer.assign([TopicPartition(TOPIC, 1)])
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        consumer.assign([TopicPartition("missing", 0)])
    with pytest.raises(errors.ClientError, match="assign"):
        consumer.poll(0)  # nothing assigned


@pytest.mark.parametrize(("reset", "expected"), [
    ("earliest", [5, 6, 7, 8, 9]),  # the oldest record still there
    ("latest", [10]),  # only what comes after
])
def test_a_position_below_the_log_start_is_reset_by_the_policy(fake, consumers, reset: str,
                                                               expected: list[int]) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 10)
    consumer = make(consumers, fake, auto_offset_reset=reset)
    consumer.assign([TP])
    consumer.seek(TP, 0)
    fake.delete_records(TOPIC, 0, 5)  # retention took offsets 0 to 4
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + 10
    while consumer.position(TP) == 0 and time.monotonic() < deadline:
        got += consumer.poll(100)  # until the out-of-range answer moved the position
    if reset == "latest":
        assert got == [] and consumer.position(TP) == 10
        write(fake, 1, first=10)
        got = poll_until(consumer, 1)
    else:
        got += poll_until(consumer, 5 - len(got))
    assert [r.offset for r in got] == expected


def test_a_position_out_of_range_with_reset_none_raises(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 10)
    consumer = make(consumers, fake, auto_offset_reset="none")
    consumer.assign([TP])
    consumer.seek(TP, 0)
    fake.delete_records(TOPIC, 0, 5)
    with pytest.raises(errors.OffsetOutOfRangeError, match="log start offset 5"):
        poll_until(consumer, 1)


def test_a_position_past_the_log_end_is_reset(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 3)
    consumer = make(consumers, fake, auto_offset_reset="earliest")
    consumer.assign([TP])
    consumer.seek(TP, 100)
    assert [r.offset for r in poll_until(consumer, 3)] == [0, 1, 2]


def test_poll_wakes_up_when_a_record_arrives(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    consumer = make(consumers, fake, auto_offset_reset="latest")
    consumer.assign([TP])
    assert consumer.position(TP) == 0

    def write_once_polling() -> None:
        fake.wait_until(lambda: fake.fetches_waiting > 0, "a fetch waiting for records")
        write(fake, 1)

    writer = threading.Thread(target=write_once_polling)
    writer.start()
    started = time.monotonic()
    records = consumer.poll(20_000)
    writer.join()
    assert [r.value for r in records] == [b"0-0"]
    assert time.monotonic() - started < 10  # woken by the record, not by the timeout


def test_a_leader_change_mid_read_neither_skips_nor_repeats(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 10)
    consumer = make(consumers, fake, auto_offset_reset="earliest")
    consumer.assign([TP])
    records = poll_until(consumer, 10)
    old = fake.leader(TOPIC, 0)
    fake.move_leader(TOPIC, 0, 1 - old)  # the consumer's metadata still names the old one
    write(fake, 10, first=10)
    records += poll_until(consumer, 10)
    assert [r.offset for r in records] == list(range(20))
    assert {r.leader_epoch for r in records[10:]} == {1}


def test_a_retriable_fetch_error_is_retried(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 3)
    fault = fake.inject("fetch", errors.KafkaStorageError, topic=TOPIC, times=2)
    consumer = make(consumers, fake, auto_offset_reset="earliest")
    consumer.assign([TP])
    assert [r.offset for r in poll_until(consumer, 3)] == [0, 1, 2]
    assert fault.times == 0


def test_a_non_retriable_fetch_error_surfaces_as_its_class(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 3)
    fake.inject("fetch", errors.UnknownServerError, topic=TOPIC)
    consumer = make(consumers, fake, auto_offset_reset="earliest")
    consumer.assign([TP])
    with pytest.raises(errors.UnknownServerError, match="injected"):
        poll_until(consumer, 3)
    assert [r.offset for r in poll_until(consumer, 3)] == [0, 1, 2]  # the next poll goes on


def test_after_an_unclean_election_a_consumer_moves_back_to_where_the_logs_part(
        fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 10)
    consumer = make(consumers, fake, auto_offset_reset="earliest")
    consumer.assign([TP])
    assert len(poll_until(consumer, 10)) == 10  # read up to 10, in leader epoch 0
    old = fake.leader(TOPIC, 0)
    fake.unclean_election(TOPIC, 0, 1 - old, log_end_offset=6)  # offsets 6 to 9 are gone
    fake.write(TOPIC, 0, [b"new-6", b"new-7"])
    records = poll_until(consumer, 2)
    assert [(r.offset, r.value) for r in records] == [(6, b"new-6"), (7, b"new-7")]


def test_with_reset_none_a_truncated_position_raises_log_truncation(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 10)
    consumer = make(consumers, fake, auto_offset_reset="none")
    consumer.assign([TP])
    consumer.seek(TP, 0)
    assert len(poll_until(consumer, 10)) == 10
    old = fake.leader(TOPIC, 0)
    fake.unclean_election(TOPIC, 0, 1 - old, log_end_offset=6)
    with pytest.raises(errors.LogTruncationError, match="offset 10"):
        poll_until(consumer, 1)


# ---- committed offsets (a group id, partitions assigned by hand) --------------------------------


def test_commit_and_committed_round_trip_and_a_new_consumer_resumes_there(fake,
                                                                           consumers) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 10)
    consumer = make(consumers, fake, group_id="g", auto_offset_reset="earliest")
    consumer.assign([TP])
    assert consumer.committed(TP) is None
    assert len(consumer.poll(5000, max_records=4)) == 4
    consumer.commit()  # the position: everything poll returned counts as processed
    assert consumer.committed(TP).offset == 4
    consumer.commit({TP: OffsetAndMetadata(6, "checkpoint")})
    committed = consumer.committed(TP)
    assert (committed.offset, committed.metadata) == (6, "checkpoint")
    # Committed offsets win over auto_offset_reset.
    resumed = make(consumers, fake, group_id="g", auto_offset_reset="latest")
    resumed.assign([TP])
    assert [r.offset for r in poll_until(resumed, 4)] == [6, 7, 8, 9]
    other = make(consumers, fake, group_id="other", auto_offset_reset="earliest")
    other.assign([TP])
    assert other.position(TP) == 0  # another group's commits are its own


def test_commit_async_commits_in_the_background_and_calls_back(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    write(fake, 5)
    consumer = make(consumers, fake, group_id="g", auto_offset_reset="earliest")
    consumer.assign([TP])
    poll_until(consumer, 5)
    called: list[tuple[dict, BaseException | None]] = []
    future = consumer.commit_async(callback=lambda offsets, error: called.append((offsets,
                                                                                  error)))
    future.result(10)
    assert called == [({TP: OffsetAndMetadata(5, "", 0)}, None)]
    assert consumer.committed(TP).offset == 5


# Kafka's commitSync retries these, retry.backoff.ms apart, until default.api.timeout.ms runs
# out; after those of COORDINATOR_MOVED it looks the coordinator up again. NETWORK_EXCEPTION is
# what a failed call to the coordinator becomes (deltabus.rpc.status), injected here as its answer.
RETRIABLE_COMMIT_ERRORS = [errors.NotCoordinatorError, errors.CoordinatorLoadInProgressError,
                           errors.CoordinatorNotAvailableError, errors.RequestTimedOutError,
                           errors.NetworkError]
COORDINATOR_MOVED = (errors.NotCoordinatorError, errors.CoordinatorNotAvailableError,
                     errors.RequestTimedOutError, errors.NetworkError)


@pytest.mark.parametrize("error", RETRIABLE_COMMIT_ERRORS, ids=lambda e: e.name)
def test_a_commit_retries_a_retriable_error_until_it_is_committed(fake, consumers,
                                                                   error) -> None:
    fake.create_topic(TOPIC, 1)
    consumer = make(consumers, fake, group_id="g")
    consumer.assign([TP])
    assert consumer.committed(TP) is None  # the coordinator is known now
    lookups = fake.coordinator_lookups
    fault = fake.inject("offset_commit", error, times=2)
    consumer.commit({TP: OffsetAndMetadata(7, "after two refusals")})
    assert fault.times == 0  # refused twice, then committed
    committed = consumer.committed(TP)
    assert (committed.offset, committed.metadata) == (7, "after two refusals")
    if error in COORDINATOR_MOVED:
        assert fake.coordinator_lookups == lookups + 2


def test_a_commit_that_keeps_failing_raises_a_timeout_once_its_timeout_runs_out(
        fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    consumer = make(consumers, fake, group_id="g", default_api_timeout_ms=400)
    consumer.assign([TP])
    fault = fake.inject("offset_commit", errors.NotCoordinatorError, times=1_000_000)
    for timeout_ms, commit in ((300, lambda: consumer.commit({TP: 3}, timeout_ms=300)),
                               (400, lambda: consumer.commit({TP: 3}))):  # the default
        tries = fault.times
        started = time.monotonic()
        with pytest.raises(errors.KafkaTimeoutError, match=f"{timeout_ms}ms expired") as raised:
            commit()
        took_s = time.monotonic() - started
        assert timeout_ms / 1000 <= took_s < timeout_ms / 1000 + 2, took_s
        assert tries - fault.times > 2  # tried again and again, retry_backoff_ms apart
        assert "NOT_COORDINATOR" in str(raised.value)  # the last refusal says why
    fault.times = 0
    assert consumer.committed(TP) is None  # nothing was committed


@pytest.mark.parametrize("error, raised", [
    (errors.IllegalGenerationError, CommitFailedError),
    (errors.UnknownMemberIdError, CommitFailedError),
    (errors.RebalanceInProgressError, CommitFailedError),
    (errors.GroupAuthorizationFailedError, errors.GroupAuthorizationFailedError),
    (errors.OffsetMetadataTooLargeError, errors.OffsetMetadataTooLargeError),
], ids=lambda e: e.__name__)
def test_a_commit_raises_a_non_retriable_error_at_once(fake, consumers, error, raised) -> None:
    fake.create_topic(TOPIC, 1)
    consumer = make(consumers, fake, group_id="g")
    consumer.assign([TP])
    fault = fake.inject("offset_commit", error, times=3)
    with pytest.raises(raised):
        consumer.commit({TP: 3}, timeout_ms=10_000)
    assert fault.times == 2  # one try only


def test_an_async_commit_tries_once_as_kafkas_commit_async(fake, consumers) -> None:
    """Kafka's commitAsync does not retry (a retry could land after a later commit): the
    callback gets the retriable error, and the next commit carries the offsets."""
    fake.create_topic(TOPIC, 1)
    consumer = make(consumers, fake, group_id="g")
    consumer.assign([TP])
    fault = fake.inject("offset_commit", errors.NotCoordinatorError, times=2)
    called: list[BaseException | None] = []
    future = consumer.commit_async({TP: 4}, callback=lambda offsets, error: called.append(error))
    with pytest.raises(errors.NotCoordinatorError):
        future.result(10)
    assert [type(e) for e in called] == [errors.NotCoordinatorError] and fault.times == 1
    fault.times = 0
    consumer.commit_async({TP: 5}).result(10)
    assert consumer.committed(TP).offset == 5


def test_committing_needs_a_group_id(fake, consumers) -> None:
    fake.create_topic(TOPIC, 1)
    consumer = make(consumers, fake)
    consumer.assign([TP])
    with pytest.raises(errors.InvalidConfigError, match="group_id"):
        consumer.commit({TP: 1})
    with pytest.raises(errors.InvalidConfigError, match="group_id"):
        consumer.subscribe([TOPIC])
