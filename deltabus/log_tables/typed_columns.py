"""The types a typed topic's decoded keys and values (records.TYPED_COLUMNS) take in its tables.

A Delta table written by delta-rs cannot change a column's type (Delta's type widening is a
table feature delta-rs does not write), yet a schema registry lets a schema promote a field:
Avro int to long or float to double, Protobuf int32 to int64. So values are stored in the
widest type of their kind from the first commit (every integer as a 64-bit integer, every
floating point number as a double), and every later batch is cast to the types the table
already holds: a promotion the registry accepted lands in the same column. A value the
table's type cannot hold (a fraction for an integer column, after an Avro int became a
double) refuses its batch with INVALID_RECORD naming the field and each such record (KIP-467's
record errors), before anything is queued; it would otherwise fail the whole group commit it
joined.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.types as pat

from deltabus import errors

_CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)
_WIDEST = {pa.int8(): pa.int64(), pa.int16(): pa.int64(), pa.int32(): pa.int64(),
           pa.uint8(): pa.int64(), pa.uint16(): pa.int64(), pa.uint32(): pa.int64(),
           pa.float16(): pa.float64(), pa.float32(): pa.float64()}


def stored_type(decoded: pa.DataType) -> pa.DataType:
    """`decoded` with every integer and floating point type, at any depth, at its widest."""
    if pat.is_struct(decoded):
        return pa.struct([f.with_type(stored_type(f.type)) for f in decoded])
    if pat.is_list(decoded):
        return pa.list_(decoded.value_field.with_type(stored_type(decoded.value_type)))
    if pat.is_large_list(decoded):
        return pa.large_list(decoded.value_field.with_type(stored_type(decoded.value_type)))
    if pat.is_map(decoded):
        return pa.map_(decoded.key_field.with_type(stored_type(decoded.key_type)),
                       decoded.item_field.with_type(stored_type(decoded.item_type)))
    return _WIDEST.get(decoded, decoded)


def table_type(decoded: pa.DataType, held: pa.DataType | None) -> pa.DataType:
    """The type values of type `decoded` are written as into a table whose column has type
    `held` (None: none yet): the held type for every field the table has, at any depth,
    and the widest type for the fields it does not (they become new nullable columns)."""
    if held is None:
        return stored_type(decoded)
    if pat.is_struct(decoded) and pat.is_struct(held):
        names = {f.name: f for f in held}
        return pa.struct([f.with_type(table_type(f.type, names[f.name].type)
                                      if f.name in names else stored_type(f.type))
                          for f in decoded])
    if pat.is_list(decoded) and pat.is_list(held):
        return pa.list_(decoded.value_field.with_type(
            table_type(decoded.value_type, held.value_type)))
    if pat.is_map(decoded) and pat.is_map(held):
        return pa.map_(decoded.key_field.with_type(table_type(decoded.key_type, held.key_type)),
                       decoded.item_field.with_type(table_type(decoded.item_type,
                                                               held.item_type)))
    return held


def conform(values: pa.Array, held: pa.DataType | None, where: str,
            what: str = "value") -> pa.Array:
    """`values` (a batch's decoded values, or keys: `what`, one per record in batch order) in
    the types a table whose typed column has type `held` stores them; INVALID_RECORD naming
    the first field whose values the table's type cannot hold, and each record whose value
    it cannot (`where`: the partition, for the message)."""
    target = table_type(values.type, held)
    if values.type.equals(target):
        return values
    try:
        return values.cast(target)
    except _CAST_ERRORS as e:
        field = _which(_failing_field(values, target), what)

        def why(cause: Exception) -> str:
            return (f"{field} to {where} does not fit the type its table's column holds "
                    f"({cause}); a Delta column's type never changes, so register the "
                    "changed field under a new name")
        unfit = [errors.RecordError(i, why(cause)) for i, cause in _unfit(values, target)]
        if not unfit:  # the batch fails as a whole only: no record to name
            raise errors.InvalidRecordError(why(e)) from e
        raise errors.invalid_records(unfit) from e


def _unfit(values: pa.Array, target: pa.DataType) -> list[tuple[int, Exception]]:
    """The places of the values that do not cast to `target` alone, and why (the error path
    alone goes one by one)."""
    out: list[tuple[int, Exception]] = []
    for i in range(len(values)):
        try:
            values.slice(i, 1).cast(target)
        except _CAST_ERRORS as e:
            out.append((i, e))
    return out


def _which(field: str | None, what: str) -> str:
    return f"field {field} of a record's {what}" if field else f"a record's {what}"


def _failing_field(values: pa.Array, target: pa.DataType, path: str = "") -> str | None:
    """The dotted name of the first struct field whose values do not cast to `target`."""
    if not (pat.is_struct(values.type) and pat.is_struct(target)):
        return path or None
    flat = values.flatten() if isinstance(values, pa.StructArray) else None
    if flat is None:
        return path or None
    for i, field in enumerate(values.type):
        want = target.field(field.name).type
        try:
            flat[i].cast(want)
        except _CAST_ERRORS:
            name = f"{path}.{field.name}" if path else field.name
            return _failing_field(flat[i], want, name) or name
    return path or None
