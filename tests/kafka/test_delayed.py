"""The Kafka door's purgatory: a delayed response completes exactly once, when its last future
is done or at its deadline, whichever comes first; after the deadline its futures read as
REQUEST_TIMED_OUT."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from deltabus import errors
from deltabus.rpc.kafka.delayed import DelayedResponse, Purgatory, result_of

WAIT_S = 10.0  # how long a test waits for what must happen


@pytest.fixture
def purgatory() -> Iterator[Purgatory]:
    p = Purgatory("test-purgatory")
    p.start()
    yield p
    p.stop()


class Completions:
    """Counts `ready` calls; `wait` returns once there is one."""

    def __init__(self) -> None:
        self.calls = 0
        self._event = threading.Event()

    def ready(self) -> None:
        self.calls += 1
        self._event.set()

    def wait(self) -> bool:
        return self._event.wait(WAIT_S)


def test_a_delayed_response_completes_once_its_last_future_is_done(purgatory) -> None:
    first, second = Future[int](), Future[int]()
    done = Completions()
    purgatory.watch(DelayedResponse([first, second], time.monotonic() + 60, lambda: None),
                    done.ready)
    first.set_result(1)
    assert done.calls == 0  # the second is still pending
    second.set_result(2)
    assert done.wait() and done.calls == 1
    assert (result_of(first, 60, "x"), result_of(second, 60, "x")) == (1, 2)


def test_a_delayed_response_completes_at_its_deadline_and_only_then(purgatory) -> None:
    never = Future[int]()
    done = Completions()
    deadline = time.monotonic() + 0.2
    purgatory.watch(DelayedResponse([never], deadline, lambda: None), done.ready)
    assert done.wait() and time.monotonic() >= deadline
    with pytest.raises(errors.RequestTimedOutError, match="the append did not complete in 1 s"):
        result_of(never, 1, "the append")
    never.set_result(1)  # too late: no second completion
    assert done.calls == 1


def test_without_futures_a_delayed_response_completes_at_once(purgatory) -> None:
    done = Completions()
    purgatory.watch(DelayedResponse([], time.monotonic() + 60, lambda: None), done.ready)
    assert done.calls == 1


def test_completed_operations_are_purged_and_pending_ones_still_expire(purgatory) -> None:
    done = [Completions() for _ in range(3_000)]
    for i, completions in enumerate(done):
        future = Future[int]()
        deadline = time.monotonic() + (0.2 if i == len(done) - 1 else 60)
        purgatory.watch(DelayedResponse([future], deadline, lambda: None), completions.ready)
        if i < len(done) - 1:
            future.set_result(i)
    assert done[-1].wait()
    assert all(c.calls == 1 for c in done)
    assert purgatory.held() < 2_000  # the completed ones did not all stay
