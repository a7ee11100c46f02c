"""A paused leader (issue 40): SIGSTOP the leader of a partition past its session timeout, let
the controller elect another, SIGCONT it, and check that the zombie acknowledged nothing it did
not durably commit as leader.

Producers send throughout: deltabus's Producer and confluent-kafka at acks=all (idempotent),
and a deltabus Producer at acks=1. Produce requests also go straight to the paused leader's gRPC
door while it is stopped (on a connection opened before, so they wait in its socket), and, once
it wakes, from a client that has not looked the leader up again: their answers are the
zombie's. The pause ends when the controller has elected another leader (the zombie wakes);
when, besides, the catch-up job that precedes its relaunch has written its table; or after twice
the session timeout.

The checker: every record acknowledged at acks=all, by the producers or by the zombie to the
requests queued at it, is in the log once, at its acknowledged offset, in send order, and no
record of an idempotent producer is in it twice (a follower that has not heard of the election
yet may still copy from the zombie, whose high watermark then passes records the new leader
keeps); once another writer took its table over, the zombie answered no request with
success; every replica table of the partition ends equal to the leader's (the zombie's
unacknowledged appends truncated when it rejoins); the metadata log never names two leaders
for one leader epoch. Every fault and every send goes to a history file (tests/faults/history.py),
named in each failure's message.

What fences a zombie leader in deltabus, whose replicas are tables of their own:
- Spark: the controller cancels a fenced broker's task, and Spark SIGKILLs its Python worker
  no sooner than two seconds later (spark.python.task.killTimeout), stopped or not.
- Its heartbeat: the first after waking is refused (STALE_BROKER_EPOCH) and the broker stops.
- The high watermark: followers that heard of the election fetch from the new leader (their
  fetches carry its epoch), so the zombie's high watermark moves only on fetches at its own
  epoch: those that waited in its socket, and those of a follower that has not heard yet
  (perhaps the new leader itself). Either reports only what that follower holds, and the new
  leader begins its epoch after what it copied, so it keeps whatever the zombie's high
  watermark passed. The ISR changes the zombie asks for are refused (stale broker epoch).
- Its table: its own, which no one else writes until the catch-up job before its relaunch
  does; from then its next commit loses its version (put-if-absent) and is fenced
  (NOT_LEADER_OR_FOLLOWER), and, since the fix this file's last test came with, so is every
  commit after it (an older leader epoch than the table's last record's is refused).
At acks=1 the zombie answers with success what it commits before it hears it is fenced (a
second or so on a loaded machine: hundreds of records, all truncated when it rejoins), as
Kafka's does: printed and in the history, not asserted.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer as KafkaProducer
from deltalake import DeltaTable

from deltabus import AdminClient, NewTopic, Producer
from deltabus.client.cluster_client import ClusterClient
from deltabus.cluster.catch_up import CatchUpTask, run_catch_up
from deltabus.cluster.partition import Partition
from deltabus.errors import NotLeaderOrFollowerError
from deltabus.log_tables.layout import metadata_path, replica_path
from deltabus.log_tables.partition_log import LogConfig, PartitionLog
from deltabus.records import produce_batch, to_ipc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from deltabus.storage import Storage
from tests.cluster.acked_load import read_all
from tests.conftest import wait_until
from tests.faults.history import History
from tests.faults.pause import Pause
from tests.soak.fault_injection import Pacer, Worker

WAIT_S = 90
RECORDS_PER_S = 100.0  # per producer
ACKED_BEFORE_PAUSE = 100
ACKED_AFTER_RESUME = 100  # per producer, once the zombie is resumed
PROBES = 5  # Produce requests queued at the paused leader, per acks setting
STALE_REQUESTS = 50  # sent to it one after the other once it wakes (it dies or stops first)


@dataclass
class Ledger:
    """What the producers were told, by value (thread-safe)."""

    acked: dict[bytes, int | None] = field(default_factory=dict)  # value -> offset
    failed: dict[bytes, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, value: bytes, offset: int | None) -> None:
        with self.lock:
            self.acked[value] = offset

    def fail(self, value: bytes, error: str) -> None:
        with self.lock:
            self.failed[value] = error

    def acked_from(self, name: str) -> int:
        with self.lock:
            return sum(1 for v in self.acked if v.startswith(f"{name}-".encode()))


class Sender(Worker):
    """A producer thread sending "<name>-<seq>" to partition 0 at RECORDS_PER_S, each send's
    invocation and outcome written to the history."""

    def __init__(self, name: str, bootstrap: str, topic: str, ledger: Ledger,
                 history: History) -> None:
        super().__init__(name)
        self.bootstrap, self.topic, self.ledger, self.history = bootstrap, topic, ledger, history
        self.sent = 0

    def next_value(self) -> bytes:
        value = f"{self.name}-{self.sent:08d}".encode()
        self.sent += 1
        self.history.invoke(self.name, "send", value.decode())
        return value

    def delivered(self, value: bytes, offset: int | None, error: object) -> None:
        if error is None:
            self.ledger.ack(value, offset)
            self.history.ok(self.name, "send", {"value": value.decode(), "offset": offset})
        else:
            self.ledger.fail(value, str(error))
            self.history.fail(self.name, "send", {"value": value.decode(), "error": str(error)})


class DeltabusSender(Sender):
    """acks=all and idempotent; or, `acks` "1", acks=1 without idempotence (Kafka requires
    acks=all for it), as a producer that trades durability for latency would send."""

    acks = "all"

    def work(self) -> None:
        pacer = Pacer(RECORDS_PER_S)
        with Producer(self.bootstrap, acks=self.acks, enable_idempotence=self.acks == "all",
                      linger_ms=5, delivery_timeout_ms=WAIT_S * 1000) as producer:
            while pacer.wait(self.stop_event):
                for _ in range(pacer.per_tick):
                    value = self.next_value()
                    future = producer.send(self.topic, value, partition=0)
                    future.add_done_callback(lambda f, v=value: self.delivered(
                        v, None if f.exception() else f.get(0).offset, f.exception()))
            producer.flush(WAIT_S)


class Acks1Sender(DeltabusSender):
    acks = "1"


class KafkaSender(Sender):
    def work(self) -> None:
        producer = KafkaProducer({
            "bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": WAIT_S * 1000})
        pacer = Pacer(RECORDS_PER_S)
        while pacer.wait(self.stop_event):
            for _ in range(pacer.per_tick):
                value = self.next_value()
                producer.produce(self.topic, value, partition=0, on_delivery=lambda e, m: (
                    self.delivered(m.value(), m.offset() if m.offset() >= 0 else None, e)))
            producer.poll(0)
        if producer.flush(WAIT_S):
            raise AssertionError("records still unacknowledged after the flush")


class Probe(threading.Thread):
    """Produce requests of one record each, sent one after the other straight to the paused
    leader's gRPC door on a connection opened before the pause: while it is stopped they wait
    in its socket; once it wakes they are what a client that has not looked the leader up
    again sends. Their answers are the zombie's: it stops once process `pid` is gone (its
    relaunch takes the same port, and answers are then the new incarnation's) or the door
    does not answer."""

    def __init__(self, client: ClusterClient, address: str, topic: str, acks: int, name: str,
                 history: History, pid: int, requests: int = 1) -> None:
        super().__init__(name=name, daemon=True)
        self.client, self.address, self.topic, self.acks = client, address, topic, acks
        self.history, self.pid, self.requests = history, pid, requests
        self.answers: list[tuple[str, tuple[int, int] | str]] = []  # value, (code, offset)

    def run(self) -> None:
        for i in range(self.requests):
            if not _exists(self.pid):
                return
            value = f"{self.name}-{i}"
            request = pb.ProduceRequest(acks=self.acks, timeout_ms=20_000, partitions=[
                pb.PartitionProduceData(topic=self.topic, partition=0,
                                        arrow_records=to_ipc(produce_batch([value.encode()])))])
            self.history.invoke(self.name, "send", value)
            try:
                part = self.client.call(self.address, "Produce", request,
                                        timeout_ms=30_000).partitions[0]
            except Exception as e:  # the zombie is gone, or never answered: a failure, fine
                self.answers.append((value, str(e)))
                self.history.fail(self.name, "send", {"value": value, "error": str(e)})
                return
            self.answers.append((value, (part.error_code, part.base_offset)))
            outcome = self.history.ok if part.error_code == 0 else self.history.fail
            outcome(self.name, "send", {"value": value, "error_code": part.error_code,
                                        "offset": part.base_offset})

    def acknowledged(self) -> list[tuple[str, int]]:
        """(value, offset) of every request the zombie answered with success."""
        return [(v, a[1]) for v, a in self.answers if isinstance(a, tuple) and a[0] == 0]


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---- reading what the cluster holds ------------------------------------------------------------


def partition_state(cluster: Any, topic: str) -> Any:
    return cluster.controller.image().partition(topic, 0)


def replica_records(cluster: Any, topic: str, broker: int) -> list[tuple[int, int, bytes]]:
    """(offset, leader epoch, value) of every record in one replica's Delta table."""
    table = DeltaTable(replica_path(cluster.config.root, topic, 0, broker)).to_pyarrow_table(
        columns=["offset", "leader_epoch", "value"]).sort_by("offset")
    return list(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


def leaders_by_epoch(cluster: Any, topic: str) -> dict[tuple[int, int], set[int]]:
    """(partition, leader epoch) -> every leader the controller's metadata log ever named for
    it, replaying the topic's partition records in log order (a change leaves unnamed fields
    as they were)."""
    table = DeltaTable(metadata_path(cluster.config.root)).to_pyarrow_table(
        columns=["offset", "record"]).sort_by("offset")
    state: dict[int, dict[str, int]] = {}
    named: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
    for text in table.column("record").to_pylist():
        record = json.loads(text)
        if record.get("type") not in ("partition", "partition_change"):
            continue
        if record.get("topic") != topic:
            continue
        current = state.setdefault(record["partition"], {"leader": -1, "leader_epoch": -1})
        current.update({k: record[k] for k in ("leader", "leader_epoch") if k in record})
        if current["leader"] >= 0:
            named[(record["partition"], current["leader_epoch"])].add(current["leader"])
    return named


def replicas_agree(cluster: Any, topic: str) -> bool:
    """The partition's ISR is whole and every replica table holds the leader's records."""
    state = partition_state(cluster, topic)
    if state.leader < 0 or sorted(state.isr) != sorted(state.replicas):
        return False
    leader = replica_records(cluster, topic, state.leader)
    return all(replica_records(cluster, topic, r) == leader for r in state.replicas)


# ---- the test ----------------------------------------------------------------------------------


@pytest.fixture
def history(tmp_path: Path) -> Any:
    with History(tmp_path / "history.jsonl") as h:
        yield h


# How long the leader stays paused: until the controller has elected another leader (a zombie
# wakes, within the seconds before Spark kills it); until, besides, the catch-up job that
# precedes its relaunch has made its table the new leader's log (run here, at once, so it ends
# before Spark's kill: the order a paused executor host gives); or twice the session timeout
# (the process is usually killed while stopped, and there is nothing to wake).
RESUMES = ("at-election", "after-the-catch-up", "after-twice-the-session-timeout")


@pytest.mark.parametrize("resume", RESUMES)
def test_paused_leader_acknowledges_nothing_it_did_not_commit_as_leader(
        cluster, topic_name, all_brokers_back, history, resume):
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3, {"min.insync.replicas": "2"})])
    wait_until(lambda: (s := partition_state(cluster, topic_name)) is not None
               and s.leader >= 0 and len(s.isr) == 3, "the partition's leader and full ISR")
    acks_all, acks_1 = Ledger(), Ledger()
    senders: list[Sender] = [
        DeltabusSender("deltabus", cluster.bootstrap_servers, topic_name, acks_all, history),
        KafkaSender("kafka", cluster.kafka_bootstrap_servers, topic_name, acks_all, history),
        Acks1Sender("acks1", cluster.bootstrap_servers, topic_name, acks_1, history)]
    where = f"(history: {history.path})"
    old = partition_state(cluster, topic_name)
    old_epoch = cluster.controller.broker_epochs()[old.leader]
    client = ClusterClient(cluster.controller.image().broker(old.leader).address)
    probes: list[Probe] = []
    try:
        for s in senders:
            s.start()
        wait_until(lambda: all(ledger.acked_from(s.name) >= ACKED_BEFORE_PAUSE for s, ledger
                               in zip(senders, (acks_all, acks_all, acks_1), strict=True)),
                   "records acknowledged before the pause")
        woke = _pause_the_leader(cluster, topic_name, old, resume, client, probes, acks_all,
                                 history)
        marks = {s.name: acks_all.acked_from(s.name) for s in senders[:2]}
        wait_until(lambda: all(acks_all.acked_from(name) >= mark + ACKED_AFTER_RESUME
                               for name, mark in marks.items()),
                   f"records acknowledged after the resume {where}", WAIT_S)
        wait_until(lambda: cluster.controller.broker_epochs().get(old.leader, -1) > old_epoch,
                   f"broker {old.leader} back with a new epoch {where}", WAIT_S)
        wait_until(lambda: old.leader in partition_state(cluster, topic_name).isr,
                   f"broker {old.leader} back in the ISR {where}", WAIT_S)
    finally:
        for s in senders:
            s.stop(WAIT_S + 30)
        for p in probes:
            p.join(60)
        client.close()
    # Spark kills a fenced broker's worker no sooner than 2 s after cancelling its task, so a
    # leader resumed within them wakes; after twice the session timeout it is usually gone,
    # but on a loaded machine the kill can come later still (then a zombie wakes then).
    assert woke or resume == RESUMES[-1], f"the paused broker did not wake {where}"
    errors = [f"{s.name} died: {s.error!r}" for s in senders if s.error is not None]
    assert not errors, f"{errors} {where}"
    # What the zombie acknowledged at acks=all is checked as the producers' acks are: a follower
    # that has not heard of the election yet still copies from it at the old epoch (Kafka's do
    # too), so the zombie's high watermark can pass records every replica of its ISR holds;
    # the new leader then begins its epoch after them. Acknowledged and kept is correct;
    # acknowledged and not at its offset is the loss this test is for.
    for value, offset in (a for p in probes if p.acks == -1 for a in p.acknowledged()):
        acks_all.ack(value.encode(), offset)
    stored = _check_log(cluster, topic_name, acks_all, where)
    if resume == "after-the-catch-up":  # its table holds a newer epoch: it commits nothing
        acked_1 = [a for p in probes for a in p.acknowledged()]
        assert not acked_1, (f"the zombie acknowledged at acks=1 what it appended after the "
                             f"catch-up job took its table over: {acked_1} {where}")
    wait_until(lambda: replicas_agree(cluster, topic_name),
               f"every replica of {topic_name} to hold the leader's records {where}", WAIT_S)
    twice = {k: v for k, v in leaders_by_epoch(cluster, topic_name).items() if len(v) > 1}
    assert not twice, f"the metadata log names two leaders for one epoch: {twice} {where}"
    _report_acks_1(acks_1, probes, stored, history)


