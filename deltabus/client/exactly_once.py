"""`ExactlyOncePipeline`: consume a topic in a group, transform, produce to another topic, with
every input record's output written exactly once, even when the pipeline crashes between
writing the output and committing the input offsets.

Kafka does this with transactions (the output and the input offsets commit together, readers use
read_committed). deltabus gets the same result from the idempotent producer, made deterministic:

- Each input partition has a producer with a stable id (a `transactional_id`,
  `<group>.<input topic>.<partition>`, which the controller always maps to the same producer id).
- The input is processed in batches [start, end). Before writing a batch's output, the pipeline
  commits the input offset `start` with, as commit metadata, the batch's `end` and the output
  producer's sequence numbers (a write-ahead record). Then it writes the output (one send per
  output partition, acks=all) and commits `end` with the new sequence numbers.
- After a crash, the next owner of the partition reads the committed metadata: if a batch was
  pending it processes exactly [start, end) again, with the recorded sequence numbers, so every
  output batch carries the same producer id and sequences as before; the partition leaders
  answer the ones already written as duplicates and append only what was missing.

So the output holds each input record's output once, in input order per output partition, given
that `transform` is deterministic (the same record gives the same output), as Kafka Streams also
requires for exactly-once. Not thread-safe: one thread runs the pipeline.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from deltabus.client.consumer import Consumer, ConsumerRebalanceListener, OffsetAndMetadata
from deltabus.client.consumer_coordinator import TopicPartition
from deltabus.client.partitioner import partition_for_key
from deltabus.client.producer import Producer
from deltabus.client.security import ClientSecurity, SecuritySettings
from deltabus.records import ConsumerRecord

log = logging.getLogger(__name__)

Output = tuple[bytes | None, bytes]  # (key, value) of one output record
FLUSH_TIMEOUT_S = 120.0


class ExactlyOncePipeline:
    """input topic --transform--> output topic, exactly once (see the module docstring)."""

    def __init__(self, bootstrap_servers: str, group_id: str, input_topic: str,
                 output_topic: str, transform: Callable[[ConsumerRecord], Iterable[Output]], *,
                 batch_records: int = 1000, **consumer_settings: Any) -> None:
        """`consumer_settings`: the Consumer's keyword arguments; its security settings
        (deltabus.client.security) are the output producers' too."""
        self.group_id, self.input_topic, self.output_topic = group_id, input_topic, output_topic
        self._bootstrap = bootstrap_servers
        self._transform = transform
        self._batch_records = batch_records
        self._security = ClientSecurity.from_settings(**{
            k: consumer_settings.pop(k) for k in SecuritySettings.__annotations__
            if k in consumer_settings})
        self.consumer = Consumer(bootstrap_servers, group_id=group_id,
                                 enable_auto_commit=False, security=self._security,
                                 **consumer_settings)
        self._producers: dict[int, Producer] = {}
        self._pending_end: dict[int, int] = {}  # a batch to redo exactly, after a crash
        self._held: dict[int, list[ConsumerRecord]] = {}
        self.consumer.subscribe([input_topic], listener=_Listener(self))

    # ---- partitions coming and going ---------------------------------------------------------

    def _assigned(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            committed = self.consumer.committed(tp)
            state = json.loads(committed.metadata) if committed and committed.metadata else {}
            producer = Producer(self._bootstrap, acks="all", security=self._security,
                                transactional_id=f"{self.group_id}.{tp.topic}.{tp.partition}")
            producer.restore_sequences({(self.output_topic, int(q)): n
                                        for q, n in state.get("sequences", {}).items()})
            self._producers[tp.partition] = producer
            if state.get("pending_end") is not None:
                self._pending_end[tp.partition] = int(state["pending_end"])
                log.info("%s-%d: redoing batch [%d, %d) left pending by a crash", tp.topic,
                         tp.partition, committed.offset if committed else 0,
                         state["pending_end"])

    def _revoked(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            producer = self._producers.pop(tp.partition, None)
            if producer is not None:
                producer.close()
            self._pending_end.pop(tp.partition, None)
            self._held.pop(tp.partition, None)

    # ---- running -------------------------------------------------------------------------------

    def run_once(self, timeout_ms: int = 1000) -> int:
        """One poll and the batches it completes; returns the input records processed."""
        by_partition: dict[int, list[ConsumerRecord]] = {}
        for record in self.consumer.poll(timeout_ms, max_records=self._batch_records):
            by_partition.setdefault(record.partition, []).append(record)
        done = 0
        for partition, records in by_partition.items():
            records = self._held.pop(partition, []) + records
            end = self._pending_end.get(partition)
            if end is not None:  # the crashed batch first, exactly as it was
                if records[-1].offset + 1 < end:
                    self._held[partition] = records  # not all of it fetched yet
                    continue
                redo = [r for r in records if r.offset < end]
                self._process(partition, redo, write_ahead=False)
                del self._pending_end[partition]
                done += len(redo)
                records = [r for r in records if r.offset >= end]
            if records:
                self._process(partition, records, write_ahead=True)
                done += len(records)
        return done

    def _process(self, partition: int, records: list[ConsumerRecord],
                 write_ahead: bool) -> None:
        tp = TopicPartition(self.input_topic, partition)
        producer = self._producers[partition]
        start, end = records[0].offset, records[-1].offset + 1
        if write_ahead:
            self._commit(tp, start, producer, pending_end=end)
        futures = []
        for q, outputs in sorted(self._route(partition, records).items()):
            table = pa.table({"key": pa.array([k for k, _ in outputs], pa.binary()),
                              "value": pa.array([v for _, v in outputs], pa.binary())})
            futures += producer.send_batch(self.output_topic, table, partition=q)
        producer.flush(FLUSH_TIMEOUT_S)
        for future in futures:
            future.get(0)  # raises the error of a failed send: the batch is not committed
        self._before_commit(tp, end)
        self._commit(tp, end, producer, pending_end=None)

    def _route(self, partition: int, records: list[ConsumerRecord]) -> dict[int, list[Output]]:
        """Each output's partition, deterministically: by key (Kafka's murmur2), and an output
        without a key to the input partition's number (modulo), never the sticky partitioner,
        whose choice a replay would not repeat."""
        count = self._output_partitions()
        routed: dict[int, list[Output]] = {}
        for record in records:
            for key, value in self._transform(record):
                q = partition_for_key(key, count) if key is not None else partition % count
                routed.setdefault(q, []).append((key, value))
        return routed

    def _output_partitions(self) -> int:
        producer = next(iter(self._producers.values()))
        return producer.partitions_for(self.output_topic)

    def _before_commit(self, tp: TopicPartition, end: int) -> None:
        """Where a crash between writing the output and committing the input would strike
        (tests override it to crash there)."""

    def _commit(self, tp: TopicPartition, offset: int, producer: Producer,
                pending_end: int | None) -> None:
        sequences = {str(q): n for (topic, q), n in producer.sequences().items()
                     if topic == self.output_topic}
        metadata = json.dumps({"sequences": sequences, "pending_end": pending_end})
        self.consumer.commit({tp: OffsetAndMetadata(offset, metadata)})

    def close(self) -> None:
        for producer in self._producers.values():
            producer.close()
        self._producers.clear()
        self.consumer.close(autocommit=False)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, pipeline: ExactlyOncePipeline) -> None:
        self._pipeline = pipeline

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self._pipeline._assigned(assigned)

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self._pipeline._revoked(revoked)
