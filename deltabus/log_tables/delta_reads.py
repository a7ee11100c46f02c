"""delta-rs's loads of live tables, made robust to a listing that misses a commit file.

Why: appends commit a version every millisecond or two (delta_commit.py). delta-rs finds a
table's commits by listing `_delta_log`, and on a local disk a directory read while files are
added to it may return a later entry and miss an earlier one (readdir walks the directory in
hash order: a file created behind the walk's position is not returned, one created ahead of it
is). delta-rs then refuses the listing ("Expected contiguous commit files, but found gap"),
although the table is whole. Listing again sees the missing file: it was there before the one
after it. Every load of a table that may be appended to goes through here (`open_table`,
`update`, `history`, `retry_gaps`); other errors are raised at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from deltalake import DeltaTable

T = TypeVar("T")

# What delta-rs (delta-kernel) says of a listing with a version missing between two others.
_GAP_MESSAGES = ("Expected contiguous commit files", "are not contiguous")
# How long listings are tried again before the gap is taken as real. A listing fails only when
# a commit lands while it runs, so most second tries succeed; under a commit every 0.1-0.5 ms
# to a directory of 10,000 commits (tests/log_tables/test_delta_reads.py), a few loads in a
# hundred took 3-10 tries, and some over 20: a deadline, not a count. (A real gap, a commit file
# deleted by hand, then costs its loads this long before they fail.)
GAP_RETRY_S = 10.0


def listing_gap(e: BaseException) -> bool:
    """Whether `e` is delta-rs refusing a `_delta_log` listing with a version missing."""
    text = str(e)
    return any(message in text for message in _GAP_MESSAGES)


def retry_gaps(load: Callable[[], T]) -> T:
    """`load()`, listed again while delta-rs finds a gap in the commit files it listed."""
    deadline = time.monotonic() + GAP_RETRY_S
    attempt = 0
    while True:
        try:
            return load()
        except Exception as e:
            if not listing_gap(e) or time.monotonic() > deadline:
                raise
        time.sleep(min(0.001 * attempt, 0.02))  # the first retry at once, later ones spaced
        attempt += 1


def open_table(path: str, *, storage_options: dict[str, str] | None = None,
               version: int | None = None) -> DeltaTable:
    """The table at `path` (at its newest version, or `version`)."""
    return retry_gaps(lambda: DeltaTable(path, version=version,
                                         storage_options=storage_options))


def update(table: DeltaTable) -> None:
    """Bring `table` to its newest version (update_incremental)."""
    retry_gaps(table.update_incremental)


def history(table: DeltaTable, limit: int | None = None) -> list[dict[str, Any]]:
    """The table's commitInfo, newest first (at most `limit`)."""
    return retry_gaps(lambda: table.history(limit))
