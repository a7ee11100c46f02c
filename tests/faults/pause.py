"""The pause nemesis (issue 40): SIGSTOP a broker's process, SIGCONT it later.

A stopped process is the fault a killed one is not: it holds its sockets, its in-memory state
and its idea of what it leads, and when it wakes it goes on from there, as a long GC pause, a
frozen VM or a swapped-out machine does. A paused leader that the controller fenced and replaced
meanwhile wakes as a zombie, with produce and fetch requests queued at its sockets.

What a pause meets here (tests/faults/test_paused_leader.py shows it): the controller fences the
broker once its session times out and cancels its Spark task; Spark then SIGKILLs the Python
worker that ran it (`spark.python.task.killTimeout`, 2 s after the cancel), stopped or not. So a
pause that ends within those seconds of the fence wakes a zombie for as long as it takes its
heartbeat to hear it is fenced or Spark to kill it; a longer one finds the process gone.

Runs in the test's process. Not thread-safe: one thread pauses and resumes.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from tests.faults.history import History

FAULT = "pause"


class Pause:
    """Pauses one broker of `cluster` (a `deltabus.Cluster`) at a time, and always resumes it:
    `resume` in the test, and again on leaving the `with` block, so a failing test never leaves
    a stopped broker to the next tests on the shared cluster. Each pause and resume goes to
    `history` when one is given."""

    def __init__(self, cluster: Any, history: History | None = None) -> None:
        self.cluster = cluster
        self.history = history
        self.broker_id: int | None = None  # the broker paused now
        self.pid: int | None = None
        self._paused_at = 0.0

    def pause(self, broker_id: int) -> int:
        """SIGSTOP broker `broker_id`'s process (its Python worker); returns its pid."""
        if self.pid is not None:
            raise RuntimeError(f"broker {self.broker_id} is paused already")
        pid = self.cluster.broker_pids()[broker_id]
        os.kill(pid, signal.SIGSTOP)
        self.broker_id, self.pid, self._paused_at = broker_id, pid, time.monotonic()
        if self.history is not None:
            self.history.fault(FAULT, {"broker": broker_id, "pid": pid})
        return pid

    def resume(self) -> bool:
        """SIGCONT the paused process. Returns whether it was still there to wake (Spark kills
        the worker of a fenced broker's cancelled task, stopped or not); nothing paused: False."""
        if self.pid is None:
            return False
        pid, broker_id = self.pid, self.broker_id
        self.pid = self.broker_id = None
        try:
            os.kill(pid, signal.SIGCONT)
            woke = True
        except ProcessLookupError:
            woke = False
        if self.history is not None:
            self.history.heal(FAULT, {"broker": broker_id, "pid": pid, "woke": woke,
                                      "paused_s": round(time.monotonic() - self._paused_at, 2)})
        return woke

    def __enter__(self) -> Pause:
        return self

    def __exit__(self, *exc: object) -> None:
        self.resume()
