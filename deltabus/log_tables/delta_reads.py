"""delta-rs's loads of live tables, made robust to a listing that misses a commit file.

Why: appends commit a version every millisecond or two (delta_commit.py). delta-rs finds a
table's commits by listing `_delta_log`, and on a local disk a directory read while files are
added to it may return a later entry and miss an earlier one (readdir walks the directory in
hash order: a file created behind the walk's position is not returned, one created ahead of it
is). delta-rs then refuses the listing ("Expected contiguous commit files, but found gap"),
although the table is whole. Every load of a table that may be appended to goes through here
(`open_table`, `update`, `history`, `retry_gaps`); other errors are raised at once.

A missed file was created while the listing ran (readdir returns every entry that existed when
it began), so every version up to the one before the gap was already there: loading the table
at that version lists it whole. That version is as new as a listing begun a moment earlier would
have given, so `open_table` and `update` fall back to it when the missing commit file is on disk
after all. Listing again instead is no cure under a commit every millisecond to a directory of
thousands: each listing misses another file (tests/log_tables/test_delta_reads.py saw ten
seconds of tries fail on a loaded machine). A commit file that is really missing is not
papered over: its loads fail after `GAP_RETRY_S`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

from deltalake import DeltaTable

T = TypeVar("T")

# What delta-rs (delta-kernel) says of a listing with a version missing between two others.
_GAP_MESSAGES = ("Expected contiguous commit files", "are not contiguous")
# The first version the message names: the last one before the gap.
_VERSION_BEFORE_GAP = re.compile(r"found gap:.*?\bversion: (\d+)", re.DOTALL)
# How long listings are tried again before a gap with no commit file behind it is taken as real
# (a commit file removed while a listing ran, by log clean-up, shows as a gap for a moment).
GAP_RETRY_S = 10.0


def listing_gap(e: BaseException) -> bool:
    """Whether `e` is delta-rs refusing a `_delta_log` listing with a version missing."""
    text = str(e)
    return any(message in text for message in _GAP_MESSAGES)


def _version_before_listing_gap(e: BaseException, table_uri: str) -> int | None:
    """The version before the gap `e` names, when the commit file after it is on a local disk
    (so the listing missed it); None when the gap may be real or the store is not local."""
    found = _VERSION_BEFORE_GAP.search(str(e))
    parsed = urlparse(table_uri)
    if found is None or parsed.scheme not in ("", "file"):
        return None
    before = int(found.group(1))
    root = unquote(parsed.path) if parsed.scheme else table_uri
    missed = os.path.join(root, "_delta_log", f"{before + 1:020d}.json")
    return before if os.path.exists(missed) else None


def retry_gaps(load: Callable[[], T], *, table_uri: str | None = None,
               at_version: Callable[[int], T] | None = None) -> T:
    """`load()`, or `at_version(v)` with `v` the version before a gap the listing made up
    (when both `table_uri` and `at_version` are given); listed again while the gap may be real."""
    deadline = time.monotonic() + GAP_RETRY_S
    attempt = 0
    while True:
        try:
            return load()
        except Exception as e:
            if not listing_gap(e):
                raise
            if at_version is not None and table_uri is not None:
                before = _version_before_listing_gap(e, table_uri)
                if before is not None:
                    return at_version(before)
            if time.monotonic() > deadline:
                raise
        time.sleep(min(0.001 * attempt, 0.02))  # the first retry at once, later ones spaced
        attempt += 1


def open_table(path: str, *, storage_options: dict[str, str] | None = None,
               version: int | None = None) -> DeltaTable:
    """The table at `path` (at its newest version, or `version`)."""
    def at(v: int) -> DeltaTable:
        return open_table(path, storage_options=storage_options, version=v)

    return retry_gaps(lambda: DeltaTable(path, version=version, storage_options=storage_options),
                      table_uri=path, at_version=at if version is None else None)


def update(table: DeltaTable) -> None:
    """Bring `table` to its newest version (update_incremental)."""
    def at(v: int) -> None:
        if v > table.version():
            retry_gaps(lambda: table.load_as_version(v))

    retry_gaps(table.update_incremental, table_uri=table.table_uri, at_version=at)


def history(table: DeltaTable, limit: int | None = None) -> list[dict[str, Any]]:
    """The table's commitInfo, newest first (at most `limit`)."""
    return retry_gaps(lambda: table.history(limit))
