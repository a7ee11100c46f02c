"""How many of each partition's records a Fetch answer carries: Kafka's fetch.max.bytes and
max.partition.fetch.bytes, counted on the bytes a door puts on the wire.

Why the doors count and not the partition log: a read is budgeted by its size in memory, but what
goes out is an encoding (Arrow IPC, proto records, Kafka record batches) whose size can be far
from it; a read across 500 small files once went out as 20 times its budget and a 6-partition
answer passed gRPC's 100 MB message limit. Only the door knows what it sends, so it measures that.

What holds for every answer, its partitions walked in the request's order with what the answer's
max bytes leaves (`remaining_bytes`):
- a partition carries at most min(its partition max bytes, remaining) bytes of encoded records,
  so the records of an answer, with the files before them, stay within its max bytes;
- except the first partition that carries anything: when its first record alone is over its
  limit, it carries that one record and nothing more (Kafka's "at least one batch", so a consumer
  always progresses); no other partition ever exceeds its limit;
- a partition carries a prefix of what was read, in order from the fetch offset: the longest that
  fits (encoded sizes grow with the prefix, so the search below finds it);
- a partition after the budget is spent carries no records (its watermarks and error stay);
- whole files a follower copies are never cut (a file is all or nothing, the answer carries only
  its address, and the broker lists about replica_files_max_bytes of them): their size counts
  against the budget, so the partitions after them carry what is left.

Pure: no I/O, no transport. A FetchBudget lives for one request, in that request's thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from deltabus.records import record_sizes

if TYPE_CHECKING:
    from deltabus.rpc.kafka.batches import EncodedFetch

# The per-record bytes an encoding adds to key + value + headers, for the first guess of where a
# prefix ends (offset, timestamp, lengths, ...). Only a guess: each cut is checked by encoding.
_RECORD_OVERHEAD_BYTES = 32
# Guesses by interpolation before the search halves its interval (bounds the encodes per cut).
_INTERPOLATIONS_MAX = 4


class FetchBudget:
    """fetch.max.bytes over one answer, spent partition by partition in the request's order.

    Not thread-safe: one request's thread builds its answer with it.
    """

    def __init__(self, max_bytes: int) -> None:
        self.remaining_bytes = max_bytes
        self.carrying = False  # whether an earlier partition already carries records or files

    def partition_limit(self, partition_max_bytes: int) -> int:
        """What the next partition may carry (0 once the answer's budget is spent)."""
        return max(0, min(partition_max_bytes, self.remaining_bytes))

    def spend(self, size_bytes: int) -> None:
        """Count what a partition carries (files a follower copies, or encoded records)."""
        self.remaining_bytes -= size_bytes
        if size_bytes > 0:
            self.carrying = True

    def fit(self, records: pa.Table, partition_max_bytes: int,
            encode: Callable[[pa.Table], bytes]) -> tuple[pa.Table, bytes]:
        """The prefix of `records` a partition carries and its encoding, spent."""
        limit = self.partition_limit(partition_max_bytes)
        prefix, data = longest_prefix(records, limit, encode, at_least_one=not self.carrying)
        assert len(data) <= limit or (prefix.num_rows == 1 and not self.carrying), (
            f"a partition's answer of {len(data)} bytes is over its limit of {limit}")
        self.spend(len(data))
        return prefix, data

    def fit_encoded(self, records: pa.Table, partition_max_bytes: int,
                    encode: Callable[[pa.Table], EncodedFetch]) -> bytes:
        """What `fit` carries, for an encoding that cuts itself to a prefix (the Kafka door's
        record batches): one encode, no search."""
        limit = self.partition_limit(partition_max_bytes)
        at_least_one = not self.carrying
        if records.num_rows == 0 or (limit <= 0 and not at_least_one):
            return b""
        encoded = encode(records)
        data = encoded.data
        if len(data) > limit:
            count = int(np.searchsorted(encoded.prefix_sizes, limit, side="right"))
            data = encoded.prefix(count or int(at_least_one))
        assert len(data) <= limit or not self.carrying, (
            f"a partition's answer of {len(data)} bytes is over its limit of {limit}")
        self.spend(len(data))
        return data

    def fit_sized(self, sizes_bytes: Sequence[int], partition_max_bytes: int) -> int:
        """How many leading records a partition carries when each record's encoded size is known
        and they add up (proto records); spent."""
        limit = self.partition_limit(partition_max_bytes)
        total = np.cumsum(np.asarray(sizes_bytes, dtype=np.int64))
        count = int(np.searchsorted(total, limit, side="right"))
        if count == 0 and len(total) and not self.carrying:
            count = 1
        self.spend(int(total[count - 1]) if count else 0)
        return count


def longest_prefix(records: pa.Table, limit_bytes: int, encode: Callable[[pa.Table], bytes], *,
                   at_least_one: bool) -> tuple[pa.Table, bytes]:
    """The longest prefix of `records` whose encoding is at most `limit_bytes`, and that
    encoding; with `at_least_one`, one record even when it alone is over the limit (none when
    there is no record). The prefix is returned as encoded (chunks combined: an encoding may
    differ by a few bytes with the chunking of the same records).

    `encode` must give sizes that never shrink as the prefix grows. The answer is found with few
    encodes: the whole (the usual case: it fits), the first record, then guesses interpolated on
    the records' cumulative sizes, checked by encoding, until the fitting and the failing prefix
    are neighbours.
    """
    total = records.num_rows
    if total == 0 or (limit_bytes <= 0 and not at_least_one):  # no record encodes to nothing
        return records.slice(0, 0), b""
    records = records.combine_chunks()  # once, not in every encode of a read of many files
    whole = encode(records)
    if len(whole) <= limit_bytes:
        return records, whole
    first = encode(records.slice(0, 1))
    if len(first) > limit_bytes:
        return (records.slice(0, 1), first) if at_least_one else (records.slice(0, 0), b"")
    weights = np.concatenate(([0], np.cumsum(record_sizes(records) + _RECORD_OVERHEAD_BYTES)))
    fits, fits_data = 1, first  # the longest prefix known to fit, and its encoding
    fails, fails_bytes = total, len(whole)  # the shortest known not to
    guesses = 0
    while fails - fits > 1:
        if guesses < _INTERPOLATIONS_MAX:
            per_weight = (fails_bytes - len(fits_data)) / (weights[fails] - weights[fits])
            target = weights[fits] + (limit_bytes - len(fits_data)) / per_weight
            guess = int(np.searchsorted(weights, target, side="right")) - 1
            guess = min(max(guess, fits + 1), fails - 1)
        else:
            guess = (fits + fails) // 2
        guesses += 1
        data = encode(records.slice(0, guess))
        if len(data) <= limit_bytes:
            fits, fits_data = guess, data
        else:
            fails, fails_bytes = guess, len(data)
    return records.slice(0, fits), fits_data
