"""Record batches to and from log rows, checked with kafka-python's own decoder: what a fetch
sends is what the log holds (offsets with gaps, keys and values null or not, headers, timestamps
in any order, both timestamp types), and what a producer sends is what the log takes."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from deltabus import errors
from deltabus.records import LOG_SCHEMA
from deltabus.rpc.kafka import batches
from deltabus.rpc.kafka.batches import (
    FETCH_BATCH_RECORDS_MAX,
    compress_batches,
    decode_produce,
    encode_fetch,
)

record = st.tuples(
    st.integers(1, 3),  # gap to the previous offset (compaction leaves gaps)
    st.integers(1_600_000_000_000, 1_800_000_000_000),
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=2),
)


def log_rows(records: list[tuple], timestamp_type: int, base: int) -> pa.Table:
    offsets, offset = [], base
    for gap, *_ in records:
        offsets.append(offset)
        offset += gap
    return pa.table({
        "offset": offsets,
        "timestamp": pa.array([r[1] * 1000 for r in records], pa.timestamp("us", tz="UTC")),
        "timestamp_type": pa.array([timestamp_type] * len(records), pa.int32()),
        "key": pa.array([r[2] for r in records], pa.binary()),
        "value": pa.array([r[3] for r in records], pa.binary()),
        "headers": pa.array([[{"key": k, "value": v} for k, v in r[4]] or None
                             for r in records], LOG_SCHEMA.field("headers").type),
        "producer_id": pa.array([-1] * len(records), pa.int64()),
        "producer_epoch": pa.array([-1] * len(records), pa.int16()),
        "sequence": pa.array([-1] * len(records), pa.int32()),
        "leader_epoch": pa.array([3] * len(records), pa.int32()),
    }, schema=LOG_SCHEMA)


def decoded(data: bytes) -> tuple[list[tuple], list[DefaultRecordBatch]]:
    out, batches = [], []
    records = MemoryRecords(data)
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        batches.append(batch)
        out += [(r.offset, r.timestamp, r.key, r.value,
                 [(k, v) for k, v in r.headers]) for r in batch]
    return out, batches


@settings(max_examples=40, deadline=None)
@given(st.lists(record, min_size=1, max_size=60), st.sampled_from([0, 1]),
       st.integers(0, 10**12), st.booleans())
def test_fetched_batches_decode_to_the_log_rows(records, timestamp_type, base, no_headers):
    if no_headers:  # the encoder skips the headers field then
        records = [(*r[:4], []) for r in records]
    rows = log_rows(records, timestamp_type, base)
    got, batches = decoded(encode_fetch(rows))
    assert got == [(o, r[1], r[2], r[3], r[4]) for o, r in
                   zip(rows.column("offset").to_pylist(), records, strict=True)]
    assert all(b.timestamp_type == timestamp_type and b.leader_epoch == 3 for b in batches)


@settings(max_examples=40, deadline=None)
@given(st.lists(record, min_size=1, max_size=60), st.sampled_from([1, 2, 3, 4]),
       st.integers(1, 3))
def test_compressed_fetch_batches_decode_to_the_same_records(records, codec, copies):
    rows = log_rows(records * copies, 0, 0)  # copies: something to compress
    plain = encode_fetch(rows)
    packed = compress_batches(plain, codec)
    got, batches = decoded(packed)
    assert got == decoded(plain)[0]
    assert all(b.compression_type in (0, codec) for b in batches)  # 0: would not shrink
    assert len(packed) <= len(plain)


def test_a_batch_that_would_not_shrink_goes_as_stored() -> None:
    plain = encode_fetch(log_rows([(1, 1_700_000_000_000, None, os.urandom(40), [])], 0, 0))
    assert compress_batches(plain, 1) == plain


@settings(max_examples=40, deadline=None)
@given(st.lists(record, min_size=1, max_size=40), st.integers(1, 7))
def test_each_prefix_is_cut_from_the_whole_encoding_as_encoded_alone(records, batch_records_max):
    rows = log_rows(records, 0, 0)
    default, batches.FETCH_BATCH_RECORDS_MAX = batches.FETCH_BATCH_RECORDS_MAX, batch_records_max
    try:  # several batches from a few records
        whole = batches.encode_fetch_sized(rows)
        alone = [encode_fetch(rows.slice(0, n)) for n in range(1, rows.num_rows + 1)]
        assert whole.prefix_sizes.tolist() == [len(data) for data in alone]
        assert [whole.prefix(n) for n in range(1, rows.num_rows + 1)] == alone
        assert whole.prefix(0) == b"" and len(whole.data) == whole.prefix_sizes[-1]
    finally:
        batches.FETCH_BATCH_RECORDS_MAX = default


def test_a_long_fetch_is_split_into_batches() -> None:
    records = [(1, 1_700_000_000_000 + i, None, b"v", []) for i in range(10_000)]
    got, batches = decoded(encode_fetch(log_rows(records, 0, 0)))
    assert len(got) == 10_000 and len(batches) == -(-10_000 // FETCH_BATCH_RECORDS_MAX)
    assert [b.base_offset for b in batches] == list(range(0, 10_000, FETCH_BATCH_RECORDS_MAX))


@settings(max_examples=30, deadline=None)
@given(st.lists(record, min_size=1, max_size=30), st.sampled_from([0, 1, 2, 3, 4]),
       st.sampled_from([1, 5]), st.booleans())
def test_produced_batches_decode_to_produce_rows(records, codec, copies, no_headers):
    records = records * copies  # past COLUMN_READ_RECORDS_MIN too: both readers
    if no_headers:
        records = [(*r[:4], []) for r in records]
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                        producer_id=9, producer_epoch=1, base_sequence=5,
                                        batch_size=1 << 24)
    for i, (_, ts, key, value, headers) in enumerate(records):
        builder.append(i, timestamp=ts, key=key, value=value, headers=headers)
    (batch,) = decode_produce(bytes(builder.build()))
    assert (batch.producer.producer_id, batch.producer.base_sequence) == (9, 5)
    rows = batch.records.to_pylist()
    assert [(r["key"], r["value"], int(r["timestamp"].timestamp() * 1000),
             [(h["key"], h["value"]) for h in r["headers"] or []]) for r in rows] == [
        (key, value, ts, headers) for _, ts, key, value, headers in records]


def assert_readers_agree(section: bytes, batch: DefaultRecordBatch) -> None:
    """The column-wise and the record-by-record reader make the same of one records section:
    the same keys and values, or the same error (the column-wise reader may hand a damaged
    header count over to the other: None)."""
    outcomes: list[Any] = []
    for read in (batches._read_columns, batches._read_records):
        try:
            outcomes.append(read(section, batch))
        except errors.DeltaBusError as e:
            outcomes.append(e.name)
    columns, rows = outcomes
    if columns is None:
        return
    if isinstance(columns, str) or isinstance(rows, str):
        assert columns == rows
        return
    assert columns.column("key").to_pylist() == rows[0]
    assert columns.column("value").to_pylist() == rows[1]


plain_record = st.tuples(
    st.integers(1_600_000_000_000, 1_800_000_000_000),
    st.none() | st.binary(max_size=20),  # inline in a binary view up to 12 bytes, not past it
    st.none() | st.binary(max_size=200),  # a length varint of one or two bytes
)


def plain_batch(records: list[tuple]) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 24)
    for i, (ts, key, value) in enumerate(records):
        builder.append(i, timestamp=ts, key=key, value=value, headers=[])
    return bytes(builder.build())


@settings(max_examples=100, deadline=None)
@given(st.lists(plain_record, min_size=1, max_size=80))
def test_batches_without_headers_are_read_column_wise_as_kafka_python_reads_them(records):
    data = plain_batch(records)
    (batch,) = decode_produce(data)
    theirs = list(DefaultRecordBatch(data))
    assert batch.records.column("key").to_pylist() == [r.key for r in theirs]
    assert batch.records.column("value").to_pylist() == [r.value for r in theirs]
    assert [int(t.timestamp() * 1000) for t in batch.records.column("timestamp").to_pylist()] \
        == [r.timestamp for r in theirs]


@settings(max_examples=200, deadline=None)
@given(st.lists(plain_record, min_size=1, max_size=20), st.data())
def test_a_damaged_batch_is_read_column_wise_as_record_by_record(records, data):
    """Whatever bytes a batch's records section holds (CRCs aside), the column-wise reader
    answers what the record-by-record one does: the same rows, or CORRUPT_MESSAGE."""
    raw = plain_batch(records)
    batch = DefaultRecordBatch(raw)
    section = bytearray(raw[61:])
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(section) - 1))
        section[at] = data.draw(st.integers(0, 255))
    else:
        section = section[:data.draw(st.integers(0, len(section)))]
    assert_readers_agree(bytes(section), batch)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 400), st.integers(0, 300)), min_size=1, max_size=12),
       st.integers(0, 10**6), st.integers(0, 255))
def test_runs_of_equal_records_are_read_as_record_by_record(runs, where, byte):
    """A batch of runs of equal-size records (a perf test's producer, whose runs the column-wise
    reader leaps over), whole or with one byte changed, reads as record by record does."""
    records = [(1_700_000_000_000, None, b"v" * size) for count, size in runs
               for _ in range(count)]
    raw = plain_batch(records)
    batch = DefaultRecordBatch(raw)
    section = bytearray(raw[61:])
    for damaged in (False, True):
        if damaged:
            section[where % len(section)] = byte
        assert_readers_agree(bytes(section), batch)
