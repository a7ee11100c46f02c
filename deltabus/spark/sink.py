"""The `deltabus` Spark data source, write side: `df.write` and `df.writeStream`.

It takes the columns of Spark's Kafka sink: `value` (required), and optionally `key`, `topic`
(or the `topic` option, which wins), `partition` and `headers`. Each Spark task sends its rows
with an idempotent producer, acks=all, and fails when any record is not acknowledged.

A typed DataFrame writes to a typed topic: a `value` column that is a struct (the fields of the
topic's schema) is encoded with the latest schema of subject `valueSubject` (option; default
`<topic>-value`, Confluent's TopicNameStrategy) in the registry's wire format, as Confluent's
serializers would; a row that does not fit the schema fails the task. A struct `key` is
encoded the same way with subject `keySubject` (default `<topic>-key`), before it picks the
partition, so rows with equal keys land together as a Kafka producer's serialized keys do.

Streaming writes are exactly once. Kafka's Spark sink is at least once: a micro-batch replayed
after a failure writes its records again. Here each task of micro-batch b writes as producer
`<query id>.<task partition>` (a transactional id: the same producer id every time) with epoch b
and sequence numbers from 0, and routes every row deterministically (by key, or by the task's
partition when there is none). A replay of b, or a retried task, sends the same records with the
same producer id, epoch and sequences, so the partition leaders drop what they already hold; a
zombie task of an older batch is fenced by its older epoch. This needs what Spark's exactly-once
sinks always need: the source replays the same rows (deltabus's and Kafka's sources do).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from deltabus import errors
from deltabus.client.admin import AdminClient
from deltabus.client.partitioner import partition_for_key
from deltabus.client.producer import FutureRecordMetadata, Producer
from deltabus.client.schema_cache import SchemaCache
from deltabus.client.security import ClientSecurity

log = logging.getLogger(__name__)

EPOCHS_PER_PRODUCER_ID = 32_768  # producer epochs are 16-bit, as in Kafka
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark on every micro-batch's jobs
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # a query's id, kept in its checkpoint


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    delivery_timeout_ms: int = 120_000
    security: ClientSecurity = field(default_factory=ClientSecurity)
    value_subject: str | None = None  # a typed value's subject (None: <topic>-value)
    key_subject: str | None = None  # a typed key's subject (None: <topic>-key)

    @classmethod
    def parse(cls, options: dict[str, str]) -> SinkOptions:
        """Spark's Kafka sink options; security from the `kafka.`-prefixed ones
        (`deltabus.spark.source.client_security`)."""
        from deltabus.spark.source import bootstrap_servers, client_security

        lowered = {k.lower(): v for k, v in options.items()}
        timeout = lowered.get("kafka.delivery.timeout.ms") or lowered.get("delivery.timeout.ms")
        return cls(bootstrap_servers(lowered), lowered.get("topic") or None,
                   int(timeout) if timeout else 120_000, client_security(lowered),
                   lowered.get("valuesubject") or None, lowered.get("keysubject") or None)


@dataclass
class SentRecords(WriterCommitMessage):
    records: int


def _as_binary(column: pa.ChunkedArray | pa.Array, name: str) -> pa.Array:
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return pc.cast(column, pa.binary())
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return column.cast(pa.binary())
    raise errors.InvalidRecordError(f"column {name} must be binary or string, not {column.type}")


def _headers(column: pa.ChunkedArray) -> list:
    rows = column.to_pylist()
    return [[(h["key"], h["value"]) for h in row] if row else None for row in rows]


class RowSender:
    """Sends a task's rows: groups them by (topic, partition) in row order and sends each group
    with the producer's bulk path; deterministic, so a replay sends the same batches."""

    def __init__(self, options: SinkOptions, producer: Producer, task_partition: int) -> None:
        self.options = options
        self.producer = producer
        self.task_partition = task_partition
        self.futures: list[FutureRecordMetadata] = []
        self.records = 0
        self._admin: AdminClient | None = None  # the registry's, once a typed value comes
        self._schemas: SchemaCache | None = None

    def _encoded(self, column: pa.ChunkedArray, name: str, topics: list[str]) -> pa.Array:
        """A struct `value` (`key`) column encoded with each row's subject's latest schema;
        a null stays null (a tombstone, a record with no key)."""
        if self._schemas is None:
            self._admin = AdminClient(self.options.bootstrap, security=self.options.security)
            self._schemas = SchemaCache(self._admin.schema_registry)
        chosen = self.options.value_subject if name == "value" else self.options.key_subject
        rows = column.to_pylist()
        out: list[bytes | None] = [None] * len(rows)
        by_subject: dict[str, list[int]] = {}
        for i, topic in enumerate(topics):
            by_subject.setdefault(chosen or f"{topic}-{name}", []).append(i)
        for subject, indices in by_subject.items():
            present = [i for i in indices if rows[i] is not None]
            try:
                encoded = self._schemas.encode_latest(subject, [rows[i] for i in present])
            except ValueError as e:
                raise errors.InvalidRecordError(
                    f"a row's {name} does not fit the latest schema of {subject}: {e}") from None
            for i, data in zip(present, encoded, strict=True):
                out[i] = data
        return pa.array(out, pa.binary())

    def _bytes(self, table: pa.Table, name: str, topics: list[str]) -> pa.Array:
        column = table.column(name)
        if pa.types.is_struct(column.type):
            return self._encoded(column, name, topics)
        return _as_binary(column, name)

    def send(self, batch: pa.RecordBatch) -> None:
        table = pa.Table.from_batches([batch])
        names = table.column_names
        if "value" not in names:
            raise errors.InvalidRecordError("the deltabus sink needs a value column")
        if self.options.topic is None and "topic" not in names:
            raise errors.InvalidRecordError(
                "the deltabus sink needs a topic column or the topic option")
        topics = ([self.options.topic] * table.num_rows if self.options.topic
                  else table.column("topic").to_pylist())
        if None in topics:
            raise errors.InvalidRecordError("a row has a null topic")
        columns = {"value": self._bytes(table, "value", topics)}
        if "key" in names:
            columns["key"] = self._bytes(table, "key", topics)
        if "headers" in names:
            from deltabus.records import HEADERS_TYPE
            columns["headers"] = pa.array(_headers(table.column("headers")), HEADERS_TYPE)
        rows = pa.table(columns)
        given = table.column("partition").to_pylist() if "partition" in names else None
        keys = columns["key"].to_pylist() if "key" in columns else None
        groups: dict[tuple[str, int], list[int]] = {}
        counts: dict[str, int] = {}
        for i, topic in enumerate(topics):
            if topic not in counts:
                counts[topic] = self.producer.partitions_for(topic)
            if given is not None and given[i] is not None:
                partition = given[i]
            elif keys is not None and keys[i] is not None:
                partition = partition_for_key(keys[i], counts[topic])
            else:  # no key: the task's own partition, so a replay routes it the same way
                partition = self.task_partition % counts[topic]
            groups.setdefault((topic, partition), []).append(i)
        for (topic, partition), indices in groups.items():
            self.futures.extend(self.producer.send_batch(
                topic, rows.take(pa.array(indices)), partition=partition))
        self.records += table.num_rows

    def finish(self) -> SentRecords:
        """Wait for every acknowledgement; the first failure fails the task."""
        if self._admin is not None:
            self._admin.close()
        self.producer.flush()
        for future in self.futures:
            error = future.exception()
            if error is not None:
                raise error
        return SentRecords(self.records)


