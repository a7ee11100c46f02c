"""The Producer's own logic against the in-memory FakeCluster (real gRPC, no Spark): batching and
linger, Kafka's partitioners, futures and callbacks, flush, retries, idempotence, errors and
timeouts. The end-to-end behaviour against real brokers is in tests/rpc/test_produce_fetch.py."""

from __future__ import annotations

import functools
import time

import pyarrow as pa
import pytest

from deltabus import FutureRecordMetadata, Producer, errors
from deltabus.client.partitioner import partition_for_key
from tests.client.fake_cluster import FakeCluster
from tests.client.test_partitioner import KAFKA_MURMUR2_VECTORS

TOPIC = "orders"


def calls_to(fake: FakeCluster, partition: int) -> list[int]:
    """The record count of every append partition `partition` of TOPIC was asked for."""
    return [c.records for c in fake.produce_calls if (c.topic, c.partition) == (TOPIC, partition)]


def test_offsets_of_the_futures_follow_send_order(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1)
    with Producer(fake.bootstrap_servers) as producer:
        futures = [producer.send(TOPIC, f"v{i}", partition=0) for i in range(50)]
        producer.flush()
        metadata = [f.get(0) for f in futures]  # flush returned: every future is done
    assert [(m.topic, m.partition, m.offset) for m in metadata] == [
        (TOPIC, 0, i) for i in range(50)]
    assert fake.values(TOPIC, 0) == [f"v{i}".encode() for i in range(50)]


def test_records_within_linger_go_in_one_request_when_flushed(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1)
    with Producer(fake.bootstrap_servers, linger_ms=60_000) as producer:
        futures = [producer.send(TOPIC, b"x", partition=0) for _ in range(30)]
        assert not any(f.done() for f in futures)  # lingering: nothing sent yet
        assert fake.produce_calls == []
        producer.flush()
        assert all(f.done() for f in futures)
    assert calls_to(fake, 0) == [30]


def test_a_lingering_batch_is_sent_after_linger_ms_without_a_flush(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1)
    with Producer(fake.bootstrap_servers, linger_ms=300) as producer:
        sent_at = time.monotonic()
        future = producer.send(TOPIC, b"alone", partition=0)
        assert future.get(10).offset == 0
        assert time.monotonic() - sent_at >= 0.3  # it waited for more records that long
    assert calls_to(fake, 0) == [1]


def test_a_full_batch_is_sent_without_waiting_for_linger(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1)
    # A record counts its value, key and 36 bytes (a record's overhead in a record batch at
    # most): 7 records of 100 bytes fill a 1000-byte batch, an 8th would overflow it.
    with Producer(fake.bootstrap_servers, linger_ms=60_000, batch_size=1000) as producer:
        futures = [producer.send(TOPIC, b"x" * 100, partition=0) for _ in range(8)]
        assert futures[6].get(10).offset == 6  # long before linger.ms
        assert not futures[7].done()  # the eighth opened the next batch, which lingers
        producer.flush()
        assert futures[7].get(0).offset == 7
    assert calls_to(fake, 0) == [7, 1]


def test_batches_stay_within_a_max_message_bytes_of_batch_size_and_its_header(
        fake: FakeCluster) -> None:
    """The broker checks max.message.bytes on each batch, as Kafka's does: both paths cut their
    batches at batch_size, counting each record at its largest, so none is refused (the bulk
    path sends its batches together, as the Arrow record batches of one entry)."""
    fake.create_topic(TOPIC, 1, {"max.message.bytes": str(5000 + 61)})
    values = [bytes([i % 256]) * (50 + i % 100) for i in range(300)]
    headers = [("trace", b"t" * 20)]
    with Producer(fake.bootstrap_servers, batch_size=5000, linger_ms=60_000) as producer:
        sent = [producer.send(TOPIC, v, headers=headers, partition=0) for v in values]
        producer.flush()
        assert sent[-1].get(0).offset == 299
        bulk = producer.send_batch(TOPIC, values, partition=0)
        producer.flush()
        assert [f.get(0).offset for f in bulk][0] == 300
    assert fake.values(TOPIC, 0) == values + values
    per_record = calls_to(fake, 0)[:-1]  # the bulk path's one entry last
    assert sum(per_record) == len(values) and len(per_record) > len(values) * 100 // 5000
    assert calls_to(fake, 0)[-1] == len(values)


def test_a_keyed_record_goes_where_kafkas_murmur2_partitioner_puts_it(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 7)
    with Producer(fake.bootstrap_servers) as producer:
        sent = {key: [producer.send(TOPIC, b"v", key=key) for _ in range(3)]
                for key, _ in KAFKA_MURMUR2_VECTORS}
        producer.flush()
    for key, murmur2 in KAFKA_MURMUR2_VECTORS:
        expected = (murmur2 & 0x7FFFFFFF) % 7  # Kafka: toPositive(murmur2(key)) % partitions
        assert {f.get(0).partition for f in sent[key]} == {expected}, key
        log = fake.log(TOPIC, expected).records
        assert log.column("key").to_pylist().count(key.encode()) == 3