def _pause_the_leader(cluster: Any, topic: str, old: Any, resume: str, client: ClusterClient,
                      probes: list[Probe], ledger: Ledger, history: History) -> bool:
    """Pause partition 0's leader `old` until the controller elects another (and, as `resume`
    says, until the catch-up or twice the session timeout), with Produce requests queued at
    it; resume it and start a client that still sends to it. The probes go to `probes`.
    Returns whether the process was there to wake."""
    address = cluster.controller.image().broker(old.leader).address
    client.call(address, "Metadata", pb.MetadataRequest())  # the connection is open
    with Pause(cluster, history) as nemesis:
        pid = nemesis.pause(old.leader)
        paused_at = time.monotonic()
        probes += [Probe(client, address, topic, acks, f"queued-acks{acks}-{i}", history, pid)
                   for acks in (-1, 1) for i in range(PROBES)]
        for p in probes:
            p.start()
        wait_until(lambda: partition_state(cluster, topic).leader_epoch > old.leader_epoch,
                   "the controller to elect another leader", WAIT_S)
        new = partition_state(cluster, topic)
        history.info("checker", "elected", {"leader": new.leader,
                                            "leader_epoch": new.leader_epoch})
        if resume == "after-the-catch-up":
            _catch_up_while_paused(cluster, topic, new.leader, old.leader, ledger, history)
        elif resume != "at-election":  # the fault's length, not a wait for an outcome
            session_s = cluster.config.broker_session_timeout_ms / 1000
            time.sleep(max(0.0, paused_at + 2 * session_s - time.monotonic()))
        woke = nemesis.resume()
    stale = Probe(client, address, topic, 1, "stale-client", history, pid, STALE_REQUESTS)
    stale.start()
    probes.append(stale)
    return woke


