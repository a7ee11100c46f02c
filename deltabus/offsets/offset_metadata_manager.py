"""Committed offsets: Kafka's OffsetMetadataManager.

OffsetCommit (a member's, a standalone consumer's, and a committed transaction's offsets),
OffsetFetch, OffsetDelete and the expiry of an idle group's offsets, over the
`__consumer_offsets` Delta table (`OffsetStore`). Separate from membership
(`GroupMetadataManager`) as in Kafka: offsets are what the coordinator must not forget, and their
rules (which partitions exist, when a write is durable, when offsets expire) are not the
rebalance protocol's. Membership is consulted, never changed, except that a first commit makes
its classic group and an expiry forgets the group.

Runs in the driver. Thread-safe: the checks against a group take the coordinator's lock (shared
with the `GroupMetadataManager`), and the store's writes happen after it is released, so no
request waits on Delta behind the lock.

Invariants:
- A commit is acknowledged only once it is durable in `__consumer_offsets`.
- Offsets are kept only for partitions the cluster has (Kafka's metadata cache check): the others
  are answered UNKNOWN_TOPIC_OR_PARTITION and not written.
- A commit is checked against the group's generation (a classic group's) or the member's epoch
  (a consumer group's) before it is written: a member that missed a rebalance cannot commit.
- An OffsetCommit names at most offset.commit.partitions.max partitions, checked first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from deltabus import config as cfg
from deltabus import errors
from deltabus.metadata import MetadataImage
from deltabus.offsets.classic_group import COMPLETING_REBALANCE
from deltabus.offsets.group_limits import COMMIT_TIMEOUT_S, check_group_id, shown, wait_result
from deltabus.offsets.group_metadata_manager import GroupMetadataManager
from deltabus.offsets.offset_store import OffsetAndMetadata, OffsetCommit, OffsetStore

log = logging.getLogger(__name__)

# Each partition's answer to an OffsetCommit: None when committed, else why not.
PartitionErrors = dict[tuple[str, int], errors.DeltaBusError | None]


class OffsetMetadataManager:
    """Every group's committed offsets; in the driver, thread-safe with `lock`."""

    def __init__(self, store: OffsetStore, config: cfg.GroupConfig, clock: Callable[[], float],
                 metadata: Callable[[], MetadataImage], lock: threading.Lock,
                 groups: GroupMetadataManager) -> None:
        """`metadata` says which partitions exist; `lock` is the coordinator's, the one
        `groups` is guarded by."""
        self._store = store
        self._config = config
        self._clock = clock
        self._metadata = metadata
        self._lock = lock
        self._groups = groups

    def check_offset_commit(self, group_id: str, partitions: int) -> None:
        """The limits of a whole OffsetCommit: its group id, and how many partitions it names.
        Doors call this before anything else, so a request past them costs nothing more."""
        check_group_id(group_id)
        limit = self._config.offset_commit_partitions_max
        if partitions > limit:
            raise errors.InvalidRequestError(
                f"an OffsetCommit names {partitions} partitions, more than the "
                f"{limit} of offset.commit.partitions.max")

    def commit_offsets(self, group_id: str, generation_id: int, member_id: str,
                       offsets: dict[tuple[str, int], OffsetAndMetadata],
                       group_instance_id: str | None = None) -> Future[PartitionErrors]:
        """OffsetCommit: members of the current generation, or a standalone consumer
        (generation -1, no member id) while the group has no members. Resolves once durable,
        with each partition's answer: partitions the cluster does not have get
        UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers them, and are not written."""
        self.check_offset_commit(group_id, len(offsets))
        for (topic, partition), om in offsets.items():
            if om.offset < 0 or partition < 0:
                raise errors.InvalidCommitOffsetSizeError(
                    f"cannot commit offset {om.offset} of {shown(topic)}-{partition}")
        unknown = _unknown_partitions(self._metadata(), list(offsets))
        known = {tp: om for tp, om in offsets.items() if tp not in unknown}
        answers: PartitionErrors = {**dict.fromkeys(known), **unknown}
        if offsets and not known:  # Kafka asks the coordinator nothing: no group is made
            return _resolved(answers)
        with self._lock:
            self._check_commit(group_id, generation_id, member_id, group_instance_id)
        now_ms = int(time.time() * 1000)
        stored = self._store.commit([
            OffsetCommit(group_id, topic, partition,
                         OffsetAndMetadata(om.offset, om.leader_epoch, om.metadata, now_ms),
                         member_id, generation_id)
            for (topic, partition), om in known.items()])
        return _once_stored(stored, answers)

    def _check_commit(self, group_id: str, generation_id: int, member_id: str,
                      group_instance_id: str | None) -> None:
        """Lock held. An OffsetCommit's sender against the group (Kafka's
        validateOffsetCommit); a commit to a group the coordinator does not hold makes it."""
        consumers = self._groups.consumer_group(group_id)
        group = self._groups.classic_group(group_id)
        if consumers is not None and (consumers.members or member_id):
            consumers.validate_offset_commit(member_id, generation_id, self._clock())
        elif generation_id < 0 and not member_id:
            if group is not None and group.members:
                raise errors.UnknownMemberIdError(
                    f"group {group_id} has active members: a consumer outside it cannot "
                    "commit its offsets")
        else:
            group, member = self._groups.member(group_id, member_id, generation_id,
                                                group_instance_id)
            if group.state == COMPLETING_REBALANCE:
                raise errors.RebalanceInProgressError(
                    f"group {group_id} is completing a rebalance")
            member.last_heartbeat_s = self._clock()
        if group is None and consumers is None:
            self._groups.new_group(group_id)

    def check_txn_offset_commit(self, group_id: str, member_id: str, generation_id: int,
                                group_instance_id: str | None = None) -> None:
        """TxnOffsetCommit's check of the consumer that sent it (KIP-447), as Kafka's: a member
        id the group does not have is UNKNOWN_MEMBER_ID, a generation (>= 0) not the group's
        ILLEGAL_GENERATION, a replaced static member FENCED_INSTANCE_ID; a producer that names
        no member (generation -1, "") is not checked. A zombie consumer's producer cannot
        commit offsets for partitions the group gave to another member since."""
        check_group_id(group_id)
        with self._lock:
            consumers = self._groups.consumer_group(group_id)
            if consumers is not None and member_id:  # KIP-848: the generation is the epoch
                consumers.validate_offset_commit(member_id, generation_id, self._clock())
                return
            group = self._groups.classic_group(group_id)
            if group is not None:
                group.check_instance(member_id, group_instance_id)
            if member_id and (group is None or member_id not in group.members):
                raise errors.UnknownMemberIdError(f"member {member_id} is not in group {group_id}")
            if generation_id >= 0 and generation_id != (group.generation_id if group else -1):
                raise errors.IllegalGenerationError(
                    f"generation {generation_id} of group {group_id} is not the current one")

    def commit_transactional_offsets(self, group_id: str,
                                     offsets: dict[tuple[str, int], OffsetAndMetadata]
                                     ) -> Future[None]:
        """A committed transaction's offsets (TxnOffsetCommit) become the group's committed
        offsets, whatever its members and generation now: the transaction coordinator checked
        the producer when it took them, as Kafka's group coordinator materializes them on the
        commit marker. Resolves once durable."""
        now_ms = int(time.time() * 1000)
        return self._store.commit([
            OffsetCommit(group_id, topic, partition,
                         OffsetAndMetadata(om.offset, om.leader_epoch, om.metadata, now_ms))
            for (topic, partition), om in offsets.items()])

    def fetch_offsets(self, group_id: str, partitions: list[tuple[str, int]] | None = None
                      ) -> dict[tuple[str, int], OffsetAndMetadata]:
        """OffsetFetch: the committed offsets of a group (all, or of these partitions)."""
        check_group_id(group_id)
        committed = self._store.offsets(group_id)
        if partitions is None:
            return committed
        return {tp: committed[tp] for tp in partitions if tp in committed}

    def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]
                       ) -> PartitionErrors:
        """OffsetDelete (kafka-consumer-groups.sh --delete-offsets): tombstones in
        `__consumer_offsets` for the named partitions' committed offsets, durable before it
        returns, but for topics the group's members subscribe to (GROUP_SUBSCRIBED_TO_TOPIC:
        they would commit them again). Raises GROUP_ID_NOT_FOUND for a group with neither
        members nor offsets, and NON_EMPTY_GROUP for one whose members are not consumers
        (their subscriptions cannot be read), as Kafka's coordinator; NOT_COORDINATOR when the
        tombstones cannot be written (`_once_stored`)."""
        self.check_offset_commit(group_id, len(partitions))
        with self._lock:
            group = self._groups.classic_group(group_id)
            if group is None and not self._store.has_group(group_id):
                raise errors.GroupIdNotFoundError(f"group {group_id} does not exist")
            subscribed = group.subscribed_topics() if group is not None else set()
        committed = self._store.offsets(group_id)
        topics = self._metadata().topics
        answers: PartitionErrors = {}
        tombstones = []
        for topic, partition in partitions:
            if topic not in topics:  # as Kafka's KafkaApis, from its metadata cache
                answers[(topic, partition)] = errors.UnknownTopicOrPartitionError(
                    f"unknown topic {shown(topic)}")
            elif subscribed is None or topic in subscribed:
                answers[(topic, partition)] = errors.GroupSubscribedToTopicError(
                    f"group {group_id} has members subscribed to {shown(topic)}")
            else:
                answers[(topic, partition)] = None
                if (topic, partition) in committed:
                    tombstones.append(OffsetCommit(group_id, topic, partition, None))
        return wait_result(_once_stored(self._store.commit(tombstones), answers),
                           COMMIT_TIMEOUT_S)

    def expire_offsets(self) -> list[str]:
        """Drop the offsets of groups empty (and not committing) for offsets.retention.minutes.
        Returns the groups whose offsets expired."""
        retention_s = self._config.offsets_retention_minutes * 60
        now = time.time()
        expired = []
        for group_id in self._store.groups():
            with self._lock:
                group = self._groups.classic_group(group_id)
                consumers = self._groups.consumer_group(group_id)
                if group is not None and group.members or consumers is not None and \
                        consumers.members:
                    continue
                idle_since = max(self._store.last_commit_ms(group_id) / 1000,
                                 group.empty_since_s if group is not None else 0.0)
                if now - idle_since <= retention_s:
                    continue
                self._groups.remove_classic_group(group_id)
            self._store.delete_group(group_id).result()
            expired.append(group_id)
            log.info("offsets of group %s expired (offsets.retention.minutes)", group_id)
        return expired


