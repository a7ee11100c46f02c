"""A new leader taking over a diskless partition's table of many small commits, on moto's S3
server: how long opening the log takes, and how long three idempotent producers' first batches
take (each producer is looked up in the table). What a failover costs beyond detection and
election, as the number of files the cleaner has not merged yet grows.

    .venv/bin/python -m bench.diskless_takeover [COMMITS] [ROUNDS]

Each of the COMMITS (1,000 by default) is one producer's batch of five records, the three
producers in turn; then ROUNDS (3) times, a leader of the next epoch opens the table, each
producer sends its next batch, and the log closes. Prints each round and the medians.
"""

from __future__ import annotations

import statistics
import sys
import time

import pyarrow as pa

from bench.moto_server import s3_server
from deltabus.log_tables import LogConfig, PartitionLog
from deltabus.records import ProducerState, normalize_produce, produce_batch
from deltabus.storage import Storage

PRODUCERS = (1, 2, 3)
RECORDS = 5


def _batch(producer_id: int, n: int) -> pa.Table:
    return normalize_produce(produce_batch(
        [f"{producer_id}-{n}-{i}".encode() for i in range(RECORDS)]))


def takeover(commits: int, rounds: int) -> dict[str, float]:
    """Median seconds of a new leader's open, and of the producers' first batches after it."""
    with s3_server() as server:
        root = server.create_bucket("diskless-takeover")
        storage = Storage(root, server.options())
        path = f"{root}/topics/t/0"
        config = LogConfig()
        sequences = dict.fromkeys(PRODUCERS, 0)
        log = PartitionLog(path, topic="t", partition=0, config=config, storage=storage,
                           leader_epoch=0)
        for n in range(commits):
            pid = PRODUCERS[n % len(PRODUCERS)]
            log.append(_batch(pid, n), leader_epoch=0,
                       producer=ProducerState(pid, 0, sequences[pid])).result()
            sequences[pid] += RECORDS
        log.close()
        opens, firsts = [], []
        for epoch in range(1, rounds + 1):
            started = time.monotonic()
            log = PartitionLog(path, topic="t", partition=0, config=config, storage=storage,
                               create=False, leader_epoch=epoch)
            opened = time.monotonic()
            for pid in PRODUCERS:
                log.append(_batch(pid, -epoch), leader_epoch=epoch,
                           producer=ProducerState(pid, 0, sequences[pid])).result()
                sequences[pid] += RECORDS
            firsts.append(time.monotonic() - opened)
            opens.append(opened - started)
            log.close()
            print(f"round {epoch}: open {opens[-1]:.2f} s, the producers' first batches "
                  f"{firsts[-1]:.2f} s", flush=True)
    return {"open_s": statistics.median(opens), "first_batches_s": statistics.median(firsts)}


if __name__ == "__main__":
    commits = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    result = takeover(commits, int(sys.argv[2]) if len(sys.argv) > 2 else 3)
    print(f"{commits} small commits: open median {result['open_s']:.2f} s, "
          f"{len(PRODUCERS)} producers' first batches median {result['first_batches_s']:.2f} s")
