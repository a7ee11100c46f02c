"""A broker: leads partitions and serves Produce/Fetch over gRPC. Runs inside a long-running Spark
task on an executor (one task, one broker), started by `deltabus.cluster.Cluster`.

Thread-safe: gRPC threads call the handler methods concurrently; the heartbeat thread applies new
metadata. Invariants:
- A broker only appends to a partition it leads in the metadata it has applied, stamping the
  leader epoch of that metadata; everything else gets NOT_LEADER_OR_FOLLOWER.
- The broker reports a metadata version as applied only after it opened (or closed) every log that
  version asks for, so when CreateTopics returns, the new partitions take produce requests.
- On shutdown, queued appends are committed before the server stops: acknowledged is durable.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import pyarrow as pa

from deltabus import config as cfg
from deltabus import errors
from deltabus.log_tables.layout import replica_path
from deltabus.log_tables.partition_log import AppendResult, LogConfig, PartitionLog
from deltabus.metadata import (
    MetadataImage,
    NewTopic,
    TopicResult,
    empty_image,
)
from deltabus.records import CREATE_TIME, LOG_APPEND_TIME, ProducerState
from deltabus.rpc import codec
from deltabus.rpc.client import ClusterClient
from deltabus.rpc.server import FetchResult, FetchSpec, start_server
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.rpc.v1 import deltabus_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

LOG_OPEN_THREADS = 8


@dataclass(frozen=True)
class BrokerSpec:
    """What a broker task needs to start; pickled into the Spark task."""

    broker_id: int
    controller_address: str
    config: cfg.ClusterConfig


class Broker:
    """One broker: its gRPC server, its partition logs and its session with the controller."""

    def __init__(self, spec: BrokerSpec) -> None:
        self.spec = spec
        self.broker_id = spec.broker_id
        self._config = spec.config
        self._log_config = LogConfig(
            group_commit_bytes_max=spec.config.group_commit_bytes_max,
            group_commit_linger_ms=spec.config.group_commit_linger_ms,
            log_cache_bytes_max=spec.config.log_cache_bytes_max,
            checkpoint_interval=spec.config.checkpoint_interval,
        )
        self._image = empty_image()
        self._topic_configs: dict[str, cfg.TopicConfig] = {}
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._logs_lock = threading.Lock()
        self._appended = threading.Condition()
        self._append_seq = 0
        self._stopped = threading.Event()
        self._epoch = -1
        self._controller = ClusterClient(spec.controller_address)
        channel = grpc.insecure_channel(spec.controller_address)
        self._lifecycle = pb_grpc.BrokerLifecycleStub(channel)
        self._server: grpc.Server | None = None
        self.port = -1

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._server, self.port = start_server(self._config.host, 0, self,
                                               threads=self._config.grpc_threads)
        self._register()
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()

    def _register(self) -> None:
        request = pb.RegisterBrokerRequest(
            broker_id=self.broker_id, host=self._config.host, port=self.port,
            pid=os.getpid(), incarnation_id=uuid.uuid4().hex)
        deadline = time.monotonic() + self._config.startup_timeout_ms / 1000
        while True:
            try:
                response = self._lifecycle.RegisterBroker(request, timeout=10)
                errors.check(response.error_code, response.error_message)
                self._epoch = response.broker_epoch
                log.info("broker %d registered, epoch %d, serving on %s:%d",
                         self.broker_id, self._epoch, self._config.host, self.port)
                return
            except grpc.RpcError as e:
                if time.monotonic() > deadline:
                    raise errors.NetworkError(f"cannot reach the controller: {e}") from None
                time.sleep(0.2)

    def _heartbeat_loop(self) -> None:
        interval_ms = self._config.broker_heartbeat_interval_ms
        while not self._stopped.is_set():
            request = pb.BrokerHeartbeatRequest(
                broker_id=self.broker_id, broker_epoch=self._epoch,
                metadata_version=self._image.version, max_wait_ms=interval_ms)
            try:
                response = self._lifecycle.BrokerHeartbeat(request, timeout=interval_ms / 500 + 5)
            except grpc.RpcError as e:
                log.warning("heartbeat to the controller failed: %s", e.code())
                self._stopped.wait(interval_ms / 1000)
                continue
            if response.error_code == errors.StaleBrokerEpochError.code:
                log.warning("broker %d was fenced; registering again", self.broker_id)
                self._register()
                continue
            if response.HasField("metadata"):
                self._apply(codec.image_from_proto(response.metadata))
            if response.should_shut_down:
                self._stopped.set()

    def serve_until_stopped(self) -> None:
        self._stopped.wait()

    def close(self) -> None:
        """Commit what is queued, close every log, then stop serving."""
        self._stopped.set()
        with self._logs_lock:
            logs, self._logs = list(self._logs.values()), {}
        for partition_log in logs:
            partition_log.close()
        if self._server is not None:
            self._server.stop(grace=2).wait(5)
        self._controller.close()

    # ---- metadata ----------------------------------------------------------------------------

    def _apply(self, image: MetadataImage) -> None:
        """Open the logs of partitions this broker now leads; close the ones it no longer does."""
        wanted = {
            (topic.name, p.partition)
            for topic in image.topics.values() for p in topic.partitions
            if p.leader == self.broker_id
        }
        with self._logs_lock:
            current = set(self._logs)
        for key in sorted(current - wanted):
            with self._logs_lock:
                partition_log = self._logs.pop(key)
            partition_log.close()
            log.info("broker %d stopped leading %s-%d", self.broker_id, *key)
        opening = sorted(wanted - current)
        if opening:  # in parallel: a broker may lead hundreds of partitions
            with ThreadPoolExecutor(max_workers=LOG_OPEN_THREADS) as pool:
                for key, opened in zip(opening, pool.map(self._open_log, opening), strict=True):
                    if opened is not None:
                        with self._logs_lock:
                            self._logs[key] = opened
        # Parsed once per metadata version, not per produce request; set before the image so a
        # topic visible in the image always has its config.
        self._topic_configs = {name: cfg.topic_config(t.configs)
                               for name, t in image.topics.items()}
        self._image = image

    def _open_log(self, key: tuple[str, int]) -> PartitionLog | None:
        topic, partition = key
        try:
            opened = PartitionLog(
                replica_path(self._config.root, topic, partition, self.broker_id),
                topic=topic, partition=partition, config=self._log_config,
                on_append=self._notify_append)
        except Exception:  # one unreadable table must not take the broker down
            log.exception("cannot open %s-%d", topic, partition)
            return None
        log.info("broker %d leads %s-%d from offset %d", self.broker_id, topic, partition,
                 opened.log_end_offset)
        return opened

    def _notify_append(self) -> None:
        with self._appended:
            self._append_seq += 1
            self._appended.notify_all()

    def _leader_log(self, topic: str, partition: int) -> tuple[PartitionLog, int]:
        """The log of a partition this broker leads, and its leader epoch; raises Kafka's error."""
        image = self._image
        state = image.partition(topic, partition)
        if state is None:
            raise errors.UnknownTopicOrPartitionError(
                f"This server does not host this topic-partition: {topic}-{partition}")
        with self._logs_lock:
            partition_log = self._logs.get((topic, partition))
        if state.leader != self.broker_id or partition_log is None:
            raise errors.NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not the leader of {topic}-{partition} "
                f"(leader: {state.leader})")
        return partition_log, state.leader_epoch

    # ---- DeltaBusHandler ---------------------------------------------------------------------

    def metadata(self, topics: list[str], allow_auto_create: bool) -> MetadataImage:
        if allow_auto_create and any(t not in self._image.topics for t in topics):
            response = self._controller.call_any(
                "Metadata", pb.MetadataRequest(topics=topics, allow_auto_topic_creation=True))
            return codec.image_from_proto(response)
        return self._image

    def create_topics(self, topics: list[NewTopic], *, timeout_ms: int,
                      validate_only: bool) -> list[TopicResult]:
        request = codec.create_topics_request(topics, timeout_ms, validate_only)
        response = self._controller.call_any("CreateTopics", request, timeout_ms + 5000)
        return [codec.topic_result_from_proto(r) for r in response.topics]

    def delete_topics(self, names: list[str], *, timeout_ms: int) -> list[TopicResult]:
        request = pb.DeleteTopicsRequest(topics=names, timeout_ms=timeout_ms)
        response = self._controller.call_any("DeleteTopics", request, timeout_ms + 5000)
        return [codec.topic_result_from_proto(r) for r in response.topics]

    def produce(self, topic: str, partition: int, batch: pa.Table, *, acks: int,
                producer: ProducerState) -> Future[AppendResult]:
        partition_log, leader_epoch = self._leader_log(topic, partition)
        topic_config = self._topic_configs.get(topic) or cfg.TopicConfig()
        timestamp_type = (LOG_APPEND_TIME if topic_config.message_timestamp_type == "LogAppendTime"
                          else CREATE_TIME)
        return partition_log.append(batch, leader_epoch=leader_epoch,
                                    timestamp_type=timestamp_type, producer=producer,
                                    max_message_bytes=topic_config.max_message_bytes)

    def fetch(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
              max_bytes: int, replica_id: int) -> list[FetchResult]:
        """Read every partition; if less than min_bytes came back and no partition failed, wait
        for an append (or max_wait_ms) and read again: Kafka's long poll."""
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            with self._appended:
                seq = self._append_seq
            results = [self._fetch_one(spec) for spec in specs]
            total = _cap_bytes(results, max_bytes)
            if (total >= max(min_bytes, 1) or any(r.error for r in results)
                    or self._stopped.is_set()):
                return results
            with self._appended:
                while self._append_seq == seq:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return results
                    self._appended.wait(left)

    def _fetch_one(self, spec: FetchSpec) -> FetchResult:
        result = FetchResult(spec.topic, spec.partition)
        try:
            partition_log, leader_epoch = self._leader_log(spec.topic, spec.partition)
            if 0 <= spec.current_leader_epoch < leader_epoch:
                raise errors.FencedLeaderEpochError(
                    f"leader epoch {spec.current_leader_epoch} is older than {leader_epoch}")
            if spec.current_leader_epoch > leader_epoch:
                raise errors.UnknownLeaderEpochError(
                    f"leader epoch {spec.current_leader_epoch} is newer than {leader_epoch}")
            result.high_watermark = partition_log.high_watermark
            result.log_start_offset = partition_log.log_start_offset
            result.log_end_offset = partition_log.log_end_offset
            result.records = partition_log.read(
                spec.offset, min(spec.max_bytes, cfg.FETCH_RESPONSE_PARTITION_BYTES_MAX))
        except errors.DeltaBusError as e:
            result.error = e
        return result

    def init_producer_id(self) -> tuple[int, int]:
        response = self._controller.call_any("InitProducerId", pb.InitProducerIdRequest())
        errors.check(response.error_code, response.error_message)
        return response.producer_id, response.producer_epoch

    def list_offsets(self, topic: str, partition: int, timestamp: int) -> tuple[int, int, int]:
        partition_log, leader_epoch = self._leader_log(topic, partition)
        offset, ts = partition_log.offset_for_timestamp(timestamp)
        return offset, ts, leader_epoch


def _cap_bytes(results: list[FetchResult], max_bytes: int) -> int:
    """Keep the response within max_bytes (but always the first partition's records)."""
    total = 0
    for r in results:
        if r.records is None:
            continue
        if total and total + r.records.nbytes > max_bytes:
            r.records = r.records.slice(0, 0)
        total += r.records.nbytes
    return total


def run_broker_task(specs: Iterator[BrokerSpec]) -> Iterator[tuple[int, str]]:
    """The Spark task body: run one broker until the controller tells it to stop."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for spec in specs:
        broker = Broker(spec)
        try:
            broker.start()
            broker.serve_until_stopped()
        finally:
            broker.close()
        yield spec.broker_id, "stopped"