def test_an_explicit_partition_wins_over_the_key(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 3)
    key = b"user-1"
    other = (partition_for_key(key, 3) + 1) % 3
    with Producer(fake.bootstrap_servers) as producer:
        assert producer.send(TOPIC, b"v", key=key, partition=other).get(10).partition == other
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            producer.send(TOPIC, b"v", partition=3)


def test_unkeyed_records_stick_to_a_partition_until_their_batch_goes(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 3)
    with Producer(fake.bootstrap_servers, linger_ms=60_000) as producer:
        first = [producer.send(TOPIC, b"x") for _ in range(20)]
        producer.flush()
        second = [producer.send(TOPIC, b"y") for _ in range(20)]
        producer.flush()
    first_partitions = {f.get(0).partition for f in first}
    second_partitions = {f.get(0).partition for f in second}
    assert len(first_partitions) == 1 and len(second_partitions) == 1
    assert first_partitions != second_partitions  # the next batch moved on


def note(seen: list[tuple[int, int]], i: int, future: FutureRecordMetadata) -> None:
    seen.append((i, future.get(0).offset))


def test_callbacks_get_each_records_metadata_before_flush_returns(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1)
    seen: list[tuple[int, int]] = []
    with Producer(fake.bootstrap_servers, linger_ms=60_000) as producer:
        for i in range(5):
            future = producer.send(TOPIC, b"v", partition=0)
            future.add_done_callback(functools.partial(note, seen, i))
        producer.flush()
        assert seen == [(i, i) for i in range(5)]
        done = producer.send(TOPIC, b"late", partition=0)
        producer.flush()
        late: list[int] = []
        done.add_done_callback(lambda f: late.append(f.get(0).offset))  # already done: at once
        assert late == [5]


def test_bulk_send_routes_keyed_rows_by_key_and_chunks_by_request_size(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 3)
    keys = [f"k{i % 11}".encode() for i in range(300)]
    table = pa.table({"key": pa.array(keys, pa.binary()),
                      "value": pa.array([b"v" * 50] * 300, pa.binary())})
    with Producer(fake.bootstrap_servers, max_request_size=4000) as producer:
        futures = producer.send_batch(TOPIC, table)
        producer.flush()
    assert len(futures) > 3  # more than one chunk for some partition
    for p in range(3):
        logged = fake.log(TOPIC, p).records.column("key").to_pylist()
        assert logged == [k for k in keys if partition_for_key(k, 3) == p]
        assert all(n * 60 <= 4000 for n in calls_to(fake, p))  # each chunk within the request
    firsts = sorted((f.get(0).partition, f.get(0).offset) for f in futures)
    assert [o for p, o in firsts if p == 0][0] == 0  # a chunk's future: its first record


def test_acks_zero_resolves_without_an_offset_and_still_writes(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1)
    with Producer(fake.bootstrap_servers, acks=0) as producer:
        assert producer.send(TOPIC, b"fire-and-forget").get(10).offset == -1
    assert fake.values(TOPIC, 0) == [b"fire-and-forget"]


def test_sending_to_a_missing_topic_creates_it_unless_told_not_to(fake: FakeCluster) -> None:
    with Producer(fake.bootstrap_servers) as producer:
        assert producer.send("fresh", b"first").get(10).offset == 0
    assert fake.values("fresh", 0) == [b"first"]
    with Producer(fake.bootstrap_servers, allow_auto_create_topics=False,
                  max_block_ms=200) as producer:
        with pytest.raises(errors.UnknownTopicOrPartitionError, match="after 200 ms"):
            producer.send("never-created", b"x")
    assert "never-created" not in fake.image().topics


# ---- retries, idempotence and failures ----------------------------------------------------------


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_retriable_error_is_retried_and_the_record_lands_once(fake: FakeCluster,
                                                               idempotent: bool) -> None:
    fake.create_topic(TOPIC, 1)
    fault = fake.inject("produce", errors.NotLeaderOrFollowerError, topic=TOPIC)
    with Producer(fake.bootstrap_servers, enable_idempotence=idempotent,
                  retry_backoff_ms=10) as producer:
        assert producer.send(TOPIC, b"once").get(10).offset == 0
    assert fault.times == 0
    assert calls_to(fake, 0) == [1, 1]  # refused, then retried
    assert fake.values(TOPIC, 0) == [b"once"]