def _catch_up_while_paused(cluster: Any, topic: str, leader: int, zombie: int, ledger: Ledger,
                           history: History) -> None:
    """What the catch-up job before the zombie's relaunch does, done now, while it is stopped:
    a record acknowledged by the new leader first (its producers are still held up at the
    zombie), so the zombie's table gets the new leader's epoch, then the job's task body."""
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        acked = producer.send(topic, b"new-leader-0", partition=0).get(WAIT_S)
    ledger.ack(b"new-leader-0", acked.offset)
    caught_up = run_catch_up(CatchUpTask(cluster.config.storage, topic, 0, leader, zombie))
    history.info("checker", "catch-up", {"error": caught_up.error,
                                         "truncated_to": caught_up.truncated_to,
                                         "log_end_offset": caught_up.log_end_offset})


def _check_log(cluster: Any, topic: str, ledger: Ledger, where: str) -> dict[int, bytes]:
    """Every record `ledger` says was acknowledged at its offset, once, in send order; no record
    of the idempotent producers twice (acks=1's, without idempotence, may be: a retry after a
    lost answer writes again, as in Kafka). Returns the log, offset -> value."""
    # Up to the high watermark and past the last acknowledged offset, not to a count: the log
    # also holds the acks=1 producer's and the probes' records, so reading as many records as
    # were acknowledged at acks=all stopped short of the end on a loaded machine (a CI run
    # counted the last six acknowledged records lost).
    last = max((o for o in ledger.acked.values() if o is not None), default=-1)
    records, _ = read_all(cluster.bootstrap_servers, topic, 1, len(ledger.acked),
                          ends={0: last + 1})
    stored = {r.offset: r.value for r in records}
    offsets: dict[bytes, list[int]] = collections.defaultdict(list)
    for r in records:
        offsets[r.value].append(r.offset)
    twice = {v: o for v, o in offsets.items() if len(o) > 1 and not v.startswith(b"acks1-")}
    assert not twice, f"records in the log twice: {list(twice.items())[:5]} {where}"
    lost = [v for v in ledger.acked if v not in offsets]
    assert not lost, f"{len(lost)} acknowledged records not in the log: {lost[:5]} {where}"
    misplaced = [(v, o) for v, o in ledger.acked.items() if o is not None and stored.get(o) != v]
    assert not misplaced, (f"{len(misplaced)} records not at their acknowledged offset: "
                           f"{misplaced[:5]} {where}")
    for name in ("deltabus", "kafka"):
        mine = [r.value for r in records if r.value.startswith(f"{name}-".encode())]
        assert mine == sorted(mine), f"{name}'s records are out of send order {where}"
    return stored


