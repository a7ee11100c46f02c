from deltabus.rpc.v1 import deltabus_pb2 as _deltabus_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ShareStateBatch(_message.Message):
    __slots__ = ("first_offset", "last_offset", "delivery_state", "delivery_count")
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_STATE_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int
    def __init__(self, first_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., delivery_state: _Optional[int] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class ShareGroupStateSnapshot(_message.Message):
    __slots__ = ("group_id", "topic", "partition", "start_offset", "state_epoch", "leader_epoch", "batches")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STATE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topic: str
    partition: int
    start_offset: int
    state_epoch: int
    leader_epoch: int
    batches: _containers.RepeatedCompositeFieldContainer[ShareStateBatch]
    def __init__(self, group_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., start_offset: _Optional[int] = ..., state_epoch: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., batches: _Optional[_Iterable[_Union[ShareStateBatch, _Mapping]]] = ...) -> None: ...

class ClaimShareGroupStateRequest(_message.Message):
    __slots__ = ("group_id", "topic", "partition", "leader_epoch")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topic: str
    partition: int
    leader_epoch: int
    def __init__(self, group_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class WriteShareGroupStateRequest(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: ShareGroupStateSnapshot
    def __init__(self, state: _Optional[_Union[ShareGroupStateSnapshot, _Mapping]] = ...) -> None: ...

class InitializeShareGroupStateRequest(_message.Message):
    __slots__ = ("group_id", "topic", "partition", "start_offset")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topic: str
    partition: int
    start_offset: int
    def __init__(self, group_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., start_offset: _Optional[int] = ...) -> None: ...

class ShareGroupStateResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "found", "state")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    error_code: int
    error_message: str
    found: bool
    state: ShareGroupStateSnapshot
    def __init__(self, error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., found: _Optional[bool] = ..., state: _Optional[_Union[ShareGroupStateSnapshot, _Mapping]] = ...) -> None: ...

class ForwardKafkaRequest(_message.Message):
    __slots__ = ("listener", "frame", "client_host", "broker_id")
    LISTENER_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    listener: str
    frame: bytes
    client_host: str
    broker_id: int
    def __init__(self, listener: _Optional[str] = ..., frame: _Optional[bytes] = ..., client_host: _Optional[str] = ..., broker_id: _Optional[int] = ...) -> None: ...

class ForwardKafkaResponse(_message.Message):
    __slots__ = ("frame", "throttle_ms")
    FRAME_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_MS_FIELD_NUMBER: _ClassVar[int]
    frame: bytes
    throttle_ms: int
    def __init__(self, frame: _Optional[bytes] = ..., throttle_ms: _Optional[int] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("broker_id", "host", "port", "rack", "pid", "incarnation_id", "kafka_port", "listeners")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    KAFKA_PORT_FIELD_NUMBER: _ClassVar[int]
    LISTENERS_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    host: str
    port: int
    rack: str
    pid: int
    incarnation_id: str
    kafka_port: int
    listeners: _containers.RepeatedCompositeFieldContainer[_deltabus_pb2.ListenerEndpoint]
    def __init__(self, broker_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., rack: _Optional[str] = ..., pid: _Optional[int] = ..., incarnation_id: _Optional[str] = ..., kafka_port: _Optional[int] = ..., listeners: _Optional[_Iterable[_Union[_deltabus_pb2.ListenerEndpoint, _Mapping]]] = ...) -> None: ...

class RegisterBrokerResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "broker_epoch")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    error_code: int
    error_message: str
    broker_epoch: int
    def __init__(self, error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class BrokerHeartbeatRequest(_message.Message):
    __slots__ = ("broker_id", "broker_epoch", "metadata_version", "max_wait_ms", "offline_replicas", "metadata_position", "partition_loads", "partition_reports")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    METADATA_POSITION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_LOADS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_REPORTS_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    metadata_version: int
    max_wait_ms: int
    offline_replicas: _containers.RepeatedCompositeFieldContainer[_deltabus_pb2.TopicPartitions]
    metadata_position: MetadataPosition
    partition_loads: _containers.RepeatedCompositeFieldContainer[PartitionLoad]
    partition_reports: _containers.RepeatedCompositeFieldContainer[PartitionReport]
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., metadata_version: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., offline_replicas: _Optional[_Iterable[_Union[_deltabus_pb2.TopicPartitions, _Mapping]]] = ..., metadata_position: _Optional[_Union[MetadataPosition, _Mapping]] = ..., partition_loads: _Optional[_Iterable[_Union[PartitionLoad, _Mapping]]] = ..., partition_reports: _Optional[_Iterable[_Union[PartitionReport, _Mapping]]] = ...) -> None: ...

class PartitionReport(_message.Message):
    __slots__ = ("topic", "partition", "high_watermark", "size_bytes", "files")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    high_watermark: int
    size_bytes: int
    files: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., high_watermark: _Optional[int] = ..., size_bytes: _Optional[int] = ..., files: _Optional[int] = ...) -> None: ...

class PartitionLoad(_message.Message):
    __slots__ = ("topic", "partition", "bytes_in_per_s")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_PER_S_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    bytes_in_per_s: float
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., bytes_in_per_s: _Optional[float] = ...) -> None: ...

class MetadataPosition(_message.Message):
    __slots__ = ("version", "index", "snapshot")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    version: int
    index: int
    snapshot: bool
    def __init__(self, version: _Optional[int] = ..., index: _Optional[int] = ..., snapshot: _Optional[bool] = ...) -> None: ...

