"""A typed topic's decoded values in the types its table holds (log_tables/typed_columns.py): a
value the table's column cannot hold refuses the batch, naming the field and each record at
fault by its index in the batch (KIP-467's record errors), with its own value's reason."""

from __future__ import annotations

import pyarrow as pa
import pytest

from deltabus import errors
from deltabus.log_tables.typed_columns import conform

AMOUNT_AS_DOUBLE = pa.struct([("amount", pa.float64())])
AMOUNT_AS_INTEGER = pa.struct([("amount", pa.int64())])


def test_a_promoted_field_is_cast_to_the_type_the_table_holds() -> None:
    values = pa.array([{"amount": 1.0}, None, {"amount": 3.0}], AMOUNT_AS_DOUBLE)
    assert conform(values, AMOUNT_AS_INTEGER, "t-0").to_pylist() == [
        {"amount": 1}, None, {"amount": 3}]


def test_each_value_the_column_cannot_hold_is_named_by_its_record() -> None:
    values = pa.array([{"amount": 1.0}, {"amount": 2.5}, None, {"amount": 4.75}],
                      AMOUNT_AS_DOUBLE)
    with pytest.raises(errors.InvalidRecordError, match="field amount of a record's value to "
                       "t-0 does not fit.*records 1, 3 of the batch") as refused:
        conform(values, AMOUNT_AS_INTEGER, "t-0")
    named = {r.batch_index: r.message for r in refused.value.record_errors}
    assert sorted(named) == [1, 3]
    assert "2.5" in named[1] and "4.75" in named[3]