def test_a_lost_answer_is_retried_without_a_duplicate_by_the_idempotent_producer(
        fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1)
    fake.inject("produce", errors.RequestTimedOutError, topic=TOPIC, after_append=True)
    with Producer(fake.bootstrap_servers, retry_backoff_ms=10) as producer:
        # The retry carries the same producer id and sequence: the leader answers it with the
        # first append's offsets instead of appending again.
        assert producer.send(TOPIC, b"once").get(10).offset == 0
        assert producer.send(TOPIC, b"next").get(10).offset == 1
    assert calls_to(fake, 0) == [1, 1, 1]
    assert fake.values(TOPIC, 0) == [b"once", b"next"]


def test_without_idempotence_a_lost_answer_writes_the_record_twice(fake: FakeCluster) -> None:
    """At-least-once, as Kafka's producer with enable.idempotence=false."""
    fake.create_topic(TOPIC, 1)
    fake.inject("produce", errors.RequestTimedOutError, topic=TOPIC, after_append=True)
    with Producer(fake.bootstrap_servers, enable_idempotence=False,
                  retry_backoff_ms=10) as producer:
        assert producer.send(TOPIC, b"twice").get(10).offset == 1  # the retry's offset
    assert fake.values(TOPIC, 0) == [b"twice", b"twice"]


def test_batches_keep_their_order_through_a_retry(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1)
    # Twice: a refusal such as NOT_ENOUGH_REPLICAS refuses every batch of the request (two
    # pipelined batches may share one), before any of them is appended.
    fake.inject("produce", errors.NotEnoughReplicasError, topic=TOPIC, times=2)
    values = [f"v{i:02d}".encode() for i in range(40)]
    with Producer(fake.bootstrap_servers, batch_size=100, retry_backoff_ms=10) as producer:
        futures = [producer.send(TOPIC, v, partition=0) for v in values]
        producer.flush()
    assert len(calls_to(fake, 0)) > 3  # several batches, refused ones again
    assert fake.values(TOPIC, 0) == values
    assert [f.get(0).offset for f in futures] == list(range(40))


def test_a_leader_that_moved_is_found_again_through_metadata(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1)
    with Producer(fake.bootstrap_servers, retry_backoff_ms=10) as producer:
        assert producer.send(TOPIC, b"before").get(10).offset == 0
        old = fake.leader(TOPIC, 0)
        fake.move_leader(TOPIC, 0, 1 - old)  # the producer's cached metadata is stale now
        assert producer.send(TOPIC, b"after").get(10).offset == 1
    attempts = [c.broker_id for c in fake.produce_calls]
    assert attempts[0] == old and attempts[-1] == 1 - old  # refused by the old one, then moved
    assert fake.values(TOPIC, 0) == [b"before", b"after"]


def test_a_non_retriable_error_fails_only_its_batch(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1, {"max.message.bytes": "100"})
    with Producer(fake.bootstrap_servers) as producer:
        assert producer.send(TOPIC, b"small").get(10).offset == 0
        big = producer.send(TOPIC, b"x" * 200)
        with pytest.raises(errors.MessageTooLargeError, match="max.message.bytes=100"):
            big.get(10)
        assert isinstance(big.exception(0), errors.MessageTooLargeError)
        # The refused batch used up its sequence numbers: the next one is not held up.
        assert producer.send(TOPIC, b"after").get(10).offset == 1
    assert calls_to(fake, 0) == [1, 1, 1]  # the big one was not retried
    assert fake.values(TOPIC, 0) == [b"small", b"after"]


def test_a_batch_the_broker_cannot_read_does_not_hold_up_the_next() -> None:
    fake = FakeCluster(sequence_wait_ms=200)
    try:
        fake.create_topic(TOPIC, 1)
        with Producer(fake.bootstrap_servers, delivery_timeout_ms=1000) as producer:
            bad = producer.send_batch(TOPIC, pa.table({"value": [b"v"], "colour": [b"red"]}),
                                      partition=0)
            with pytest.raises(errors.InvalidRecordError, match="colour"):
                bad[0].get(10)
            assert producer.send(TOPIC, b"next", partition=0).get(10).offset == 0
    finally:
        fake.close()


@pytest.mark.parametrize(("refusal", "raised"), [
    (errors.NotEnoughReplicasError, errors.NotEnoughReplicasError),  # the broker's last word
    (errors.RequestTimedOutError, errors.KafkaTimeoutError),  # no answer: the client gave up
])
def test_a_batch_still_refused_at_delivery_timeout_fails(
        fake: FakeCluster, refusal: type[errors.DeltaBusError],
        raised: type[errors.DeltaBusError]) -> None:
    fake.create_topic(TOPIC, 1)
    fake.inject("produce", refusal, topic=TOPIC, times=1_000_000)
    with Producer(fake.bootstrap_servers, delivery_timeout_ms=300,
                  retry_backoff_ms=20) as producer:
        sent_at = time.monotonic()
        future = producer.send(TOPIC, b"never")
        with pytest.raises(raised):
            future.get(10)
        assert time.monotonic() - sent_at >= 0.3
    assert len(calls_to(fake, 0)) > 1  # retried until delivery.timeout.ms
    assert fake.values(TOPIC, 0) == []


