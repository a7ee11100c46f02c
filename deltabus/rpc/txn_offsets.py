"""TxnOffsetCommit as both doors answer it: Kafka's checks, then the coordinator.

The consumer named must be the group's (KIP-447: UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
FENCED_INSTANCE_ID), each topic READ-able by the caller; the offsets that pass are held by the
transaction coordinator until the transaction commits.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from deltabus import errors
from deltabus.cluster.handler import TransactionHandler
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.rpc.access import Access
from deltabus.security.acls import Operation

PartitionAnswers = dict[tuple[str, int], errors.DeltaBusError | None]
# (topic, partition, offset, leader epoch, metadata), as a request names them
TxnOffset = tuple[str, int, int, int, str]


def commit_txn_offsets(coordinator: TransactionHandler, groups: GroupCoordinator | None,
                       access: Access, refused: errors.DeltaBusError | None,
                       request: Any, member: tuple[str, int, str | None],
                       offsets: Iterable[TxnOffset]) -> PartitionAnswers:
    """Each partition's answer. `request` carries transactional_id, group_id, producer_id and
    producer_epoch; `member` is the consumer's (member id, generation, group instance id)."""
    group_id: str = request.group_id
    if refused is None and groups is not None:
        try:
            groups.check_txn_offset_commit(group_id, *member)
        except errors.DeltaBusError as e:
            refused = e
    answers: PartitionAnswers = {}
    held: dict[tuple[str, int], tuple[int, int, str]] = {}
    for topic, partition, offset, leader_epoch, metadata in offsets:
        denied = refused or access.topic(Operation.READ, topic)
        answers[(topic, partition)] = denied
        if denied is None:
            held[(topic, partition)] = (offset, leader_epoch, metadata)
    if held:
        try:
            answers.update(coordinator.txn_offset_commit(
                request.transactional_id, group_id,
                request.producer_id, request.producer_epoch, held))
        except errors.DeltaBusError as e:
            answers.update(dict.fromkeys(held, e))
    return answers
