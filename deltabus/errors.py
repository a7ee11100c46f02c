"""The one error tree of deltabus, with Kafka's error codes.

    DeltaBusError                      root; `code`, `retriable`, `invalid_metadata`
    ├── one subclass per Kafka code    UnknownTopicOrPartitionError (3), NotLeaderOrFollowerError...
    │   raised by brokers and the controller, carried on the wire as `error_code` + message,
    │   and raised again by clients from the code (`error_for_code`); InvalidRecordError (87)
    │   also names the records of its batch at fault (`record_errors`, KIP-467)
    └── ClientError                    client-side problems with no Kafka code (closed, timeout,
                                       a Spark query's data loss)

Retry loops test `retriable` (try again later) and `invalid_metadata` (refresh metadata first: the
leader moved), never a list of types. grpc and delta-rs exceptions are mapped into this tree in one
place each: `deltabus.rpc.status` (both ways: an error to a gRPC status, a failed call to an error)
and `deltabus.log_tables.partition_log`. This module imports nothing but the standard library, so
every layer may raise these errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DeltaBusError",
    "ClientError",
    "DataLossError",
    "KafkaTimeoutError",
    "LogTruncationError",
    "RecordError",
    "error_for_code",
    "invalid_records",
    "ERRORS_BY_CODE",
]


class DeltaBusError(Exception):
    """Root of every error deltabus raises."""

    code: int = -1
    name: str = "UNKNOWN_SERVER_ERROR"
    retriable: bool = False
    invalid_metadata: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.name)
        self.message = message or self.name

    def __str__(self) -> str:
        return f"{self.name}: {self.message}" if self.message != self.name else self.name


ERRORS_BY_CODE: dict[int, type[DeltaBusError]] = {}


def _kafka_error(
    code: int,
    name: str,
    *,
    retriable: bool = False,
    invalid_metadata: bool = False,
) -> type[DeltaBusError]:
    """Make the class for one Kafka error code and index it by code."""
    class_name = "".join(part.capitalize() for part in name.split("_"))
    if not class_name.endswith(("Error", "Exception")):
        class_name += "Error"
    cls = type(
        class_name,
        (DeltaBusError,),
        {
            "code": code,
            "name": name,
            "retriable": retriable,
            "invalid_metadata": invalid_metadata,
            "__doc__": f"Kafka error {code}, {name}.",
        },
    )
    return _indexed(cls)


def _indexed(cls: type[DeltaBusError]) -> type[DeltaBusError]:
    """Index the class of a Kafka error code by its code (one class per code)."""
    if cls.code in ERRORS_BY_CODE:
        raise AssertionError(f"error code {cls.code} has two classes: "
                             f"{ERRORS_BY_CODE[cls.code].__name__}, {cls.__name__}")
    ERRORS_BY_CODE[cls.code] = cls
    return cls


UnknownServerError = _kafka_error(-1, "UNKNOWN_SERVER_ERROR")
OffsetOutOfRangeError = _kafka_error(1, "OFFSET_OUT_OF_RANGE")
CorruptMessageError = _kafka_error(2, "CORRUPT_MESSAGE", retriable=True)
UnknownTopicOrPartitionError = _kafka_error(
    3, "UNKNOWN_TOPIC_OR_PARTITION", retriable=True, invalid_metadata=True
)
InvalidFetchSizeError = _kafka_error(4, "INVALID_FETCH_SIZE")
LeaderNotAvailableError = _kafka_error(
    5, "LEADER_NOT_AVAILABLE", retriable=True, invalid_metadata=True
)
NotLeaderOrFollowerError = _kafka_error(
    6, "NOT_LEADER_OR_FOLLOWER", retriable=True, invalid_metadata=True
)
RequestTimedOutError = _kafka_error(
    7, "REQUEST_TIMED_OUT", retriable=True
)
BrokerNotAvailableError = _kafka_error(8, "BROKER_NOT_AVAILABLE")
MessageTooLargeError = _kafka_error(10, "MESSAGE_TOO_LARGE")
NetworkError = _kafka_error(
    13, "NETWORK_EXCEPTION", retriable=True, invalid_metadata=True
)
OffsetMetadataTooLargeError = _kafka_error(
    12, "OFFSET_METADATA_TOO_LARGE")
CoordinatorLoadInProgressError = _kafka_error(
    14, "COORDINATOR_LOAD_IN_PROGRESS", retriable=True)
CoordinatorNotAvailableError = _kafka_error(
    15, "COORDINATOR_NOT_AVAILABLE", retriable=True)
NotCoordinatorError = _kafka_error(16, "NOT_COORDINATOR", retriable=True)
InvalidTopicError = _kafka_error(17, "INVALID_TOPIC_EXCEPTION")
RecordListTooLargeError = _kafka_error(18, "RECORD_LIST_TOO_LARGE")
NotEnoughReplicasError = _kafka_error(19, "NOT_ENOUGH_REPLICAS", retriable=True)
NotEnoughReplicasAfterAppendError = _kafka_error(
    20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", retriable=True)
InvalidRequiredAcksError = _kafka_error(
    21, "INVALID_REQUIRED_ACKS")
IllegalGenerationError = _kafka_error(22, "ILLEGAL_GENERATION")
InconsistentGroupProtocolError = _kafka_error(23, "INCONSISTENT_GROUP_PROTOCOL")
InvalidGroupIdError = _kafka_error(24, "INVALID_GROUP_ID")
UnknownMemberIdError = _kafka_error(25, "UNKNOWN_MEMBER_ID")
InvalidSessionTimeoutError = _kafka_error(
    26, "INVALID_SESSION_TIMEOUT")
RebalanceInProgressError = _kafka_error(27, "REBALANCE_IN_PROGRESS")
InvalidCommitOffsetSizeError = _kafka_error(
    28, "INVALID_COMMIT_OFFSET_SIZE")
TopicAuthorizationFailedError = _kafka_error(29, "TOPIC_AUTHORIZATION_FAILED")
GroupAuthorizationFailedError = _kafka_error(30, "GROUP_AUTHORIZATION_FAILED")
ClusterAuthorizationFailedError = _kafka_error(31, "CLUSTER_AUTHORIZATION_FAILED")
InvalidTimestampError = _kafka_error(32, "INVALID_TIMESTAMP")
UnsupportedSaslMechanismError = _kafka_error(33, "UNSUPPORTED_SASL_MECHANISM")
IllegalSaslStateError = _kafka_error(34, "ILLEGAL_SASL_STATE")
UnsupportedVersionError = _kafka_error(35, "UNSUPPORTED_VERSION")
TopicAlreadyExistsError = _kafka_error(36, "TOPIC_ALREADY_EXISTS")
InvalidPartitionsError = _kafka_error(37, "INVALID_PARTITIONS")
InvalidReplicaAssignmentError = _kafka_error(
    39, "INVALID_REPLICA_ASSIGNMENT")
InvalidReplicationFactorError = _kafka_error(
    38, "INVALID_REPLICATION_FACTOR"
)
InvalidConfigError = _kafka_error(40, "INVALID_CONFIG")
NotControllerError = _kafka_error(41, "NOT_CONTROLLER", retriable=True)
InvalidRequestError = _kafka_error(42, "INVALID_REQUEST")
UnsupportedForMessageFormatError = _kafka_error(
    43, "UNSUPPORTED_FOR_MESSAGE_FORMAT")
# A request the cluster's policy refuses: Kafka's controller answers a request too large to commit
# (more than MAX_RECORDS_PER_USER_OP records) with it; deltabus, a creation past its limits on
# topics and partitions (config.ClusterConfig: max.topics, max.partitions, auto-creation).
PolicyViolationError = _kafka_error(44, "POLICY_VIOLATION")
OutOfOrderSequenceNumberError = _kafka_error(45, "OUT_OF_ORDER_SEQUENCE_NUMBER", retriable=True)
DuplicateSequenceNumberError = _kafka_error(46, "DUPLICATE_SEQUENCE_NUMBER")
InvalidProducerEpochError = _kafka_error(47, "INVALID_PRODUCER_EPOCH")
# Transactions (KIP-98): a request out of its transaction's order (INVALID_TXN_STATE), a producer
# id the transactional id does not have now, a transaction.timeout.ms past the coordinator's
# transaction.max.timeout.ms, a transaction still being ended (retry), a producer whose epoch a
# newer one took over (PRODUCER_FENCED; INVALID_PRODUCER_EPOCH to Produce and to versions before
# KIP-588: fatal to clients either way), a request not tried because another part of it failed,
# a transactional id nobody used.
InvalidTxnStateError = _kafka_error(48, "INVALID_TXN_STATE")
InvalidProducerIdMappingError = _kafka_error(49, "INVALID_PRODUCER_ID_MAPPING")
InvalidTransactionTimeoutError = _kafka_error(50, "INVALID_TRANSACTION_TIMEOUT")
ConcurrentTransactionsError = _kafka_error(51, "CONCURRENT_TRANSACTIONS", retriable=True)
TransactionalIdAuthorizationFailedError = _kafka_error(
    53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
OperationNotAttemptedError = _kafka_error(55, "OPERATION_NOT_ATTEMPTED")
ProducerFencedError = _kafka_error(90, "PRODUCER_FENCED")
# OffsetFetch with require_stable (KIP-447): an open transaction commits offsets of the partition.
UnstableOffsetCommitError = _kafka_error(88, "UNSTABLE_OFFSET_COMMIT", retriable=True)
TransactionalIdNotFoundError = _kafka_error(105, "TRANSACTIONAL_ID_NOT_FOUND")
KafkaStorageError = _kafka_error(
    56, "KAFKA_STORAGE_ERROR", retriable=True, invalid_metadata=True
)
SaslAuthenticationFailedError = _kafka_error(58, "SASL_AUTHENTICATION_FAILED")
ReassignmentInProgressError = _kafka_error(60, "REASSIGNMENT_IN_PROGRESS")
NonEmptyGroupError = _kafka_error(68, "NON_EMPTY_GROUP")
GroupIdNotFoundError = _kafka_error(69, "GROUP_ID_NOT_FOUND")
# Incremental fetch sessions (KIP-227): a session the broker no longer has (evicted, or never
# its), and a request whose epoch is not the one its session expects next.
FetchSessionIdNotFoundError = _kafka_error(70, "FETCH_SESSION_ID_NOT_FOUND", retriable=True)
InvalidFetchSessionEpochError = _kafka_error(71, "INVALID_FETCH_SESSION_EPOCH", retriable=True)
FencedLeaderEpochError = _kafka_error(
    74, "FENCED_LEADER_EPOCH", retriable=True, invalid_metadata=True)
UnknownLeaderEpochError = _kafka_error(75, "UNKNOWN_LEADER_EPOCH", retriable=True)
StaleBrokerEpochError = _kafka_error(77, "STALE_BROKER_EPOCH")
# A new leader's high watermark has not yet caught up with its log end after the election:
# ListOffsets cannot answer "latest" (or a timestamp) without going back in time. Retry.
OffsetNotAvailableError = _kafka_error(
    78, "OFFSET_NOT_AVAILABLE", retriable=True)
MemberIdRequiredError = _kafka_error(79, "MEMBER_ID_REQUIRED")
# A static member (group.instance.id) whose instance id a newer member of the group now holds.
FencedInstanceIdError = _kafka_error(82, "FENCED_INSTANCE_ID")
PreferredLeaderNotAvailableError = _kafka_error(80, "PREFERRED_LEADER_NOT_AVAILABLE",
                                                retriable=True)
EligibleLeadersNotAvailableError = _kafka_error(83, "ELIGIBLE_LEADERS_NOT_AVAILABLE",
                                                retriable=True)
GroupMaxSizeReachedError = _kafka_error(81, "GROUP_MAX_SIZE_REACHED")
ElectionNotNeededError = _kafka_error(84, "ELECTION_NOT_NEEDED")
NoReassignmentInProgressError = _kafka_error(85, "NO_REASSIGNMENT_IN_PROGRESS")
# OffsetDelete of a topic the group's members subscribe to: they would commit it again.
GroupSubscribedToTopicError = _kafka_error(86, "GROUP_SUBSCRIBED_TO_TOPIC")


@dataclass(frozen=True)
class RecordError:
    """One record a produce batch was refused for (KIP-467): its index in the record batch as
    the client sent it (Kafka's batch_index), and why."""

    batch_index: int
    message: str


class InvalidRecordError(DeltaBusError):
    """Kafka error 87, INVALID_RECORD: a produce batch the log refuses as a whole. Where some of
    its records are at fault, `record_errors` names each, in batch order, so a client can tell
    them from their batch-mates (Produce v8+ answers them, KIP-467); the message names them
    too, for the doors without that field (Produce before v8, the gRPC door)."""

    code = 87
    name = "INVALID_RECORD"

    def __init__(self, message: str = "", record_errors: Sequence[RecordError] = ()) -> None:
        super().__init__(message)
        self.record_errors = tuple(record_errors)


_indexed(InvalidRecordError)
_RECORD_ERRORS_NAMED = 10  # the batch indexes an INVALID_RECORD message names; the field has all


def invalid_records(record_errors: Sequence[RecordError]) -> InvalidRecordError:
    """INVALID_RECORD for the records of a batch `record_errors` names (at least one). Its
    message gives the first three distinct reasons, as Kafka's broker shows the first three
    record errors, and which records: the doors without `record_errors` still tell them."""
    reasons = list(dict.fromkeys(e.message for e in record_errors))
    indexes = [str(e.batch_index) for e in record_errors[:_RECORD_ERRORS_NAMED]]
    if len(record_errors) > _RECORD_ERRORS_NAMED:
        indexes.append(f"... ({len(record_errors)} records in all)")
    noun = "record" if len(record_errors) == 1 else "records"
    return InvalidRecordError(
        f"{'; '.join(reasons[:3])} ({noun} {', '.join(indexes)} of the batch)", record_errors)


# SCRAM credentials (AlterUserScramCredentials / DescribeUserScramCredentials): deleting or
# describing a credential that is not there, one credential altered twice in a request, and a
# credential the controller will not store (an empty user name, salt or salted password, or an
# iteration count outside Kafka's limits).
ResourceNotFoundError = _kafka_error(91, "RESOURCE_NOT_FOUND")
DuplicateResourceError = _kafka_error(92, "DUPLICATE_RESOURCE")
UnacceptableCredentialError = _kafka_error(93, "UNACCEPTABLE_CREDENTIAL")
InvalidUpdateVersionError = _kafka_error(95, "INVALID_UPDATE_VERSION")
# A Fetch (v13+) naming a topic by an id the cluster does not have.
UnknownTopicIdError = _kafka_error(100, "UNKNOWN_TOPIC_ID", retriable=True)
IneligibleReplicaError = _kafka_error(107, "INELIGIBLE_REPLICA")
# KIP-848's consumer groups: a member epoch the coordinator no longer holds for the member (it
# must join again with epoch 0), a static member's instance id still held by a live member, a
# server assignor the coordinator does not have, and a commit of an older member epoch.
FencedMemberEpochError = _kafka_error(110, "FENCED_MEMBER_EPOCH")
UnreleasedInstanceIdError = _kafka_error(111, "UNRELEASED_INSTANCE_ID")
UnsupportedAssignorError = _kafka_error(112, "UNSUPPORTED_ASSIGNOR")
StaleMemberEpochError = _kafka_error(113, "STALE_MEMBER_EPOCH")
# KIP-932's share groups: an acknowledgement of a record not acquired by the member (or no longer
# locked), a share session the broker does not have or whose epoch is not the next, share state
# written on an older state epoch (its offsets were altered or deleted meanwhile), and a broker
# that holds as many share sessions as it may.
InvalidRecordStateError = _kafka_error(121, "INVALID_RECORD_STATE")
ShareSessionNotFoundError = _kafka_error(122, "SHARE_SESSION_NOT_FOUND", retriable=True)
InvalidShareSessionEpochError = _kafka_error(123, "INVALID_SHARE_SESSION_EPOCH", retriable=True)
FencedStateEpochError = _kafka_error(124, "FENCED_STATE_EPOCH")
ShareSessionLimitReachedError = _kafka_error(133, "SHARE_SESSION_LIMIT_REACHED", retriable=True)


class ClientError(DeltaBusError):
    """A client-side failure with no Kafka error code (for example, the client is closed)."""

    name = "CLIENT_ERROR"


class LogTruncationError(ClientError):
    """The consumer's position is past the end of its leader epoch in the new leader's log: the
    records it read were truncated (an unclean election). Raised only with
    auto_offset_reset="none" (Kafka's LogTruncationException); otherwise the consumer moves to
    the first offset that diverged and logs it."""

    name = "LOG_TRUNCATION"


class DataLossError(ClientError):
    """Records a Spark query should read are gone (retention, or a deleted topic): Spark's Kafka
    source fails the same way, unless the query sets failOnDataLoss to false."""

    name = "DATA_LOSS"


class KafkaTimeoutError(ClientError):
    """The client gave up waiting (metadata, a send's delivery timeout, a flush)."""

    name = "KAFKA_TIMEOUT"
    retriable = True


def error_for_code(code: int, message: str = "") -> DeltaBusError:
    """The exception for a Kafka error code read off the wire (an unknown code maps to -1)."""
    return ERRORS_BY_CODE.get(code, UnknownServerError)(message)


def check(code: int, message: str = "") -> None:
    """Raise the error for `code` unless it is 0 (NONE)."""
    if code:
        raise error_for_code(code, message)
