"""`ShareConsumer`: Kafka's KafkaShareConsumer (KIP-932), a member of a share group over gRPC.

A share group's members read the same partitions at once: each record is acquired by one member
at a time, under a lock (group.share.record.lock.duration.ms), and acknowledged one by one:
ACCEPT (done), RELEASE (deliver it again, to anyone), REJECT (never again). A record whose lock
times out is delivered again too, its delivery count raised, until the count limit archives it.
So consumers may outnumber partitions, and a slow record holds up no other.

Acknowledgement modes, as Kafka's `share.acknowledgement.mode`:
- "implicit" (the default): every record `poll` returned is accepted at the next `poll`,
  `commit` or `close`;
- "explicit": each record is acknowledged with `acknowledge(record, type)`; `poll` refuses to
  go on (an error) while a record of the last one is not.
Acknowledgements travel with the next fetch to the leader that delivered the record, or with
`commit` (which waits for the leaders' answers: each partition's error, or None once durable).

Not thread-safe (as Kafka's): one thread polls. Group membership (ShareGroupHeartbeat) runs on
a heartbeat thread; `poll` fetches from one leader at a time, in turn, holding a share session
with each (epoch 0 opens it, each request after it names the next epoch).
"""

from __future__ import annotations

import enum
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple, Unpack

import grpc

from deltabus import config as cfg
from deltabus import errors
from deltabus.client.cluster_client import ClusterClient
from deltabus.client.security import ClientSecurity, SecuritySettings
from deltabus.records import ConsumerRecord, from_ipc, iter_consumer_records
from deltabus.rpc.v1 import deltabus_pb2 as pb

log = logging.getLogger(__name__)

LEAVE_EPOCH, CLOSE_SESSION = -1, -1
# librdkafka's answers to a share session gone wrong: open a new one (epoch 0).
_SESSION_ERRORS = (errors.ShareSessionNotFoundError, errors.InvalidShareSessionEpochError,
                   errors.ShareSessionLimitReachedError)
_REJOIN_ERRORS = (errors.UnknownMemberIdError, errors.FencedMemberEpochError)

Partition = tuple[str, int]


class AcknowledgeType(enum.IntEnum):
    """How a record is acknowledged (Kafka's AcknowledgeType)."""

    ACCEPT = 1
    RELEASE = 2
    REJECT = 3


