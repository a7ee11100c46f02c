"""Kafka's control records (KIP-98's transaction markers) as rows of a partition table.

A transaction coordinator ends a transaction by having each partition's leader append one
marker for the producer: COMMIT or ABORT. The marker takes an offset like any record, so it
replicates as part of the table's files and survives restarts with them. No column is added
for it (delta-spark reads every table unchanged): a marker is the one kind of row with a
producer id (>= 0) and no sequence (-1), as a Kafka control batch has base sequence -1. Its
key and value are Kafka's control record key (version, type) and value (version,
coordinator epoch), so the Kafka door sends them back byte for byte in a control batch; a
header names the offset its transaction began at, so the aborted transactions a
read_committed fetch must be told of are found from the markers alone.

Invariant: a row is a marker exactly when `control_mask` says so; nothing else writes a row
with producer_id >= 0 and sequence -1.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltabus.records import HEADERS_TYPE, PRODUCE_SCHEMA

CONTROL_SEQUENCE = -1
ABORT, COMMIT = 0, 1  # Kafka's ControlRecordType
TXN_FIRST_OFFSET_HEADER = "deltabus.txnFirstOffset"  # the transaction's first offset here
_KEY = struct.Struct(">hh")  # version 0, type
_VALUE = struct.Struct(">hi")  # version 0, coordinator epoch


@dataclass(frozen=True)
class TxnMarker:
    """One producer's transaction ended on some partitions (Kafka's WritableTxnMarker)."""

    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: tuple[tuple[str, int], ...]


def control_key(committed: bool) -> bytes:
    return _KEY.pack(0, COMMIT if committed else ABORT)


def control_value(coordinator_epoch: int) -> bytes:
    return _VALUE.pack(0, coordinator_epoch)


def marker_batch(committed: bool, coordinator_epoch: int, first_offset: int) -> pa.Table:
    """A marker as the one record of a produce batch (key, value, timestamp and headers of
    PRODUCE_SCHEMA), the header naming where its transaction began here (`first_offset`, -1:
    its producer wrote nothing here since its last marker)."""
    return pa.table({
        "key": pa.array([control_key(committed)], pa.binary()),
        "value": pa.array([control_value(coordinator_epoch)], pa.binary()),
        "timestamp": pa.nulls(1, PRODUCE_SCHEMA.field("timestamp").type),
        "headers": pa.array([[{"key": TXN_FIRST_OFFSET_HEADER,
                               "value": str(first_offset).encode()}]], HEADERS_TYPE)})


def is_commit(key: bytes) -> bool:
    """Whether a marker's key (`control_key`) is a COMMIT; ABORT otherwise."""
    return _KEY.unpack_from(key)[1] == COMMIT


def control_mask(rows: pa.Table) -> pa.ChunkedArray:
    """True for the markers among `rows` (any table with producer_id and sequence)."""
    return pc.and_(pc.greater_equal(rows.column("producer_id"), 0),
                   pc.equal(rows.column("sequence"), CONTROL_SEQUENCE))


def cannot_hold_markers(meta: pq.RowGroupMetaData, leaves: dict[str, int]) -> bool:
    """Whether a row group's statistics (producer ids all below 0, or sequences all above -1)
    prove it holds no marker; `leaves`: the file's leaf column indexes by name
    (log_reader.leaf_columns). A reader skips such groups, or their transaction columns."""
    pid, seq = leaves.get("producer_id"), leaves.get("sequence")
    if pid is None or seq is None:
        return False
    pid_stats, seq_stats = meta.column(pid).statistics, meta.column(seq).statistics
    return bool((pid_stats is not None and pid_stats.has_min_max and pid_stats.max < 0)
                or (seq_stats is not None and seq_stats.has_min_max
                    and seq_stats.min > CONTROL_SEQUENCE))
