"""The Kafka door's produce decoding alone: records/s of `decode_produce` on 10,000-record
batches as librdkafka or kafka-python send them (best of 20 rounds each). Run alone:
`python -m bench.record_batches`; it needs no cluster."""

from __future__ import annotations

import os
import time

from kafka.record.default_records import DefaultRecordBatchBuilder

from deltabus.rpc.kafka.batches import decode_produce

RECORDS = 10_000
ROUNDS = 20
SHAPES = (("100-byte values", False, 100), ("keyed, 100-byte values", True, 100),
          ("keyed, 10-byte values", True, 10), ("1,000-byte values", False, 1000))


def batch(records: int, keyed: bool, value_bytes: int) -> bytes:
    """One uncompressed v2 record batch without headers."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 30)
    for i in range(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, headers=[],
                       key=b"user-%d" % (i % 100) if keyed else None,
                       value=os.urandom(value_bytes))
    return bytes(builder.build())


def decode_rates() -> dict[str, float]:
    """records/s of decode_produce for each shape, the best of ROUNDS."""
    rates = {}
    for name, keyed, value_bytes in SHAPES:
        data = batch(RECORDS, keyed, value_bytes)
        best_s = min(_timed(data) for _ in range(ROUNDS))
        rates[name] = RECORDS / best_s
    return rates


def _timed(data: bytes) -> float:
    start = time.perf_counter()
    decode_produce(data)
    return time.perf_counter() - start


if __name__ == "__main__":
    for shape, rate in decode_rates().items():
        print(f"decode_produce, {shape}: {rate:,.0f} records/s")