class ShareRecord(NamedTuple):
    """A record as a share consumer sees it: a ConsumerRecord's fields and how many times it
    was delivered (1 the first time)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    leader_epoch: int
    delivery_count: int


class ShareConsumer:
    """A member of a share group: `subscribe`, then `poll`, `acknowledge`, `commit`, `close`."""

    def __init__(self, bootstrap_servers: str | Iterable[str], *, group_id: str,
                 acknowledgement_mode: str = "implicit", max_poll_records: int = 500,
                 fetch_max_wait_ms: int = cfg.FETCH_MAX_WAIT_MS,
                 fetch_max_bytes: int = cfg.FETCH_MAX_BYTES, request_timeout_ms: int = 30_000,
                 client_id: str = "deltabus-share-consumer", rack_id: str | None = None,
                 **security: Unpack[SecuritySettings]) -> None:
        if acknowledgement_mode not in ("implicit", "explicit"):
            raise errors.InvalidConfigError(
                f"acknowledgement_mode {acknowledgement_mode!r}: implicit or explicit")
        if not group_id:
            raise errors.InvalidConfigError("a share consumer needs a group_id")
        self.group_id = group_id
        self.member_id = str(uuid.uuid4())  # the client makes it (KIP-848, KIP-932)
        self._explicit = acknowledgement_mode == "explicit"
        self._max_records = max_poll_records
        self._max_wait_ms = fetch_max_wait_ms
        self._max_bytes = fetch_max_bytes
        self._rack = rack_id
        self._client = ClusterClient(bootstrap_servers, request_timeout_ms=request_timeout_ms,
                                     client_id=client_id,
                                     security=ClientSecurity.from_settings(**security))
        # Membership, under the lock (the heartbeat thread changes it).
        self._lock = threading.Lock()
        self._topics: list[str] = []
        self._subscription_sent = False
        self._epoch = 0
        self._assignment: dict[str, tuple[int, ...]] = {}
        self._interval_s = 0.0
        self._stop = threading.Event()
        self._heartbeats: threading.Thread | None = None
        self._fatal: errors.DeltaBusError | None = None
        # Fetching: the polling thread's only.
        self._sessions: dict[str, int] = {}  # leader address -> next session epoch
        self._in_session: dict[str, set[Partition]] = {}
        self._turn = itertools.count()
        self._delivered: dict[tuple[str, int, int], str] = {}  # record -> leader address
        self._unacknowledged: list[ShareRecord] = []
        self._pending: dict[str, dict[Partition, dict[int, int]]] = {}  # address -> acks
        self._closed = False

    # ---- membership ----------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str]) -> None:
        """Join the share group for these topics (every member is given all their
        partitions); the heartbeat thread keeps the membership."""
        with self._lock:
            self._topics = sorted(set(topics))
            self._subscription_sent = False
        if self._heartbeats is None:
            self._heartbeats = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                                name=f"share-heartbeat-{self.group_id}")
            self._heartbeats.start()

    def subscription(self) -> list[str]:
        with self._lock:
            return list(self._topics)

    def assignment(self) -> dict[str, tuple[int, ...]]:
        """The partitions the group gave this member (every partition of its topics)."""
        with self._lock:
            return dict(self._assignment)

    def _heartbeat_loop(self) -> None:
        coordinator = ""
        while not self._stop.is_set():
            try:
                coordinator = coordinator or self._coordinator()
                self._heartbeat(coordinator)
            except _REJOIN_ERRORS as e:
                log.info("share group %s: %s; joining again", self.group_id, e.message)
                with self._lock:
                    self._epoch, self._subscription_sent = 0, False
                continue
            except (errors.NotCoordinatorError, errors.CoordinatorNotAvailableError,
                    errors.NetworkError, errors.RequestTimedOutError) as e:
                log.info("share group %s: %s; looking the coordinator up again",
                         self.group_id, e.message)
                coordinator = ""
                with self._lock:
                    self._subscription_sent = False
            except errors.DeltaBusError as e:
                log.error("share group %s: %s", self.group_id, e)
                self._fatal = e
                return
            with self._lock:
                wait_s = self._interval_s or self._client.retry_backoff_ms / 1000
            self._stop.wait(wait_s)

    def _coordinator(self) -> str:
        found = self._client.call_any("FindCoordinator",
                                      pb.FindCoordinatorRequest(key=self.group_id))
        errors.check(found.error_code, found.error_message)
        return f"{found.host}:{found.port}"

    def _heartbeat(self, coordinator: str, leave: bool = False) -> None:
        with self._lock:
            request = pb.ShareGroupHeartbeatRequest(
                group_id=self.group_id, member_id=self.member_id,
                member_epoch=LEAVE_EPOCH if leave else self._epoch)
            if not self._subscription_sent and not leave:
                request.subscribed_topic_names.names.extend(self._topics)
                if self._rack is not None:
                    request.rack_id = self._rack
        response = self._client.call(coordinator, "ShareGroupHeartbeat", request)
        errors.check(response.error_code, response.error_message)
        if leave:
            return
        with self._lock:
            self._subscription_sent = True
            self._epoch = response.member_epoch
            self._interval_s = response.heartbeat_interval_ms / 1000
            if response.assignment_changed:
                self._assignment = {tp.topic: tuple(tp.partitions)
                                    for tp in response.assignment}

    # ---- polling -------------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 1_000) -> list[ShareRecord]:
        """Records acquired for this member (at most max_poll_records), waiting up to
        `timeout_ms` for some. In implicit mode, the records of the last poll are accepted
        first; in explicit mode every one of them must have been acknowledged."""
        self._check_open()
        if self._explicit and self._unacknowledged:
            raise errors.ClientError(
                f"{len(self._unacknowledged)} records of the last poll are not acknowledged "
                f"(acknowledgement_mode explicit): acknowledge each before polling again")
        self._accept_unacknowledged()
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            records = self._fetch_once(deadline)
            if records or time.monotonic() >= deadline:
                self._unacknowledged = list(records)
                return records

    def acknowledge(self, record: ShareRecord,
                    type: AcknowledgeType = AcknowledgeType.ACCEPT) -> None:  # noqa: A002
        """Acknowledge one record of the last poll; sent with the next fetch or `commit`."""
        key = (record.topic, record.partition, record.offset)
        address = self._delivered.pop(key, None)
        if address is None:
            raise errors.InvalidRecordStateError(
                f"{record.topic}-{record.partition} offset {record.offset} was not delivered "
                f"to this consumer, or is acknowledged already")
        self._unacknowledged = [r for r in self._unacknowledged
                                if (r.topic, r.partition, r.offset) != key]
        acks = self._pending.setdefault(address, {}).setdefault(
            (record.topic, record.partition), {})
        acks[record.offset] = int(type)

    def commit(self, timeout_ms: int = 30_000) -> dict[Partition, errors.DeltaBusError | None]:
        """Send every acknowledgement not sent yet (in implicit mode, the last poll's records
        accepted) and wait for the leaders: each partition's error, or None once its
        acknowledgements are durable."""
        self._check_open()
        self._accept_unacknowledged()
        results: dict[Partition, errors.DeltaBusError | None] = {}
        for address in list(self._pending):
            results.update(self._acknowledge(address, timeout_ms))
        return results

    def _accept_unacknowledged(self) -> None:
        """Implicit mode: the last poll's records are accepted (explicit mode: untouched; a
        record left unacknowledged is released when the session closes, or its lock times
        out)."""
        if self._explicit:
            return
        for record in list(self._unacknowledged):
            self.acknowledge(record, AcknowledgeType.ACCEPT)

    def _fetch_once(self, deadline: float) -> list[ShareRecord]:
        """One ShareFetch, to the next leader in turn (with its acknowledgements); the other
        leaders' acknowledgements go in a ShareAcknowledge each."""
        leaders = self._leaders()
        if not leaders:
            self._stop.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            self._acknowledge_all(exclude="")
            return []
        addresses = sorted(leaders)
        address = addresses[next(self._turn) % len(addresses)]
        self._acknowledge_all(exclude=address)
        wait_ms = max(0, min(self._max_wait_ms, int((deadline - time.monotonic()) * 1000)))
        partitions, forgotten = self._session_partitions(address, leaders[address])
        epoch = self._sessions.get(address, 0)
        request = pb.ShareFetchRequest(
            group_id=self.group_id, member_id=self.member_id, share_session_epoch=epoch,
            max_wait_ms=wait_ms, min_bytes=1, max_bytes=self._max_bytes,
            max_records=self._max_records, format=pb.ARROW,
            partitions=partitions if epoch else [pb.SharePartition(topic=t, partition=p)
                                                 for t, p in sorted(leaders[address])],
            forgotten=forgotten)
        sent = self._pending.pop(address, {}) if epoch else {}
        try:
            response = self._client.call(address, "ShareFetch", request,
                                         timeout_ms=self._client.request_timeout_ms + wait_ms)
        except (errors.DeltaBusError, grpc.RpcError) as e:
            self._sessions.pop(address, None)
            self._acknowledgements_lost(sent, e)
            self._client.refresh_metadata()
            return []
        self._sessions[address] = epoch + 1 if epoch < 2**31 - 1 else 1
        self._in_session[address] = set(leaders[address])
        error = errors.error_for_code(response.error_code, response.error_message) \
            if response.error_code else None
        if error is not None:
            self._session_failed(address, error)
            self._acknowledgements_lost(sent, error)
            return []
        return self._records(address, response.partitions)

    def _session_partitions(self, address: str, led: set[Partition]
                            ) -> tuple[list[pb.SharePartition], list[pb.TopicPartitions]]:
        """What a request in an open session names: partitions new to it, those with
        acknowledgements, and those it no longer fetches (forgotten)."""
        known = self._in_session.get(address, set())
        acks = self._pending.get(address, {})
        named = sorted((led - known) | set(acks))
        partitions = [pb.SharePartition(topic=t, partition=p, acknowledgement_batches=_batches(
            acks.get((t, p), {}))) for t, p in named]
        gone: dict[str, list[int]] = {}
        for t, p in sorted(known - led):
            gone.setdefault(t, []).append(p)
        return partitions, [pb.TopicPartitions(topic=t, partitions=ps) for t, ps in gone.items()]

    def _records(self, address: str, partitions: Iterable[Any]) -> list[ShareRecord]:
        records: list[ShareRecord] = []
        for p in partitions:
            if p.acknowledge_error_code:
                log.warning("share group %s: acknowledgements of %s-%d failed: %s",
                            self.group_id, p.topic, p.partition, errors.error_for_code(
                                p.acknowledge_error_code, p.acknowledge_error_message))
            if p.error_code:
                error = errors.error_for_code(p.error_code, p.error_message)
                if error.invalid_metadata:
                    self._client.refresh_metadata()
                elif not error.retriable:
                    raise error
                continue
            if not p.acquired_records or not p.arrow_records:
                continue
            counts = {o: a.delivery_count for a in p.acquired_records
                      for o in range(a.first_offset, a.last_offset + 1)}
            for r in iter_consumer_records(p.topic, p.partition, from_ipc(p.arrow_records)):
                if r.offset in counts:
                    records.append(_share_record(r, counts[r.offset]))
                    self._delivered[(r.topic, r.partition, r.offset)] = address
        return records

    def _leaders(self) -> dict[str, set[Partition]]:
        """The assigned partitions by their leaders' addresses (unknown leaders left out)."""
        self._check_open()
        assigned = self.assignment()
        if not assigned:
            return {}
        image = self._client.metadata()
        if any(t not in image.topics for t in assigned):
            image = self._client.refresh_metadata(list(assigned))
        leaders: dict[str, set[Partition]] = {}
        for topic, partitions in assigned.items():
            for partition in partitions:
                try:
                    broker, _ = self._client.leader(topic, partition)
                except errors.DeltaBusError:
                    continue
                leaders.setdefault(broker.address, set()).add((topic, partition))
        return leaders

    # ---- acknowledging -------------------------------------------------------------------------

    def _acknowledge_all(self, exclude: str) -> None:
        for address in [a for a in self._pending if a != exclude]:
            for tp, error in self._acknowledge(address, self._client.request_timeout_ms).items():
                if error is not None:
                    log.warning("share group %s: acknowledgements of %s-%d failed: %s",
                                self.group_id, *tp, error)

    def _acknowledge(self, address: str, timeout_ms: int,
                     close: bool = False) -> dict[Partition, errors.DeltaBusError | None]:
        """ShareAcknowledge to one leader: its pending acknowledgements (and, with `close`,
        the end of the share session, which releases what this member still holds)."""
        sent = self._pending.pop(address, {})
        epoch = self._sessions.get(address, 0)
        if not epoch:
            failed = errors.InvalidShareSessionEpochError("no share session with the leader")
            return dict.fromkeys(sent, failed)
        request = pb.ShareAcknowledgeRequest(
            group_id=self.group_id, member_id=self.member_id,
            share_session_epoch=CLOSE_SESSION if close else epoch, partitions=[
                pb.SharePartition(topic=t, partition=p, acknowledgement_batches=_batches(acks))
                for (t, p), acks in sorted(sent.items())])
        try:
            response = self._client.call(address, "ShareAcknowledge", request,
                                         timeout_ms=timeout_ms)
        except (errors.DeltaBusError, grpc.RpcError) as e:
            self._sessions.pop(address, None)
            return dict.fromkeys(sent, _as_error(e))
        self._sessions[address] = epoch + 1 if epoch < 2**31 - 1 else 1
        if response.error_code:
            error = errors.error_for_code(response.error_code, response.error_message)
            self._session_failed(address, error)
            return dict.fromkeys(sent, error)
        answered = {(p.topic, p.partition): errors.error_for_code(
            p.acknowledge_error_code or p.error_code,
            p.acknowledge_error_message or p.error_message)
            if p.acknowledge_error_code or p.error_code else None for p in response.partitions}
        return {tp: answered.get(tp, errors.InvalidRecordStateError(
            f"{tp[0]}-{tp[1]}: the leader did not answer its acknowledgements"))
            for tp in sent}

    def _session_failed(self, address: str, error: errors.DeltaBusError) -> None:
        if isinstance(error, _SESSION_ERRORS):
            self._sessions.pop(address, None)
            self._in_session.pop(address, None)
        elif not error.retriable:
            raise error

    def _acknowledgements_lost(self, sent: dict[Partition, dict[int, int]],
                               error: BaseException) -> None:
        for tp in sent:
            log.warning("share group %s: acknowledgements of %s-%d were not answered (%s): "
                        "their records are delivered again once their locks time out",
                        self.group_id, *tp, error)

    # ---- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the group: accept what the last poll returned (implicit mode), send the
        acknowledgements not sent yet, close the share sessions (the leaders release what this
        member still holds: in explicit mode, records it did not acknowledge), then stop."""
        if self._closed:
            return
        try:
            self._accept_unacknowledged()
        except errors.DeltaBusError:
            pass
        self._stop.set()
        if self._heartbeats is not None:
            self._heartbeats.join(timeout=self._client.request_timeout_ms / 1000)
            try:
                self._heartbeat(self._coordinator(), leave=True)
            except errors.DeltaBusError as e:
                log.info("share group %s: leaving: %s", self.group_id, e.message)
        for address in list(self._sessions):
            self._pending.setdefault(address, {})
            self._acknowledge(address, self._client.request_timeout_ms, close=True)
        self._closed = True
        self._client.close()

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClientError("the share consumer is closed")
        if self._fatal is not None:
            raise self._fatal

    def __enter__(self) -> ShareConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _batches(acks: dict[int, int]) -> list[pb.AcknowledgementBatch]:
    """Runs of consecutive offsets with one acknowledge type."""
    batches: list[pb.AcknowledgementBatch] = []
    for offset, kind in sorted(acks.items()):
        last = batches[-1] if batches else None
        if last is not None and last.last_offset + 1 == offset and \
                last.acknowledge_types[0] == kind:
            last.last_offset = offset
        else:
            batches.append(pb.AcknowledgementBatch(first_offset=offset, last_offset=offset,
                                                   acknowledge_types=[kind]))
    return batches


def _share_record(r: ConsumerRecord, delivery_count: int) -> ShareRecord:
    return ShareRecord(*r, delivery_count=delivery_count)


def _as_error(e: BaseException) -> errors.DeltaBusError:
    return e if isinstance(e, errors.DeltaBusError) else errors.NetworkError(f"{e}")
