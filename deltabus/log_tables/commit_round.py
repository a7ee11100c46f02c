"""A partition log's commit rounds, and how what each commit did is applied to the log.

The log queues its writes in its appender (appender.py) and asks the process's append pool
(append_pool.py) for a round; a round takes what is ready off the queue, has the appender make it
one Delta commit, then applies what that commit did (`Committed`) to the log's parts, all under
the log's one lock: the offsets and the high watermark (log_offsets.py), the tail cache, the
leader epochs, the producer state and the transaction state. Only then are the futures resolved:
the log end offset moves only after the commit holding the records, and an acknowledged record is
durable in the table. A failed commit fails its work and everything queued behind it (order is
kept), and the log reloads the table: where the commit left nothing there, the log's parts are as
if those writes never came (`_fail`); otherwise they are rebuilt from what the table holds.

Separate from the log (partition_log.py) because this is the log's one writer, run on pool
threads, where the log's other methods run on request threads: the parts it changes are handed
to it, and it takes the log's lock (a Condition) as the log itself would, in the same order.

Runs on executors. Thread-safe: at most one round of a log runs at a time (the pool sees to it);
it shares the log's lock with the request threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future

from deltabus import errors, trace
from deltabus.log_tables.append_pool import AppendPool
from deltabus.log_tables.appender import (
    AppendResult,
    CommitFailed,
    Committed,
    LogAppender,
    PendingAppend,
    PendingFiles,
    Work,
)
from deltabus.log_tables.leader_epochs import LeaderEpochCache
from deltabus.log_tables.log_offsets import LogOffsets
from deltabus.log_tables.partition_reader import PartitionReader
from deltabus.log_tables.producer_state import ProducerStateManager
from deltabus.log_tables.tail_cache import TailCache
from deltabus.log_tables.transactions import LogTransactions
from deltabus.metrics import LogMeters

log = logging.getLogger(__name__)


class CommitRound:
    """The commit rounds of one partition log, and their application to its parts."""

    def __init__(self, owner: Hashable, *, path: str, topic: str, partition: int,
                 lock: threading.Condition, pool: AppendPool, appender: LogAppender,
                 offsets: LogOffsets, reader: PartitionReader, tail: TailCache,
                 epochs: LeaderEpochCache, producers: ProducerStateManager,
                 txns: LogTransactions, replicated: bool, traced: bool,
                 closed: Callable[[], bool], meters: LogMeters | None = None) -> None:
        """The parts are the log's own (`owner`, the pool's key for its rounds), `lock` its
        lock; `closed()` says whether the log is closing (what lingers goes at once);
        `meters`: its broker's log metrics, which time each commit."""
        self._owner = owner
        self.path = path
        self.topic = topic
        self.partition = partition
        self._name = f"{topic}-{partition}"
        self._lock = lock
        self._pool = pool
        self._appender = appender
        self._offsets = offsets
        self._reader = reader
        self._tail = tail
        self._epochs = epochs
        self._producers = producers
        self._txns = txns
        self._replicated = replicated
        self._traced = traced
        self._closed = closed
        self._meters = meters
        # (data files, bytes) of the table as its commits left it; None: unknown until the
        # log counts them again (after a truncation, a restart or another writer's commit)
        self.file_stats: tuple[int, int] | None = None
        # The newest leader epoch whose produced append lost to another writer of this log
        # that took the log end back: nothing more is appended at it or older (`_older_epoch`).
        self._fenced_epoch = -1

    def schedule(self) -> None:
        """Lock held: ask the pool for a commit round when the queue's head may go."""
        at = self._appender.ready_at(self._closed())
        if at is not None:
            self._pool.schedule(self._owner, self.run, at)

    def run(self) -> float | None:
        """On a pool thread, at most one at a time for this log: commit what is ready. Returns
        when the next round may go (what queued meanwhile), None when nothing is queued."""
        with self._lock:
            at = self._appender.ready_at(self._closed())
            if at is None or at > time.monotonic():
                return at
            work = self._appender.take()
            refused = self._older_epoch(work)
        taken_s = time.monotonic()
        taken_ns = trace.now_ns() if self._traced else 0
        try:
            try:
                if refused is not None:
                    raise refused
                done = self._appender.commit(work, self._offsets.log_end_offset)
            except CommitFailed as failure:
                self._fail(work, failure)
            else:
                if self._meters is not None and done.added is not None:
                    self._meters.committed(time.monotonic() - taken_s, done.added[1])
                applied_ns = self._apply(done)
                if self._traced and isinstance(work, (list, PendingFiles)):
                    self._stamp_commit(list(work) if isinstance(work, list) else [work], done,
                                       taken_ns, applied_ns)
                self._appender.renew()
        finally:
            self._appender.done()
        with self._lock:
            return self._appender.ready_at(self._closed())

    def _older_epoch(self, work: Work) -> CommitFailed | None:
        """Lock held. Refuse, before anything is written, produced records stamped with a
        leader epoch older than the log's last record's: a newer leader wrote this table (the
        catch-up job before this broker's relaunch, or its next incarnation), and this broker,
        a zombie leader that has not heard it was replaced, lost its first commit to that
        writer (FencedWriter), reloaded, and would append its stale epoch on top. Epochs must
        only grow along a log: a returning replica finds where it parts from its leader by the
        epoch of its last record, and an old epoch's records above a newer epoch's are
        invisible to that (its last epoch reads the newer one), so it would keep them where the
        leader holds acknowledged records.

        Refuse as well every epoch up to one at which another writer took the log end back
        (`_fenced_epoch`): the catch-up job copies from a follower of this very epoch, so the
        table may show no newer one, yet its log end went back below offsets this leader gave
        out and its followers hold; appended there, records would be acknowledged at offsets
        the followers hold others at. (Another writer that only added records, such as a
        catch-up job finishing late into a relaunched leader's table, leaves it leading.)
        NOT_LEADER_OR_FOLLOWER: the producer looks the leader up again."""
        if not isinstance(work, list) or not work or work[0].copied:
            return None
        latest = self._epochs.latest
        oldest = min(item.leader_epoch for item in work)
        if oldest >= latest and oldest > self._fenced_epoch:
            return None
        error = errors.NotLeaderOrFollowerError(
            f"{self._name} was written by another leader at epoch {max(latest, oldest)} or "
            f"later; this broker no longer leads it at epoch {oldest}")
        return CommitFailed(error, error, reload=False)

    def _apply(self, done: Committed) -> int:
        """Bring the offsets, cache, epochs and producers up to a commit, then resolve its
        futures: the log end offset moves only after the commit holding the records. Returns
        when the log took the commit in (time.time_ns(), for the latency trace; 0 untraced)."""
        ready: list[Future[int]] = []
        changed = True
        with self._lock:
            self._offsets.version = done.version
            self.file_stats = (None if self.file_stats is None or done.added is None else
                               (self.file_stats[0] + done.added[0],
                                self.file_stats[1] + done.added[1]))
            if done.kind in ("append", "copy"):
                assert done.records is not None
                self._offsets.log_end_offset = done.end_offset
                if not self._replicated:
                    ready = self._offsets.set_high_watermark(done.end_offset)
                self._tail.append(done.records)
                self._epochs.assign(done.records)
                if done.kind == "copy":
                    self._producers.note_copied(done.records)
                    self._txns.forget()  # a follower's: rebuilt if it leads
                else:
                    self._txns.take_in(done.records, done.txn_begins)
                self._producers.note_timestamps(done.records)
            elif done.kind == "files":
                assert done.records is not None
                self._offsets.log_end_offset = done.end_offset
                self._tail.clear()  # the cache must stay a suffix of the log: these are not in it
                self._epochs.assign(done.records)
                self._producers.note_copied(done.records)
                self._producers.note_timestamps(done.records)
                self._txns.forget()
            elif done.kind == "truncate":
                changed = done.end_offset < self._offsets.log_end_offset
                if changed:
                    self._offsets.log_end_offset = done.end_offset
                    self._offsets.high_watermark = min(self._offsets.high_watermark,
                                                       done.end_offset)
                    self._tail.truncate(done.end_offset)
                    self._epochs.truncate_from(done.end_offset)
                    self._producers.clear()  # rebuilt from the table on their next batch
                    self._txns.forget()
            elif done.kind == "log_start":
                self._offsets.raise_log_start(done.log_start_offset)
            else:  # restart
                self._offsets.log_start_offset = self._offsets.log_end_offset = done.end_offset
                self._offsets.high_watermark = done.end_offset
                self._tail.clear()
                self._epochs.reset([])
                self._producers.clear()
                self._txns.forget()
            self._lock.notify_all()
        applied_ns = trace.now_ns() if self._traced else 0
        if done.kind == "truncate" and changed:
            log.info("truncated %s to offset %d", self._name, done.end_offset)
        elif done.kind == "restart":
            log.info("%s emptied to start again at offset %d (below its leader's log start)",
                     self._name, done.end_offset)
        if changed:
            self._offsets.after_change(ready)
        for future, first, last in done.results:
            future.set_result(AppendResult(first, last, done.now_ms,
                                           self._offsets.log_start_offset))
        return applied_ns

    def _stamp_commit(self, group: list[PendingAppend | PendingFiles], done: Committed,
                      taken_ns: int, applied_ns: int) -> None:
        """The latency trace's stamps of a group committed (deltabus.trace): "append", or
        "copy" for a follower's records or files."""
        stage = "append" if done.kind == "append" else "copy"
        for item, (_, first, last) in zip(group, done.results, strict=True):
            trace.stamp(stage, self.topic, self.partition, first, last,
                        queued=item.queued_ns, taken=taken_ns, built=done.built_ns,
                        committed=done.committed_ns, applied=applied_ns)

    def _fail(self, work: Work, failure: CommitFailed) -> None:
        """A commit failed (or could not be tried): it and everything queued behind it fail
        (order is kept).

        Where the table shows that the commit left nothing behind (a full disk, a store that
        refused the write), the log is as if those writes never came, as Kafka's is after a
        failed append: each producer's next sequence is its first failed batch's again, so its
        retry is taken (not answered with this failure), and the tail cache, leader epochs and
        transactions stand. Forgetting them instead has them rebuilt from every data file of
        the table, the producers under the log's lock, where fetches wait: for each failed
        write, and again for each producer's first write once the storage is back. On a log of
        a few minutes' commits, the soak's full disk kept a partition from taking writes for
        35 s after the room was back. Where the table did move (a commit that landed after
        all, another writer's), the log trusts only the table, and rebuilds from it."""
        log.error("%s", failure.pending_error)
        with self._lock:
            log_end_offset = self._offsets.log_end_offset
        as_it_was = not failure.reload or self._reload_after_failure()
        with self._lock:
            went_back = self._offsets.log_end_offset < log_end_offset
            if (failure.fenced and (went_back or self._appender.superseded())
                    and isinstance(work, list) and work and not work[0].copied):
                # Another writer took back offsets this leader gave out (and its followers may
                # hold), or a diskless partition's next leader claimed the table: nothing more
                # of this leader epoch (`_older_epoch`).
                self._fenced_epoch = max(self._fenced_epoch,
                                         max(item.leader_epoch for item in work))
        failed = work if isinstance(work, list) else [work]
        with self._lock:
            queued = self._appender.drain()
            if as_it_was:
                for item in (*failed, *queued):
                    if isinstance(item, PendingAppend):
                        self._producers.roll_back(item.producer, item.future)
            else:
                self._producers.clear()  # rebuilt from the table on their next batch
                self._txns.forget()
        for item in failed:
            item.future.set_exception(failure.error)
        for other in queued:
            other.future.set_exception(failure.pending_error)

    def _reload_after_failure(self) -> bool:
        """After a failed commit, trust only the table: reload it. True when it holds what the
        log knew (the same version and log end offset: the commit left nothing), and the log's
        parts stand; else its offsets and leader epochs are taken from the table, and False
        (False too when the table cannot be read)."""
        try:
            version, leo = self._appender.reload()
        except Exception:  # the storage may still be down; the next commit will fail cleanly too
            log.exception("reloading %s after a failed commit", self.path)
            return False
        with self._lock:
            if (version, leo) == (self._offsets.version, self._offsets.log_end_offset):
                return True
            self._offsets.version = version
            self._offsets.log_end_offset = leo
            self._offsets.high_watermark = min(self._offsets.high_watermark, leo)
            if not self._replicated:
                self._offsets.high_watermark = leo
            self._tail.clear()
        try:
            epochs = self._reader.leader_epochs()
        except Exception:
            log.exception("reloading the epochs of %s after a failed commit", self.path)
            return False
        with self._lock:
            self._epochs.reset(epochs)
        return False
