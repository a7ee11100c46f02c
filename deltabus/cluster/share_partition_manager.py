"""Share groups on a partition leader (Kafka's SharePartitionManager): ShareFetch and
ShareAcknowledge for the partitions this broker leads, over their SharePartitions
(share_partition.py), with share sessions and the durable state in `__share_group_state`.

- **Share sessions** (Kafka's ShareSessionCache), one per (group, member) on each broker: epoch 0
  opens one (a former one of the member goes; what it held times out), every request after it
  names the next epoch and adds or forgets partitions; -1 closes it and releases what the member
  holds. A wrong epoch drops the session (INVALID_SHARE_SESSION_EPOCH) and the client opens a
  new one. A session idle for group.share.session.timeout.ms goes, as if closed.
- **State**: a SharePartition is loaded on its first use here: `claim` in the share state store
  (the driver's `__share_group_state`, through `state`) raises the stored leader epoch to this
  leader's, fencing a former leader, and returns where the group was; a group new to the
  partition starts where its share.auto.offset.reset says (latest by default). Every
  acknowledgement is written back before it is answered (one write in flight per
  share-partition; changes made meanwhile go together in the next). A failed write drops the
  SharePartition, so the next use loads what is durable: an acknowledgement is reported done
  only when it is.
- **Fetching**: acknowledgements first, then records are acquired in the session's partitions
  in turn (the first partition rotates). With nothing to acquire, a fetch waits (a future, no
  thread) until an append, a release, a lock that timed out, or its max wait.

Thread-safe: one lock guards sessions and SharePartitions; reads of the log and waits on the
store happen outside it. A sweeper thread times out locks and idle sessions and wakes waiting
fetches.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.handler import (
    AcknowledgementBatch,
    Acquired,
    FetchResult,
    FetchSpec,
    ShareFetchAnswer,
    ShareFetchRequest,
    SharePartitionData,
    TopicPartition,
)
from deltabus.cluster.share_partition import SharePartition
from deltabus.group_configs import ShareGroupSettings, share_group_settings
from deltabus.log_tables.partition_log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from deltabus.log_tables.transactions import READ_COMMITTED, READ_UNCOMMITTED, consumed_rows
from deltabus.offsets.share_state_store import ShareState

log = logging.getLogger(__name__)

OPEN_EPOCH, CLOSE_EPOCH = 0, -1
STATE_TIMEOUT_S = 30.0  # a claim or write the driver does not answer in this long fails
SWEEP_INTERVAL_S = 0.2  # how often locks and idle sessions are timed out

Key = tuple[str, str, int]  # (group, topic, partition)


class ShareStateApi(Protocol):
    """What a leader asks of `__share_group_state` (ShareStateStore, or its gRPC client)."""

    def claim(self, group_id: str, topic: str, partition: int,
              leader_epoch: int) -> Future[ShareState | None]: ...

    def write(self, state: ShareState) -> Future[None]: ...

    def alter(self, group_id: str, topic: str, partition: int,
              start_offset: int) -> Future[ShareState]: ...


class LeaderLogs(Protocol):
    """What a leader's handler gives the manager: its partitions' offsets and reads."""

    def list_offsets(self, topic: str, partition: int, timestamp: int,
                     isolation_level: int = ...) -> tuple[int, int, int]: ...

    def fetch(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
              max_bytes: int, replica_id: int) -> list[FetchResult]: ...

    def fetch_delayed(self, specs: list[FetchSpec], *, max_wait_ms: int, min_bytes: int,
                      max_bytes: int, replica_id: int) -> Future[list[FetchResult]]: ...


@dataclass
class _Session:
    epoch: int
    partitions: list[TopicPartition]
    last_used_s: float
    turn: int = 0  # which partition acquires first, in turn


@dataclass
class _Persister:
    """One write in flight per share-partition; waiters of changes made meanwhile."""

    writing: bool = False
    waiters: list[Future[None]] = field(default_factory=list)


class SharePartitionManager:
    """Every share group's partitions this broker leads. Thread-safe."""

    def __init__(self, logs: LeaderLogs, state: ShareStateApi, config: cfg.GroupConfig,
                 clock: Callable[[], float] = time.monotonic,
                 group_configs: Callable[[str], Mapping[str, str] | None] = lambda g: None
                 ) -> None:
        """`group_configs(group_id)`: the group's overrides, as the metadata holds them
        (kafka-configs.sh --entity-type groups); `config`: the brokers' defaults."""
        self._logs = logs
        self._state = state
        self._config = config
        self._clock = clock
        self._group_configs = group_configs
        # Re-entrant: a state write's future may be done before `_write_next` hands it its
        # callback (the store answered, or refused, at once), and the callback then runs on
        # the thread that holds this lock.
        self._lock = threading.RLock()
        self._load_lock = threading.Lock()  # one load at a time: one SharePartition per key
        self._partitions: dict[Key, SharePartition] = {}
        self._persisters: dict[Key, _Persister] = {}
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._waiters: list[tuple[float, Future[None]]] = []  # (max wait's end, wake)
        self._recheck: set[Key] = set()  # loaded SharePartitions to read again when idle
        self._closed = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep, daemon=True,
                                         name="share-partition-sweeper")
        self._sweeper.start()

    def close(self) -> None:
        self._closed.set()
        self._wake()

    # ---- ShareFetch and ShareAcknowledge -------------------------------------------------------

    def settings(self, group_id: str) -> ShareGroupSettings:
        return share_group_settings(self._config, self._group_configs(group_id))

    def share_fetch(self, request: ShareFetchRequest) -> ShareFetchAnswer:
        """Acknowledge, then acquire records for the member in its session's partitions;
        waits (`waiting_on`) while there is nothing to acquire, up to the max wait."""
        now = self._clock()
        deadline_s = time.monotonic() + max(0, request.max_wait_ms) / 1000
        lock_ms = self.settings(request.group_id).record_lock_duration_ms
        try:
            partitions = self._session(request, now)
        except errors.DeltaBusError as e:
            return ShareFetchAnswer(e, [], deadline_s, lambda: [], lock_ms)
        answers = {tp: SharePartitionData(*tp) for tp in partitions}
        written: list[tuple[Future[None], SharePartitionData | None]] = []
        for tp, batches in request.acknowledgements.items():
            data = answers.setdefault(tp, SharePartitionData(*tp))
            data.acknowledged = True
            written.append((self._acknowledge(request.group_id, request.member_id, tp,
                                              batches, data), data))
        if request.session_epoch == CLOSE_EPOCH:
            written += [(f, None) for f in self._release_member(
                request.group_id, request.member_id, partitions)]
        futures = [f for f, _ in written]
        if written:  # acknowledgements are answered once durable, however long the max wait
            deadline_s = max(deadline_s, time.monotonic() + STATE_TIMEOUT_S)
        if not request.fetching or request.session_epoch == CLOSE_EPOCH:
            return ShareFetchAnswer(None, futures, deadline_s,
                                    lambda: self._answers(answers, written), lock_ms)
        acquired = self._acquire(request, partitions, answers)
        if acquired or request.max_wait_ms <= 0:
            return ShareFetchAnswer(None, futures, deadline_s,
                                    lambda: self._answers(answers, written), lock_ms)
        wake = self._wait_for_records(request, partitions)

        def complete() -> list[SharePartitionData]:
            self._discard_waiter(wake)
            self._acquire(request, partitions, answers)
            return self._answers(answers, written)

        return ShareFetchAnswer(None, [*futures, wake], deadline_s, complete, lock_ms)

    def _session(self, request: ShareFetchRequest, now: float) -> list[TopicPartition]:
        """The session's partitions after this request's epoch, adds and forgets (Kafka's
        ShareSessionCache rules)."""
        key = (request.group_id, request.member_id)
        with self._lock:
            session = self._sessions.get(key)
            epoch = request.session_epoch
            if epoch == OPEN_EPOCH:
                if not request.fetching:
                    raise errors.InvalidShareSessionEpochError(
                        "ShareAcknowledge cannot open a share session (epoch 0)")
                if request.acknowledgements:
                    raise errors.InvalidRequestError(
                        "a ShareFetch opening a share session (epoch 0) carries no "
                        "acknowledgements")
                if session is None and len(self._sessions) >= \
                        self._config.group_share_max_share_sessions:
                    raise errors.ShareSessionLimitReachedError(
                        f"this broker holds group.share.max.share.sessions "
                        f"({self._config.group_share_max_share_sessions}) share sessions")
                session = self._sessions[key] = _Session(1, [], now)
                # A member starting anew: where nobody holds records, what is durable may
                # have moved meanwhile (offsets altered or deleted): read it again.
                self._recheck.update((request.group_id, *tp) for tp in request.added)
            elif session is None:
                raise errors.ShareSessionNotFoundError(
                    f"no share session of member {request.member_id} of share group "
                    f"{request.group_id} on this broker")
            elif epoch == CLOSE_EPOCH:
                del self._sessions[key]
                return list(session.partitions)
            elif epoch != session.epoch:
                del self._sessions[key]
                raise errors.InvalidShareSessionEpochError(
                    f"share session epoch {epoch} is not the next one ({session.epoch})")
            else:
                session.epoch = session.epoch + 1 if session.epoch < 2**31 - 1 else 1
            session.last_used_s = now
            for tp in request.added:
                if tp not in session.partitions:
                    session.partitions.append(tp)
            gone = [tp for tp in request.forgotten if tp in session.partitions]
            for tp in gone:
                session.partitions.remove(tp)
        if gone:
            self._release_member(request.group_id, request.member_id, gone)
        return list(session.partitions)

    @staticmethod
    def _answers(answers: dict[TopicPartition, SharePartitionData],
                 written: list[tuple[Future[None], SharePartitionData | None]]
                 ) -> list[SharePartitionData]:
        for future, data in written:  # done by now, unless the store did not answer in time
            if not future.done() and data is not None and data.acknowledge_error is None:
                data.acknowledge_error = errors.RequestTimedOutError(
                    f"the share state store did not write {data.topic}-{data.partition}'s "
                    f"acknowledgements in {STATE_TIMEOUT_S:.0f} s")
        return list(answers.values())

    # ---- acknowledgements ----------------------------------------------------------------------

    def _acknowledge(self, group_id: str, member_id: str, tp: TopicPartition,
                     batches: list[AcknowledgementBatch], data: SharePartitionData
                     ) -> Future[None]:
        """Apply a partition's acknowledgements; the future resolves once they are durable
        (the partition's `acknowledge_error` set if they were refused or not written)."""
        done: Future[None] = Future()

        def failed(e: errors.DeltaBusError) -> Future[None]:
            data.acknowledge_error = e
            done.set_result(None)
            return done

        try:
            sp = self._load(group_id, *tp)
        except errors.DeltaBusError as e:
            return failed(e)
        with self._lock:
            if self._partitions.get((group_id, *tp)) is not sp:
                return failed(errors.NotLeaderOrFollowerError(
                    f"{tp[0]}-{tp[1]}: its share state was reloaded"))
            try:
                sp.acknowledge(member_id, batches)
            except errors.DeltaBusError as e:
                data.acknowledge_error = e  # batches that were valid still apply
            persisted = self._persist((group_id, *tp), sp)
        self._wake()

        def written(f: Future[None]) -> None:
            error = f.exception()
            if error is not None and data.acknowledge_error is None:
                data.acknowledge_error = error if isinstance(error, errors.DeltaBusError) \
                    else errors.KafkaStorageError(f"{error!r}")
            _resolve(done)

        persisted.add_done_callback(written)
        return done

    def _release_member(self, group_id: str, member_id: str,
                        partitions: Sequence[TopicPartition]) -> list[Future[None]]:
        """What the member holds in these partitions is available again (its session closed,
        it forgot them); written, since a release may archive records at their limit."""
        written = []
        with self._lock:
            for tp in partitions:
                sp = self._partitions.get((group_id, *tp))
                if sp is not None and sp.release_member(member_id):
                    written.append(self._persist((group_id, *tp), sp))
        self._wake()
        return written

    # ---- acquiring -----------------------------------------------------------------------------

    def _acquire(self, request: ShareFetchRequest, partitions: list[TopicPartition],
                 answers: dict[TopicPartition, SharePartitionData]) -> int:
        """Acquire up to max_records in the partitions, starting at the session's turn;
        returns how many were acquired."""
        with self._lock:
            session = self._sessions.get((request.group_id, request.member_id))
            turn = session.turn if session is not None else 0
            if session is not None:
                session.turn += 1
        left, bytes_left, total = request.max_records, request.max_bytes, 0
        count = len(partitions)
        for i in range(count):
            tp = partitions[(turn + i) % count]
            data = answers[tp]
            if left <= 0 or bytes_left <= 0 or data.error is not None or data.acquired:
                continue
            try:
                rows, acquired = self._acquire_in(request.group_id, request.member_id, tp,
                                                  left, bytes_left)
            except errors.DeltaBusError as e:
                data.error = e
                continue
            if acquired:
                data.records, data.acquired = rows, acquired
                taken = sum(a.last_offset - a.first_offset + 1 for a in acquired)
                left, total = left - taken, total + taken
                bytes_left -= rows.nbytes
        return total

    def _acquire_in(self, group_id: str, member_id: str, tp: TopicPartition,
                    max_records: int, max_bytes: int) -> tuple[pa.Table, list[Acquired]]:
        """Read what a partition's SharePartition wants and acquire what the log has there:
        to the high watermark, or (share.isolation.level=read_committed) to the last stable
        offset, without the records of aborted transactions (gaps, as markers are)."""
        settings = self.settings(group_id)
        isolation = (READ_COMMITTED if settings.isolation_level == "read_committed"
                     else READ_UNCOMMITTED)
        sp = self._load(group_id, *tp)
        high_watermark = self._logs.list_offsets(tp[0], tp[1], LATEST_TIMESTAMP, isolation)[0]
        with self._lock:
            sp.lock_duration_ms = settings.record_lock_duration_ms
            asked = sp.to_read(high_watermark, max_records)
        if asked is None:
            return _EMPTY, []
        first, last = asked
        # What max_records needs, not the whole of a 50 MB fetch.max.bytes past it.
        read_bytes = min(max_bytes, cfg.FETCH_PARTITION_MAX_BYTES)
        result = self._logs.fetch([FetchSpec(tp[0], tp[1], first, read_bytes,
                                             isolation_level=isolation)], max_wait_ms=0,
                                  min_bytes=0, max_bytes=read_bytes, replica_id=-1)[0]
        if isinstance(result.error, errors.OffsetOutOfRangeError) and \
                first < result.log_start_offset:
            with self._lock:
                sp.skip_to(result.log_start_offset)
                self._persist((group_id, *tp), sp)
            return _EMPTY, []
        if result.error is not None:
            raise result.error
        rows = result.records if result.records is not None else _EMPTY
        offsets = rows.column("offset") if rows.num_rows else pa.array([], pa.int64())
        if rows.num_rows and pc.max(offsets).as_py() >= last:
            read_to = last
        else:
            read_to = pc.max(offsets).as_py() + 1 if rows.num_rows else last
        data_rows = consumed_rows(rows.filter(pc.less(offsets, last)),
                                  result.aborted_transactions or ()) if rows.num_rows else rows
        present = data_rows.column("offset").to_pylist() if data_rows.num_rows else []
        with self._lock:
            if self._partitions.get((group_id, *tp)) is not sp:
                return _EMPTY, []  # reloaded meanwhile: the next fetch acquires
            acquired = sp.acquire(member_id, present, read_to, max_records)
        if not acquired:
            return _EMPTY, []
        taken = pa.array([o for a in acquired for o in range(a.first_offset, a.last_offset + 1)],
                         pa.int64())
        return data_rows.filter(pc.is_in(data_rows.column("offset"), value_set=taken)), acquired

    def _wait_for_records(self, request: ShareFetchRequest,
                          partitions: list[TopicPartition]) -> Future[None]:
        """A future done when records may be there to acquire: an append to one of the
        partitions, a release, a lock timing out (the sweeper), or the max wait."""
        wake: Future[None] = Future()
        with self._lock:
            self._waiters.append((time.monotonic() + request.max_wait_ms / 1000, wake))
            specs = []
            for tp in partitions:
                sp = self._partitions.get((request.group_id, *tp))
                if sp is not None:
                    specs.append(FetchSpec(tp[0], tp[1], sp.end_offset, 1))
        if specs:
            try:
                appended = self._logs.fetch_delayed(
                    specs, max_wait_ms=request.max_wait_ms, min_bytes=1, max_bytes=1,
                    replica_id=-1)
                appended.add_done_callback(lambda _: _set(wake))
            except errors.DeltaBusError:
                _set(wake)
        return wake

    def _discard_waiter(self, wake: Future[None]) -> None:
        with self._lock:
            self._waiters = [(d, w) for d, w in self._waiters if w is not wake]

    def _wake(self, only_due: bool = False) -> None:
        """Wake every waiting fetch (records may have become available), or only those past
        their max wait."""
        now = time.monotonic()
        with self._lock:
            woken = [w for d, w in self._waiters if not only_due or d <= now]
            self._waiters = [(d, w) for d, w in self._waiters if only_due and d > now]
        for wake in woken:
            _set(wake)

    # ---- state ---------------------------------------------------------------------------------

    def _load(self, group_id: str, topic: str, partition: int) -> SharePartition:
        """The group's SharePartition, loaded (claimed) on first use or after this broker's
        leader epoch changed. NOT_LEADER_OR_FOLLOWER where this broker does not lead."""
        key = (group_id, topic, partition)
        _, _, epoch = self._logs.list_offsets(topic, partition, LATEST_TIMESTAMP)
        with self._lock:
            old = self._partitions.get(key)
            if old is not None and old.leader_epoch == epoch and not self._stale(key, old):
                return old
            old_version = old.version if old is not None else -1
        with self._load_lock:
            with self._lock:
                sp = self._partitions.get(key)
                if sp is not None and sp is not old and sp.leader_epoch == epoch:
                    return sp  # another request loaded it meanwhile
            state = _wait(self._state.claim(group_id, topic, partition, epoch), "claim")
            settings = self.settings(group_id)
            if state is None:
                start = self._start_offset(topic, partition, settings)
                state = _wait(self._state.alter(group_id, topic, partition, start), "start")
                log.info("share group %s starts %s-%d at offset %d (%s)", group_id, topic,
                         partition, start, settings.auto_offset_reset)
            sp = SharePartition(
                dataclasses.replace(state, leader_epoch=epoch),
                lock_duration_ms=settings.record_lock_duration_ms,
                delivery_count_limit=self._config.group_share_delivery_count_limit,
                max_record_locks=self._config.group_share_partition_max_record_locks,
                clock=self._clock)
            with self._lock:
                current = self._partitions.get(key)
                if (current is old and old is not None and old.leader_epoch == epoch
                        and (old.version != old_version or old.acquired())):
                    return old  # used while this was read: what it holds is newer
                self._partitions[key] = sp
            return sp

    def _start_offset(self, topic: str, partition: int, settings: ShareGroupSettings) -> int:
        """Where a group new to a partition starts (share.auto.offset.reset): the latest
        offset, the earliest, or the first record at most `by_duration` old (the latest where
        none is)."""
        duration = settings.reset_duration()
        if settings.auto_offset_reset == "earliest":
            return self._logs.list_offsets(topic, partition, EARLIEST_TIMESTAMP)[0]
        if duration is not None:
            since_ms = int((time.time() - duration.total_seconds()) * 1000)
            found = self._logs.list_offsets(topic, partition, max(0, since_ms))[0]
            if found >= 0:
                return found
        return self._logs.list_offsets(topic, partition, LATEST_TIMESTAMP)[0]

    def _stale(self, key: Key, sp: SharePartition) -> bool:
        """Lock held. Whether a SharePartition a new session named is to be read again: when
        nobody holds a record of it and nothing is being written, memory is what is durable
        but for what an admin changed since."""
        if key not in self._recheck:
            return False
        self._recheck.discard(key)
        persister = self._persisters.get(key)
        return (not sp.acquired() and (persister is None or not persister.writing))

    def _persist(self, key: Key, sp: SharePartition) -> Future[None]:
        """Lock held. A future done once a snapshot at least as new as `sp` now is durable;
        a failed write drops `sp`, so the next use loads what is durable."""
        done: Future[None] = Future()
        persister = self._persisters.setdefault(key, _Persister())
        persister.waiters.append(done)
        if not persister.writing:
            self._write_next(key, sp, persister)
        return done

    def _write_next(self, key: Key, sp: SharePartition, persister: _Persister) -> None:
        """Lock held."""
        waiters, persister.waiters, persister.writing = persister.waiters, [], True
        try:
            write = self._state.write(sp.snapshot())
        except errors.DeltaBusError as e:
            write = Future()
            write.set_exception(e)

        def done(f: Future[None]) -> None:
            error = f.exception()
            with self._lock:
                persister.writing = False
                if error is not None:
                    log.warning("share group %s %s-%d: its state was not written (%s); "
                                "reloading it", *key, error)
                    if self._partitions.get(key) is sp:
                        del self._partitions[key]
                if persister.waiters:
                    if self._partitions.get(key) is sp:
                        self._write_next(key, sp, persister)
                    else:
                        for w in persister.waiters:
                            _resolve(w, error or errors.NotLeaderOrFollowerError(
                                f"{key[1]}-{key[2]}: its share state was reloaded"))
                        persister.waiters = []
            for w in waiters:
                _resolve(w, error)

        write.add_done_callback(done)

    # ---- time ----------------------------------------------------------------------------------

    def _sweep(self) -> None:
        """Time out locks (written: a record at its delivery count limit is archived; and
        waking fetches, since records are available again) and idle sessions (releasing what
        their members hold)."""
        while not self._closed.wait(SWEEP_INTERVAL_S):
            now = self._clock()
            idle_s = self._config.group_share_session_timeout_ms / 1000
            with self._lock:
                expired = [(held, sp) for held, sp in self._partitions.items()
                           if sp.expire_locks()]
                for held, sp in expired:  # archived at the limit: the start offset may move
                    self._persist(held, sp)
                idle = [(key, s) for key, s in self._sessions.items()
                        if now - s.last_used_s > idle_s]
                for key, _ in idle:
                    del self._sessions[key]
            for (group_id, member_id), session in idle:
                log.info("share group %s: member %s's share session was idle; closed",
                         group_id, member_id)
                self._release_member(group_id, member_id, session.partitions)
            self._wake(only_due=not expired)

    # ---- what the console and tests read -------------------------------------------------------

    def share_partition(self, group_id: str, topic: str, partition: int
                        ) -> SharePartition | None:
        with self._lock:
            return self._partitions.get((group_id, topic, partition))


_EMPTY = pa.table({"offset": pa.array([], pa.int64())})


def _set(future: Future[None]) -> None:
    _resolve(future)


def _resolve(future: Future[None], error: BaseException | None = None) -> None:
    """Complete a future that another thread may have completed meanwhile."""
    try:
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass


def _wait(future: Future[Any], what: str) -> Any:
    try:
        return future.result(STATE_TIMEOUT_S)
    except TimeoutError:
        raise errors.CoordinatorNotAvailableError(
            f"the share state store did not answer a {what} in {STATE_TIMEOUT_S:.0f} s"
        ) from None
