"""Bench step (s), issue 21: bulk produce to a typed topic against an untyped one, in the same run.

A typed topic (`value.schema.subject`) decodes every record at the leader, with the schema its
wire header names, and writes the decoded values as typed columns beside the raw bytes; an
untyped topic stores the bytes alone. Both get the same Avro records (a payment of four fields,
about 100 bytes with the wire header), sent with send_batch; rounds alternate and the medians
are compared (the target: typed at least 70% of untyped).

The schema is registered through AdminClient's registry (gRPC), so the step runs against any
cluster; the topics are the step's own.
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

from deltabus import AdminClient, NewTopic
from deltabus.cli.producer_performance import BULK_CHUNK_BYTES
from deltabus.client.producer import Producer
from deltabus.schemas import wire_header

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
    rows = max(1, min(values.num_rows, BULK_CHUNK_BYTES // max(1, values.nbytes
                                                                // values.num_rows)))
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


def typed_vs_untyped(bootstrap: str, records: int, rounds: int) -> dict[str, Any]:
    """Medians of `rounds` alternating rounds of bulk produce to an untyped and a typed topic
    (one partition each, a topic per round), and the typed rate as a share of the untyped."""
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
    return {"records": records, "untyped_rps": untyped_rps, "typed_rps": typed_rps,
            "typed_vs_untyped": typed_rps / untyped_rps, "rounds": {
                "untyped": untyped, "typed": typed}}
