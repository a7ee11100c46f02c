"""The bounds every group request is held to, and how a refusal names what it refuses.

Separate because the group coordinator's three parts (`GroupMetadataManager`,
`OffsetMetadataManager`, `GroupCoordinator` in front) and the doors all check a request against
them, and none of those parts may import another one above it: this module imports no part of
the coordinator, so each can import it. Pure: no state, no I/O.

Invariants:
- No JoinGroup or SyncGroup waits longer than group.max.rebalance.timeout.ms and
  LONG_POLL_SLACK_S; no OffsetCommit longer than COMMIT_TIMEOUT_S for `__consumer_offsets`.
- A group id has 1 to config.GROUP_ID_LENGTH_MAX characters, checked before anything is read or
  written for it.
- A refusal's message never repeats a hostile name in full (at most NAME_SHOWN_MAX characters),
  since doors copy it into every partition's answer.
"""

from __future__ import annotations

from concurrent import futures
from concurrent.futures import Future
from typing import Any

from deltabus import config as cfg
from deltabus import errors

# A JoinGroup or SyncGroup waits for the rebalance at most its rebalance timeout and this much.
LONG_POLL_SLACK_S = 5.0
COMMIT_TIMEOUT_S = 30.0  # an OffsetCommit waits this long for __consumer_offsets
# A name longer than this is cut short in error messages.
NAME_SHOWN_MAX = 64


def check_group_id(group_id: str) -> None:
    """INVALID_GROUP_ID for an empty or overlong group id."""
    if not group_id or len(group_id) > cfg.GROUP_ID_LENGTH_MAX:
        raise errors.InvalidGroupIdError(
            f"a group id has 1 to {cfg.GROUP_ID_LENGTH_MAX} characters, not {len(group_id)}")


def shown(name: str) -> str:
    """A name as error messages show it: cut short if long (a door copies a message into the
    answer of every partition it concerns)."""
    return name if len(name) <= NAME_SHOWN_MAX else f"{name[:NAME_SHOWN_MAX]}..."


def wait_result(future: Future, timeout_s: float) -> Any:
    """A coordinator future's result, or REQUEST_TIMED_OUT after `timeout_s`."""
    try:
        return future.result(timeout_s)
    except futures.TimeoutError:
        raise errors.RequestTimedOutError(
            f"the group coordinator did not answer in {timeout_s:.0f} s") from None
