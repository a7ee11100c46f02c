"""The error tree: every Kafka code survives the wire, and retry loops can trust the flags."""

from __future__ import annotations

import pytest

from deltabus import errors


@pytest.mark.parametrize("code", sorted(errors.ERRORS_BY_CODE))
def test_error_for_code_round_trips(code: int) -> None:
    cls = errors.ERRORS_BY_CODE[code]
    error = errors.error_for_code(code, "something broke")
    assert type(error) is cls
    assert error.code == code
    assert isinstance(error, errors.DeltaBusError)
    assert error.message == "something broke"
    assert "something broke" in str(error)
    # What a server raises, a client raises again from the code it read off the wire.
    again = errors.error_for_code(cls("x").code)
    assert type(again) is cls


def test_codes_and_names_are_unique() -> None:
    names = [cls.name for cls in errors.ERRORS_BY_CODE.values()]
    assert len(names) == len(set(names))
    for code, cls in errors.ERRORS_BY_CODE.items():
        assert cls.code == code


@pytest.mark.parametrize("code", [9999, -2, 12345678])
def test_unknown_code_maps_to_unknown_server_error(code: int) -> None:
    error = errors.error_for_code(code, "mystery")
    assert error.code == -1
    assert error.name == "UNKNOWN_SERVER_ERROR"
    assert type(error) is errors.ERRORS_BY_CODE[-1]
    assert error.message == "mystery"


def test_check_raises_only_for_non_zero_codes() -> None:
    errors.check(0)
    with pytest.raises(errors.NotLeaderOrFollowerError):
        errors.check(6, "moved")


# (code, name, retriable, invalid_metadata) as Kafka's Errors.java defines them: retriable when the
# exception extends RetriableException, invalid metadata when it extends InvalidMetadataException.
KAFKA_FLAGS = [
    (6, "NOT_LEADER_OR_FOLLOWER", True, True),
    (3, "UNKNOWN_TOPIC_OR_PARTITION", True, True),
    (10, "MESSAGE_TOO_LARGE", False, False),
    (5, "LEADER_NOT_AVAILABLE", True, True),
    (1, "OFFSET_OUT_OF_RANGE", False, False),
    (17, "INVALID_TOPIC_EXCEPTION", False, False),
    (40, "INVALID_CONFIG", False, False),
    (87, "INVALID_RECORD", False, False),
    (7, "REQUEST_TIMED_OUT", True, False),
]


@pytest.mark.parametrize(("code", "name", "retriable", "invalid_metadata"), KAFKA_FLAGS)
def test_flags_match_kafka(code: int, name: str, retriable: bool, invalid_metadata: bool) -> None:
    error = errors.error_for_code(code)
    assert error.name == name
    assert error.retriable is retriable
    assert error.invalid_metadata is invalid_metadata


def test_named_classes_carry_their_codes() -> None:
    assert errors.NotLeaderOrFollowerError.code == 6
    assert errors.UnknownTopicOrPartitionError.code == 3
    assert errors.MessageTooLargeError.code == 10
    assert errors.InvalidRecordError.code == 87
    assert errors.CorruptMessageError.code == 2


def test_invalid_records_names_each_record_and_says_why_in_its_message() -> None:
    """KIP-467: the error carries every record at fault; its message (what a door without the
    field shows) gives the distinct reasons and the first indexes."""
    refused = [errors.RecordError(i, "no key" if i % 2 else "bad value") for i in range(1, 25)]
    error = errors.invalid_records(refused)
    assert isinstance(error, errors.InvalidRecordError) and error.code == 87
    assert error.record_errors == tuple(refused)
    assert error.message == ("no key; bad value (records 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ... "
                             "(24 records in all) of the batch)")
    assert errors.invalid_records(refused[:1]).message == "no key (record 1 of the batch)"
    assert errors.error_for_code(87, "x").record_errors == ()  # off the wire: none known


def test_client_errors_have_no_kafka_code_but_share_the_root() -> None:
    assert issubclass(errors.KafkaTimeoutError, errors.ClientError)
    assert issubclass(errors.ClientError, errors.DeltaBusError)
    assert errors.KafkaTimeoutError().retriable is True
    assert errors.KafkaTimeoutError not in errors.ERRORS_BY_CODE.values()


def test_each_kafka_code_has_one_class_and_comes_back_as_it() -> None:
    """What a server raises is what a client raises again from the code: two classes claiming
    one code (CORRUPT_MESSAGE once had two) would turn one into the other on the wire."""
    classes = [value for value in vars(errors).values()
               if isinstance(value, type) and issubclass(value, errors.DeltaBusError)
               and not issubclass(value, errors.ClientError) and value is not errors.DeltaBusError]
    for cls in classes:
        assert errors.error_for_code(cls.code).__class__ is cls, cls.__name__
    assert len({cls.code for cls in classes}) == len(classes)


def test_a_server_error_reaches_a_client_as_its_class_and_status() -> None:
    """Through a real gRPC server: the class, message and status the server's error maps to."""
    from concurrent import futures

    import grpc

    from deltabus.rpc import status

    def fail(request: bytes, context: grpc.ServicerContext) -> bytes:
        status.abort(context, errors.CorruptMessageError("a record batch failed its CRC"))

    handler = grpc.method_handlers_generic_handler(
        "t.T", {"Fail": grpc.unary_unary_rpc_method_handler(fail)})
    server = grpc.server(futures.ThreadPoolExecutor(1), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary("/t.T/Fail")(b"")
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        error = status.error_from_rpc(info.value)
        assert type(error) is errors.CorruptMessageError
        assert error.message == "a record batch failed its CRC"
    finally:
        server.stop(None)


def test_errors_module_imports_only_the_standard_library() -> None:
    import ast
    import sys

    tree = ast.parse(open(errors.__file__).read())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