def _report_acks_1(ledger: Ledger, probes: list[Probe], stored: dict[int, bytes],
                   history: History) -> None:
    """What acks=1 was told and what the log kept, printed and in the history, not asserted:
    Kafka promises acks=1 no more than the leader's own write, and a zombie's is truncated."""
    lost = sorted(v for v, o in ledger.acked.items() if stored.get(o) != v) if ledger.acked else []
    answers = {p.name: p.answers for p in probes if p.acks == 1}
    zombie_acked = [(v, o, stored.get(o) == v.encode()) for p in probes if p.acks == 1
                    for v, o in p.acknowledged()]
    history.info("checker", "acks=1", {"acknowledged": len(ledger.acked), "not_kept": len(lost),
                                       "examples": [v.decode() for v in lost[:5]],
                                       "zombie_acknowledged": zombie_acked})
    print(f"acks=1: {len(ledger.acked)} acknowledged, {len(lost)} of them not in the log at "
          f"their offset {[v.decode() for v in lost[:5]]}; acknowledged by the zombie (value, "
          f"offset, kept): {zombie_acked}; its answers: {answers}", flush=True)


# ---- the zombie's own table ----------------------------------------------------------------------
# What the catch-up job does to a zombie's replica table while it is stopped (the job that
# precedes its relaunch, here run in this process: the order a paused executor host gives, where
# Spark cannot kill the worker until the host wakes), then what the zombie's commits meet.

