"""A Fetch answer keeps fetch.max.bytes and max.partition.fetch.bytes on the bytes it sends
(Arrow IPC, Kafka record batches, proto records), whatever the number of files behind a read:
no partition is over its limit, the answer not over its total, except the first partition that
carries anything, with one record, so a consumer always progresses; what a partition carries is
the longest prefix of its read that fits, in offset order. No Spark: tables built here."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecords

from deltabus.records import LOG_SCHEMA, from_ipc, normalize_produce, produce_batch, to_log_batch
from deltabus.rpc.codec import table_to_arrow_records
from deltabus.rpc.fetch_size import FetchBudget, longest_prefix
from deltabus.rpc.kafka.batches import encode_fetch, encode_fetch_sized

ENCODINGS = {"arrow": table_to_arrow_records, "kafka": encode_fetch,
             "kafka-sized": encode_fetch}  # the Kafka door's: fit_encoded, no search


def fit(budget: FetchBudget, encoding: str, read: pa.Table,
        partition_max_bytes: int) -> tuple[pa.Table, bytes]:
    """What a partition carries, as each door asks its budget for it."""
    if encoding != "kafka-sized":
        return budget.fit(read, partition_max_bytes, ENCODINGS[encoding])
    data = budget.fit_encoded(read, partition_max_bytes, encode_fetch_sized)
    return read.slice(0, len(sent_offsets("kafka", data))), data


def read_of_files(files: list[list[int]], fetch_offset: int = 0) -> pa.Table:
    """What a read across many files looks like: one chunk per file, records of the given value
    sizes (some keyed, some with headers), offsets contiguous from `fetch_offset`."""
    chunks, offset = [], fetch_offset
    for sizes in files:
        batch = normalize_produce(produce_batch(
            [b"v" * n for n in sizes],
            keys=[f"k{offset + i}".encode() if i % 3 else None for i in range(len(sizes))],
            headers=[[("h", b"x" * (i % 4))] if i % 5 == 0 else None for i in range(len(sizes))]))
        chunks.append(to_log_batch(batch, base_offset=offset, now_ms=1_700_000_000_000,
                                   leader_epoch=0))
        offset += len(sizes)
    return pa.concat_tables(chunks) if chunks else LOG_SCHEMA.empty_table()


def sent_offsets(encoding: str, data: bytes) -> list[int]:
    """The offsets an answer carries, read back as a client reads them."""
    if not data:
        return []
    if encoding == "arrow":
        return from_ipc(data).column("offset").to_pylist()
    records, out = MemoryRecords(data), []
    while records.has_next():
        out += [r.offset for r in records.next_batch()]
    return out


def test_a_read_of_500_small_files_goes_out_within_its_partition_limit() -> None:
    read = read_of_files([[100] * 20] * 500)  # the consumer: 500 files of 20 records
    assert read.column("offset").num_chunks == 500
    for encoding, encode in ENCODINGS.items():
        records, data = FetchBudget(52_428_800).fit(read, 1_048_576, encode)
        assert 0 < len(data) <= 1_048_576
        assert sent_offsets(encoding, data) == list(range(records.num_rows))
        longer = read.combine_chunks().slice(0, records.num_rows + 1)
        assert len(encode(longer)) > 1_048_576  # the longest prefix that fits


def test_the_first_partition_carries_one_record_over_its_limit_and_no_other_does() -> None:
    big = read_of_files([[5_000, 10]])
    for encoding, encode in ENCODINGS.items():
        budget = FetchBudget(3_000)
        first, data = budget.fit(big, 1_000, encode)
        assert sent_offsets(encoding, data) == [0] and len(data) > 3_000
        assert budget.fit(big, 1_000, encode)[0].num_rows == 0  # nothing left of the total
        assert budget.fit(read_of_files([[1]]), 1_000, encode)[0].num_rows == 0


def test_a_partition_after_an_oversized_first_record_still_gets_what_fits() -> None:
    budget = FetchBudget(100_000)
    budget.fit(read_of_files([[5_000]]), 1_000, table_to_arrow_records)
    records, data = budget.fit(read_of_files([[100] * 50]), 3_000, table_to_arrow_records)
    assert 0 < records.num_rows < 50 and len(data) <= 3_000


def test_files_a_follower_copies_count_against_the_answer() -> None:
    budget = FetchBudget(10_000)
    budget.spend(9_000)  # one partition's whole files
    records, data = budget.fit(read_of_files([[100] * 50]), 8_000, table_to_arrow_records)
    assert records.num_rows == 0 and data == b""  # the IPC of even one record is over 1,000


def test_proto_records_fit_by_their_sizes() -> None:
    budget = FetchBudget(250)
    assert budget.fit_sized([40, 40, 40], 100) == 2
    assert budget.fit_sized([200], 1_000) == 0  # 170 left of the total
    assert budget.fit_sized([100, 60, 20], 1_000) == 2  # 170: two fit, the third not
    first = FetchBudget(50)
    assert first.fit_sized([80, 1], 60) == 1  # the first record, over both limits
    assert first.fit_sized([1], 60) == 0


def test_an_empty_read_carries_nothing_and_spends_nothing() -> None:
    budget = FetchBudget(1_000)
    records, data = longest_prefix(read_of_files([]), 10, encode_fetch, at_least_one=True)
    assert records.num_rows == 0 and data == b""
    assert budget.fit(read_of_files([[]]), 500, encode_fetch)[1] == b""
    assert budget.remaining_bytes == 1_000 and not budget.carrying


partition = st.tuples(
    st.lists(st.lists(st.integers(0, 3_000), min_size=0, max_size=12), min_size=0, max_size=15),
    st.integers(0, 10**9),  # fetch offset
    st.integers(0, 40_000),  # partition max bytes
)


@settings(max_examples=80, deadline=None)
@given(st.lists(partition, min_size=1, max_size=5), st.integers(0, 120_000),
       st.sampled_from(sorted(ENCODINGS)))
def test_every_answer_keeps_its_limits_and_carries_prefixes(partitions, max_bytes, encoding):
    encode = ENCODINGS[encoding]
    budget = FetchBudget(max_bytes)
    total, first_bytes = 0, None  # first_bytes: what the first partition with records carries
    for files, fetch_offset, partition_max_bytes in partitions:
        read = read_of_files(files, fetch_offset)
        limit = max(0, min(partition_max_bytes, max_bytes - total))
        records, data = fit(budget, encoding, read, partition_max_bytes)
        count = records.num_rows
        sent = sent_offsets(encoding.removesuffix("-sized"), data)
        assert sent == list(range(fetch_offset, fetch_offset + count))
        assert data == (encode(records) if count else b"")
        if read.num_rows and first_bytes is None:
            first_bytes = len(data)
            assert count >= 1  # progress, whatever the limits
            assert len(data) <= limit or count == 1
        else:
            assert len(data) <= limit
        longer = read.combine_chunks().slice(0, count + 1)
        assert count == read.num_rows or len(encode(longer)) > limit
        total += len(data)
    assert total <= max(max_bytes, first_bytes or 0)
    assert budget.remaining_bytes == max_bytes - total
