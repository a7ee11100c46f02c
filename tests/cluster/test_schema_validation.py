"""The broker's check of a batch against the registry (Confluent Server's schema validation),
as a typed topic's leader runs it on every produce: a batch may mix versions of a schema and
hold tombstones, and the decoded values come back in the batch's order either way; a record
that names no schema of the subject, or does not decode, refuses the batch naming it."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from deltabus import errors
from deltabus.cluster.schema_registry import check_records
from deltabus.schemas import wire_header
from deltabus.schemas.avro import encode_avro, parse_avro

V1 = {"type": "record", "name": "Payment", "fields": [{"name": "id", "type": "string"},
                                                     {"name": "amount", "type": "double"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"],
                                      "default": None}]}
SCHEMAS = {1: parse_avro(json.dumps(V1), {}), 2: parse_avro(json.dumps(V2), {})}


def wire(schema_id: int, row: dict) -> bytes:
    return wire_header(schema_id) + encode_avro(SCHEMAS[schema_id], [row])[0]


def check(values: list[bytes | None]) -> pa.Array:
    return check_records(SCHEMAS.get, "payments-value", pa.array(values, pa.binary()),
                         "value", "payments-0")


@pytest.mark.parametrize("copies", [1, 100])  # record by record, and column-wise
def test_a_batch_mixing_versions_and_tombstones_decodes_in_its_own_order(copies: int) -> None:
    rows = [(1, {"id": "a", "amount": 1.0}), None, (2, {"id": "b", "amount": 2.0, "note": "n"}),
            (1, {"id": "c", "amount": 3.0})] * copies
    got = check([None if r is None else wire(*r) for r in rows])
    assert got.to_pylist() == [None if r is None else {"note": None, **r[1]} for r in rows]


def test_a_batch_of_one_version_decodes_as_its_schema_types() -> None:
    rows = [{"id": f"p{i}", "amount": i / 4} for i in range(200)]
    got = check([wire(1, r) for r in rows])
    assert got.type == pa.struct([("id", pa.string()), ("amount", pa.float64())])
    assert got.to_pylist() == rows


@pytest.mark.parametrize(("value", "named"), [
    (b"\x01\x00\x00\x00\x01", "magic byte"),
    (wire_header(7) + b"\x02a", "schema id 7 is not registered"),
    (wire_header(1) + b"\xff", "does not match schema id 1"),
])
def test_a_record_that_is_not_the_subjects_refuses_the_batch_naming_it(
        value: bytes, named: str) -> None:
    good = wire(1, {"id": "a", "amount": 1.0})
    with pytest.raises(errors.InvalidRecordError, match=f"{named}.*record 70 of the batch") as e:
        check([good] * 70 + [value] + [good] * 5)
    ((index, why),) = [(r.batch_index, r.message) for r in e.value.record_errors]
    assert index == 70 and named in why and "payments-0" in why


@pytest.mark.parametrize("copies", [1, 100])  # record by record, and column-wise
def test_every_record_at_fault_is_named_whatever_its_fault(copies: int) -> None:
    """KIP-467's record errors: each refused record, by its index in the batch, with its own
    reason; the records that pass and the tombstones are not named."""
    good = wire(1, {"id": "a", "amount": 1.0})
    faults = {1: b"\x01\x00\x00\x00\x01", 3: wire_header(7) + b"\x02a", 4: wire_header(1) + b"\xff",
              6: wire_header(7) + b"\x02b"}
    batch = [faults.get(i, None if i == 5 else good) for i in range(8)] * copies
    with pytest.raises(errors.InvalidRecordError) as e:
        check(batch)
    named = {r.batch_index: r.message for r in e.value.record_errors}
    assert sorted(named) == sorted(i + 8 * c for c in range(copies) for i in faults)
    assert "magic byte" in named[1] and "schema id 7 is not registered" in named[3]
    assert "does not match schema id 1" in named[4] and "schema id 7" in named[6]
