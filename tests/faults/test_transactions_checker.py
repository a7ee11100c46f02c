"""The transactions checker (tests/faults/transactions.py) on synthetic observations, no
cluster: a clean history passes, and each defect it exists for (a duplicate, a missing input,
an aborted record returned, a committed offset going backwards) fails it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.faults import transactions
from tests.faults.history import History, read_history
from tests.faults.transactions import (
    ABORT_MARK,
    ABORTED,
    COMMIT_MARK,
    COMMITTED,
    UNKNOWN,
    TxnChecker,
    TxnReport,
    output_value,
    parse_output,
)

INPUTS = [f"p0-{i:08d}".encode() for i in range(6)]


@pytest.fixture
def history(tmp_path: Path):
    with History(tmp_path / "history.jsonl") as h:
        yield h


def clean(history: History) -> TxnChecker:
    """Transaction 1 commits inputs 0-2; 2 is aborted on purpose with 3-5; 3 is aborted by a
    fault with 3-5; 4 commits 3-5. The reader returns 1's and 4's records; the committed
    offsets move 0, 3, 3, 6."""
    checker = TxnChecker(history)
    checker.producer_made()
    checker.committed({0: -1001})
    checker.ended(1, COMMITTED, 3)
    checker.committed({0: 3})
    checker.ended(2, ABORTED, 3, deliberate=True)
    checker.committed({0: 3})
    checker.ended(3, ABORTED, 3)
    checker.ended(4, COMMITTED, 3)
    checker.committed({0: 6})
    for offset, value in enumerate(INPUTS[:3]):
        checker.returned(0, offset, output_value(value, 1, COMMIT_MARK))
    for offset, value in enumerate(INPUTS[3:], start=4):  # 3: transaction 1's marker
        checker.returned(0, offset, output_value(value, 4, COMMIT_MARK))
    return checker


def test_a_clean_history_passes(history: History) -> None:
    report = clean(history).result(INPUTS)
    report.assert_exactly_once(report.summary())
    assert (report.committed, report.aborted_deliberately, report.aborted_by_faults) == (2, 1, 1)
    assert (report.inputs, report.outputs, report.offset_reads) == (6, 6, 4)


def test_output_values_say_their_input_transaction_and_mark() -> None:
    assert parse_output(output_value(b"k0-00000001", 12, ABORT_MARK)) == (
        b"k0-00000001", 12, ABORT_MARK)


def failing(report: TxnReport) -> str:
    with pytest.raises(AssertionError):
        report.assert_exactly_once(report.summary())
    return report.summary()


def test_a_duplicate_fails(history: History) -> None:
    checker = clean(history)
    checker.ended(5, UNKNOWN, 1)  # a commit whose outcome was unknown did land
    checker.returned(1, 0, output_value(INPUTS[0], 5, COMMIT_MARK))
    report = checker.result(INPUTS)
    assert report.duplicates == 1 and report.unknown == 1
    assert "in the output 2 times" in "".join(report.examples)
    failing(report)


def test_a_record_read_twice_at_one_offset_is_no_duplicate(history: History) -> None:
    checker = clean(history)
    checker.returned(0, 0, output_value(INPUTS[0], 1, COMMIT_MARK))  # a reader's re-fetch
    report = checker.result(INPUTS)
    report.assert_exactly_once(report.summary())


def test_an_offset_read_with_another_value_fails(history: History) -> None:
    checker = clean(history)
    checker.returned(0, 0, output_value(INPUTS[1], 1, COMMIT_MARK))
    report = checker.result(INPUTS)
    assert report.errors
    failing(report)


def test_a_missing_input_fails(history: History) -> None:
    report = clean(history).result([*INPUTS, b"p1-00000000"])
    assert report.missing == 1
    assert "missing from the output: b'p1-00000000'" in failing(report) + "".join(
        report.examples)


@pytest.mark.parametrize("partition, offset, value", [
    pytest.param(0, 7, output_value(INPUTS[3], 2, ABORT_MARK), id="deliberate-abort"),
    # its value says "commit" (the loop meant to commit it): the loop's outcome judges it
    pytest.param(1, 0, output_value(INPUTS[4], 3, COMMIT_MARK), id="aborted-by-a-fault"),
])
def test_a_record_of_an_aborted_transaction_returned_fails(
        history: History, partition: int, offset: int, value: bytes) -> None:
    checker = clean(history)
    checker.returned(partition, offset, value)
    report = checker.result(INPUTS)
    assert report.aborted_seen == 1
    failing(report)


def test_a_committed_offset_going_backwards_fails(history: History) -> None:
    checker = clean(history)
    checker.committed({0: 5})
    report = checker.result(INPUTS)
    assert report.offset_regressions == 1
    failing(report)
    assert [op["f"] for op in read_history(history.path)] == ["offset-regression"]


def test_a_committed_offset_disappearing_fails(history: History) -> None:
    checker = clean(history)
    checker.committed({0: -1001})
    assert checker.result(INPUTS).offset_regressions == 1


def test_a_run_without_an_aborted_transaction_fails(history: History) -> None:
    """Nothing aborted: the aborted-records check had nothing to judge."""
    checker = TxnChecker(history)
    checker.ended(1, COMMITTED, 6)
    checker.committed({0: 6})
    for offset, value in enumerate(INPUTS):
        checker.returned(0, offset, output_value(value, 1, COMMIT_MARK))
    failing(checker.result(INPUTS))


def test_the_drain_waits_for_every_committed_record(history: History) -> None:
    checker = TxnChecker(history)
    checker.ended(1, COMMITTED, 3)
    checker.ended(2, ABORTED, 3, deliberate=True)
    checker.returned(0, 0, output_value(INPUTS[0], 1, COMMIT_MARK))
    assert checker.committed_unread() == 2
    checker.returned(0, 1, output_value(INPUTS[1], 1, COMMIT_MARK))
    checker.returned(0, 2, output_value(INPUTS[2], 1, COMMIT_MARK))
    assert checker.committed_unread() == 0


def test_a_call_past_its_bound_is_given_up_and_a_calls_error_comes_through(monkeypatch) -> None:
    """The loop's watchdog over librdkafka's transactional calls (librdkafka#5511)."""
    monkeypatch.setattr(transactions, "HUNG_S", 0.1)
    release = threading.Event()
    with pytest.raises(transactions.ClientHung):
        transactions._bounded(lambda: release.wait(10), "send-offsets")
    release.set()
    with pytest.raises(ValueError):
        transactions._bounded(lambda: int("x"), "commit")
    transactions._bounded(lambda: None, "begin")
