"""Where a record's time goes: stamps of its trip through the clients and the brokers, from
which `make bench` prints the latency breakdown of steps (e) and (g) (bench/latency_trace.py).

Off unless the process's environment names a folder in DELTABUS_TRACE_DIR (the bench sets it
before it starts Spark, so the brokers' processes inherit it). Then each process appends its
stamps to a file of its own there, one JSON line each, for the topics whose names start with
one of the comma-separated prefixes in DELTABUS_TRACE_TOPICS (every topic when unset):

    {"stage": "append", "topic": "t", "partition": 0, "first": 5, "last": 7, "pid": 123,
     "queued": ns, "taken": ns, ...}

A stage covers the offsets first..last and carries its named moments (time.time_ns(): one
clock for every process of the machine). Stages: "produce" (a client's request: `sent`,
`acked`), "append" and "copy" (a leader's and a follower's commit: `queued`, `taken`,
`built`, `committed`, `applied`), "hw" (the high watermark passing the offsets: `moved`),
"read" (a broker reading them for a fetch: `read`, and `replica`, the fetching follower or
-1), "fetched" (a consumer client's fetch answer: `received`).

Disabled, a stamp costs one attribute test. Pure: runs anywhere (clients, brokers); thread-safe.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import IO, Any

TRACE_DIR_ENV = "DELTABUS_TRACE_DIR"
TRACE_TOPICS_ENV = "DELTABUS_TRACE_TOPICS"


class _Tracer:
    def __init__(self, folder: str, prefixes: tuple[str, ...]) -> None:
        self._folder = folder
        self._prefixes = prefixes
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._pid = -1

    def traces(self, topic: str) -> bool:
        return not self._prefixes or topic.startswith(self._prefixes)

    def write(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            if self._pid == 0:
                return  # its folder could not be written: tracing ended in this process
            pid = os.getpid()
            try:
                if self._file is None or self._pid != pid:  # a forked worker: its own file
                    self._pid = pid
                    self._file = open(  # noqa: SIM115 (kept open for the process's life)
                        os.path.join(self._folder, f"trace-{pid}.jsonl"), "a", buffering=1)
                self._file.write(line)
            except OSError:  # the folder went (a bench or test that ended): never a failure
                self._pid = 0


def _from_environment() -> _Tracer | None:
    folder = os.environ.get(TRACE_DIR_ENV)
    if not folder:
        return None
    prefixes = tuple(p for p in os.environ.get(TRACE_TOPICS_ENV, "").split(",") if p)
    return _Tracer(folder, prefixes)


_tracer = _from_environment()


def start(folder: str, topic_prefixes: tuple[str, ...] = ()) -> None:
    """Trace the topics starting with `topic_prefixes` (every topic when empty) into `folder`,
    in this process and in the processes it starts from now on (Spark's, with the brokers)."""
    global _tracer
    os.makedirs(folder, exist_ok=True)
    os.environ[TRACE_DIR_ENV] = folder
    os.environ[TRACE_TOPICS_ENV] = ",".join(topic_prefixes)
    _tracer = _Tracer(folder, topic_prefixes)


def stop() -> None:
    """Trace nothing more, here or in processes started from now on."""
    global _tracer
    os.environ.pop(TRACE_DIR_ENV, None)
    os.environ.pop(TRACE_TOPICS_ENV, None)
    _tracer = None


def now_ns() -> int:
    """The moment, as stamps take it."""
    return time.time_ns()


def traced(topic: str) -> bool:
    """Whether stamps of `topic` are recorded (callers skip taking moments when not)."""
    return _tracer is not None and _tracer.traces(topic)


def stamp(stage: str, topic: str, partition: int, first: int, last: int,
          **moments: int) -> None:
    """Record that offsets first..last of `topic`-`partition` passed `stage` at `moments`
    (names -> time.time_ns()). Nothing when tracing is off for the topic."""
    if _tracer is None or not _tracer.traces(topic):
        return
    _tracer.write({"stage": stage, "topic": topic, "partition": partition, "first": first,
                   "last": last, "pid": os.getpid(), **moments})
