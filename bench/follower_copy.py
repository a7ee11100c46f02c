"""How fast a follower copies a leader's small files on object storage (moto's S3 server): the
catch-up a relaunched broker makes behind a leader that commits a small file every few
milliseconds. Not a step of `make bench`; `python -m bench.follower_copy [FILES]` prints it.

The leader's table gets `files` commits of two records each (as a busy leader's group commits
are); a follower table then copies them all as one round (PartitionLog.append_files: each file
copied, read back and checked, then one commit), and a second follower copies them again. The
figures: milliseconds and S3 requests per file copied, by method, from the server's access log.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.moto_server import by_method, log_mark, s3_server, served
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.records import normalize_produce, produce_batch
from deltabus.storage import Storage

FILES = 300
ROUNDS = 3


def measure(files: int = FILES, rounds: int = ROUNDS) -> dict[str, Any]:
    """Median ms per file copied over `rounds` follower tables, and the requests of one copy
    per file by method."""
    with tempfile.TemporaryDirectory() as scratch, s3_server(Path(scratch) / "s3.log") as s3:
        log = Path(scratch) / "s3.log"
        root = s3.create_bucket("follower-copy")
        storage = Storage(root, s3.options())
        leader = PartitionLog(f"{root}/leader", topic="t", partition=0, storage=storage)
        try:
            for i in range(files):
                batch = normalize_produce(produce_batch([b"v%d" % i, b"w%d" % i]))
                leader.append(batch, leader_epoch=0).result(60)
            offered = leader.files_from(0, 1 << 40)
        finally:
            leader.close()
        per_file_ms, requests = [], {}
        for n in range(rounds):
            follower = PartitionLog(f"{root}/follower-{n}", topic="t", partition=0,
                                    storage=storage, replicated=True)
            try:
                start, mark = time.perf_counter(), log_mark(log)
                follower.append_files(offered).result(600)
                per_file_ms.append((time.perf_counter() - start) * 1000 / len(offered))
                requests = by_method(served(log, mark), f"follower-{n}/")
            finally:
                follower.close()
    return {"files": len(offered), "ms_per_file": statistics.median(per_file_ms),
            "requests_per_file": {m: c / len(offered) for m, c in requests.items() if c}}


def main(argv: list[str]) -> None:
    figures = measure(int(argv[0]) if argv else FILES)
    print(f"{figures['files']} files copied: {figures['ms_per_file']:.1f} ms a file (median of "
          f"{ROUNDS}); requests a file: " + ", ".join(
              f"{m} {c:.2f}" for m, c in figures["requests_per_file"].items()))


if __name__ == "__main__":
    main(sys.argv[1:])