def _task_partition() -> int:
    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


class BatchWriter(DataSourceArrowWriter):
    """`df.write.format("deltabus")`: at least once, as Kafka's sink (a retried task sends its
    rows again), with the idempotent producer dropping retried requests within a task."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentRecords:
        with Producer(self.options.bootstrap, acks="all",
                      delivery_timeout_ms=self.options.delivery_timeout_ms,
                      client_id="deltabus-spark-sink", security=self.options.security) as producer:
            sender = RowSender(self.options, producer, _task_partition())
            for batch in iterator:
                sender.send(batch)
            return sender.finish()

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("deltabus sink wrote %d records",
                 sum(m.records for m in messages if isinstance(m, SentRecords)))


class StreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("deltabus")`: exactly once (see the module docstring)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentRecords:
        context = TaskContext.get()
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context else None
        if batch_id is None or query_id is None:
            raise errors.ClientError("the deltabus stream sink runs only in a streaming query")
        task_partition = _task_partition()
        epoch_block, epoch = divmod(int(batch_id), EPOCHS_PER_PRODUCER_ID)
        with Producer(self.options.bootstrap, acks="all",
                      delivery_timeout_ms=self.options.delivery_timeout_ms,
                      transactional_id=f"spark-{query_id}.{task_partition}.{epoch_block}",
                      producer_epoch=epoch, client_id="deltabus-spark-sink",
                      security=self.options.security) as producer:
            sender = RowSender(self.options, producer, task_partition)
            for batch in iterator:
                sender.send(batch)
            return sender.finish()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("deltabus sink: micro-batch %d wrote %d records", batchId,
                 sum(m.records for m in messages if isinstance(m, SentRecords)))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("deltabus sink: micro-batch %d failed; its replay writes only what is "
                    "missing", batchId)
