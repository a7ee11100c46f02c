"""A partition replica hosted by a broker: its log, its role, and, on the leader, what the
followers hold. Runs on executors, inside a broker. Thread-safe (one lock per partition).

As in Kafka's `Partition`: the leader learns each follower's log end offset from the offset it
fetches at, and moves the high watermark to the smallest log end offset in the ISR, so consumers
only see records every in-sync replica holds and acks=all is answered once they all do. A follower
that has not caught up with the leader's log end for `replica.lag.time.max.ms` is dropped from the
ISR; one that reaches the high watermark (and the start of the current leader epoch) joins again.
ISR changes go to the controller (AlterPartition); while one is in flight the high watermark
counts the replicas being added (the "maximal ISR"), so it never passes a replica the controller
may already call in sync.

DeleteRecords moves the leader's log start offset up and is answered once every replica in the
ISR reports a log start offset at least as high in its fetches (Kafka's low watermark), so a
follower that becomes the leader serves nothing below it either.

Invariants: only a leader appends produced records or moves its high watermark from follower
state; a follower's high watermark is at most the leader's; the high watermark never goes back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from deltabus import errors
from deltabus.log_tables.partition_log import AppendResult, PartitionLog
from deltabus.metadata import PartitionState

log = logging.getLogger(__name__)

# How long an ISR change whose AlterPartition got no answer stays pending: longer than the
# request's timeout, so the controller has either committed it (metadata shows it) or never will.
UNRESOLVED_ISR_CHANGE_S = 30.0


@dataclass
class FollowerState:
    """The leader's view of one follower replica."""

    log_end_offset: int = -1  # unknown until it fetches from this leader
    last_caught_up_s: float = 0.0  # when it last held everything the leader had
    last_fetch_s: float = 0.0
    last_fetch_leader_end_offset: int = -1
    log_start_offset: int = -1  # as its last fetch said (-1: not known yet)


