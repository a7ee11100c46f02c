"""Bench step (s), issue 21: bulk produce to a typed topic against an untyped one, in the same run.

A typed topic (`value.schema.subject`) decodes every record at the leader, with the schema its
wire header names, and writes the decoded values as typed columns beside the raw bytes; an
untyped topic stores the bytes alone. Both get the same Avro records (a payment of four fields,
about 100 bytes with the wire header), sent with send_batch; rounds alternate and the medians
are compared (the target: typed at least 70% of untyped).

The schema is registered through AdminClient's registry (gRPC), so the step runs against any
cluster; the topics are the step's own.

The design not taken is timed too (`decode_behind_head`): decoding in the log cleaner's job,
behind the head, leaves produce at the untyped rate and adds to the cleaner the rewrite of
every file with its decoded values. One task of that job is run here, in this process, on a
partition table of its own under the bench's scratch root.
"""

from __future__ import annotations

import io
import json
import statistics
import time
import uuid
from typing import Any

import fastavro
import pyarrow as pa
from deltalake import DeltaTable

from deltabus import AdminClient, NewTopic, schemas
from deltabus.cli.producer_performance import BULK_CHUNK_BYTES
from deltabus.client.producer import Producer
from deltabus.cluster.schema_registry import check_records
from deltabus.log_tables.delta_commit import write_data_file
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.log_tables.typed_columns import conform
from deltabus.records import VALUE_FIELDS, normalize_produce
from deltabus.schemas import SchemaType, wire_header
from deltabus.storage import Storage

SCHEMA = {"type": "record", "name": "Payment", "namespace": "bench",
          "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "double"},
                     {"name": "currency", "type": "string"}, {"name": "note", "type": "string"}]}
DISTINCT = 10_000  # records encoded once, sent again and again
ROUNDS = 3  # of each, alternating


def avro_values(schema_id: int) -> pa.Table:
    """DISTINCT Avro records in Confluent's wire format: a produce chunk's `value` column."""
    parsed = fastavro.parse_schema(SCHEMA)
    header, values = wire_header(schema_id), []
    for i in range(DISTINCT):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, {
            "id": f"payment-{i:08d}", "amount": i * 0.25, "currency": ("EUR", "USD")[i % 2],
            "note": f"paid for order {i * 7919 % 100_000:05d} by card"})
        values.append(header + out.getvalue())
    return pa.table({"value": pa.array(values, pa.binary())})


def produce_rate(bootstrap: str, topic: str, values: pa.Table, records: int) -> float:
    """Records/s of send_batch (acks=1) of `records` of `values`, until every chunk is acked."""
    rows = chunk_rows(values)
    chunk = values.slice(0, rows)
    with Producer(bootstrap, acks=1) as producer:
        producer.send(topic, values.column("value")[0].as_py()).get(30)  # warm-up, untimed
        start = time.perf_counter()
        futures = [f for first in range(0, records, rows)
                   for f in producer.send_batch(topic, chunk.slice(0, min(rows,
                                                                          records - first)))]
        producer.flush()
        elapsed = time.perf_counter() - start
        for future in futures:
            future.get(0)  # the first refusal, if any, ends the step
    return records / elapsed


def chunk_rows(values: pa.Table) -> int:
    """Records per send_batch call: BULK_CHUNK_BYTES of `values`."""
    return max(1, min(values.num_rows, BULK_CHUNK_BYTES // max(1, values.nbytes
                                                              // values.num_rows)))


def typed_vs_untyped(bootstrap: str, records: int, rounds: int,
                     root: str | None = None) -> dict[str, Any]:
    """Medians of `rounds` alternating rounds of bulk produce to an untyped and a typed topic
    (one partition each, a topic per round), and the typed rate as a share of the untyped.
    With a scratch `root`, the decode behind the head is timed too (`decode_behind_head`)."""
    tag = uuid.uuid4().hex[:6]
    subject = f"bench-typed-{tag}-value"
    with AdminClient(bootstrap) as admin:
        held = admin.schema_registry.register_schema(subject, "AVRO", json.dumps(SCHEMA), [])
        values = avro_values(held.schema_id)
        untyped, typed = [], []
        for r in range(rounds):
            plain, decoded = f"bench-untyped-{tag}-{r}", f"bench-typed-{tag}-{r}"
            admin.create_topics([NewTopic(plain, 1, 1), NewTopic(decoded, 1, 1, configs={
                "value.schema.subject": subject})])
            untyped.append(produce_rate(bootstrap, plain, values, records))
            typed.append(produce_rate(bootstrap, decoded, values, records))
            print(f"    round {r + 1}: untyped {untyped[-1]:,.0f} rec/s, typed "
                  f"{typed[-1]:,.0f} rec/s", flush=True)
    untyped_rps, typed_rps = statistics.median(untyped), statistics.median(typed)
    figures = {"records": records, "untyped_rps": untyped_rps, "typed_rps": typed_rps,
               "typed_vs_untyped": typed_rps / untyped_rps,
               # what decoding adds to produce, in seconds per million records
               "produce_decode_s_per_m": 1e6 / typed_rps - 1e6 / untyped_rps,
               "rounds": {"untyped": untyped, "typed": typed}}
    if root is not None:
        figures["behind_head"] = decode_behind_head(f"{root}/typed-behind-head", values,
                                                    records, rounds)
    return figures


def decode_behind_head(path: str, values: pa.Table, records: int, rounds: int
                       ) -> dict[str, Any]:
    """One task of the log cleaner's job, had it decoded typed topics behind the head: the
    untyped records, committed by a PartitionLog a produce chunk at a time, read back file by
    file and rewritten as the cleaner's merge rewrites them (`write_data_file`), once as they
    are and once with their decoded values beside them; medians of `rounds` alternating
    rounds. The difference is what decoding would add to the cleaner, per core."""
    parsed = schemas.parse(SchemaType.AVRO, json.dumps(SCHEMA), {})
    log = PartitionLog(path, topic="bench-behind-head", partition=0)
    rows = chunk_rows(values)
    try:
        for first in range(0, records, rows):
            chunk = values.slice(0, min(rows, records - first))
            log.append(normalize_produce(chunk), leader_epoch=0).result(60)
    finally:
        log.close()
    storage = Storage(path)
    files = DeltaTable(path).file_uris()

    def rewrite(decode: bool) -> float:
        started = time.perf_counter()
        for uri in files:
            data = storage.read_parquet(uri)
            if decode:
                fields = check_records(lambda _id: parsed, "bench-value", data.column("value"),
                                       "value", "bench-behind-head")
                data = data.append_column(VALUE_FIELDS, conform(fields, None, path))
            write_data_file(storage, f"{path}/rewritten", data, "typed" if decode else "merged")
        return time.perf_counter() - started

    plain, decoded = [], []
    for _ in range(rounds):
        plain.append(rewrite(False))
        decoded.append(rewrite(True))
    plain_s, decoded_s = statistics.median(plain), statistics.median(decoded)
    return {"files": len(files), "rewrite_rps": records / plain_s,
            "decode_rewrite_rps": records / decoded_s,
            "cleaner_decode_s_per_m": (decoded_s - plain_s) * 1e6 / records,
            "rounds": {"rewrite_s": plain, "decode_rewrite_s": decoded}}
