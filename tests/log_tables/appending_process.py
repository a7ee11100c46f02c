"""A broker's appends from a process of its own, for the tests of the cleaner's commits beside
them: `python -m tests.log_tables.appending_process PATH` appends one-record batches ("p-<i>",
acks as a broker gives them) to the partition log at PATH as fast as it can, prints "appending"
after the first 50 acknowledgements, and when its stdin closes closes the log and prints how
many appends were acknowledged."""

from __future__ import annotations

import sys
import threading

from deltabus.config import LogConfig
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.records import normalize_produce, produce_batch


def main(path: str) -> None:
    log = PartitionLog(path, topic="t", partition=0, config=LogConfig(group_commit_linger_ms=0))
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    acknowledged = 0
    while not stop.is_set():
        batch = normalize_produce(produce_batch([f"p-{acknowledged}".encode()], keys=[b"k"]))
        log.append(batch, leader_epoch=0).result(60)
        acknowledged += 1
        if acknowledged == 50:
            print("appending", flush=True)
    log.close()
    print(acknowledged, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
