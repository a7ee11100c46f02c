"""What deltabus.proto promises a client written from it alone, checked without a cluster: its
enums carry Kafka's numbers and stay equal to the server's own lists, optional fields keep 0
apart from absent, and null header values survive the proto codec.

The same promises over a real cluster: tests/rpc/test_api_defaults.py and test_header_values.py.
"""

from __future__ import annotations

import pyarrow as pa

from deltabus import errors
from deltabus.client import wire
from deltabus.log_tables import partition_log
from deltabus.records import CREATE_TIME, HEADERS_TYPE, LOG_APPEND_TIME, LOG_SCHEMA
from deltabus.rpc import codec
from deltabus.rpc.v1 import deltabus_pb2 as pb


def test_error_code_enum_lists_every_code_of_the_error_tree() -> None:
    """A code added to deltabus/errors.py must be added to ErrorCode too (and the reverse)."""
    in_proto = dict(pb.ErrorCode.items())
    in_errors = {cls.name: code for code, cls in errors.ERRORS_BY_CODE.items()}
    assert in_proto == {"NONE": 0, **in_errors}


def test_enums_carry_kafkas_numbers() -> None:
    assert dict(pb.Acks.items()) == {"ACKS_NONE": 0, "ACKS_LEADER": 1, "ACKS_ALL": -1}
    assert (pb.CREATE_TIME, pb.LOG_APPEND_TIME) == (CREATE_TIME, LOG_APPEND_TIME)
    assert (pb.LATEST_TIMESTAMP, pb.EARLIEST_TIMESTAMP, pb.MAX_TIMESTAMP) == (
        partition_log.LATEST_TIMESTAMP, partition_log.EARLIEST_TIMESTAMP,
        partition_log.MAX_TIMESTAMP)


def test_python_producer_sends_acks_zero_explicitly() -> None:
    """An absent acks is all: the producer's acks=0 must reach the broker as a present 0."""
    for acks in (pb.ACKS_NONE, pb.ACKS_LEADER, pb.ACKS_ALL):
        request = pb.ProduceRequest.FromString(wire.produce_request(acks, 0, []))
        assert request.HasField("acks") and request.acks == acks
        assert request.HasField("timeout_ms") and request.timeout_ms == 0


def test_optional_fields_keep_their_numbers_and_read_as_the_old_ints() -> None:
    """Wire compatibility: a request from a client built before the fields became optional
    parses, and its zeros read as absent (it could not send them)."""
    old_style = pb.ProduceRequest(acks=1, timeout_ms=5).SerializeToString()
    assert old_style == b"\x08\x01\x10\x05"  # field 1 and field 2, varints, as before
    assert not pb.ProduceRequest.FromString(b"").HasField("acks")
    fetch = pb.FetchRequest.FromString(pb.FetchRequest(format=pb.ARROW).SerializeToString())
    assert fetch.HasField("format") and fetch.format == pb.ARROW


def test_absent_topic_counts_are_the_cluster_defaults() -> None:
    topic = codec.new_topic_from_proto(pb.CreatableTopic(name="t"))
    assert (topic.num_partitions, topic.replication_factor) == (-1, -1)
    topic = codec.new_topic_from_proto(pb.CreatableTopic(name="t", num_partitions=0,
                                                         replication_factor=2))
    assert (topic.num_partitions, topic.replication_factor) == (0, 2)  # 0 is refused later


def test_proto_records_keep_null_and_empty_header_values_apart() -> None:
    records = [pb.Record(value=b"v", headers=[pb.Header(key="null"),
                                              pb.Header(key="empty", value=b""),
                                              pb.Header(key="set", value=b"1")])]
    table = codec.records_to_table(records)
    assert table.column("headers").to_pylist() == [[
        {"key": "null", "value": None}, {"key": "empty", "value": b""},
        {"key": "set", "value": b"1"}]]
    log = pa.table({
        "offset": [7], "timestamp": pa.array([1_000_000], LOG_SCHEMA.field("timestamp").type),
        "timestamp_type": pa.array([LOG_APPEND_TIME], pa.int32()),
        "key": pa.array([None], pa.binary()), "value": [b"v"],
        "headers": pa.array(table.column("headers").to_pylist(), HEADERS_TYPE)})
    (record,) = codec.table_to_records(log)
    assert [(h.key, h.HasField("value"), h.value) for h in record.headers] == [
        ("null", False, b""), ("empty", True, b""), ("set", True, b"1")]
    assert (record.offset, record.timestamp_type, record.HasField("key")) == (
        7, pb.LOG_APPEND_TIME, False)


def test_a_record_timestamp_of_zero_is_the_epoch_and_absent_is_now() -> None:
    table = codec.records_to_table([pb.Record(value=b"a", timestamp_ms=0), pb.Record(value=b"b")])
    assert table.column("timestamp").cast(pa.int64()).to_pylist() == [0, None]