class MetadataBatch(_message.Message):
    __slots__ = ("start", "end", "records")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    start: MetadataPosition
    end: MetadataPosition
    records: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, start: _Optional[_Union[MetadataPosition, _Mapping]] = ..., end: _Optional[_Union[MetadataPosition, _Mapping]] = ..., records: _Optional[_Iterable[bytes]] = ...) -> None: ...

class BrokerHeartbeatResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "should_shut_down", "refresh_logs", "metadata_records")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SHOULD_SHUT_DOWN_FIELD_NUMBER: _ClassVar[int]
    REFRESH_LOGS_FIELD_NUMBER: _ClassVar[int]
    METADATA_RECORDS_FIELD_NUMBER: _ClassVar[int]
    error_code: int
    error_message: str
    should_shut_down: bool
    refresh_logs: _containers.RepeatedCompositeFieldContainer[_deltabus_pb2.TopicPartitions]
    metadata_records: MetadataBatch
    def __init__(self, error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., should_shut_down: _Optional[bool] = ..., refresh_logs: _Optional[_Iterable[_Union[_deltabus_pb2.TopicPartitions, _Mapping]]] = ..., metadata_records: _Optional[_Union[MetadataBatch, _Mapping]] = ...) -> None: ...

class AlterPartitionRequest(_message.Message):
    __slots__ = ("broker_id", "broker_epoch", "topic", "partition", "leader_epoch", "isr", "new_isr")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    NEW_ISR_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    topic: str
    partition: int
    leader_epoch: int
    isr: _containers.RepeatedScalarFieldContainer[int]
    new_isr: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., isr: _Optional[_Iterable[int]] = ..., new_isr: _Optional[_Iterable[int]] = ...) -> None: ...

class AlterPartitionResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "leader_epoch", "isr", "metadata_version")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    error_code: int
    error_message: str
    leader_epoch: int
    isr: _containers.RepeatedScalarFieldContainer[int]
    metadata_version: int
    def __init__(self, error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., isr: _Optional[_Iterable[int]] = ..., metadata_version: _Optional[int] = ...) -> None: ...

class ReplicaFetchPartition(_message.Message):
    __slots__ = ("topic", "partition", "fetch_offset", "partition_max_bytes", "current_leader_epoch", "last_fetched_epoch", "log_start_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PARTITION_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_FETCHED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int
    last_fetched_epoch: int
    log_start_offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., fetch_offset: _Optional[int] = ..., partition_max_bytes: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ..., last_fetched_epoch: _Optional[int] = ..., log_start_offset: _Optional[int] = ...) -> None: ...

class ReplicaFetchRequest(_message.Message):
    __slots__ = ("replica_id", "max_wait_ms", "min_bytes", "max_bytes", "partitions")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partitions: _containers.RepeatedCompositeFieldContainer[ReplicaFetchPartition]
    def __init__(self, replica_id: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., min_bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[ReplicaFetchPartition, _Mapping]]] = ...) -> None: ...

class LogFile(_message.Message):
    __slots__ = ("uri", "size_bytes", "stats", "base_offset", "last_offset")
    URI_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    uri: str
    size_bytes: int
    stats: str
    base_offset: int
    last_offset: int
    def __init__(self, uri: _Optional[str] = ..., size_bytes: _Optional[int] = ..., stats: _Optional[str] = ..., base_offset: _Optional[int] = ..., last_offset: _Optional[int] = ...) -> None: ...

class EpochEndOffset(_message.Message):
    __slots__ = ("epoch", "end_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    end_offset: int
    def __init__(self, epoch: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class ReplicaFetchPartitionResponse(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "high_watermark", "log_start_offset", "log_end_offset", "arrow_records", "files", "diverging_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ARROW_RECORDS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    DIVERGING_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: int
    error_message: str
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    arrow_records: bytes
    files: _containers.RepeatedCompositeFieldContainer[LogFile]
    diverging_epoch: EpochEndOffset
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., high_watermark: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., arrow_records: _Optional[bytes] = ..., files: _Optional[_Iterable[_Union[LogFile, _Mapping]]] = ..., diverging_epoch: _Optional[_Union[EpochEndOffset, _Mapping]] = ...) -> None: ...

class ReplicaFetchResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[ReplicaFetchPartitionResponse]
    def __init__(self, partitions: _Optional[_Iterable[_Union[ReplicaFetchPartitionResponse, _Mapping]]] = ...) -> None: ...

class TxnMarkerPartition(_message.Message):
    __slots__ = ("topic", "partition")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class TxnMarker(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "committed", "coordinator_epoch", "partitions")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: _containers.RepeatedCompositeFieldContainer[TxnMarkerPartition]
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., committed: _Optional[bool] = ..., coordinator_epoch: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[TxnMarkerPartition, _Mapping]]] = ...) -> None: ...

class WriteTxnMarkersRequest(_message.Message):
    __slots__ = ("markers", "timeout_ms")
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    markers: _containers.RepeatedCompositeFieldContainer[TxnMarker]
    timeout_ms: int
    def __init__(self, markers: _Optional[_Iterable[_Union[TxnMarker, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class TxnMarkerResult(_message.Message):
    __slots__ = ("producer_id", "topic", "partition", "error_code", "error_message")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    topic: str
    partition: int
    error_code: int
    error_message: str
    def __init__(self, producer_id: _Optional[int] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class WriteTxnMarkersResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TxnMarkerResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TxnMarkerResult, _Mapping]]] = ...) -> None: ...
