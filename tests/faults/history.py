"""A run's history, Jepsen's way: every operation a client began (`invoke`) and how it ended
(`ok`, `fail`, or `info` when the outcome is unknown: a timeout may still have written), and
every fault the nemeses injected and healed, one JSON object per line in the order they
happened. A failed check names records; the history says what was going on around them, so a
failure can be read (and a run's schedule replayed: the nemesis lines carry their targets).

A line: {"index": 12, "time_ms": 5312.4, "process": "producer-1", "type": "ok", "f": "send",
"value": {...}}. Processes are the clients' names and "nemesis"."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"


class History:
    """Appends operations to `path` as they happen (thread-safe, flushed per line, so a run
    that hangs or is killed still leaves what it saw)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", encoding="utf-8")
        self._lock = threading.Lock()
        self._index = 0
        self._started = time.monotonic()
        self.counts: dict[tuple[str, str], int] = {}  # (f, type) -> how many

    def add(self, process: str, type_: str, f: str, value: Any = None) -> None:
        with self._lock:
            line = {"index": self._index, "time_ms": round(
                (time.monotonic() - self._started) * 1000, 1), "process": process,
                "type": type_, "f": f, "value": value}
            self._index += 1
            self.counts[(f, type_)] = self.counts.get((f, type_), 0) + 1
            if not self._file.closed:
                self._file.write(json.dumps(line, default=str) + "\n")
                self._file.flush()

    def invoke(self, process: str, f: str, value: Any = None) -> None:
        self.add(process, INVOKE, f, value)

    def ok(self, process: str, f: str, value: Any = None) -> None:
        self.add(process, OK, f, value)

    def fail(self, process: str, f: str, value: Any = None) -> None:
        self.add(process, FAIL, f, value)

    def info(self, process: str, f: str, value: Any = None) -> None:
        self.add(process, INFO, f, value)

    def fault(self, f: str, value: Any = None) -> None:
        """A nemesis began a fault (`f` names it: "partition", "pause", ...)."""
        self.add("nemesis", INFO, f"start-{f}", value)

    def heal(self, f: str, value: Any = None) -> None:
        self.add("nemesis", INFO, f"stop-{f}", value)

    def count(self, f: str, type_: str = OK) -> int:
        with self._lock:
            return self.counts.get((f, type_), 0)

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """A history file's operations, in order."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
