"""Topics, partitions and their leaders and ISRs (KRaft's ReplicationControlManager). Runs in the
driver, inside the controller.

Every handler here takes a request and the current `MetadataState`, validates the request
(raising a DeltaBusError, or answering one per item), and returns the records to commit and the
answer: it changes nothing, so the controller can run it under its lock, write the records, and
only then replay them. Elections after a broker change are computed against the broker registry
as it will be once the broker records are replayed (`BrokerRegistry.replayed`).

Invariants the records keep: a leader is always in the ISR; the ISR is never empty; a leader
change bumps the leader epoch; only the current leader may change the ISR (AlterPartition), and
only from the ISR the controller holds (a stale request gets INVALID_UPDATE_VERSION). A broker
that leaves (fenced, or in controlled shutdown) leaves every ISR it is in unless it is the last
member; a partition with no live ISR member goes offline (leader -1) until one registers again,
unless the topic allows unclean leader election. A replica whose broker reports it offline (its
table lost: see `topic_tables` on who creates tables) leaves the ISR the same way and is never
elected, cleanly or not, while it is reported.

Not thread-safe: the controller holds its lock around every call.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Collection, Sequence

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.broker_registry import BrokerRegistry
from deltabus.cluster.catch_up import CatchUpTask
from deltabus.cluster.log_cleaner import CleanerTask
from deltabus.cluster.metadata_records import (
    ConfigRecord,
    ControllerResult,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RemoveTopicRecord,
    TopicRecord,
)
from deltabus.cluster.metadata_state import (
    MetadataState,
    PartitionRegistration,
    TopicRegistration,
)
from deltabus.cluster.replica_placement import assign_replicas
from deltabus.metadata import NO_LEADER, NewTopic, PartitionState, TopicResult, new_topic_id
from deltabus.storage import Storage
from deltabus.topics import INTERNAL_TOPICS, colliding_topic, validate_topic_name

log = logging.getLogger(__name__)

PartitionResults = dict[tuple[str, int], errors.DeltaBusError | None]
Reassignment = tuple[str, int, list[int]]  # (topic, partition, target replicas)


# ---- topics ----------------------------------------------------------------------------------

def create_topic(state: MetadataState, config: cfg.ClusterConfig, topic: NewTopic, *,
                 duplicated: bool = False,
                 creating: Collection[str] = ()) -> ControllerResult[TopicResult]:
    """Kafka's CreateTopics for one topic (`duplicated`: the request names it twice;
    `creating`: topics the same request creates before it)."""
    if duplicated:
        raise errors.InvalidRequestError(
            f"Create topics request from client has multiple entries for {topic.name}")
    validate_topic_name(topic.name)
    if topic.name in state.topics:
        raise errors.TopicAlreadyExistsError(f"Topic '{topic.name}' already exists.")
    clash = colliding_topic(topic.name, [*state.topics, *creating])
    if clash is not None:
        raise errors.InvalidTopicError(
            f"Topic '{topic.name}' collides with existing topic: {clash} (names that differ "
            "only in case are one directory on a case-insensitive file system)")
    configs = config.pinned_overrides(dict(topic.configs or {}))
    diskless = cfg.topic_config(configs).diskless_enable  # raises InvalidConfigError
    if topic.replica_assignment:
        assignment = _check_assignment(state.brokers, topic)
        if diskless and any(len(replicas) > 1 for replicas in assignment):
            raise errors.InvalidReplicaAssignmentError(
                "A diskless topic's partition has one replica, its leader: the store keeps "
                "its one table durable")
    else:
        assignment = _assign(state.brokers, config, topic, diskless=diskless)
    topic_id = new_topic_id()
    records: list[MetadataRecord] = [TopicRecord(topic.name, topic_id)]
    records += _new_partitions(topic.name, assignment, 0)
    records += [ConfigRecord(topic.name, key, value) for key, value in sorted(configs.items())]
    return ControllerResult(records, TopicResult(topic.name, None, topic_id, len(assignment),
                                                 len(assignment[0])))


def create_topics(state: MetadataState, config: cfg.ClusterConfig,
                  topics: list[NewTopic]) -> ControllerResult[list[TopicResult]]:
    """Kafka's CreateTopics: each topic checked on its own (`create_topic`) and against the
    cluster's limits with the topics before it in the request; the records of every topic
    that passes are returned together, for one metadata commit."""
    names = collections.Counter(t.name for t in topics)
    topic_count, partition_count = len(state.topics), _partition_count(state)
    records: list[MetadataRecord] = []
    results: list[TopicResult] = []
    accepted: list[str] = []
    for topic in topics:
        try:
            result = create_topic(state, config, topic, duplicated=names[topic.name] > 1,
                                  creating=accepted)
            added = result.response.num_partitions
            _check_cluster_limits(config, topic.name, topic_count + 1, partition_count + added)
        except errors.DeltaBusError as e:
            results.append(TopicResult(topic.name, e))
            continue
        topic_count, partition_count = topic_count + 1, partition_count + added
        accepted.append(topic.name)
        records += result.records
        results.append(result.response)
    return ControllerResult(records, results)


def auto_create_topics(state: MetadataState, config: cfg.ClusterConfig,
                       names: list[str]) -> ControllerResult[list[TopicResult]]:
    """Metadata's auto-creation (auto.create.topics.enable) of the `names` missing: with the
    cluster's defaults, and all or nothing as to the limits: more than
    auto.create.topics.per.request.max topics, or more than the cluster's limits leave room
    for, is refused whole with POLICY_VIOLATION. A name that is no legal topic is only left out,
    as a CreateTopics would refuse it."""
    missing = [n for n in dict.fromkeys(names) if n not in state.topics]
    limit = config.auto_create_topics_per_request_max
    if len(missing) > limit:
        raise errors.PolicyViolationError(
            f"Unable to auto-create {len(missing)} topics in one request: "
            f"auto.create.topics.per.request.max is {limit}")
    result = create_topics(state, config, [NewTopic(n) for n in missing])
    for r in result.response:
        if isinstance(r.error, errors.PolicyViolationError):
            raise r.error
    return result


def _partition_count(state: MetadataState) -> int:
    return sum(len(t.partitions) for t in state.topics.values())


def _check_cluster_limits(config: cfg.ClusterConfig, topic: str, topics: int,
                          partitions: int) -> None:
    """POLICY_VIOLATION when the cluster would hold more topics or partitions than it may."""
    if topics > config.max_topics:
        raise errors.PolicyViolationError(
            f"Unable to create topic {topic}: the cluster would have {topics} topics, more "
            f"than max.topics ({config.max_topics})")
    if partitions > config.max_partitions:
        raise errors.PolicyViolationError(
            f"Unable to create partitions of {topic}: the cluster would have {partitions} "
            f"partitions, more than max.partitions ({config.max_partitions})")


def _new_partitions(topic: str, assignment: list[list[int]],
                    first: int) -> list[MetadataRecord]:
    """Records for partitions `first`.. of an assignment; each starts led by its first replica
    with every replica in sync (a new partition's tables are empty)."""
    return [PartitionRecord(topic, p, tuple(replicas), tuple(replicas), replicas[0], 0)
            for p, replicas in enumerate(assignment) if p >= first]


def _check_assignment(brokers: BrokerRegistry, topic: NewTopic) -> list[list[int]]:
    """An explicit replica assignment, checked as Kafka checks it."""
    assignment = topic.replica_assignment or {}
    if topic.num_partitions != -1 or topic.replication_factor != -1:
        raise errors.InvalidRequestError(
            "Both numPartitions or replicationFactor and replicasAssignments were set. "
            "Both cannot be used at the same time.")
    if sorted(assignment) != list(range(len(assignment))):
        raise errors.InvalidReplicaAssignmentError(
            f"Partitions should be a consecutive 0-based integer sequence: "
            f"{sorted(assignment)}")
    if len(assignment) > cfg.PARTITIONS_MAX:
        raise errors.InvalidPartitionsError(
            f"Number of partitions {len(assignment)} is more than the limit "
            f"{cfg.PARTITIONS_MAX}.")
    live = set(brokers.live_broker_ids())
    sizes = {len(replicas) for replicas in assignment.values()}
    for p, replicas in sorted(assignment.items()):
        if not replicas or len(set(replicas)) != len(replicas):
            raise errors.InvalidReplicaAssignmentError(
                f"Partition {p} has an empty or duplicated replica list {replicas}.")
        unknown = [b for b in replicas if b not in live]
        if unknown:
            raise errors.InvalidReplicaAssignmentError(
                f"Partition {p} names brokers {unknown} that are not live.")
    if len(sizes) > 1:
        raise errors.InvalidReplicaAssignmentError(
            "All partitions should have the same number of replicas.")
    return [list(assignment[p]) for p in range(len(assignment))]


def _assign(brokers: BrokerRegistry, config: cfg.ClusterConfig,
            topic: NewTopic, *, diskless: bool = False) -> list[list[int]]:
    """Kafka's placement; a diskless topic's partitions get one replica each (their leader,
    spread over the brokers), whatever replication factor is asked: the store is the copy."""
    partitions = (config.num_partitions if topic.num_partitions == -1
                  else topic.num_partitions)
    if partitions < 1:
        raise errors.InvalidPartitionsError("Number of partitions must be larger than 0.")
    if partitions > cfg.PARTITIONS_MAX:
        raise errors.InvalidPartitionsError(
            f"Number of partitions {partitions} is more than the limit {cfg.PARTITIONS_MAX}.")
    rf = (config.default_replication_factor if topic.replication_factor == -1
          else topic.replication_factor)
    if rf < 1:
        raise errors.InvalidReplicationFactorError(
            "Replication factor must be larger than 0.")
    return _place(brokers, partitions, 1 if diskless else rf)


def _place(brokers: BrokerRegistry, partitions: int, rf: int) -> list[list[int]]:
    live = brokers.live_broker_ids()
    if rf > len(live):
        raise errors.InvalidReplicationFactorError(
            f"Replication factor: {rf} larger than available brokers: {len(live)}.")
    return assign_replicas(live, partitions, rf, brokers.racks(live))


def create_partitions(state: MetadataState, config: cfg.ClusterConfig, name: str,
                      count: int) -> ControllerResult[TopicResult]:
    """Kafka's CreatePartitions for one topic: `count` is its new total. New partitions get
    replicas as a new topic would, with the topic's replication factor; the cluster stays
    within max.partitions."""
    topic = state.topics.get(name)
    if topic is None:
        raise errors.UnknownTopicOrPartitionError(f"Topic '{name}' does not exist.")
    current = len(topic.partitions)
    if count <= current:
        raise errors.InvalidPartitionsError(
            f"Topic currently has {current} partitions, which is "
            f"{'higher than' if count < current else 'equal to'} the requested {count}.")
    if count > cfg.PARTITIONS_MAX:
        raise errors.InvalidPartitionsError(
            f"Number of partitions {count} is more than the limit {cfg.PARTITIONS_MAX}.")
    _check_cluster_limits(config, name, len(state.topics),
                          _partition_count(state) - current + count)
    rf = len(topic.partitions[0].replicas)
    records = _new_partitions(name, _place(state.brokers, count, rf), current)
    return ControllerResult(records, TopicResult(name, None, "", count, rf))


def delete_topic(state: MetadataState, name: str) -> ControllerResult[TopicResult]:
    """Kafka's DeleteTopics for one topic (internal topics cannot be deleted)."""
    topic = state.topics.get(name)
    if topic is None:
        raise errors.UnknownTopicOrPartitionError(f"Topic '{name}' does not exist.")
    if name in INTERNAL_TOPICS:
        raise errors.InvalidTopicError(f"Topic '{name}' is internal and cannot be deleted.")
    return ControllerResult([RemoveTopicRecord(name, topic.topic_id)],
                            TopicResult(name, None, topic.topic_id))


# ---- ISR changes -----------------------------------------------------------------------------

def alter_partition(state: MetadataState, broker_id: int, broker_epoch: int, topic: str,
                    partition: int, leader_epoch: int, isr: list[int],
                    new_isr: list[int]) -> ControllerResult[PartitionState]:
    """Kafka's AlterPartition: a leader shrinks or grows its partition's ISR. The answer is the
    partition's state once the records are committed."""
    state.brokers.check_epoch(broker_id, broker_epoch)
    s = state.partition(topic, partition)
    if s is None:
        raise errors.UnknownTopicOrPartitionError(
            f"This server does not host this topic-partition: {topic}-{partition}")
    if s.leader != broker_id:
        raise errors.NotLeaderOrFollowerError(
            f"broker {broker_id} does not lead {topic}-{partition} (leader: {s.leader})")
    if leader_epoch != s.leader_epoch:
        raise errors.FencedLeaderEpochError(
            f"leader epoch {leader_epoch} of {topic}-{partition} is not the current "
            f"{s.leader_epoch}")
    if sorted(isr) != sorted(s.isr):
        raise errors.InvalidUpdateVersionError(
            f"the ISR of {topic}-{partition} is {list(s.isr)}, not {isr}")
    if broker_id not in new_isr or any(r not in s.replicas for r in new_isr):
        raise errors.InvalidRequestError(
            f"ISR {new_isr} must hold the leader and only replicas of {topic}-{partition} "
            f"({list(s.replicas)})")
    live = state.brokers.leader_candidates((topic, partition))
    added = [r for r in new_isr if r not in s.isr]
    if any(r not in live for r in added):
        raise errors.IneligibleReplicaError(
            f"replicas {added} cannot join the ISR of {topic}-{partition}: not all live")
    ordered = tuple(r for r in s.replicas if r in new_isr)
    records: list[MetadataRecord] = []
    if ordered != s.isr:
        log.info("%s-%d ISR %s -> %s", topic, partition, list(s.isr), list(ordered))
        records.append(PartitionChangeRecord(topic, partition, isr=ordered))
    answer = PartitionState(partition, s.leader, s.leader_epoch, s.replicas, ordered)
    return ControllerResult(records, answer)


# ---- elections -------------------------------------------------------------------------------

def elect_after_broker_change(state: MetadataState, config: cfg.ClusterConfig,
                              broker_records: Sequence[MetadataRecord],
                              leaving: int | None = None) -> list[MetadataRecord]:
    """`broker_records` and the partition changes they bring: a `leaving` broker (fenced, or in
    controlled shutdown) leaves every ISR it is in (but the last member), and every partition
    without an eligible leader gets one: the first live in-sync replica in replica order, or,
    where the topic allows unclean election, the first live replica at all. A broker in
    controlled shutdown keeps what no other in-sync replica can take, until it stops. Leader
    changes are metadata records, so epochs survive restarts.

    A replica its broker reports offline (its table is lost) is treated as a leaving broker
    for that partition alone: it leaves the ISR (but the last member) and is never elected,
    so nobody leads, and nobody truncates to, a log that lost its records."""
    after = state.brokers.replayed(broker_records)
    live = after.leader_candidates()
    records = list(broker_records)
    leads = _leader_counts(state)
    for name, topic in state.topics.items():
        unclean = config.topic_config(topic.configs).unclean_leader_election_enable
        diskless = cfg.is_diskless(topic.configs)
        for p, s in topic.partitions.items():
            offline = after.offline((name, p))
            candidates = live - offline
            if diskless:
                move = _diskless_failover(name, p, s, candidates, leads)
                if move is not None:
                    records.append(move)
                continue
            isr = list(s.isr)
            for gone in (leaving, *sorted(offline)):
                if gone in isr and len(isr) > 1:
                    isr.remove(gone)
            leader = s.leader
            if leader not in candidates:
                stopping = after.get(leader)
                alive = stopping is not None and not stopping.fenced and leader not in offline
                # Never elect an out-of-sync replica while the leader still runs.
                leader, isr = _elect(s.replicas, isr, candidates, unclean and not alive)
                if leader == NO_LEADER and alive and s.leader in isr:
                    leader = s.leader  # controlled shutdown: no one else can lead yet
            change = _leader_change(name, p, s, leader, isr)
            if change is not None:
                records.append(change)
    return records


def _leader_counts(state: MetadataState) -> collections.Counter[int]:
    """Partitions each broker leads."""
    return collections.Counter(s.leader for topic in state.topics.values()
                               for s in topic.partitions.values() if s.leader != NO_LEADER)


def _diskless_failover(topic: str, partition: int, s: PartitionRegistration,
                       candidates: set[int], leads: collections.Counter[int]
                       ) -> PartitionChangeRecord | None:
    """A diskless partition whose leader is gone moves, in metadata only, to the live broker
    leading the fewest partitions (`leads`, updated): any broker can open its one table. With
    no broker live it waits, leaderless, for the first to register."""
    if s.leader in candidates:
        return None
    if not candidates:
        if s.leader == NO_LEADER:
            return None
        log.info("%s-%d (diskless) leader %d -> none: no broker is live", topic, partition,
                 s.leader)
        return PartitionChangeRecord(topic, partition, leader=NO_LEADER,
                                     leader_epoch=s.leader_epoch + 1)
    leader = min(sorted(candidates), key=lambda b: leads[b])
    leads[leader] += 1
    if s.leader != NO_LEADER:
        leads[s.leader] -= 1
    log.info("%s-%d (diskless) leader %d -> %d at epoch %d (a broker change: metadata only)",
             topic, partition, s.leader, leader, s.leader_epoch + 1)
    return diskless_move(topic, partition, s, leader)


def diskless_move(topic: str, partition: int, s: PartitionRegistration,
                  leader: int) -> PartitionChangeRecord:
    """A diskless partition led by `leader` from the next epoch on: its one replica, its ISR."""
    return PartitionChangeRecord(topic, partition, leader=leader,
                                 leader_epoch=s.leader_epoch + 1, isr=(leader,),
                                 replicas=(leader,))


def _leader_change(topic: str, partition: int, s: PartitionRegistration, leader: int,
                   isr: list[int]) -> PartitionChangeRecord | None:
    change = PartitionChangeRecord(topic, partition)
    if tuple(isr) != s.isr:
        change = dataclasses.replace(change, isr=tuple(isr))
    if leader != s.leader:
        change = dataclasses.replace(change, leader=leader, leader_epoch=s.leader_epoch + 1)
        if leader != NO_LEADER and leader not in s.isr:
            log.warning("unclean leader election: %s-%d led by out-of-sync replica %d; "
                        "records only the old ISR held are lost", topic, partition, leader)
    if change == PartitionChangeRecord(topic, partition):
        return None
    log.info("%s-%d leader %d -> %d at epoch %d, ISR %s -> %s (a broker change)", topic,
             partition, s.leader, leader, s.leader_epoch + (leader != s.leader), list(s.isr),
             isr)
    return change


def _elect(replicas: Sequence[int], isr: list[int], live: set[int],
           unclean: bool) -> tuple[int, list[int]]:
    """(leader, ISR) for a partition whose leader is gone."""
    for r in replicas:
        if r in isr and r in live:
            return r, isr
    if unclean:
        for r in replicas:
            if r in live:
                return r, [r]
    return NO_LEADER, isr


def elect_leaders(state: MetadataState, election_type: str,
                  partitions: list[tuple[str, int]] | None
                  ) -> ControllerResult[PartitionResults]:
    """Kafka's ElectLeaders. "preferred": give each partition its first replica as leader
    where that replica is live and in sync. "unclean": give a partition without a leader any
    live replica. `partitions` None means all; the answer is an error or None per partition."""
    if election_type not in ("preferred", "unclean"):
        raise errors.InvalidRequestError(
            f"election type must be preferred or unclean, not {election_type!r}")
    if partitions is None:
        partitions = [(t, p) for t, topic in sorted(state.topics.items())
                      for p in sorted(topic.partitions)]
    results: PartitionResults = {}
    records: list[MetadataRecord] = []
    for topic, partition in partitions:
        s = state.partition(topic, partition)
        live = state.brokers.leader_candidates((topic, partition))
        if s is None:
            results[(topic, partition)] = errors.UnknownTopicOrPartitionError(
                f"The partition {topic}-{partition} does not exist.")
            continue
        current = s.replicas[0] if election_type == "preferred" else s.leader
        if s.leader == current and current in live:
            results[(topic, partition)] = errors.ElectionNotNeededError(
                "Leader election not needed for topic partition")
            continue
        leader, isr = _choose_leader(election_type, s, live)
        if leader == NO_LEADER or leader == s.leader:
            failed = (errors.PreferredLeaderNotAvailableError if election_type == "preferred"
                      else errors.EligibleLeadersNotAvailableError)  # Kafka's, per type
            results[(topic, partition)] = failed(
                f"Failed to elect leader for partition {topic}-{partition} under "
                f"strategy {election_type}")
        else:
            log.info("%s-%d leader %d -> %d at epoch %d (%s election)", topic, partition,
                     s.leader, leader, s.leader_epoch + 1, election_type)
            records.append(PartitionChangeRecord(topic, partition, leader=leader,
                                                 leader_epoch=s.leader_epoch + 1,
                                                 isr=tuple(isr)))
            results[(topic, partition)] = None
    return ControllerResult(records, results)


def _choose_leader(election_type: str, s: PartitionRegistration,
                   live: set[int]) -> tuple[int, list[int]]:
    """(leader, ISR) an ElectLeaders request would give a partition (NO_LEADER: none)."""
    if election_type == "preferred":
        preferred = s.replicas[0]
        if preferred in live and preferred in s.isr:
            return preferred, list(s.isr)
        return NO_LEADER, list(s.isr)
    return _elect(s.replicas, list(s.isr), live, unclean=True)


# ---- reassignments ---------------------------------------------------------------------------

def reassign_partitions(state: MetadataState, targets: dict[tuple[str, int], list[int]]
                        ) -> ControllerResult[tuple[PartitionResults, list[Reassignment]]]:
    """Kafka's AlterPartitionReassignments, checked: the answer is an error or None per
    partition, and the reassignments to start (those whose replicas change). Nothing is written
    yet: the new replicas catch up first (`start_reassignments`)."""
    results: PartitionResults = {}
    started: list[Reassignment] = []
    moved: list[MetadataRecord] = []
    live = state.brokers.leader_candidates()
    for (topic, partition), replicas in targets.items():
        s = state.partition(topic, partition)
        try:
            s = _check_reassignment(topic, partition, s, replicas, live)
            diskless = cfg.is_diskless(state.topics[topic].configs)
            if diskless and len(replicas) != 1:
                raise errors.InvalidReplicaAssignmentError(
                    f"{topic}-{partition} is diskless: its one replica is its leader, so a "
                    f"reassignment names one broker, not {replicas}")
        except errors.DeltaBusError as e:
            results[(topic, partition)] = e
            continue
        results[(topic, partition)] = None
        if tuple(replicas) == s.replicas:
            continue
        if diskless:  # metadata only: the new leader opens the partition's one table
            log.info("%s-%d (diskless) moves to broker %d at epoch %d: metadata only", topic,
                     partition, replicas[0], s.leader_epoch + 1)
            moved.append(diskless_move(topic, partition, s, replicas[0]))
        else:
            started.append((topic, partition, list(replicas)))
    return ControllerResult(moved, (results, started))


def _check_reassignment(topic: str, partition: int, s: PartitionRegistration | None,
                        replicas: list[int], live: set[int]) -> PartitionRegistration:
    if s is None:
        raise errors.UnknownTopicOrPartitionError(
            f"The partition {topic}-{partition} does not exist.")
    if not replicas or len(set(replicas)) != len(replicas):
        raise errors.InvalidReplicaAssignmentError(
            f"The proposed assignment {replicas} for {topic}-{partition} is empty or contains "
            "duplicates.")
    new = [r for r in replicas if r not in s.replicas]
    if any(r not in live for r in new):
        raise errors.InvalidReplicaAssignmentError(
            f"The proposed assignment for {topic}-{partition} contains brokers that are not "
            f"live: {[r for r in new if r not in live]}")
    if s.adding_replicas or s.removing_replicas:
        raise errors.InvalidRequestError(
            f"A reassignment of {topic}-{partition} is already in progress.")
    return s


def reassignment_catch_up_tasks(state: MetadataState, storage: Storage,
                                started: list[Reassignment]) -> list[CatchUpTask]:
    """What the catch-up job copies before new replicas join: each from its partition's
    leader (partitions without a leader or gone meanwhile are skipped)."""
    tasks = []
    for topic, partition, replicas in started:
        s = state.partition(topic, partition)
        if s is None or s.leader == NO_LEADER:
            continue
        tasks += [CatchUpTask(storage, topic, partition, s.leader, r)
                  for r in replicas if r not in s.replicas]
    return tasks


def added_replicas(state: MetadataState,
                   started: list[Reassignment]) -> list[tuple[str, int, int]]:
    """(topic, partition, broker) of each replica the reassignments add: their tables must
    exist before they are copied into or opened."""
    added = []
    for topic, partition, replicas in started:
        s = state.partition(topic, partition)
        if s is not None:
            added += [(topic, partition, r) for r in replicas if r not in s.replicas]
    return added


def start_reassignments(state: MetadataState,
                        started: list[Reassignment]) -> list[MetadataRecord]:
    """Add the new replicas (as `adding`, followers that catch up) and mark the ones to go as
    `removing`; the replica list holds both until the reassignment completes."""
    records: list[MetadataRecord] = []
    for topic, partition, replicas in started:
        s = state.partition(topic, partition)
        if s is None:
            continue
        adding = tuple(r for r in replicas if r not in s.replicas)
        removing = tuple(r for r in s.replicas if r not in replicas)
        records.append(PartitionChangeRecord(
            topic, partition, replicas=tuple(replicas) + removing, adding_replicas=adding,
            removing_replicas=removing))
    return records


def cancel_reassignment(state: MetadataState, topic: str,
                        partition: int) -> ControllerResult[tuple[int, ...]]:
    """Kafka's cancel (AlterPartitionReassignments with null replicas): back to the replicas
    the reassignment started from, as Kafka reverts one: the replicas being added go, those
    to be removed stay; a leader among the added hands over. The answer is the replicas
    dropped (whose tables may go once brokers closed them)."""
    s = state.partition(topic, partition)
    if s is None:
        raise errors.UnknownTopicOrPartitionError(
            f"The partition {topic}-{partition} does not exist.")
    if not (s.adding_replicas or s.removing_replicas):
        raise errors.NoReassignmentInProgressError(
            f"No reassignment is in progress for topic {topic} partition {partition}")
    replicas = tuple(r for r in s.replicas if r not in s.adding_replicas)
    isr = tuple(r for r in s.isr if r in replicas)
    change = PartitionChangeRecord(topic, partition, replicas=replicas, isr=isr,
                                   adding_replicas=(), removing_replicas=())
    change = _leader_within(state, s.leader, s.leader_epoch, change, replicas, isr)
    return ControllerResult([change], s.adding_replicas)


def _leader_within(state: MetadataState, leader: int, leader_epoch: int,
                   change: PartitionChangeRecord, replicas: tuple[int, ...],
                   isr: tuple[int, ...]) -> PartitionChangeRecord:
    """`change` of a partition's replicas to `replicas`: a `leader` left out of them hands over
    to a live in-sync one among them (none: NO_LEADER), in the next leader epoch."""
    if leader in replicas:
        return change
    live = state.brokers.leader_candidates((change.topic, change.partition))
    new_leader = next((r for r in replicas if r in isr and r in live), NO_LEADER)
    return dataclasses.replace(change, leader=new_leader, leader_epoch=leader_epoch + 1)


def complete_reassignment(state: MetadataState, topic: str,
                          partition: int) -> ControllerResult[tuple[int, ...] | None]:
    """Once every added replica is in sync, make the target list the replicas; a leader that is
    not in it hands over. The answer is None while added replicas are still catching up, else
    the replicas removed (whose tables may go once brokers closed them)."""
    s = state.partition(topic, partition)
    if s is None or not (s.adding_replicas or s.removing_replicas):
        return ControllerResult([], ())  # done, or moot
    if any(r not in s.isr for r in s.adding_replicas):
        return ControllerResult([], None)
    replicas = tuple(r for r in s.replicas if r not in s.removing_replicas)
    isr = tuple(r for r in replicas if r in s.isr)
    change = PartitionChangeRecord(topic, partition, replicas=replicas, isr=isr,
                                   adding_replicas=(), removing_replicas=())
    change = _leader_within(state, s.leader, s.leader_epoch, change, replicas, isr)
    return ControllerResult([change], s.removing_replicas)


# ---- what the driver's Spark jobs work on ----------------------------------------------------

def cleaner_tasks(state: MetadataState, config: cfg.ClusterConfig, topics: list[str] | None,
                  merge_min_age_ms: int) -> list[CleanerTask]:
    """Every partition with a leader (of `topics`, when given), with its topic's retention
    limits (none unless cleanup.policy includes delete), compaction settings (none unless it
    includes compact) and merge settings. A topic whose tasks cannot be made is logged as an
    error and left out of this round: it must not stop the cleaning of the others."""
    tasks = []
    open_as_of_ms = int(time.time() * 1000)  # before reading which transactions are open
    open_transactions = state.open_transactions()
    for name, topic in sorted(state.topics.items()):
        if topics is not None and name not in topics:
            continue
        try:
            tasks += [dataclasses.replace(
                t, open_producers=tuple(sorted(open_transactions.get((name, t.partition), ()))),
                open_as_of_ms=open_as_of_ms)
                for t in _topic_cleaner_tasks(config, name, topic, merge_min_age_ms)]
        except Exception:
            log.exception("log cleaner: topic %s is left out of this round", name)
    return tasks


def _topic_cleaner_tasks(config: cfg.ClusterConfig, name: str, topic: TopicRegistration,
                         merge_min_age_ms: int) -> list[CleanerTask]:
    c = config.topic_config(topic.configs)
    return [CleanerTask(config.storage, name, partition, s.leader, s.replicas, s.isr,
                        c.retention_ms if c.deletes else -1,
                        c.retention_bytes if c.deletes else -1,
                        c.file_delete_delay_ms, c.segment_bytes, merge_min_age_ms,
                        c.compacts, c.min_compaction_lag_ms, c.delete_retention_ms,
                        c.min_cleanable_dirty_ratio, diskless=c.diskless_enable)
            for partition, s in sorted(topic.partitions.items()) if s.leader >= 0]


def catch_up_tasks(state: MetadataState, storage: Storage,
                   broker_id: int) -> list[CatchUpTask]:
    """What the catch-up job copies before broker `broker_id` is relaunched: each replica it
    follows, from the partition's registered leader."""
    registered = set(state.brokers.registrations) - {broker_id}
    return [CatchUpTask(storage, topic, partition, s.leader, broker_id)
            for topic, t in sorted(state.topics.items())
            for partition, s in sorted(t.partitions.items())
            if broker_id in s.replicas and s.leader in registered
            and not cfg.is_diskless(t.configs)]  # a diskless partition has nothing to copy
