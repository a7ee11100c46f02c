"""Where deltabus errors meet gRPC, both ways: the status a server answers a Kafka error code
with, and the error a client raises for a failed call. The one place grpc and the error tree touch.

A server aborts a call with the error's gRPC status and puts its Kafka code in the trailing
metadata (`ERROR_CODE_KEY`), so a deltabus client raises exactly the class the server raised, and
a client in another language can still switch on the status alone. A call that failed without a
code (a dead or unreachable broker) becomes a retriable NETWORK_EXCEPTION.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from deltabus import errors

__all__ = ["ERROR_CODE_KEY", "abort", "error_from_rpc", "grpc_status"]

ERROR_CODE_KEY = "deltabus-error-code"

_S = grpc.StatusCode
# Kafka error code -> gRPC status; a code not listed answers FAILED_PRECONDITION (the request was
# well formed but the cluster's state refuses it: not the leader, a stale epoch, a rebalance).
_STATUS_BY_CODE: dict[int, grpc.StatusCode] = {
    errors.UnknownServerError.code: _S.INTERNAL,
    errors.OffsetOutOfRangeError.code: _S.OUT_OF_RANGE,
    errors.CorruptMessageError.code: _S.INVALID_ARGUMENT,
    errors.UnknownTopicOrPartitionError.code: _S.NOT_FOUND,
    errors.InvalidFetchSizeError.code: _S.INVALID_ARGUMENT,
    errors.LeaderNotAvailableError.code: _S.UNAVAILABLE,
    errors.RequestTimedOutError.code: _S.DEADLINE_EXCEEDED,
    errors.BrokerNotAvailableError.code: _S.UNAVAILABLE,
    errors.MessageTooLargeError.code: _S.INVALID_ARGUMENT,
    errors.OffsetMetadataTooLargeError.code: _S.INVALID_ARGUMENT,
    errors.NetworkError.code: _S.UNAVAILABLE,
    errors.CoordinatorLoadInProgressError.code: _S.UNAVAILABLE,
    errors.CoordinatorNotAvailableError.code: _S.UNAVAILABLE,
    errors.InvalidTopicError.code: _S.INVALID_ARGUMENT,
    errors.RecordListTooLargeError.code: _S.INVALID_ARGUMENT,
    errors.InvalidRequiredAcksError.code: _S.INVALID_ARGUMENT,
    errors.InvalidGroupIdError.code: _S.INVALID_ARGUMENT,
    errors.InvalidSessionTimeoutError.code: _S.INVALID_ARGUMENT,
    errors.InvalidCommitOffsetSizeError.code: _S.INVALID_ARGUMENT,
    errors.InvalidTimestampError.code: _S.INVALID_ARGUMENT,
    errors.UnsupportedVersionError.code: _S.UNIMPLEMENTED,
    errors.TopicAlreadyExistsError.code: _S.ALREADY_EXISTS,
    errors.InvalidPartitionsError.code: _S.INVALID_ARGUMENT,
    errors.InvalidReplicationFactorError.code: _S.INVALID_ARGUMENT,
    errors.InvalidReplicaAssignmentError.code: _S.INVALID_ARGUMENT,
    errors.InvalidConfigError.code: _S.INVALID_ARGUMENT,
    errors.InvalidRequestError.code: _S.INVALID_ARGUMENT,
    errors.UnsupportedForMessageFormatError.code: _S.INVALID_ARGUMENT,
    errors.KafkaStorageError.code: _S.UNAVAILABLE,
    errors.GroupIdNotFoundError.code: _S.NOT_FOUND,
    errors.OffsetNotAvailableError.code: _S.UNAVAILABLE,
    errors.InvalidRecordError.code: _S.INVALID_ARGUMENT,
    errors.ResourceNotFoundError.code: _S.NOT_FOUND,
    errors.DuplicateResourceError.code: _S.INVALID_ARGUMENT,
    errors.UnacceptableCredentialError.code: _S.INVALID_ARGUMENT,
    errors.TopicAuthorizationFailedError.code: _S.PERMISSION_DENIED,
    errors.GroupAuthorizationFailedError.code: _S.PERMISSION_DENIED,
    errors.ClusterAuthorizationFailedError.code: _S.PERMISSION_DENIED,
    errors.TransactionalIdAuthorizationFailedError.code: _S.PERMISSION_DENIED,
    errors.SaslAuthenticationFailedError.code: _S.UNAUTHENTICATED,
    errors.UnsupportedSaslMechanismError.code: _S.UNAUTHENTICATED,
    errors.IllegalSaslStateError.code: _S.UNAUTHENTICATED,
}

# A failed call with no Kafka code in its trailers: what the status alone tells.
_ERROR_BY_STATUS: dict[grpc.StatusCode, type[errors.DeltaBusError]] = {
    _S.UNAVAILABLE: errors.NetworkError,
    _S.DEADLINE_EXCEEDED: errors.RequestTimedOutError,
    _S.RESOURCE_EXHAUSTED: errors.RecordListTooLargeError,
    _S.UNIMPLEMENTED: errors.UnsupportedVersionError,
    _S.CANCELLED: errors.NetworkError,
    _S.UNAUTHENTICATED: errors.SaslAuthenticationFailedError,
    _S.PERMISSION_DENIED: errors.ClusterAuthorizationFailedError,
}


def grpc_status(error: errors.DeltaBusError) -> grpc.StatusCode:
    """The gRPC status a server answers `error` with (CANCELLED for a client-side error)."""
    if isinstance(error, errors.ClientError):
        return _S.CANCELLED
    return _STATUS_BY_CODE.get(error.code, _S.FAILED_PRECONDITION)


def abort(context: grpc.ServicerContext, error: errors.DeltaBusError) -> NoReturn:
    """End a call with `error`: its gRPC status, its message, its Kafka code in the trailers."""
    context.set_trailing_metadata(((ERROR_CODE_KEY, str(error.code)),))
    context.abort(grpc_status(error), str(error))
    raise AssertionError("grpc's abort returned")  # abort always raises


def error_from_rpc(e: grpc.RpcError | Any) -> errors.DeltaBusError:
    """The deltabus error for a failed gRPC call: the Kafka code the server sent, else one
    inferred from the status (a dead or unreachable broker is a retriable NETWORK_EXCEPTION)."""
    code = e.code() if hasattr(e, "code") else None
    details = (e.details() if hasattr(e, "details") else "") or str(code)
    for key, value in (e.trailing_metadata() or ()) if hasattr(e, "trailing_metadata") else ():
        if key == ERROR_CODE_KEY:
            message = details.split(": ", 1)[1] if ": " in details else details
            return errors.error_for_code(int(value), message)
    cls = _ERROR_BY_STATUS.get(code, errors.UnknownServerError) if code else errors.NetworkError
    return cls(details)