class Partition:
    """One topic-partition replica on this broker."""

    def __init__(self, topic: str, partition: int, broker_id: int, partition_log: PartitionLog,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.topic = topic
        self.partition = partition
        self.broker_id = broker_id
        self.log = partition_log
        self._clock = clock
        self._lock = threading.RLock()
        self.leader = -1
        self.leader_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.adding_replicas: tuple[int, ...] = ()  # a reassignment's: throttled (moves)
        self.isr: tuple[int, ...] = ()  # as committed by the controller
        self._isr_version = -1  # metadata version the ISR came from
        self._pending_isr: tuple[int, ...] | None = None  # an AlterPartition in flight
        self._unresolved_until: float | None = None  # when a change with no answer is dropped
        self.leader_epoch_start_offset = -1
        self._followers: dict[int, FollowerState] = {}
        # DeleteRecords answers waiting for the low watermark: (offset, future of it).
        self._low_watermark_waiters: list[tuple[int, Future[int]]] = []
        # Bytes of the batches appended as leader (the balancer's load, from the heartbeats).
        self.bytes_in = 0

    @property
    def is_leader(self) -> bool:
        return self.leader == self.broker_id

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR plus replicas an in-flight AlterPartition adds: what the HW must wait for."""
        with self._lock:
            if self._pending_isr is None:
                return self.isr
            return self.isr + tuple(r for r in self._pending_isr if r not in self.isr)

    @property
    def minimal_isr(self) -> tuple[int, ...]:
        """The ISR without replicas an in-flight AlterPartition drops: what acks=all may count
        on. A replica the leader proposed to drop is lagging; counting it towards
        min.insync.replicas would append records it then cannot replicate."""
        with self._lock:
            if self._pending_isr is None:
                return self.isr
            return tuple(r for r in self.isr if r in self._pending_isr)

    # ---- metadata ------------------------------------------------------------------------------

    def apply(self, state: PartitionState, version: int) -> bool:
        """Take the partition state of metadata `version`. Returns True when this broker just
        became the leader or a follower of a new leader epoch (its role changed)."""
        with self._lock:
            if state.leader_epoch < self.leader_epoch:
                return False  # older than what we hold
            new_epoch = state.leader_epoch > self.leader_epoch or state.leader != self.leader
            was_leader = self.is_leader
            self.replicas = state.replicas
            self.adding_replicas = state.adding_replicas
            if new_epoch or version >= self._isr_version:
                self.isr, self._isr_version = state.isr, version
                # A change in flight stays pending until its answer (or metadata showing it)
                # comes: metadata the controller sent before committing it still shows the old
                # ISR, and a high watermark computed from that could pass a replica the
                # controller is about to count as in sync (and may then elect).
                if new_epoch or self._pending_isr is None or set(state.isr) == set(
                        self._pending_isr) or self._unresolved_expired():
                    self._pending_isr = None
                    self._unresolved_until = None
            if not new_epoch:  # replicas may have been added or removed (a reassignment)
                now = self._clock()
                self._followers = {
                    r: self._followers.get(r) or FollowerState(last_caught_up_s=now)
                    for r in self.replicas if r != self.broker_id} if self.is_leader else {}
                self._advance_high_watermark()
                return False
            self.leader, self.leader_epoch = state.leader, state.leader_epoch
            if self.is_leader:
                now = self._clock()
                self.leader_epoch_start_offset = self.log.log_end_offset
                # Followers get a full lag period to show up before they count as lagging.
                self._followers = {r: FollowerState(last_caught_up_s=now)
                                   for r in self.replicas if r != self.broker_id}
                log.info("broker %d leads %s-%d at epoch %d from offset %d (ISR %s)",
                         self.broker_id, self.topic, self.partition, self.leader_epoch,
                         self.leader_epoch_start_offset, list(self.isr))
                self._advance_high_watermark()
            else:
                self._followers = {}
                log.info("broker %d follows %s-%d (leader %d, epoch %d) from offset %d",
                         self.broker_id, self.topic, self.partition, self.leader,
                         self.leader_epoch, self.log.log_end_offset)
        if was_leader and not self.is_leader:  # acks=all waiters can no longer be answered
            lost = errors.NotLeaderOrFollowerError(
                f"broker {self.broker_id} lost the leadership of {self.topic}-{self.partition}")
            self.log.fail_waiters(lost)
            with self._lock:
                waiters, self._low_watermark_waiters = self._low_watermark_waiters, []
            for _, future in waiters:
                future.set_exception(lost)
        return True

    def isr_committed(self, isr: tuple[int, ...], version: int) -> None:
        """The controller accepted an ISR change (AlterPartition response)."""
        with self._lock:
            if version >= self._isr_version:
                self.isr, self._isr_version = isr, version
            self._pending_isr = None
            self._unresolved_until = None
            self._advance_high_watermark()
        self._resolve_low_watermark()

    def isr_change_failed(self, outcome_known: bool = True) -> None:
        """The controller refused the change (`outcome_known`), or the request failed without an
        answer: then the controller may still have committed it, so it stays pending (the high
        watermark keeps waiting for any replica it adds) until metadata shows the ISR, or for
        `UNRESOLVED_ISR_CHANGE_S`."""
        with self._lock:
            if outcome_known:
                self._pending_isr = None
            else:
                self._unresolved_until = self._clock() + UNRESOLVED_ISR_CHANGE_S

    def _unresolved_expired(self) -> bool:
        """Lock held."""
        return self._unresolved_until is not None and self._clock() > self._unresolved_until

    def _change_pending(self) -> bool:
        """Lock held: is an ISR change still in flight (one with no answer expires)?"""
        if self._pending_isr is not None and self._unresolved_expired():
            self._pending_isr = self._unresolved_until = None
        return self._pending_isr is not None

    # ---- leader: follower fetches --------------------------------------------------------------

    def check_leader(self, current_leader_epoch: int = -1) -> int:
        """Raise Kafka's error unless this broker leads the partition at the epoch the client
        knows (-1: not checked). Returns the leader epoch."""
        with self._lock:
            if not self.is_leader:
                raise errors.NotLeaderOrFollowerError(
                    f"broker {self.broker_id} is not the leader of {self.topic}-"
                    f"{self.partition} (leader: {self.leader})")
            epoch = self.leader_epoch
        if 0 <= current_leader_epoch < epoch:
            raise errors.FencedLeaderEpochError(
                f"leader epoch {current_leader_epoch} is older than {epoch}")
        if current_leader_epoch > epoch:
            raise errors.UnknownLeaderEpochError(
                f"leader epoch {current_leader_epoch} is newer than {epoch}")
        return epoch

    def check_offsets_available(self) -> None:
        """Raise OFFSET_NOT_AVAILABLE while this new leader's high watermark is below the start
        of its epoch: the old leader may have shown consumers offsets up to there, so "latest"
        (or a timestamp lookup) now could go back in time (Kafka's KIP-207). Retriable: it ends
        once the followers fetch and the high watermark catches up."""
        with self._lock:
            start = self.leader_epoch_start_offset
        hw = self.log.high_watermark
        if hw < start:
            raise errors.OffsetNotAvailableError(
                f"{self.topic}-{self.partition}: the high watermark {hw} of the new leader has "
                f"not reached the start of its epoch {self.leader_epoch} at offset {start}")

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch on the leader: (the largest epoch at most
        `leader_epoch`, where it ends in this log); (-1, -1) for an epoch newer than this
        leader's (Kafka's UNDEFINED_EPOCH_OFFSET). A consumer whose position is past the end of
        its epoch lost records to a truncation."""
        with self._lock:
            if leader_epoch > self.leader_epoch:
                return -1, -1
        return self.log.end_offset_for_epoch(leader_epoch)

    def diverging_epoch(self, fetch_offset: int, last_fetched_epoch: int) -> tuple[int, int] | None:
        """Where a follower's log parts from ours (Kafka's DivergingEpoch), or None when its
        records up to `fetch_offset` agree with ours."""
        leo = self.log.log_end_offset
        if last_fetched_epoch >= 0:
            epoch, end = self.log.end_offset_for_epoch(last_fetched_epoch)
            if epoch < 0:  # we hold no records at all
                return -1, leo
            if end < fetch_offset or epoch < last_fetched_epoch:
                return epoch, end
        if fetch_offset > leo:
            return -1, leo
        return None

    def follower_fetched(self, replica_id: int, fetch_offset: int,
                         log_start_offset: int = -1) -> list[int] | None:
        """A follower fetched at `fetch_offset`: it holds everything before it, and nothing
        below `log_start_offset`. Updates its state, the high watermark and the low watermark.
        Returns a proposed larger ISR when it has caught up."""
        proposal = self._follower_fetched(replica_id, fetch_offset, log_start_offset)
        self._resolve_low_watermark()
        return proposal

    def _follower_fetched(self, replica_id: int, fetch_offset: int,
                          log_start_offset: int) -> list[int] | None:
        now = self._clock()
        with self._lock:
            follower = self._followers.get(replica_id)
            if follower is None or not self.is_leader:
                return None
            if log_start_offset >= 0:
                follower.log_start_offset = log_start_offset
            leo = self.log.log_end_offset
            if fetch_offset >= leo:
                follower.last_caught_up_s = now
            elif fetch_offset >= follower.last_fetch_leader_end_offset >= 0:
                follower.last_caught_up_s = follower.last_fetch_s
            follower.log_end_offset = fetch_offset
            follower.last_fetch_s = now
            follower.last_fetch_leader_end_offset = leo
            self._advance_high_watermark()
            if (replica_id not in self.isr and not self._change_pending()
                    and fetch_offset >= self.log.high_watermark
                    and fetch_offset >= self.leader_epoch_start_offset):
                self._pending_isr = tuple(r for r in self.replicas
                                          if r in self.isr or r == replica_id)
                return list(self._pending_isr)
        return None

    def lagging_isr(self, lag_max_ms: int) -> list[int] | None:
        """A smaller ISR without the followers that have not caught up for `lag_max_ms`, or
        None when all keep up (or a change is already in flight)."""
        now = self._clock()
        with self._lock:
            if not self.is_leader or self._change_pending():
                return None
            lagging = [r for r in self.isr if r != self.broker_id
                       and now - self._followers.get(r, FollowerState()).last_caught_up_s
                       > lag_max_ms / 1000]
            if not lagging:
                return None
            self._pending_isr = tuple(r for r in self.isr if r not in lagging)
            log.warning("%s-%d: followers %s are more than %d ms behind; shrinking the ISR",
                        self.topic, self.partition, lagging, lag_max_ms)
            return list(self._pending_isr)

    def on_log_change(self) -> None:
        """The log's end moved (a commit): a leader may move its high watermark."""
        with self._lock:
            if self.is_leader:
                self._advance_high_watermark()

    def _advance_high_watermark(self) -> None:
        """Lock held. HW = the smallest log end offset in the maximal ISR."""
        if not self.is_leader:
            return
        hw = self.log.log_end_offset
        for r in self.maximal_isr:
            if r != self.broker_id:
                hw = min(hw, self._followers.get(r, FollowerState()).log_end_offset)
        if hw > self.log.high_watermark:
            self.log.advance_high_watermark(hw)

    # ---- leader: DeleteRecords ---------------------------------------------------------------

    def delete_records(self, offset: int) -> Future[int]:
        """Kafka's DeleteRecords on the leader: move the log start offset up to `offset` (-1:
        the high watermark), never down. The future holds the low watermark (the smallest log
        start offset in the ISR) once it reaches `offset`; it fails NOT_LEADER_OR_FOLLOWER
        when the leadership moves first. Past the high watermark: OFFSET_OUT_OF_RANGE."""
        self.check_leader()
        high_watermark = self.log.high_watermark
        if offset == -1:
            offset = high_watermark
        if offset < 0 or offset > high_watermark:
            raise errors.OffsetOutOfRangeError(
                f"cannot delete the records of {self.topic}-{self.partition} below offset "
                f"{offset}: its high watermark is {high_watermark}")
        done: Future[int] = Future()

        def committed(f: Future[AppendResult]) -> None:
            error = f.exception()
            if error is not None:
                done.set_exception(error)
                return
            with self._lock:
                self._low_watermark_waiters.append((offset, done))
            self._resolve_low_watermark()

        self.log.advance_log_start(offset).add_done_callback(committed)
        return done

    def _low_watermark(self) -> int:
        """Lock held: the smallest log start offset among the ISR's replicas (-1: one unknown)."""
        low = self.log.log_start_offset
        for r in self.maximal_isr:
            if r != self.broker_id:
                low = min(low, self._followers.get(r, FollowerState()).log_start_offset)
        return low

    def _resolve_low_watermark(self) -> None:
        """Answer the DeleteRecords the low watermark has reached (outside the lock)."""
        with self._lock:
            if not self._low_watermark_waiters:
                return
            low = self._low_watermark()
            ready = [w for w in self._low_watermark_waiters if w[0] <= low]
            self._low_watermark_waiters = [w for w in self._low_watermark_waiters
                                           if w[0] > low]
        for _, future in ready:
            if not future.done():
                future.set_result(low)

    # ---- leader: produce -----------------------------------------------------------------------

    def count_bytes_in(self, appended: Future[AppendResult], size: int) -> None:
        """Once `appended` commits, its `size` bytes count as this partition's bytes in."""
        def count(future: Future[AppendResult]) -> None:
            if future.exception() is None:
                with self._lock:
                    self.bytes_in += size
        appended.add_done_callback(count)

    def acknowledged(self, appended: Future[AppendResult], leader_epoch: int,
                     min_insync_replicas: int | None = None) -> Future[AppendResult]:
        """The answer to a produce appended at `leader_epoch`: acks=1 once the append
        committed; acks=all (`min_insync_replicas` given) once the high watermark passes the
        records too, failing NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below the
        minimum meanwhile.

        Either only while this broker still leads at `leader_epoch`: an append queued before
        the leadership moved commits afterwards, and the new leader's log will truncate it and
        refill its offsets (a high watermark passing them as a follower says nothing about
        them). Acknowledging it would lose the records, and an idempotent producer's next batch
        would never be in sequence again; NOT_LEADER_OR_FOLLOWER makes the producer retry at
        the new leader, which answers DUPLICATE_SEQUENCE_NUMBER if they did get there."""
        done: Future[AppendResult] = Future()

        def still_leading() -> bool:
            with self._lock:
                if self.is_leader and self.leader_epoch == leader_epoch:
                    return True
            done.set_exception(errors.NotLeaderOrFollowerError(
                f"broker {self.broker_id} no longer leads {self.topic}-{self.partition} at "
                f"epoch {leader_epoch}: the records may not be replicated"))
            return False

        def on_hw(hw_future: Future[int], result: AppendResult) -> None:
            error = hw_future.exception()
            if error is not None:
                done.set_exception(error)
            elif not still_leading():
                return
            elif min_insync_replicas is not None and len(self.isr) < min_insync_replicas:
                done.set_exception(errors.NotEnoughReplicasAfterAppendError(
                    f"{self.topic}-{self.partition} has {len(self.isr)} in-sync replicas, fewer "
                    f"than min.insync.replicas={min_insync_replicas}; the records were "
                    "written but may be lost"))
            else:
                done.set_result(result)

        def on_append(f: Future[AppendResult]) -> None:
            error = f.exception()
            if error is not None:
                done.set_exception(error)
            elif not still_leading():
                return
            elif min_insync_replicas is None:
                done.set_result(f.result())
            else:
                result = f.result()
                self.log.await_high_watermark(result.last_offset).add_done_callback(
                    lambda h: on_hw(h, result))

        appended.add_done_callback(on_append)
        return done

    def check_min_isr(self, min_insync_replicas: int) -> None:
        isr = self.minimal_isr
        if len(isr) < min_insync_replicas:
            raise errors.NotEnoughReplicasError(
                f"{self.topic}-{self.partition} has {len(isr)} in-sync replicas {list(isr)}, "
                f"fewer than min.insync.replicas={min_insync_replicas}")

    # ---- follower ------------------------------------------------------------------------------

    def follower_high_watermark(self, leader_high_watermark: int) -> None:
        """A follower's high watermark: the leader's, as far as this log reaches."""
        self.log.advance_high_watermark(min(leader_high_watermark, self.log.log_end_offset))

    def truncation_offset(self, diverging: tuple[int, int]) -> int:
        """Where to truncate when the leader says our logs part at (epoch, end offset)."""
        epoch, end = diverging
        if epoch < 0:
            return min(end, self.log.log_end_offset)
        own_epoch, own_end = self.log.end_offset_for_epoch(epoch)
        if own_epoch < 0:
            return min(end, self.log.log_end_offset)
        return min(end, own_end)
