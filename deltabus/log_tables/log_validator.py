"""Kafka's LogValidator for a leader's produce batches: what is checked of a batch before it is
queued for its group commit, so that a bad batch changes nothing and never fails the commit
of the batches it would have joined.

The checks, in order: max.message.bytes (first against the size the batch's record counts
imply, before normalising, which allocates per record; then against the client's record batch,
or each Arrow record batch as an uncompressed record batch of its records), at least one record,
a key on every record of a compacted topic, and a topic's schema validation, whose typed values
are cast to the types the table's typed columns hold (typed_columns.py).

Separate from the log (partition_log.py) because it needs nothing of it but its name and those
types: pure functions of the batch, run outside the log's lock. Runs on executors (the leader's
request threads); thread-safe, holding no state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltabus import errors
from deltabus.log_tables import typed_columns
from deltabus.records import (
    PRODUCE_SCHEMA,
    arrow_batch_rows,
    batch_bytes_at_most,
    batch_size_min_bytes,
    check_batch_size,
    largest_batch_bytes,
    normalize_produce,
)

# A topic's schema validation of a produce batch: raises INVALID_RECORD, or returns a typed
# topic's decoded keys and values by typed column (records.TYPED_COLUMNS; empty: untyped).
Validation = Callable[[pa.Table], Mapping[str, pa.Array]]


def checked_batch(batch: pa.Table, name: str, typed_types: Mapping[str, pa.DataType],
                  max_message_bytes: int | None, batch_bytes: int | None, compacted: bool,
                  validate: Validation | None = None
                  ) -> tuple[pa.Table, errors.DeltaBusError | None, dict[str, pa.Array]]:
    """The batch normalised, why it is refused (None: it is not), and its typed columns, in
    `typed_types` (the types the table's typed columns hold). `name` is the partition's, for
    the messages. The size a batch's record count implies is checked before normalising, which
    allocates per record."""
    typed: dict[str, pa.Array] = {}
    try:
        batch_rows = arrow_batch_rows(batch)
        if max_message_bytes is not None:
            check_batch_size(batch_size_min_bytes(max(batch_rows)), max_message_bytes,
                             name, at_least=True)
        if not batch.schema.equals(PRODUCE_SCHEMA):
            batch = normalize_produce(batch)
        if batch.num_rows == 0:
            raise errors.InvalidRecordError("a produce batch must hold at least one record")
        if max_message_bytes is not None:
            size = batch_bytes
            if size is None:
                bound = batch_bytes_at_most(batch)
                size = (bound if bound is not None and bound <= max_message_bytes
                        else largest_batch_bytes(batch, batch_rows))
            check_batch_size(size, max_message_bytes, name)
        if compacted and batch.column("key").null_count:
            raise _keyless(batch.column("key"), name)
        if validate is not None:  # in the types the table's columns hold
            typed = {column: typed_columns.conform(values, typed_types.get(column), name,
                                                   column.split("_")[0])
                     for column, values in validate(batch).items()}
    except errors.DeltaBusError as e:
        return batch, e, {}
    return batch, None, typed


def _keyless(keys: pa.ChunkedArray, name: str) -> errors.InvalidRecordError:
    """INVALID_RECORD naming each record without a key, in Kafka's words: a compacted topic
    keeps the latest record of each key, so one without is refused (KIP-467's record errors,
    as Kafka's LogValidator lists them)."""
    missing = np.flatnonzero(pc.is_null(keys).to_numpy(zero_copy_only=False))
    message = f"Compacted topic cannot accept message without key in topic partition {name}."
    return errors.invalid_records([errors.RecordError(int(i), message) for i in missing])