def test_a_batch_expired_unwritten_does_not_wedge_its_partition() -> None:
    """A batch that fails at delivery.timeout.ms was never written: its sequence numbers leave
    a gap the leader waits on in vain, and every later batch of the partition failed
    OUT_OF_ORDER_SEQUENCE_NUMBER (the S3 soak's producers, after a leader change). As Kafka's
    idempotent producer (KIP-360), the producer bumps its epoch and starts the sequences
    again at 0."""
    fake = FakeCluster(sequence_wait_ms=200)
    try:
        fake.create_topic(TOPIC, 1)
        fault = fake.inject("produce", errors.NotLeaderOrFollowerError, topic=TOPIC,
                            times=1_000_000)
        with Producer(fake.bootstrap_servers, delivery_timeout_ms=300,
                      retry_backoff_ms=20) as producer:
            with pytest.raises(errors.NotLeaderOrFollowerError):
                producer.send(TOPIC, b"lost").get(10)
            fault.times = 0
            assert producer.send(TOPIC, b"next").get(10).offset == 0
            assert producer.send(TOPIC, b"after").get(10).offset == 1
        assert fake.values(TOPIC, 0) == [b"next", b"after"]
        epochs = [c.producer.producer_epoch for c in fake.produce_calls]
        assert epochs[-1] == epochs[0] + 1
        assert [c.producer.base_sequence for c in fake.produce_calls][-2:] == [0, 1]
    finally:
        fake.close()


def test_flush_times_out_while_the_broker_holds_the_append(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1)
    with Producer(fake.bootstrap_servers, linger_ms=0) as producer:
        with fake.appends_held():
            future = producer.send(TOPIC, b"slow")
            fake.wait_until(lambda: fake.appends_waiting == 1, "the request at the broker")
            with pytest.raises(errors.KafkaTimeoutError, match="flush"):
                producer.flush(timeout=0.2)
            assert not future.done()
        assert future.get(10).offset == 0


def test_send_blocks_while_buffer_memory_is_full_then_times_out(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1)
    with Producer(fake.bootstrap_servers, linger_ms=0, buffer_memory=1000,
                  max_block_ms=200) as producer:
        with fake.appends_held():
            first = producer.send(TOPIC, b"x" * 900)
            fake.wait_until(lambda: fake.appends_waiting == 1, "the request at the broker")
            blocked_at = time.monotonic()
            with pytest.raises(errors.KafkaTimeoutError, match="buffer_memory=1000"):
                producer.send(TOPIC, b"y" * 900)
            assert time.monotonic() - blocked_at >= 0.2  # max_block_ms
        assert first.get(10).offset == 0
        assert producer.send(TOPIC, b"z" * 900).get(10).offset == 1  # room again
    assert fake.values(TOPIC, 0) == [b"x" * 900, b"z" * 900]


def test_a_closed_producer_refuses_to_send(fake: FakeCluster) -> None:
    fake.create_topic(TOPIC, 1)
    producer = Producer(fake.bootstrap_servers, linger_ms=60_000)
    future = producer.send(TOPIC, b"flushed-by-close")
    producer.close()
    assert future.get(0).offset == 0  # close flushed it
    with pytest.raises(errors.ClientError, match="closed"):
        producer.send(TOPIC, b"x")


def test_transactions_need_a_transactional_id_and_init_transactions_first(fake) -> None:
    """confluent-kafka's order: init_transactions (with a transactional_id, and not with the
    Spark sink's fixed producer_epoch) before begin_transaction; nothing is sent meanwhile."""
    fake.create_topic(TOPIC, 1)
    with Producer(fake.bootstrap_servers) as producer:
        with pytest.raises(errors.InvalidConfigError):
            producer.init_transactions()
        with pytest.raises(errors.InvalidTxnStateError):
            producer.begin_transaction()
    with Producer(fake.bootstrap_servers, transactional_id="tx", producer_epoch=3) as producer:
        with pytest.raises(errors.InvalidConfigError):
            producer.init_transactions()
    with Producer(fake.bootstrap_servers, transactional_id="tx") as producer:
        for call in (producer.begin_transaction, producer.commit_transaction,
                     producer.abort_transaction):
            with pytest.raises(errors.InvalidTxnStateError):
                call()
        producer.send(TOPIC, b"stable id, no transaction", partition=0).get(30)
    assert fake.values(TOPIC, 0) == [b"stable id, no transaction"]