TOPIC = "t"


def _log(root: Path, broker: int) -> PartitionLog:
    return PartitionLog(replica_path(str(root), TOPIC, 0, broker), topic=TOPIC, partition=0,
                        config=LogConfig(), storage=Storage(str(root)), replicated=True)


def _append(log: PartitionLog, values: list[bytes], epoch: int) -> None:
    log.append(produce_batch(values), leader_epoch=epoch).result(30)


def _records(root: Path, broker: int) -> list[tuple[int, int, bytes]]:
    table = DeltaTable(replica_path(str(root), TOPIC, 0, broker)).to_pyarrow_table(
        columns=["offset", "leader_epoch", "value"]).sort_by("offset")
    return list(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


def test_a_zombie_fenced_on_its_table_commits_nothing_more_at_its_old_epoch(tmp_path):
    """Broker 0 led at epoch 0 and appended z-0..z-2 that no follower copied; paused, it was
    replaced by broker 1 at epoch 1, and the catch-up job made broker 0's table the new
    leader's log. The zombie's next commit loses its version to the job's and is fenced
    (NOT_LEADER_OR_FOLLOWER, never acknowledged). Nothing it appends after that may land
    either: a record of epoch 0 above epoch 1's is invisible to the truncation by epoch that
    makes a returning replica equal to its leader (its last epoch still reads 1), so the
    replica would keep it where the leader holds an acknowledged record."""
    zombie, leader = _log(tmp_path, 0), _log(tmp_path, 1)
    try:
        _append(zombie, [b"a-0", b"a-1", b"a-2"], epoch=0)
        leader.append_copy(zombie.read(0, 1 << 20, to_log_end=True)).result(30)
        _append(zombie, [b"z-0", b"z-1", b"z-2"], epoch=0)  # never copied
        _append(leader, [b"b-0", b"b-1", b"b-2"], epoch=1)  # the new leader's
        caught_up = run_catch_up(CatchUpTask(Storage(str(tmp_path)), TOPIC, 0, 1, 0))
        assert caught_up.error == "" and caught_up.truncated_to == 3
        committed = []
        for value in (b"late-0", b"late-1"):  # requests that waited in the zombie's socket
            try:
                _append(zombie, [value], epoch=0)
                committed.append(value)
            except NotLeaderOrFollowerError:
                pass
        zombie.close()  # it dies; its successor opens the table and follows the new leader
        _append(leader, [b"b-3", b"b-4", b"b-5"], epoch=1)  # acknowledged by the new leader
        returning = _log(tmp_path, 0)
        try:
            parts = Partition(TOPIC, 0, 1, leader).diverging_epoch(
                returning.log_end_offset, returning.last_epoch)
        finally:
            returning.close()
    finally:
        zombie.close()
        leader.close()
    held, led = _records(tmp_path, 0), _records(tmp_path, 1)
    assert parts is not None or held == led[:len(held)], (
        f"the zombie committed {committed} after it was fenced; its replica holds {held} "
        f"where its leader holds {led}, and its fetches see no divergence")
    assert not committed, f"the zombie committed {committed} after it was fenced"
