"""The consumer's side of a consumer group (Kafka's client ConsumerCoordinator).

Finds the group coordinator, joins the group, computes the assignment when it is the leader,
heartbeats from a background thread, and commits and fetches offsets. Owned by one `Consumer`;
its methods run on the consumer's polling thread, except the heartbeat thread, which only sends
heartbeats and sets `rejoin_needed` (so the application's thread does every rebalance, where its
rebalance listener can commit before partitions move, as in Kafka).

Rebalance protocols: EAGER assignors (range, roundrobin) give up every partition before each
rebalance; COOPERATIVE (cooperative-sticky) keeps what stays with the member and gives up only
what moves, then joins once more so the partition reaches its new owner.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import grpc

from deltabus import errors
from deltabus.client.assignors import Assignor
from deltabus.client.cluster_client import ClusterClient
from deltabus.client.consumer_protocol import Assignment, Subscription
from deltabus.rpc.status import error_from_rpc
from deltabus.rpc.v1 import deltabus_pb2 as pb

log = logging.getLogger(__name__)

PROTOCOL_TYPE = "consumer"
# Errors after which the member must join again (its generation or membership is gone).
REJOIN_ERRORS = (errors.RebalanceInProgressError, errors.IllegalGenerationError,
                 errors.UnknownMemberIdError, errors.MemberIdRequiredError)
COORDINATOR_ERRORS = (errors.NotCoordinatorError, errors.CoordinatorNotAvailableError,
                      errors.CoordinatorLoadInProgressError, errors.NetworkError)


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class ConsumerGroupMetadata(NamedTuple):
    """What a transactional producer's send_offsets_to_transaction needs of a consumer: its
    group and membership, which the coordinator checks (KIP-447: a zombie's offsets fail)."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""


class OffsetAndMetadata(NamedTuple):
    offset: int
    metadata: str = ""
    leader_epoch: int = -1


class CommitFailedError(errors.ClientError):
    """The commit cannot complete: the group rebalanced and the partitions may be someone
    else's now (Kafka's CommitFailedException). The records since the last commit will be
    delivered again to whoever owns the partitions: at-least-once, never loss."""


class ConsumerCoordinator:
    """Group membership for one consumer. Not thread-safe except as described above."""

    def __init__(self, client: ClusterClient, group_id: str, *, session_timeout_ms: int,
                 heartbeat_interval_ms: int, max_poll_interval_ms: int,
                 assignors: list[Assignor], client_id: str) -> None:
        if heartbeat_interval_ms >= session_timeout_ms:
            raise errors.InvalidConfigError(
                "heartbeat_interval_ms must be lower than session_timeout_ms")
        self.group_id = group_id
        self._client = client
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self._assignors = {a.name: a for a in assignors}
        self._preference = [a.name for a in assignors]
        self._client_id = client_id
        self._coordinator: str | None = None
        self.member_id = ""
        self.generation_id = -1
        self.protocol = ""
        self.assignment: list[TopicPartition] = []
        self.rejoin_needed = True
        self._pending: tuple[str, Any] | None = None  # a JoinGroup or SyncGroup in flight
        self._partition_counts: dict[str, int] = {}  # of the subscribed topics, when assigned
        self._last_poll_s = time.monotonic()
        self._lock = threading.Lock()  # member id and generation, shared with the heartbeat
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                           name=f"deltabus-heartbeat-{group_id}")
        self._heartbeat.start()

    # ---- coordinator -------------------------------------------------------------------------

    def _call(self, method: str, request: Any, timeout_ms: int | None = None) -> Any:
        """An RPC to the group coordinator, finding it first (again after it moved); each
        call waits at most `timeout_ms` (None: request_timeout_ms)."""
        if self._coordinator is None:
            response = self._client.call_any("FindCoordinator",
                                             pb.FindCoordinatorRequest(key=self.group_id),
                                             timeout_ms)
            errors.check(response.error_code, response.error_message)
            self._coordinator = f"{response.host}:{response.port}"
        try:
            return self._client.call(self._coordinator, method, request, timeout_ms)
        except COORDINATOR_ERRORS:
            self._coordinator = None
            raise

    def _check(self, code: int, message: str) -> None:
        try:
            errors.check(code, message)
        except COORDINATOR_ERRORS:
            self._coordinator = None
            raise

    # ---- joining -----------------------------------------------------------------------------

    def ensure_active(self, topics: list[str], on_revoked: Callable[[list[TopicPartition]], None],
                      on_assigned: Callable[[list[TopicPartition]], None],
                      deadline_s: float) -> None:
        """Called at every poll: note the poll (for max.poll.interval.ms) and, when needed, take
        part in a rebalance until this member holds a stable assignment or the poll's deadline
        passes (the rebalance then goes on at the next poll, as Kafka's poll(timeout) does)."""
        self._last_poll_s = time.monotonic()
        if not self.rejoin_needed and self._partitions_changed(topics):
            log.info("group %s: the subscribed topics' partitions changed; rejoining",
                     self.group_id)
            self.rejoin_needed = True
        while self.rejoin_needed and not self._stop.is_set():
            try:
                if self._rebalance(topics, on_revoked, on_assigned, deadline_s):
                    continue
            except REJOIN_ERRORS as e:
                log.info("group %s: %s; joining again", self.group_id, e)
                self._pending = None
                if isinstance(e, errors.UnknownMemberIdError):
                    self._reset_member()
            except (*COORDINATOR_ERRORS, errors.RequestTimedOutError) as e:
                log.info("group %s: coordinator unavailable (%s); retrying", self.group_id, e)
                self._pending = None
                time.sleep(self._client.retry_backoff_ms / 1000)
            if time.monotonic() >= deadline_s:
                return

    def _rebalance(self, topics: list[str], on_revoked: Callable[[list[TopicPartition]], None],
                   on_assigned: Callable[[list[TopicPartition]], None], deadline_s: float) -> bool:
        """One step of a rebalance: send JoinGroup, then SyncGroup, each as a call the next poll
        picks up if it has not answered by `deadline_s`. Returns True when a step completed."""
        if self._pending is None:
            self._pending = ("join", self._send_join(topics, on_revoked))
        stage, call = self._pending
        try:
            response = call.result(timeout=max(0.0, deadline_s - time.monotonic()))
        except grpc.FutureTimeoutError:
            return False
        except grpc.RpcError as e:
            self._pending = None
            raise error_from_rpc(e) from None
        self._pending = None
        if stage == "join":
            self._joined(response)
            return True
        self._check(response.error_code, response.error_message)
        self._synced(response, topics, on_revoked, on_assigned)
        return True

    def _send_join(self, topics: list[str],
                   on_revoked: Callable[[list[TopicPartition]], None]) -> Any:
        cooperative = self._cooperative()
        if not cooperative and self.assignment:  # eager: give everything up first
            revoked, self.assignment = self.assignment, []
            on_revoked(revoked)
        owned = [(t, [p for tt, p in self.assignment if tt == t])
                 for t in sorted({tp.topic for tp in self.assignment})]
        metadata = Subscription(sorted(topics), owned_partitions=owned,
                                generation_id=self.generation_id).encode()
        return self._future("JoinGroup", pb.JoinGroupRequest(
            group_id=self.group_id, session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.max_poll_interval_ms, member_id=self.member_id,
            protocol_type=PROTOCOL_TYPE, client_id=self._client_id,
            protocols=[pb.JoinGroupProtocol(name=n, metadata=metadata)
                       for n in self._preference]),
            self.max_poll_interval_ms + self.session_timeout_ms + 5000)

    def _joined(self, join: pb.JoinGroupResponse) -> None:
        if join.member_id:
            with self._lock:
                self.member_id = join.member_id
        self._check(join.error_code, join.error_message)
        with self._lock:
            self.generation_id, self.protocol = join.generation_id, join.protocol_name
        assignments = self._assign(join) if join.leader == join.member_id else {}
        self._pending = ("sync", self._future("SyncGroup", pb.SyncGroupRequest(
            group_id=self.group_id, generation_id=join.generation_id, member_id=join.member_id,
            assignments=[pb.SyncGroupAssignment(member_id=m, assignment=a)
                         for m, a in assignments.items()]),
            self.max_poll_interval_ms + 5000))

    def _synced(self, sync: pb.SyncGroupResponse, topics: list[str],
                on_revoked: Callable[[list[TopicPartition]], None],
                on_assigned: Callable[[list[TopicPartition]], None]) -> None:
        new = [TopicPartition(t, p) for t, ps in Assignment.decode(sync.assignment).partitions
               for p in ps]
        revoked = [tp for tp in self.assignment if tp not in new]
        added = [tp for tp in new if tp not in self.assignment]
        if revoked:  # cooperative: give up what moves, then rejoin so its new owner gets it
            on_revoked(revoked)
        self.assignment = sorted(new)
        self._partition_counts = self._counts(topics)
        self.rejoin_needed = bool(revoked) and self._cooperative()
        log.info("group %s generation %d: member %s assigned %s", self.group_id,
                 self.generation_id, self.member_id, [f"{t}-{p}" for t, p in self.assignment])
        on_assigned(added)

    def _cooperative(self) -> bool:
        return all(a.rebalance_protocol == "COOPERATIVE" for a in self._assignors.values())

    def _future(self, method: str, request: Any, timeout_ms: int) -> Any:
        """An RPC to the coordinator, as a future (JoinGroup and SyncGroup are long polls)."""
        if self._coordinator is None:
            response = self._client.call_any("FindCoordinator",
                                             pb.FindCoordinatorRequest(key=self.group_id))
            errors.check(response.error_code, response.error_message)
            self._coordinator = f"{response.host}:{response.port}"
        return getattr(self._client.stub(self._coordinator), method).future(
            request, timeout=timeout_ms / 1000)

    def _assign(self, join: pb.JoinGroupResponse) -> dict[str, bytes]:
        """The leader's job: every member's partitions, by the group's chosen assignor."""
        assignor = self._assignors[join.protocol_name]
        subscriptions = {m.member_id: Subscription.decode(m.metadata) for m in join.members}
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        counts = self._counts(topics, refresh=True)
        plan = assignor.assign({t: n for t, n in counts.items() if n > 0}, subscriptions)
        out = {}
        for member_id, tps in plan.items():
            by_topic: dict[str, list[int]] = {}
            for topic, partition in tps:
                by_topic.setdefault(topic, []).append(partition)
            out[member_id] = Assignment(sorted(by_topic.items())).encode()
        return out

    def _counts(self, topics: list[str], refresh: bool = False) -> dict[str, int]:
        image = self._client.refresh_metadata() if refresh else self._client.metadata()
        return {t: len(image.topics[t].partitions) if t in image.topics else 0 for t in topics}

    def _partitions_changed(self, topics: list[str]) -> bool:
        """Partitions added to a subscribed topic (or a subscribed topic created): rebalance.
        Checked against metadata at most metadata.max.age.ms old, as Kafka's leader does."""
        return self._counts(topics) != self._partition_counts

    def _reset_member(self) -> None:
        with self._lock:
            self.member_id, self.generation_id = "", -1

    # ---- heartbeats --------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_interval_ms / 1000):
            with self._lock:
                member_id, generation_id = self.member_id, self.generation_id
            if not member_id or generation_id < 0 or self.rejoin_needed:
                continue
            if time.monotonic() - self._last_poll_s > self.max_poll_interval_ms / 1000:
                log.warning("group %s: poll() not called for max.poll.interval.ms (%d ms): "
                            "leaving the group so its partitions go to others; the next poll "
                            "joins again", self.group_id, self.max_poll_interval_ms)
                self.leave()
                continue
            try:
                response = self._call("Heartbeat", pb.HeartbeatRequest(
                    group_id=self.group_id, generation_id=generation_id, member_id=member_id))
                self._check(response.error_code, response.error_message)
            except REJOIN_ERRORS as e:
                if isinstance(e, errors.UnknownMemberIdError):
                    self._reset_member()
                self.rejoin_needed = True
            except errors.DeltaBusError as e:
                log.debug("group %s: heartbeat failed: %s", self.group_id, e)

    # ---- offsets -----------------------------------------------------------------------------

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata],
               timeout_ms: int | None = None) -> None:
        """OffsetCommit for this member's generation, as Kafka's commitSync: a retriable
        failure (the coordinator moved or is loading, a timeout, a failed call) is tried again
        retry_backoff_ms later, after looking the coordinator up again where it may have moved,
        until `timeout_ms` runs out, then KafkaTimeoutError. `timeout_ms` None: one try (Kafka's
        commitAsync and auto-commit, which the next commit makes good). CommitFailedError when
        the group has moved on (the partitions may be someone else's); any other error that is
        not retriable raises at once."""
        if not offsets:
            return
        deadline_s = time.monotonic() + (timeout_ms or 0) / 1000
        last: errors.DeltaBusError | None = None
        answered: errors.DeltaBusError | None = None  # the coordinator's last refusal
        while True:
            left_ms = max(1, int((deadline_s - time.monotonic()) * 1000))
            try:
                self._commit_once(offsets, None if timeout_ms is None else
                                  min(left_ms, self._client.request_timeout_ms))
                return
            except errors.DeltaBusError as e:
                if timeout_ms is None or not e.retriable:
                    raise
                if isinstance(e, errors.RequestTimedOutError):  # as Kafka: it may have moved
                    self._coordinator = None
                log.info("group %s: commit failed (%s); retrying", self.group_id, e)
                last = e
                if not isinstance(e, (errors.RequestTimedOutError, errors.NetworkError)):
                    answered = e
            time.sleep(max(0.0, min(self._client.retry_backoff_ms / 1000,
                                    deadline_s - time.monotonic())))
            if time.monotonic() >= deadline_s:
                shown = {f"{tp.topic}-{tp.partition}": om.offset for tp, om in offsets.items()}
                raise errors.KafkaTimeoutError(
                    f"Timeout of {timeout_ms}ms expired before successfully committing offsets "
                    f"{shown} (the last try: {last}"
                    + (f"; the coordinator's last answer: {answered})"
                       if answered is not None and answered is not last else ")"))

    def _commit_once(self, offsets: dict[TopicPartition, OffsetAndMetadata],
                     timeout_ms: int | None) -> None:
        """One OffsetCommit; CommitFailedError when the group has moved on."""
        with self._lock:
            member_id, generation_id = self.member_id, self.generation_id
        response = self._call("OffsetCommit", pb.OffsetCommitRequest(
            group_id=self.group_id, generation_id=generation_id, member_id=member_id,
            partitions=[pb.OffsetCommitPartition(
                topic=tp.topic, partition=tp.partition, committed_offset=om.offset,
                committed_leader_epoch=om.leader_epoch, metadata=om.metadata)
                for tp, om in offsets.items()]), timeout_ms)
        for result in response.results:
            try:
                self._check(result.error_code, result.error_message)
            except REJOIN_ERRORS as e:
                self.rejoin_needed = True
                raise CommitFailedError(
                    f"Commit cannot be completed since the group has already rebalanced and "
                    f"assigned the partitions to another member ({e.name})") from None

    def committed(self, partitions: list[TopicPartition]) -> dict[TopicPartition,
                                                                  OffsetAndMetadata | None]:
        """OffsetFetch: the group's committed offsets (None where it committed none)."""
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        response = self._call("OffsetFetch", pb.OffsetFetchRequest(
            group_id=self.group_id,
            topic_partitions=[pb.TopicPartitions(topic=t, partitions=ps)
                              for t, ps in by_topic.items()]))
        self._check(response.error_code, response.error_message)
        out: dict[TopicPartition, OffsetAndMetadata | None] = {tp: None for tp in partitions}
        for p in response.partitions:
            if p.committed_offset >= 0:
                out[TopicPartition(p.topic, p.partition)] = OffsetAndMetadata(
                    p.committed_offset, p.metadata, p.committed_leader_epoch)
        return out

    # ---- leaving -----------------------------------------------------------------------------

    def leave(self) -> None:
        """LeaveGroup: the partitions move to other members at once."""
        with self._lock:
            member_id = self.member_id
            self.member_id, self.generation_id = "", -1
        self.rejoin_needed = True
        if self._pending is not None:
            self._pending[1].cancel()
            self._pending = None
        if not member_id:
            return
        try:
            response = self._call("LeaveGroup", pb.LeaveGroupRequest(
                group_id=self.group_id, member_ids=[member_id]))
            self._check(response.error_code, response.error_message)
        except errors.DeltaBusError as e:
            log.info("group %s: leaving failed (%s); the session timeout removes us", self.group_id,
                     e)

    def close(self) -> None:
        self._stop.set()
        self.leave()
        self._heartbeat.join(5)


def matching_topics(pattern: re.Pattern[str], topics: list[str]) -> list[str]:
    """Topics a subscription pattern covers (internal topics, named __*, never)."""
    return sorted(t for t in topics if pattern.fullmatch(t) and not t.startswith("__"))
