"""What one request may name, checked by both doors before anything is read: at most
REQUEST_PARTITIONS_MAX partitions, none of them twice.

Why: a broker reads every partition a Fetch names before the answer's byte limits cut it, and a
ListOffsets by timestamp may read files for each entry, so a small request naming one partition
100,000 times made the broker do 100,000 reads. Kafka answers a ListOffsets entry whose partition
appears twice with INVALID_REQUEST (ListOffsetsRequest.duplicatePartitions); deltabus does the
same, and refuses a Fetch with duplicates as a whole (nothing is read for it).

Pure: no I/O, no transport.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from deltabus import config as cfg
from deltabus import errors


def check_partition_count(api: str, count: int) -> None:
    """Raise InvalidRequestError when a request names more partitions than the limit."""
    if count > cfg.REQUEST_PARTITIONS_MAX:
        raise errors.InvalidRequestError(
            f"a {api} request names {count} partitions, more than the limit of "
            f"{cfg.REQUEST_PARTITIONS_MAX} (deltabus's REQUEST_PARTITIONS_MAX)")


def duplicates(partitions: Iterable[tuple[str, int]]) -> set[tuple[str, int]]:
    """The (topic, partition) pairs that appear more than once."""
    return {tp for tp, n in collections.Counter(partitions).items() if n > 1}


def duplicate_error(api: str, partition: tuple[str, int]) -> errors.DeltaBusError:
    topic, index = partition
    return errors.InvalidRequestError(
        f"a {api} request names partition {topic}-{index} more than once")


def check_distinct(api: str, partitions: Iterable[tuple[str, int]]) -> None:
    """Raise InvalidRequestError, naming one of them, when a partition appears twice."""
    twice = duplicates(partitions)
    if twice:
        raise duplicate_error(api, min(twice))
