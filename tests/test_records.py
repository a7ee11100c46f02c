"""Records: a produce batch is checked and normalised, a log batch gets contiguous offsets, and
what goes over the wire as Arrow IPC comes back unchanged."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from deltabus import errors
from deltabus.records import (
    CREATE_TIME,
    HEADERS_TYPE,
    LOG_APPEND_TIME,
    LOG_SCHEMA,
    PRODUCE_SCHEMA,
    ProducerState,
    batch_bytes_at_most,
    batch_size_bytes,
    check_batch_size,
    from_ipc,
    iter_consumer_records,
    normalize_produce,
    produce_batch,
    record_bytes_max,
    record_encoded_sizes,
    record_sizes,
    to_ipc,
    to_log_batch,
)

NOW_MS = 1_700_000_000_000


def _log_batch(table: pa.Table, base_offset: int = 0, **kwargs) -> pa.Table:
    return to_log_batch(normalize_produce(table), base_offset=base_offset, now_ms=NOW_MS,
                        leader_epoch=kwargs.pop("leader_epoch", 3), **kwargs)


# ---- normalize_produce ---------------------------------------------------------------------


def test_normalize_fills_missing_columns_with_nulls() -> None:
    out = normalize_produce(pa.table({"value": pa.array([b"a", b"b"], pa.binary())}))
    assert out.schema == PRODUCE_SCHEMA
    assert out.column("value").to_pylist() == [b"a", b"b"]
    for name in ("key", "timestamp", "headers"):
        assert out.column(name).null_count == 2


def test_normalize_accepts_columns_in_any_order_and_castable_types() -> None:
    table = pa.table({
        "key": pa.array(["k1", None], pa.string()),  # utf-8 casts to binary
        "value": pa.array([b"v1", None], pa.large_binary()),
    })
    out = normalize_produce(table)
    assert out.schema == PRODUCE_SCHEMA
    assert out.column("key").to_pylist() == [b"k1", None]
    assert out.column("value").to_pylist() == [b"v1", None]


def test_normalize_rejects_batch_without_value() -> None:
    with pytest.raises(errors.InvalidRecordError, match="value"):
        normalize_produce(pa.table({"key": pa.array([b"k"], pa.binary())}))


def test_normalize_rejects_unknown_columns() -> None:
    table = pa.table({"value": pa.array([b"v"], pa.binary()), "partition": pa.array([1])})
    with pytest.raises(errors.InvalidRecordError, match="partition"):
        normalize_produce(table)


def test_normalize_rejects_uncastable_column_naming_it() -> None:
    table = pa.table({"value": pa.array([b"v"], pa.binary()), "headers": pa.array([1.5])})
    with pytest.raises(errors.InvalidRecordError, match="headers"):
        normalize_produce(table)


@pytest.mark.parametrize("int_type", [pa.int64(), pa.int32(), pa.uint32()])
def test_normalize_reads_integer_timestamps_as_ms(int_type: pa.DataType) -> None:
    table = pa.table({
        "value": pa.array([b"a", b"b", b"c"], pa.binary()),
        "timestamp": pa.array([1_000, None, 2_000_000_000], int_type),
    })
    out = normalize_produce(table)
    micros = out.column("timestamp").cast(pa.int64()).to_pylist()
    assert micros == [1_000_000, None, 2_000_000_000_000]


def test_normalize_accepts_int64_ms_epoch_timestamps() -> None:
    table = pa.table({
        "value": pa.array([b"a"], pa.binary()),
        "timestamp": pa.array([NOW_MS + 123], pa.int64()),
    })
    out = normalize_produce(table)
    assert out.column("timestamp").cast(pa.int64()).to_pylist() == [(NOW_MS + 123) * 1000]


def test_normalize_rejects_out_of_range_integer_timestamps_as_invalid_record() -> None:
    # The contract: a bad batch raises InvalidRecordError naming the column, never a raw Arrow
    # error (which the broker would answer as UNKNOWN_SERVER_ERROR).
    table = pa.table({
        "value": pa.array([b"v"], pa.binary()),
        "timestamp": pa.array([2**64 - 1], pa.uint64()),
    })
    with pytest.raises(errors.InvalidRecordError, match="timestamp"):
        normalize_produce(table)


def test_produce_batch_gives_a_normalisable_table() -> None:
    batch = produce_batch([b"v"], keys=[b"k"], timestamps_ms=[NOW_MS],
                          headers=[[("h", b"x"), ("n", None)]])
    out = normalize_produce(batch)
    assert out.to_pylist() == [{
        "key": b"k", "value": b"v", "timestamp": out.column("timestamp")[0].as_py(),
        "headers": [{"key": "h", "value": b"x"}, {"key": "n", "value": None}],
    }]
    assert out.column("timestamp").cast(pa.int64())[0].as_py() == NOW_MS * 1000


# ---- to_log_batch --------------------------------------------------------------------------


@given(st.integers(min_value=1, max_value=300), st.integers(min_value=0, max_value=2**40))
@settings(max_examples=50, deadline=None)
def test_log_batch_offsets_are_contiguous_from_base(n: int, base: int) -> None:
    out = _log_batch(produce_batch([b"x"] * n), base_offset=base)
    assert out.schema == LOG_SCHEMA
    assert out.column("offset").to_pylist() == list(range(base, base + n))


def test_log_batch_fills_null_timestamps_with_now_and_keeps_given_ones() -> None:
    out = _log_batch(produce_batch([b"a", b"b"], timestamps_ms=[None, 42]))
    ms = [t // 1000 for t in out.column("timestamp").cast(pa.int64()).to_pylist()]
    assert ms == [NOW_MS, 42]
    assert out.column("timestamp_type").to_pylist() == [CREATE_TIME] * 2
    assert out.column("timestamp").null_count == 0


def test_log_append_time_overrides_client_timestamps() -> None:
    out = _log_batch(produce_batch([b"a", b"b"], timestamps_ms=[1, 2]),
                     timestamp_type=LOG_APPEND_TIME)
    ms = [t // 1000 for t in out.column("timestamp").cast(pa.int64()).to_pylist()]
    assert ms == [NOW_MS, NOW_MS]
    assert out.column("timestamp_type").to_pylist() == [LOG_APPEND_TIME] * 2


def test_log_batch_stamps_broker_fields() -> None:
    out = _log_batch(produce_batch([b"a", b"b", b"c"]), leader_epoch=7,
                     producer=ProducerState(producer_id=99, producer_epoch=2, base_sequence=10))
    assert out.column("leader_epoch").to_pylist() == [7] * 3
    assert out.column("producer_id").to_pylist() == [99] * 3
    assert out.column("producer_epoch").to_pylist() == [2] * 3
    assert out.column("sequence").to_pylist() == [10, 11, 12]


def test_log_batch_without_idempotence_has_no_sequence() -> None:
    out = _log_batch(produce_batch([b"a", b"b"]))
    assert out.column("producer_id").to_pylist() == [-1, -1]
    assert out.column("sequence").to_pylist() == [-1, -1]


# ---- IPC -----------------------------------------------------------------------------------

header_lists = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=16))), max_size=3
)
records = st.lists(
    st.tuples(st.one_of(st.none(), st.binary(max_size=32)),
              st.one_of(st.none(), st.binary(max_size=64)),
              header_lists),
    min_size=1, max_size=30,
)


@given(records)
@settings(max_examples=60, deadline=None)
def test_ipc_round_trip_of_produce_and_log_batches(rows: list) -> None:
    keys = [k for k, _, _ in rows]
    values = [v for _, v, _ in rows]
    headers = [h for _, _, h in rows]
    produce = normalize_produce(produce_batch(values, keys=keys, headers=headers))
    back = from_ipc(to_ipc(produce))
    assert back.equals(produce)
    log_batch = to_log_batch(produce, base_offset=5, now_ms=NOW_MS, leader_epoch=0)
    back = from_ipc(to_ipc(log_batch))
    assert back.equals(log_batch)
    consumed = iter_consumer_records("t", 0, back)
    assert [r.key for r in consumed] == keys
    assert [r.value for r in consumed] == values
    assert [r.headers for r in consumed] == [list(h) for h in headers]
    assert [r.offset for r in consumed] == list(range(5, 5 + len(rows)))


def test_ipc_of_a_read_across_many_files_is_about_its_size() -> None:
    # One chunk per file: 500 files of 20 records of 100 bytes once went out as 20 times the
    # records' size (a record batch, with its metadata, per chunk).
    files = [to_log_batch(normalize_produce(produce_batch([b"x" * 100] * 20)),
                          base_offset=20 * i, now_ms=NOW_MS, leader_epoch=0) for i in range(500)]
    read = pa.concat_tables(files)
    data = to_ipc(read)
    assert len(data) < read.nbytes * 1.1
    assert from_ipc(data).equals(read)


@pytest.mark.parametrize(
    "data", [b"", b"garbage", b"\xff\xff\xff\xff\x10\x00\x00\x00junk", b"\x00" * 3]
)
def test_from_ipc_of_garbage_raises_corrupt_message(data: bytes) -> None:
    with pytest.raises(errors.CorruptMessageError):
        from_ipc(data)


def test_from_ipc_of_truncated_stream_raises_corrupt_message() -> None:
    data = to_ipc(normalize_produce(produce_batch([b"x" * 100] * 10)))
    with pytest.raises(errors.CorruptMessageError):
        from_ipc(data[: len(data) // 2])


# ---- record_sizes --------------------------------------------------------------------------


def test_record_sizes_count_key_value_and_headers() -> None:
    batch = normalize_produce(produce_batch(
        [b"12345", b"", None, b"v"],
        keys=[b"abc", None, None, b"k"],
        headers=[[("hk", b"hv1")], None, None, [("é", None), ("x", b"yy")]],
    ))
    # 3+5+2+3; 0; 0; 1+1+len("é".encode())+0+1+2
    assert record_sizes(batch).tolist() == [13, 0, 0, 1 + 1 + 2 + 1 + 2]


def test_null_header_key_is_an_invalid_record_not_a_crash() -> None:
    # Kafka refuses null header keys ("Null header keys are not permitted"); the schema allows
    # them, so a client can send one, and the produce path must answer INVALID_RECORD.
    table = pa.table({
        "value": pa.array([b"v"], pa.binary()),
        "headers": pa.array([[{"key": None, "value": b"x"}]], HEADERS_TYPE),
    })
    with pytest.raises(errors.InvalidRecordError):
        record_sizes(normalize_produce(table))


def test_record_sizes_without_headers() -> None:
    batch = normalize_produce(produce_batch([b"a" * 10, b"b" * 20], keys=[b"kk", None]))
    assert record_sizes(batch).tolist() == [12, 20]


# ---- batch sizes as Kafka counts them for max.message.bytes ---------------------------------

_BYTES = st.one_of(st.none(), st.binary(max_size=300),
                   st.sampled_from([b"v" * 63, b"v" * 64, b"v" * 8191, b"v" * 8192]))
_RECORDS = st.lists(st.tuples(
    _BYTES, _BYTES, st.integers(-10**10, 10**10),
    st.lists(st.tuples(st.text(max_size=70), _BYTES), max_size=4)), min_size=1, max_size=150)


@given(_RECORDS)
@settings(max_examples=100, deadline=None)
def test_a_batchs_size_is_the_length_of_the_record_batch_a_kafka_client_builds(records) -> None:
    """max.message.bytes means the same on both doors: the gRPC door's batches are measured as
    the uncompressed record batch kafka-python (Kafka's format) makes of the same records."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=2**31 - 1)
    for i, (key, value, delta, headers) in enumerate(records):
        builder.append(i, timestamp=NOW_MS + delta, key=key, value=value, headers=headers)
    batch = normalize_produce(produce_batch(
        [v for _, v, _, _ in records], keys=[k for k, _, _, _ in records],
        timestamps_ms=[NOW_MS + d for _, _, d, _ in records],
        headers=[h or None for _, _, _, h in records]))
    assert batch_size_bytes(batch) == len(builder.build())
    assert (record_bytes_max(batch) >= record_encoded_sizes(batch)).all()
    bound = batch_bytes_at_most(batch)
    assert bound is None or bound >= batch_size_bytes(batch)


@given(st.lists(st.tuples(_BYTES, _BYTES, st.integers(-10**10, 10**10)), min_size=1,
                max_size=150), st.integers(0, 20))
@settings(max_examples=100, deadline=None)
def test_the_bound_of_a_batch_without_headers_is_never_below_its_size(records, cut) -> None:
    """The broker checks max.message.bytes on this bound when it fits (batch_bytes_at_most):
    it must never be below the exact size, sliced batches included."""
    batch = normalize_produce(produce_batch(
        [v for _, v, _ in records], keys=[k for k, _, _ in records],
        timestamps_ms=[NOW_MS + d for _, _, d in records]))
    part = batch.slice(min(cut, batch.num_rows - 1))
    for table in (batch, part):
        bound = batch_bytes_at_most(table)
        assert bound is not None and bound >= batch_size_bytes(table)


def test_max_message_bytes_is_refused_with_kafkas_error_naming_the_limit() -> None:
    check_batch_size(100, 100, "t-0")
    with pytest.raises(errors.MessageTooLargeError) as info:
        check_batch_size(101, 100, "t-0")
    assert info.value.message == (
        "The record batch size in the append to t-0 is 101 bytes which exceeds the maximum "
        "configured value (max.message.bytes=100).")


# ---- iter_consumer_records -----------------------------------------------------------------


def test_consumer_records_round_trip_every_field() -> None:
    batch = produce_batch(
        [b"v0", None, b"v2"],
        keys=[None, b"k1", b"k2"],
        timestamps_ms=[NOW_MS - 5, None, 0],
        headers=[[("a", b"1"), ("b", None)], None, [("c", b"")]],
    )
    log_batch = _log_batch(batch, base_offset=100, leader_epoch=4)
    out = iter_consumer_records("orders", 2, log_batch)
    assert [(r.topic, r.partition) for r in out] == [("orders", 2)] * 3
    assert [r.offset for r in out] == [100, 101, 102]
    assert [r.key for r in out] == [None, b"k1", b"k2"]
    assert [r.value for r in out] == [b"v0", None, b"v2"]
    assert [r.timestamp for r in out] == [NOW_MS - 5, NOW_MS, 0]
    assert [r.timestamp_type for r in out] == [CREATE_TIME] * 3
    assert [r.headers for r in out] == [[("a", b"1"), ("b", None)], [], [("c", b"")]]
    assert [r.leader_epoch for r in out] == [4] * 3


def test_consumer_records_of_empty_table() -> None:
    assert iter_consumer_records("t", 0, LOG_SCHEMA.empty_table()) == []


def test_consumer_records_without_headers_do_not_share_header_lists() -> None:
    out = iter_consumer_records("t", 0, _log_batch(produce_batch([b"a", b"b"])))
    assert [r.headers for r in out] == [[], []]
    out[0].headers.append(("added", b"by the user"))
    assert out[1].headers == [], "records must not share one mutable headers list"