def _unknown_partitions(image: MetadataImage, partitions: list[tuple[str, int]]
                        ) -> dict[tuple[str, int], errors.DeltaBusError]:
    """UNKNOWN_TOPIC_OR_PARTITION for each partition `image` does not have, as Kafka's
    KafkaApis answers an OffsetCommit from its metadata cache."""
    unknown: dict[tuple[str, int], errors.DeltaBusError] = {}
    for topic, partition in partitions:
        if image.partition(topic, partition) is not None:
            continue
        if len(topic) > cfg.TOPIC_NAME_LENGTH_MAX:
            unknown[(topic, partition)] = errors.UnknownTopicOrPartitionError(
                f"a topic name has at most {cfg.TOPIC_NAME_LENGTH_MAX} characters, not "
                f"{len(topic)}")
        else:
            unknown[(topic, partition)] = errors.UnknownTopicOrPartitionError(
                f"This server does not host this topic-partition: {topic}-{partition}")
    return unknown


def _resolved(answers: PartitionErrors) -> Future[PartitionErrors]:
    future: Future[PartitionErrors] = Future()
    future.set_result(answers)
    return future


def _once_stored(stored: Future[None], answers: PartitionErrors) -> Future[PartitionErrors]:
    """`answers` once the store's future (an OffsetCommit's or an OffsetDelete's write)
    resolves; its failure if it fails, a storage failure as NOT_COORDINATOR: what Kafka's
    coordinator answers when its append fails with KAFKA_STORAGE_ERROR
    (appendGroupMetadataErrorToResponseError; GroupCoordinatorService's
    handleOperationException for every write), and what Kafka's clients retry, after looking
    the coordinator up again. KAFKA_STORAGE_ERROR is no OffsetCommit error to them: Java's
    consumer throws "Unexpected error in commit", librdkafka gives up."""
    future: Future[PartitionErrors] = Future()

    def done(f: Future[None]) -> None:
        error = (errors.KafkaStorageError("the offset commit was cancelled") if f.cancelled()
                 else f.exception())
        if isinstance(error, errors.KafkaStorageError):
            future.set_exception(errors.NotCoordinatorError(
                f"the offset commit was not written: {error.message}"))
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(answers)

    stored.add_done_callback(done)
    return future
