"""The partition tables' lives and the topic directories: the replica tables of new partitions
and added replicas created, empty, before the metadata naming them is committed, and those of
deleted topics removed once brokers closed them (what Kafka's LogManager does on brokers with
createLog and asyncDelete). Runs in the driver, inside the controller.

Nobody else creates a replica table: a broker or catch-up job that finds an assigned replica's
table missing knows its records were lost, and the broker reports the replica offline (it leaves
its ISR and is never elected) instead of serving an empty log that followers would truncate to.
Tables are created outside the controller's lock (a big topic takes seconds), under its
`tables_lock`, which also orders them with the removal of a deleted topic's directory or a
replica a reassignment dropped.

Separate from the controller because this is storage work, slow and fallible, around a commit
(tables first, then the records), and from `replication_control` because that module's handlers
do no I/O. Invariants: a create never deletes data (a topic whose directory holds files is
refused, and only what a failed create made is removed); a topic's directory is removed only
once its removal is committed, and not if a topic of the same name was created again meanwhile;
a failed create's tables are removed only once the metadata log is known not to name them (a
commit whose outcome was unknown may have landed: the controller's reload tells).

Thread-safe: `tables_lock` is taken before the controller's lock, never while waiting for brokers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster import replication_control
from deltabus.cluster.metadata_records import (
    CommitRecords,
    ConfigRecord,
    ControllerResult,
    MetadataRecord,
    PartitionRecord,
)
from deltabus.cluster.metadata_state import MetadataState
from deltabus.log_tables.layout import partition_path, replica_path, topic_path
from deltabus.log_tables.partition_log import create_log_table
from deltabus.metadata import NewTopic, TopicResult
from deltabus.topics import validate_topic_name

log = logging.getLogger(__name__)
# Waits before each new try at removing a deleted topic's directory (about 5 minutes in all).
TOPIC_DIR_RETRY_S = (0.5, 1, 2, 4, 8, 15, 30, 60, 60, 60, 60)
TABLE_CREATE_THREADS = 8  # replica tables a CreateTopics or CreatePartitions creates at once


class TopicTables:
    """Creates and deletes the controller's topics with their tables. Thread-safe."""

    def __init__(self, config: cfg.ClusterConfig, lock: threading.Condition,
                 tables_lock: threading.Lock, state: MetadataState, commit: CommitRecords, *,
                 version: Callable[[], int], shutting_down: Callable[[], bool],
                 await_brokers: Callable[[int, int], None],
                 reload_log: Callable[[], object]) -> None:
        """`lock`, `tables_lock`, `state`, `commit`: the controller's; `version`: its current
        metadata version; `await_brokers(version, timeout_ms)`: returns once the live brokers
        applied `version` (`ClusterControlManager.await_brokers`), so a new topic can be
        produced to at once and a deleted one's logs are closed before its tables go;
        `reload_log()`: with the lock held, applies the metadata append whose outcome was
        unknown if it landed (`Controller._reload_log`; KafkaStorageError while unknown)."""
        self._config = config
        self._lock = lock
        self._tables_lock = tables_lock
        self._state = state
        self._commit = commit
        self._version = version
        self._shutting_down = shutting_down
        self._await_brokers = await_brokers
        self._reload_log = reload_log
        self._storage = config.storage

    def create_topics(self, topics: list[NewTopic], *, timeout_ms: int = 30_000,
                      validate_only: bool = False) -> list[TopicResult]:
        """Create topics; each gets its own result, as in Kafka's CreateTopics. A topic whose
        directory already holds files is refused: a create never deletes data. The replica
        tables of those accepted are created first, then their records are one metadata commit,
        however many."""
        with self._tables_lock:
            with self._lock:
                result = self._check_new_topics(topics)
            results = result.response if validate_only else self._create_topics(result)
            with self._lock:
                target = self._version()
        if not validate_only:
            self._await_brokers(target, timeout_ms)
        return results

    def auto_create_topics(self, names: list[str], *, timeout_ms: int = 10_000) -> None:
        """Metadata's auto-creation of the missing `names` (replication_control.
        auto_create_topics: POLICY_VIOLATION past the limits, and nothing is created); a name
        whose directory holds files is left out, as a CreateTopics would refuse it."""
        with self._tables_lock:
            with self._lock:
                names = [n for n in names if self._dir_refusal(n) is None]
                result = replication_control.auto_create_topics(self._state, self._config,
                                                                names)
            self._create_topics(result)
            with self._lock:
                target = self._version()
        self._await_brokers(target, timeout_ms)

    def _check_new_topics(self, topics: list[NewTopic]) -> ControllerResult[list[TopicResult]]:
        """Lock held. The records and answers of a CreateTopics (replication_control.
        create_topics), a topic whose directory already holds files refused first."""
        refused = {t.name: e for t in topics if (e := self._dir_refusal(t.name)) is not None}
        result = replication_control.create_topics(
            self._state, self._config, [t for t in topics if t.name not in refused])
        answers = iter(result.response)
        return ControllerResult(result.records, [
            TopicResult(t.name, refused[t.name]) if t.name in refused else next(answers)
            for t in topics])

    def _dir_refusal(self, name: str) -> errors.DeltaBusError | None:
        try:
            self._check_topic_dir(name)
        except errors.DeltaBusError as e:
            return e
        return None

    def _create_topics(self, result: ControllerResult[list[TopicResult]]) -> list[TopicResult]:
        """`_tables_lock` held. Create the replica tables of the topics a CreateTopics accepted,
        then commit their records in one metadata commit; their results, or the failure for
        each of them (what was created goes again: their directories held nothing before; but
        not while the commit may have landed, `_remove_topic_dir_locked`)."""
        created = [r for r in result.response if r.error is None]
        if not created:
            return list(result.response)
        try:
            self._create_tables(result.records)
            with self._lock:
                self._commit(result.records)
        except errors.DeltaBusError as e:
            with self._lock:
                left = [t.name for t in created if not self._remove_topic_dir_locked(t.name)]
            if left:
                threading.Thread(target=self._remove_topic_dirs_later, args=(left,),
                                 name="failed-topic-dirs", daemon=True).start()
            failed = {r.name for r in created}
            return [TopicResult(r.name, e) if r.name in failed else r for r in result.response]
        return list(result.response)

    def _create_tables(self, records: Sequence[MetadataRecord]) -> None:
        """Create, in parallel, the empty table of every replica the records assign (new
        partitions, replicas a reassignment adds), or of each new diskless partition (a topic
        the records make diskless, or one that is). Raises KafkaStorageError."""
        diskless = {r.topic for r in records if isinstance(r, ConfigRecord)
                    and cfg.is_diskless({r.key: r.value or ""})}
        with self._lock:
            diskless |= {t for t, topic in self._state.topics.items()
                         if cfg.is_diskless(topic.configs)}
        partitions = [r for r in records if isinstance(r, PartitionRecord)]
        self.create_replica_tables([(r.topic, r.partition, b) for r in partitions
                                    if r.topic not in diskless for b in r.replicas])
        self._create((partition_path(self._config.root, r.topic, r.partition), r.topic,
                      r.partition) for r in partitions if r.topic in diskless)

    def create_replica_tables(self, replicas: list[tuple[str, int, int]]) -> None:
        """Create, in parallel, the empty table of each (topic, partition, broker) replica:
        before the metadata naming it is committed, so a missing table always means lost
        records. `tables_lock` held. Raises KafkaStorageError."""
        self._create((replica_path(self._config.root, topic, partition, broker), topic,
                      partition) for topic, partition, broker in replicas)

    def _create(self, tables: Iterable[tuple[str, str, int]]) -> None:
        """Create the empty log table of each (path, topic, partition), in parallel."""
        def create(table: tuple[str, str, int]) -> None:
            path, topic, partition = table
            create_log_table(path, topic=topic, partition=partition,
                             checkpoint_interval=self._config.checkpoint_interval,
                             storage_options=self._storage.delta_options)
        tables = list(tables)
        if tables:
            with ThreadPoolExecutor(max_workers=TABLE_CREATE_THREADS) as pool:
                list(pool.map(create, tables))

    def create_partitions(self, counts: dict[str, int], *, timeout_ms: int = 30_000,
                          validate_only: bool = False) -> list[TopicResult]:
        """Add partitions to topics (Kafka's CreatePartitions): `counts` maps a topic to its
        new total. New partitions get replicas as a new topic would, with the topic's
        replication factor, and their tables before they are committed; keyed records may map
        to other partitions from now on."""
        results = []
        with self._tables_lock:
            for name, count in counts.items():
                try:
                    with self._lock:
                        result = replication_control.create_partitions(
                            self._state, self._config, name, count)
                    if not validate_only:
                        self._create_tables(result.records)
                        with self._lock:
                            self._commit(result.records)
                    results.append(result.response)
                except errors.DeltaBusError as e:
                    results.append(TopicResult(name, e))
            with self._lock:
                target = self._version()
        if not validate_only:
            self._await_brokers(target, timeout_ms)
        return results

    def delete_topics(self, names: list[str], *, timeout_ms: int = 30_000) -> list[TopicResult]:
        """Delete topics: remove them from metadata, let brokers close them, drop their tables."""
        results = []
        deleted = []
        with self._lock:
            for name in names:
                try:
                    result = replication_control.delete_topic(self._state, name)
                except errors.DeltaBusError as e:
                    results.append(TopicResult(name, e))
                    continue
                self._commit(result.records)
                deleted.append(name)
                results.append(result.response)
            target = self._version()
        if deleted:
            self._await_brokers(target, timeout_ms)
            left = [name for name in deleted if not self._remove_topic_dir(name)]
            if left:
                threading.Thread(target=self._remove_topic_dirs_later, args=(left,),
                                 name="deleted-topic-dirs", daemon=True).start()
        return results

    def _remove_topic_dir(self, name: str) -> bool:
        """`_remove_topic_dir_locked`, taking the locks."""
        with self._tables_lock, self._lock:
            return self._remove_topic_dir_locked(name)

    def _remove_topic_dir_locked(self, name: str) -> bool:
        """Both locks held. Remove the directory of a topic the log does not name (deleted, or
        whose create failed), unless it was created (again) meanwhile; False when that is not
        known yet (a metadata append whose outcome was unknown may have created it: the log
        is reloaded first) or the storage failed (a broker still closing one of its logs
        writes into it)."""
        try:
            self._reload_log()
            if name in self._state.topics:
                return True
            self.delete_dir(topic_path(self._config.root, name))
        except errors.DeltaBusError as e:
            log.warning("topic %s: its directory is not removed yet (%s)", name, e)
            return False
        return True

    def _remove_topic_dirs_later(self, names: list[str]) -> None:
        """Try again what `delete_topics` or a failed create could not remove: the topics are
        deleted (their removal is committed and answered, as Kafka answers before its logs are
        gone), or their creation failed, and a directory left behind would refuse a topic of
        the same name later."""
        for wait_s in TOPIC_DIR_RETRY_S:
            time.sleep(wait_s)
            names = [name for name in names if not self._remove_topic_dir(name)]
            if not names or self._shutting_down():
                return
        log.error("topics %s (deleted, or their create failed): their directories could not "
                  "be removed; a topic of the same name is refused until they are", names)

    def _check_topic_dir(self, name: str) -> None:
        """Refuse to create a topic whose directory holds files: a deleted topic's tables whose
        removal did not finish (the controller stopped, or brokers still had them open), or on
        a case-insensitive file system another topic's. Deleting them would lose records.
        An illegal name is INVALID_TOPIC_EXCEPTION first, as Kafka checks names before all
        else: its path would be no topic's ("..": the folder above the topics)."""
        validate_topic_name(name)
        path = topic_path(self._config.root, name)
        if self._storage.exists(path):
            raise errors.TopicAlreadyExistsError(
                f"Topic '{name}' cannot be created: {path} already holds data (of a deleted "
                "topic whose removal did not finish, or of a topic whose name differs only in "
                "case on a case-insensitive file system). A create never deletes data: move "
                "that directory away, or choose another name.")

    def delete_dir(self, path: str) -> None:
        """Remove a topic's or a replica's directory; `tables_lock` held, so no table is being
        created under it."""
        self._storage.delete_tree(path)

