"""A broker's metadata publisher (Kafka's BrokerMetadataPublisher): applies each metadata image
the broker's heartbeats bring. It closes the replicas the broker no longer hosts, opens the ones
it now hosts, makes each a leader or a follower, points the replica fetchers at the leaders, and
then publishes the image to the broker's metadata cache.

Separate from the broker's session with the controller (`broker_lifecycle`, whose heartbeat
thread hands images over here) so that applying an image, which may open thousands of partition
tables and take minutes, runs on a thread of its own and never holds a heartbeat up; and
separate from the requests served from the partitions (`replica_manager`, whose partition table
it changes). Runs on executors, in a broker task: the metadata thread runs `apply_loop`.
Invariants:
- The broker reports a metadata version as applied (`applied_version`) only after it opened (or
  closed) every log that version asks for, so when CreateTopics returns, the new partitions take
  produce requests.
- An image of an earlier registration (`new_generation`) is never reported as applied.
- A hosted replica whose table cannot be opened is offline, reported with every heartbeat, so
  the controller keeps it out of ISRs and leadership.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.metadata_cache import MetadataCache
from deltabus.cluster.partition import Partition
from deltabus.cluster.replica_fetcher import ReplicaFetcher
from deltabus.cluster.replica_manager import ReplicaManager
from deltabus.cluster.replication_quota import ReplicationQuota
from deltabus.log_tables.layout import log_path
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.metadata import NO_LEADER, MetadataImage, PartitionState
from deltabus.quotas import ClientQuotaManager
from deltabus.rpc.leader_endpoint import RemoteLeaderEndpoint

log = logging.getLogger(__name__)

LOG_OPEN_THREADS = 8


class BrokerMetadataPublisher:
    """Applies one broker's metadata images, on its metadata thread. Thread-safe: the heartbeat
    thread hands images over (`hand_over`) and reads what was applied under `_publish`."""

    def __init__(self, broker_id: int, config: cfg.ClusterConfig, cache: MetadataCache,
                 replicas: ReplicaManager, leaders: RemoteLeaderEndpoint,
                 quota_manager: ClientQuotaManager, stopped: threading.Event) -> None:
        self.broker_id = broker_id
        self._config = config
        self._log_config = config.log_config()
        self._cache = cache
        self._replicas = replicas
        self._leaders = leaders
        self._quota_manager = quota_manager
        self._stopped = stopped
        # The heartbeat thread hands the loader's newest image to the metadata thread, which
        # applies it (`apply_loop`); `_applied_image` is the last it applied, `_generation`
        # counts registrations (an image of an earlier one is not reported as applied).
        self._publish = threading.Condition()
        self._to_apply: MetadataImage | None = None
        self._generation = 0
        self._applied_image: MetadataImage | None = None  # the loader's, applied
        # Hosted replicas whose tables cannot be opened (lost): reported with every heartbeat,
        # so the controller keeps them out of ISRs and leadership. The metadata thread changes
        # it; the heartbeat thread sends a copy.
        self._offline: set[tuple[str, int]] = set()
        self._fetchers: dict[int, ReplicaFetcher] = {}
        # follower.replication.throttled.rate, shared by every fetcher (replication_quota.py)
        self._follower_quota = ReplicationQuota(config.follower_replication_throttled_rate)

    # ---- the heartbeat thread's side ---------------------------------------------------------

    def new_generation(self) -> None:
        """A new registration, with a new metadata loader: say none applied until its image is,
        and drop an image of the old one not applied yet. The image served until then stays."""
        with self._publish:
            self._generation += 1
            self._applied_image = None
            self._to_apply = None

    def applied_version(self) -> int:
        """The version of the last image applied in this generation (0: none yet)."""
        with self._publish:
            return self._applied_image.version if self._applied_image is not None else 0

    def hand_over(self, image: MetadataImage, wait_s: float) -> None:
        """Have the metadata thread apply `image` (the loader's newest), unless it is the one
        applied; wait up to `wait_s` for it, so an apply that ends within a heartbeat interval
        is said with the next heartbeat, while a longer one never holds the heartbeats up."""
        with self._publish:
            if image is not self._applied_image:
                self._to_apply = image
                self._publish.notify_all()
                self._publish.wait_for(lambda: self._applied_image is image
                                       or self._stopped.is_set(), wait_s)

    def offline_replicas(self) -> list[tuple[str, int]]:
        """The hosted replicas whose tables cannot be opened, for the next heartbeat."""
        return sorted(self._offline.copy())

    def stop_fetchers(self) -> None:
        """Stop copying from every leader (the broker is stopping)."""
        for fetcher in list(self._fetchers.values()):
            fetcher.stop()

    # ---- the metadata thread -----------------------------------------------------------------

    def apply_loop(self) -> None:
        """Apply the newest image the heartbeats brought, on a thread of its own (KRaft's
        metadata publisher): opening a few thousand partition tables takes minutes, and a
        broker whose heartbeats waited on it was fenced, relaunched, and opened them all again.
        A failed apply is logged and tried again with the next image or after an interval."""
        interval_s = self._config.broker_heartbeat_interval_ms / 1000
        while not self._stopped.is_set():
            with self._publish:
                image, generation = self._to_apply, self._generation
                if image is None or image is self._applied_image:
                    self._publish.wait(interval_s)
                    continue
            try:
                self.apply(image)
            except Exception:
                log.exception("broker %d: applying metadata version %d failed", self.broker_id,
                              image.version)
                self._stopped.wait(interval_s)
                continue
            with self._publish:
                if generation == self._generation:
                    self._applied_image = image
                self._publish.notify_all()

    def apply(self, image: MetadataImage) -> None:
        """Open the replicas this broker now hosts and close the ones it no longer does; make
        each a leader or a follower as the image says, and point the fetchers at the leaders."""
        # Parsed once per metadata version, not per produce request; set before the image so a
        # topic visible in the image always has its config.
        configs = self._replicas.topic_configs = {
            name: self._config.topic_config(t.configs) for name, t in image.topics.items()}
        # A diskless partition is hosted by its leader alone: its one table is the log.
        hosted = {
            (topic.name, p.partition): p
            for topic in image.topics.values() for p in topic.partitions
            if self.broker_id in p.replicas and (not configs[topic.name].diskless_enable
                                                 or p.leader == self.broker_id)
        }
        current = self._replicas.hosted_keys()
        # A diskless log is claimed for one leader epoch: a new epoch opens it again, from
        # whatever the leaders between committed (metadata may skip their tenures).
        reclaimed = {key for key in current & set(hosted) if configs[key[0]].diskless_enable
                     and _claimed_epoch(self._replicas.get_partition(key))
                     != hosted[key].leader_epoch}
        started = time.monotonic()
        closing = sorted((current - set(hosted)) | reclaimed)
        leaving = []
        for key in closing:
            self._unfollow(key)
            leaving.append(self._replicas.remove_partition(key))
        if leaving:  # in parallel, as opening: each close may wait for a commit to the store
            with ThreadPoolExecutor(max_workers=LOG_OPEN_THREADS) as pool:
                list(pool.map(lambda partition: partition.log.close(), leaving))
        for key in closing:
            # Its fetches answer NOT_LEADER_OR_FOLLOWER now.
            self._replicas.fetch_purgatory.check(key)
            log.info("broker %d no longer hosts %s-%d", self.broker_id, *key)
        closed = time.monotonic()
        self._offline &= set(hosted)  # a replica no longer hosted is not ours to report
        opening = sorted((set(hosted) - current) | reclaimed)
        if opening:  # in parallel: a broker may host hundreds of partitions
            with ThreadPoolExecutor(max_workers=LOG_OPEN_THREADS) as pool:
                opened_logs = pool.map(lambda key: self._open_partition(
                    key, configs[key[0]], hosted[key].leader_epoch), opening)
                for key, opened in zip(opening, opened_logs, strict=True):
                    if opened is None:  # tried again with the next metadata
                        self._offline.add(key)
                        continue
                    self._offline.discard(key)
                    self._replicas.add_partition(key, opened)
        opened_at = time.monotonic()
        for key, state in hosted.items():
            found = self._replicas.get_partition(key)
            if found is not None:
                topic_config = configs[key[0]]
                found.log.flush_messages = topic_config.flush_messages
                if topic_config.diskless_enable:
                    found.log.pace_commits(**self._diskless_pacing(topic_config))
                self._apply_partition(found, state, image)
        if image.acls == self._cache.image.acls:  # the same tuple: the authorizer is not rebuilt
            image = dataclasses.replace(image, acls=self._cache.image.acls)
        self._quota_manager.update(image.client_quotas)
        self._cache.publish(image)
        took_s = time.monotonic() - started
        if took_s > self._config.broker_session_timeout_ms / 4000:
            # Until an apply ends, the partitions this broker was given refuse requests
            # (NOT_LEADER_OR_FOLLOWER), and the next image waits: as long as a good part of
            # the session timeout delays a failover as much as a slow detection does.
            log.warning("broker %d applied metadata version %d in %.1f s: closed %d logs in "
                        "%.1f s, opened %d in %.1f s and took the image in %.1f s",
                        self.broker_id, image.version, took_s, len(closing), closed - started,
                        len(opening), opened_at - closed, time.monotonic() - opened_at)

    def _apply_partition(self, partition: Partition, state: PartitionState,
                         image: MetadataImage) -> None:
        key = (partition.topic, partition.partition)
        following = state.leader not in (self.broker_id, NO_LEADER)
        # Before the role changes: a copy from the old leader lands first, or not at all.
        self._unfollow(key, keep=state.leader if following else NO_LEADER)
        if partition.apply(state, image.version) and partition.is_leader:
            partition.log.reset_transactions(image.open_transactions.get(key, frozenset()))
        self._replicas.fetch_purgatory.check(key)  # a fetch of an old leader epoch is answered now
        if not following:
            return
        fetcher = self._fetchers.get(state.leader)
        if fetcher is None:
            fetcher = self._fetchers[state.leader] = ReplicaFetcher(
                self.broker_id, state.leader, self._leaders, self._config,
                self._follower_quota)
        leader = image.broker(state.leader)
        if leader is not None:
            fetcher.set_address(leader.address)
        fetcher.follow(partition, state.leader_epoch)

    def _unfollow(self, key: tuple[str, int], keep: int = NO_LEADER) -> None:
        """Stop copying `key` from every leader but `keep`."""
        for leader_id, fetcher in self._fetchers.items():
            if leader_id != keep:
                fetcher.unfollow(key)

    def _open_partition(self, key: tuple[str, int], config: cfg.TopicConfig,
                        leader_epoch: int) -> Partition | None:
        """Open a hosted replica's log, or None when its table is missing or unreadable: then
        the replica is offline (never created empty: see PartitionLog) until it opens. A
        diskless partition's leader opens the partition's one table and claims it for
        `leader_epoch`; its commits start diskless.append.commit.interval.ms apart at most
        often, sooner once diskless.append.buffer.max.bytes wait."""
        topic, partition = key
        holder: list[Partition] = []
        diskless = config.diskless_enable
        log_config = self._log_config
        if diskless:
            log_config = dataclasses.replace(log_config, **self._diskless_pacing(config))
        try:
            opened = PartitionLog(
                log_path(self._config.root, topic, partition, self.broker_id, diskless),
                topic=topic, partition=partition, config=log_config,
                storage=self._config.storage,
                on_append=lambda: self._on_log_change(holder), replicated=not diskless,
                create=False, leader_epoch=leader_epoch if diskless else None,
                meters=self._replicas.metrics.node.logs if self._replicas.metrics.enabled
                else None)
        except Exception as e:  # one unreadable table must not take the broker down
            if key not in self._offline:  # said once, not with every metadata version
                log.error("broker %d cannot open %s-%d; reporting it offline: %s",
                          self.broker_id, topic, partition, e,
                          exc_info=not isinstance(e, errors.KafkaStorageError))
            return None
        holder.append(Partition(topic, partition, self.broker_id, opened))
        log.info("broker %d opened %s-%d at offset %d (%s)", self.broker_id, topic, partition,
                 opened.log_end_offset, opened.open_phases)
        return holder[0]

    def _diskless_pacing(self, config: cfg.TopicConfig) -> dict[str, int]:
        """A diskless log's commit pacing, from its topic's configs: commits at most every
        diskless.append.commit.interval.ms, sooner once diskless.append.buffer.max.bytes wait
        (no more than the log's cache holds)."""
        return {"commit_interval_ms": config.diskless_append_commit_interval_ms,
                "group_commit_bytes_max": min(config.diskless_append_buffer_max_bytes,
                                              self._log_config.log_cache_bytes_max)}

    def _on_log_change(self, holder: list[Partition]) -> None:
        """A log's end or high watermark moved: a leader may move its high watermark, and
        the fetches waiting on the partition (consumers and followers) may complete."""
        if holder:
            holder[0].on_log_change()
            self._replicas.fetch_purgatory.check((holder[0].topic, holder[0].partition))


def _claimed_epoch(partition: Partition | None) -> int | None:
    """The leader epoch a diskless partition's open log was claimed for."""
    return partition.log.claimed_epoch if partition is not None else None
