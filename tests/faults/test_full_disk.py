"""Full disk (issue 40): a replica's directory on a small filesystem that fills, then gets its
room back (tests/faults/full_disk.py).

What a Kafka user should expect, and why deltabus does not do what Kafka's broker does. Kafka
treats a failed write as a failed log dir: the dir goes offline, its replicas leave their ISRs,
their leadership moves to other brokers, and the dir stays offline until the broker restarts
(with one log dir, the broker halts). deltabus's brokers share one log dir, the cluster root
(`describe_log_dirs` says so): the disk that fills is, in the usual deployment, every replica's
disk, so moving the leadership would only move the error, and taking the replica offline would
stop its reads too. So a full disk is what Kafka's producers see of any failed write, and no
more: the leader answers KAFKA_STORAGE_ERROR (retriable, and it invalidates metadata, so the
client looks the leader up again), moves no log end offset or high watermark past what it
could not write, goes on serving reads, and takes writes again as soon as there is room, with
no restart: the producer's retries (delivery.timeout.ms) carry it over a short fault. A follower
whose disk is full falls behind and leaves the ISR after replica.lag.time.max.ms, as any slow
follower does, so the leader goes on while min.insync.replicas holds; it catches up and joins
again once there is room.

The checker: every acknowledged record is read once, in order, at the offset it was
acknowledged at; a record not acknowledged is read at most once. Every fault and what the
clients saw meanwhile go to a history file (tests/faults/history.py) under the test's tmp_path.

The tests without Spark put the pieces on the full disk one by one (a partition log, the
consumer offsets store, the controller's metadata log); those on the shared cluster put a
topic's directory, then one follower's replica, on it, and the soak's steady load on a full
topic.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from deltabus.client.cluster_client import ClusterClient
from deltabus.cluster import txn_marker_channel
from deltabus.cluster.controller import Controller
from deltabus.cluster.metadata_log import MetadataLog
from deltabus.cluster.txn_marker_channel import MarkerAnswers
from deltabus.config import ClusterConfig, GroupConfig
from deltabus.log_tables.control_records import TxnMarker
from deltabus.log_tables.layout import replica_path, topic_path
from deltabus.log_tables.partition_log import AppendResult, PartitionLog
from deltabus.log_tables.partition_reader import PartitionReader
from deltabus.metadata import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    BrokerEndpoint,
    MetadataImage,
    PartitionState,
    TopicState,
    TransactionMetadata,
)
from deltabus.offsets.group_coordinator import GroupCoordinator
from deltabus.offsets.offset_store import OffsetAndMetadata, OffsetCommit, OffsetStore
from deltabus.records import ProducerState, produce_batch, to_ipc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from tests.cluster.controller_server import LiveBrokers
from tests.conftest import read_records, wait_until
from tests.faults.full_disk import BALLAST_NAME, FullDisk
from tests.faults.history import OK, History, read_history
from tests.soak.fault_injection import DeltabusSender, FaultPlan, Ledger

SMALL_DISK_BYTES = 4 * 1024 * 1024
WAIT_S = 60
# The steady-load test: the soak's topic, load (tests/soak/fault_injection.py's FaultPlan: 150
# records/s from each producer) and disk (nemesis.DiskFull's), with room for its tables until
# the ballast: their many small commits, and a checkpoint every 25, filled 512 MiB by 38,000
# records.
LOADED_PARTITIONS = 4
LOADED_PRODUCERS = 2
LOADED_DISK_BYTES = 1 << 30
ACKED_BEFORE_FILL = int(os.environ.get("DELTABUS_FULL_DISK_ACKED_BEFORE", "2000"))
FULL_HOLD_S = 10.0  # the soak's: past the 5 s replica lag time (followers behind leave ISRs)
RESUME_WAIT_S = 300  # no bound: how long a hung partition is waited for before failing


@pytest.fixture
def history(tmp_path: Path) -> Iterator[History]:
    with History(tmp_path / "history.jsonl") as h:
        yield h


# ---- the nemesis -------------------------------------------------------------------------------


def test_the_nemesis_fills_and_frees_a_mount_of_its_own_and_keeps_what_it_held(
        tmp_path: Path, history: History) -> None:
    folder = tmp_path / "replica"
    folder.mkdir()
    (folder / "before.txt").write_text("held before the mount")
    with FullDisk(folder, 1024 * 1024, history=history) as disk:
        assert os.path.ismount(folder)
        assert (folder / "before.txt").read_text() == "held before the mount"
        disk.fill()
        with pytest.raises(OSError, match="No space left"):
            (folder / "more.txt").write_bytes(b"x" * 8192)
        disk.free()
        (folder / "after.txt").write_text("written on the mount")
    assert not os.path.ismount(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["after.txt", "before.txt", "more.txt"]
    assert [(op["f"], op["type"]) for op in read_history(history.path)] == [
        ("start-full-disk", "info"), ("stop-full-disk", "info")]

    with pytest.raises(RuntimeError), FullDisk(folder, 1024 * 1024) as disk:
        disk.fill()
        raise RuntimeError("a test that fails with the disk full")
    assert not os.path.ismount(folder)  # unmounted all the same
    assert not (folder / BALLAST_NAME).exists()


# ---- the pieces on a full disk, without Spark ---------------------------------------------------


@pytest.mark.parametrize("leave_bytes, value_bytes", [(64 * 1024, 256 * 1024), (4096, 4)],
                         ids=["data-file-cut-short", "commit-file-refused"])
def test_a_log_on_a_full_disk_refuses_appends_leaves_no_half_written_file_and_recovers(
        tmp_path: Path, leave_bytes: int, value_bytes: int) -> None:
    """A failed append moves no offset, and leaves no file of its own half written (a partial
    data file, a commit's temporary) holding the room that was left; a whole data file no
    commit names is vacuum's, as after any failed commit."""
    with FullDisk(tmp_path / "disk", SMALL_DISK_BYTES) as disk:
        path = str(disk.path / "log")
        log = PartitionLog(path, topic="t", partition=0)
        try:
            for i in range(3):
                log.append(produce_batch([f"v{i}".encode()]), leader_epoch=0).result(10)
            disk.fill(leave_bytes=leave_bytes)
            left = disk.free_bytes()
            with pytest.raises(errors.KafkaStorageError, match="No space left"):
                log.append(produce_batch([os.urandom(value_bytes)]),
                           leader_epoch=0).result(10)
            assert (log.log_end_offset, log.high_watermark) == (3, 3)
            assert half_written(path) == []
            assert disk.free_bytes() >= left - 8192  # at most a whole small file stays
            assert values(path) == [b"v0", b"v1", b"v2"]  # delta-rs reads it as it was

            disk.free()
            log.append(produce_batch([b"after"]), leader_epoch=0).result(10)
            assert (log.log_end_offset, log.high_watermark) == (4, 4)
        finally:
            log.close()
        assert values(path) == [b"v0", b"v1", b"v2", b"after"]


def test_a_refused_append_leaves_the_log_as_it_was_and_reads_no_data_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka's log after a failed append is as if the write never happened, and so is this one
    after a commit the full disk refused: the idempotent producer is still known at the last
    sequence written, its retry is taken (not answered with the failure) at the offset the
    failure left free, the recent records are still served from memory, and no data file is
    read to get there. Rebuilding the producers from the table instead reads every data file
    under the log's lock, and on a log of a few minutes' commits that took seconds per refused
    write, and again for each producer's first write once the room was back: the soak's full
    disk kept a partition from taking writes for 35 s after it."""
    scans = data_file_scans(monkeypatch)
    with FullDisk(tmp_path / "disk", SMALL_DISK_BYTES) as disk:
        log = PartitionLog(str(disk.path / "log"), topic="t", partition=0)
        try:
            for sequence in range(3):
                append_as(log, 7, sequence).result(10)
            known = log.active_producers()
            assert [(p.producer_id, p.last_sequence) for p in known] == [(7, 2)]
            scanned = scans[0]
            disk.fill()
            with pytest.raises(errors.KafkaStorageError, match="No space left"):
                append_as(log, 7, 3).result(10)
            assert log.active_producers() == known  # as if the write never happened
            assert log.cached_tail_under(0, 1024 * 1024), "the recent records left memory"
            assert (log.log_end_offset, log.end_offset_for_epoch(0)) == (3, (0, 3))
            disk.free()
            assert append_as(log, 7, 3).result(10).base_offset == 3  # the retry is taken
            assert scans[0] == scanned, "the log read its data files again"
        finally:
            log.close()
        assert values(str(disk.path / "log")) == [b"v0", b"v1", b"v2", b"v3"]


def test_a_refused_copy_leaves_the_follower_as_it_was_and_reads_no_data_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower's copy the full disk refused leaves its log as it was too: the producers it
    learnt from the leader's records (what it answers their retries with, should it lead) and
    its recent records stay, and it reads no data file; the copy goes in once there is room.
    The soak's followers failed a copy every replica.fetch.backoff.ms, each failure reading
    every data file of their replica."""
    scans = data_file_scans(monkeypatch)
    leader = PartitionLog(str(tmp_path / "leader"), topic="t", partition=0)
    try:
        for sequence in range(4):
            append_as(leader, 7, sequence).result(10)
        with FullDisk(tmp_path / "disk", SMALL_DISK_BYTES) as disk:
            follower = PartitionLog(str(disk.path / "follower"), topic="t", partition=0,
                                    replicated=True)
            try:
                follower.append_copy(leader.read(0, 1024 * 1024, upto=3), 0).result(10)
                known = follower.active_producers()
                assert [(p.producer_id, p.last_sequence) for p in known] == [(7, 2)]
                scanned = scans[0]
                disk.fill()
                with pytest.raises(errors.KafkaStorageError, match="No space left"):
                    follower.append_copy(leader.read(3, 1024 * 1024), 3).result(10)
                assert follower.active_producers() == known
                assert follower.cached_tail_under(0, 1024 * 1024)
                assert follower.log_end_offset == 3
                disk.free()
                follower.append_copy(leader.read(3, 1024 * 1024), 3).result(10)
                assert follower.log_end_offset == 4
                assert scans[0] == scanned, "the follower read its data files again"
            finally:
                follower.close()
    finally:
        leader.close()


def test_consumer_offsets_on_a_full_disk_fail_the_commit_and_lose_nothing_acknowledged(
        tmp_path: Path) -> None:
    with FullDisk(tmp_path / "disk", SMALL_DISK_BYTES) as disk:
        path = str(disk.path / "__consumer_offsets")
        store = OffsetStore(path, commit_linger_ms=0)
        try:
            store.commit([offset_commit("g", 0, 10)]).result(10)
            disk.fill()
            with pytest.raises(errors.KafkaStorageError, match="No space left"):
                store.commit([offset_commit("g", 0, 20), offset_commit("g", 1, 5)]).result(10)
            assert committed(store, "g") == {0: 10}  # nothing of the failed commit applied
            disk.free()
            store.commit([offset_commit("g", 1, 7)]).result(10)
        finally:
            store.close()
        reopened = OffsetStore(path)
        try:
            assert committed(reopened, "g") == {0: 10, 1: 7}  # exactly what was acknowledged
        finally:
            reopened.close()


def test_an_offset_commit_on_a_full_disk_answers_kafkas_retriable_not_coordinator(
        tmp_path: Path, history: History) -> None:
    """The group coordinator's `__consumer_offsets` on a full disk: Kafka's coordinator answers
    NOT_COORDINATOR when its log append fails with KAFKA_STORAGE_ERROR (GroupMetadataManager's
    appendGroupMetadataErrorToResponseError), which Kafka's consumers retry after looking the
    coordinator up again. KAFKA_STORAGE_ERROR itself is no error an OffsetCommit answers:
    Java's consumer throws "Unexpected error in commit" and librdkafka fails the commit for
    good. Both doors send the coordinator's error as it is. Nothing of the failed commit is
    kept; what was acknowledged is, after a restart too."""
    with FullDisk(tmp_path / "disk", SMALL_DISK_BYTES, history=history) as disk:
        path = str(disk.path / "__consumer_offsets")
        coordinator = group_coordinator(path)
        try:
            assert offset_commit_answer(coordinator, history, 5) is None
            disk.fill()
            error = offset_commit_answer(coordinator, history, 9)
            assert isinstance(error, errors.NotCoordinatorError), error
            assert "No space left" in error.message
            assert committed_offsets(coordinator) == {("t", 0): 5}
            disk.free()
            assert offset_commit_answer(coordinator, history, 12) is None
        finally:
            coordinator.close()
        restarted = group_coordinator(path)
        try:
            assert committed_offsets(restarted) == {("t", 0): 12}
        finally:
            restarted.close()

def test_an_offset_delete_on_a_full_disk_answers_kafkas_retriable_not_coordinator(
        tmp_path: Path, history: History) -> None:
    """OffsetDelete's tombstones in `__consumer_offsets` on a full disk: NOT_COORDINATOR, as
    Kafka's group coordinator answers any write of its that fails with KAFKA_STORAGE_ERROR
    (GroupCoordinatorService's handleOperationException), which Kafka's admin client retries
    after looking the coordinator up again. The offset stays until a delete is written."""
    with FullDisk(tmp_path / "disk", SMALL_DISK_BYTES, history=history) as disk:
        path = str(disk.path / "__consumer_offsets")
        coordinator = group_coordinator(path)
        try:
            assert offset_commit_answer(coordinator, history, 5) is None
            disk.fill()
            with pytest.raises(errors.NotCoordinatorError, match="No space left"):
                coordinator.delete_offsets("g", [("t", 0)])
            assert committed_offsets(coordinator) == {("t", 0): 5}
            disk.free()
            assert coordinator.delete_offsets("g", [("t", 0)]) == {("t", 0): None}
            assert committed_offsets(coordinator) == {}
        finally:
            coordinator.close()
        restarted = group_coordinator(path)
        try:
            assert committed_offsets(restarted) == {}
        finally:
            restarted.close()


def test_a_txn_offset_commit_on_a_full_disk_answers_kafkas_retriable_not_coordinator(
        tmp_path: Path) -> None:
    """TxnOffsetCommit's offsets are held with their transaction in the controller's metadata
    log until it commits (then written to `__consumer_offsets`). That log on a full disk:
    NOT_COORDINATOR, what Kafka's group coordinator answers when a TxnOffsetCommit's append
    fails with KAFKA_STORAGE_ERROR, and what Kafka's transactional producers retry after
    looking the coordinator up again; KAFKA_STORAGE_ERROR is fatal to them ("Unexpected error
    in TxnOffsetCommitResponse"). Once there is room, the same call is taken."""
    with FullDisk(tmp_path / "root", SMALL_DISK_BYTES) as disk:
        controller = Controller(ClusterConfig(root=str(disk.path), brokers=1, kafka_port=-1))
        epoch = controller.register_broker(BrokerEndpoint(0, "127.0.0.1", 9000), 100)
        controller.heartbeat(0, epoch, controller.image().version, 0)
        controller.create_topics([NewTopic("t")], timeout_ms=0)
        producer_id, producer_epoch = controller.init_transactional_producer("tx", 60_000)
        controller.add_offsets_to_txn("tx", producer_id, producer_epoch, "g")
        offsets = {("t", 0): (5, -1, "")}
        disk.fill()
        with pytest.raises(errors.NotCoordinatorError, match="No space left"):
            controller.txn_offset_commit("tx", "g", producer_id, producer_epoch, offsets)
        disk.free()
        assert controller.txn_offset_commit("tx", "g", producer_id, producer_epoch,
                                            offsets) == {("t", 0): None}


# The transaction coordinator's other writes (its state, in the controller's metadata log, where
# Kafka keeps it in __transaction_state). Kafka's TransactionStateManager answers a state write
# that fails with KAFKA_STORAGE_ERROR with NOT_COORDINATOR (appendTransactionToLog), which Kafka's
# transactional producers retry after looking the coordinator up again; to Java's producer
# KAFKA_STORAGE_ERROR is fatal on InitProducerId, AddOffsetsToTxn and EndTxn and makes the
# transaction abortable on AddPartitionsToTxn. Each test below: the request on a full disk
# answers what Kafka answers, nothing of it is kept, and the same request is taken once there
# is room.


class Leaders:
    """A fake of the partitions' leaders: takes every transaction marker at once. `then`, when
    set, runs once after markers are taken, before they are answered: a fault that strikes
    between the markers and the coordinator's record of the transaction's completion."""

    def __init__(self) -> None:
        self.markers: list[TxnMarker] = []
        self.then: Callable[[], object] | None = None

    def __call__(self, broker_id: int, markers: list[TxnMarker]) -> MarkerAnswers:
        self.markers += markers
        then, self.then = self.then, None
        if then is not None:
            then()
        return {(m.producer_id, t, p): None for m in markers for t, p in m.partitions}


@pytest.fixture
def coordinator_disk(tmp_path: Path) -> Iterator[tuple[FullDisk, Controller, Leaders]]:
    """The transaction coordinator (the controller) with its root, the metadata log's too, on a
    small disk; one live broker leads topic t, and the leaders take every marker."""
    leaders = Leaders()
    with FullDisk(tmp_path / "root", SMALL_DISK_BYTES) as disk:
        controller = Controller(ClusterConfig(root=str(disk.path), brokers=1, kafka_port=-1),
                                send_markers=leaders)
        try:
            LiveBrokers(controller, 1)  # heartbeating until the controller shuts down
            controller.create_topics([NewTopic("t")], timeout_ms=0)
            yield disk, controller, leaders
        finally:
            controller.begin_shutdown()


def transaction(controller: Controller, transactional_id: str = "tx") -> TransactionMetadata:
    txn = controller.describe_transactions([transactional_id])[transactional_id]
    assert txn is not None
    return txn


def test_a_transactional_init_producer_id_on_a_full_disk_answers_not_coordinator(
        coordinator_disk: tuple[FullDisk, Controller, Leaders]) -> None:
    """A new transactional id's first InitProducerId, then one that fences its producer and
    would abort its open transaction: neither keeps anything (no id, no epoch used up, the
    transaction still open under its producer), and each is taken once there is room."""
    disk, controller, _ = coordinator_disk
    disk.fill()
    with pytest.raises(errors.NotCoordinatorError, match="No space left"):
        controller.init_transactional_producer("tx", 60_000)
    assert controller.describe_transactions(["tx"]) == {"tx": None}
    disk.free()
    producer_id, epoch = controller.init_transactional_producer("tx", 60_000)
    assert epoch == 0
    controller.add_offsets_to_txn("tx", producer_id, epoch, "g")  # open: Ongoing

    disk.fill()
    with pytest.raises(errors.NotCoordinatorError, match="No space left"):
        controller.init_transactional_producer("tx", 60_000)
    assert (transaction(controller).state, transaction(controller).producer_epoch) == (
        ONGOING, epoch)  # not fenced, not being aborted
    disk.free()
    with pytest.raises(errors.ConcurrentTransactionsError):  # the abort begins
        controller.init_transactional_producer("tx", 60_000)
    assert controller.init_transactional_producer("tx", 60_000) == (producer_id, epoch + 2)


def test_an_add_partitions_to_txn_on_a_full_disk_answers_not_coordinator(
        coordinator_disk: tuple[FullDisk, Controller, Leaders]) -> None:
    disk, controller, _ = coordinator_disk
    producer_id, epoch = controller.init_transactional_producer("tx", 60_000)
    disk.fill()
    with pytest.raises(errors.NotCoordinatorError, match="No space left"):
        controller.add_partitions_to_txn("tx", producer_id, epoch, [("t", 0)])
    assert transaction(controller).state == EMPTY
    assert controller.image().open_transactions == {}  # no leader takes its batches
    disk.free()
    assert controller.add_partitions_to_txn("tx", producer_id, epoch, [("t", 0)]) == {
        ("t", 0): None}
    assert controller.image().open_transactions == {("t", 0): frozenset({producer_id})}


def test_an_add_offsets_to_txn_on_a_full_disk_answers_not_coordinator(
        coordinator_disk: tuple[FullDisk, Controller, Leaders]) -> None:
    disk, controller, _ = coordinator_disk
    producer_id, epoch = controller.init_transactional_producer("tx", 60_000)
    disk.fill()
    with pytest.raises(errors.NotCoordinatorError, match="No space left"):
        controller.add_offsets_to_txn("tx", producer_id, epoch, "g")
    assert (transaction(controller).state, transaction(controller).groups) == (
        EMPTY, frozenset())
    with pytest.raises(errors.InvalidTxnStateError):  # the group did not join
        controller.txn_offset_commit("tx", "g", producer_id, epoch, {("t", 0): (5, -1, "")})
    disk.free()
    controller.add_offsets_to_txn("tx", producer_id, epoch, "g")
    assert transaction(controller).groups == frozenset({"g"})


def test_an_end_txn_on_a_full_disk_answers_not_coordinator_and_sends_no_marker(
        coordinator_disk: tuple[FullDisk, Controller, Leaders]) -> None:
    """EndTxn's PrepareCommit not written: the transaction stays open, with no marker sent,
    and the producer's retry commits it."""
    disk, controller, leaders = coordinator_disk
    producer_id, epoch = controller.init_transactional_producer("tx", 60_000)
    controller.add_partitions_to_txn("tx", producer_id, epoch, [("t", 0)])
    disk.fill()
    with pytest.raises(errors.NotCoordinatorError, match="No space left"):
        controller.end_txn("tx", producer_id, epoch, committed=True)
    assert transaction(controller).state == ONGOING
    assert leaders.markers == []
    disk.free()
    controller.end_txn("tx", producer_id, epoch, committed=True)
    wait_until(lambda: transaction(controller).state == COMPLETE_COMMIT, "tx CompleteCommit",
               WAIT_S)
    assert [(m.committed, m.partitions) for m in leaders.markers] == [(True, (("t", 0),))]


@pytest.mark.parametrize("ending", ["commit", "abort", "timed-out-abort"])
def test_a_transaction_whose_completion_meets_a_full_disk_completes_once_there_is_room(
        coordinator_disk: tuple[FullDisk, Controller, Leaders], caplog: pytest.LogCaptureFixture,
        ending: str) -> None:
    """The disk fills after the leaders took the markers, so recording CompleteCommit or
    CompleteAbort fails. Kafka never gives that write up (a storage error moves the
    coordinator, and the one that loads the log ends every PrepareX transaction it finds);
    deltabus's coordinator never moves, so it writes it again: the transaction completes once
    there is room, with no restart, each partition's marker written once, and the producer's
    next InitProducerId gets the next epoch."""
    disk, controller, leaders = coordinator_disk
    producer_id, epoch = controller.init_transactional_producer(
        "tx", 1 if ending == "timed-out-abort" else 60_000)
    controller.add_partitions_to_txn("tx", producer_id, epoch, [("t", 0)])
    leaders.then = disk.fill
    if ending == "timed-out-abort":  # under a new epoch: the producer is fenced
        wait_until(lambda: controller.abort_timed_out_transactions() == ["tx"], "a timeout")
        epoch += 1
    else:
        controller.end_txn("tx", producer_id, epoch, committed=ending == "commit")
    committed, prepared, completed = ((True, PREPARE_COMMIT, COMPLETE_COMMIT)
                                      if ending == "commit"
                                      else (False, PREPARE_ABORT, COMPLETE_ABORT))
    wait_until(lambda: completion_failed(caplog), "the completion's write to fail", WAIT_S)
    assert (transaction(controller).state, transaction(controller).producer_epoch) == (
        prepared, epoch)
    disk.free()
    wait_until(lambda: transaction(controller).state == completed, f"tx {completed}", WAIT_S)
    assert [(m.committed, m.producer_epoch, m.partitions) for m in leaders.markers] == [
        (committed, epoch, (("t", 0),))]
    assert controller.init_transactional_producer("tx", 60_000) == (producer_id, epoch + 1)


def completion_failed(caplog: pytest.LogCaptureFixture) -> bool:
    """The marker channel logged a write the full disk refused (its record's message or the
    exception it carries)."""
    return any(r.name == txn_marker_channel.__name__ and "No space left" in
               r.getMessage() + repr(r.exc_info[1] if r.exc_info else "")
               for r in caplog.records)


def test_an_idempotent_init_producer_id_on_a_full_disk_answers_coordinator_load_in_progress(
        coordinator_disk: tuple[FullDisk, Controller, Leaders]) -> None:
    """An idempotent producer's InitProducerId writes only when it needs a new block of ids.
    Kafka's broker, with no block to hand out (its controller did not give one), answers
    COORDINATOR_LOAD_IN_PROGRESS (RPCProducerIdManager), which Kafka's producers retry where
    NOT_COORDINATOR would send them looking for a transaction coordinator they have no key
    for; KAFKA_STORAGE_ERROR is fatal to Java's producer here too. No block is taken; within
    a block, ids are handed out with the disk full."""
    disk, controller, _ = coordinator_disk
    disk.fill()
    with pytest.raises(errors.CoordinatorLoadInProgressError, match="No space left"):
        controller.init_producer_id()
    disk.free()
    assert controller.init_producer_id() == (0, 0)
    disk.fill()
    assert controller.init_producer_id() == (1, 0)


def test_the_metadata_log_on_a_full_disk_fails_the_append_and_keeps_its_offsets(
        tmp_path: Path) -> None:
    with FullDisk(tmp_path / "disk", SMALL_DISK_BYTES) as disk:
        path = str(disk.path / "__cluster_metadata")
        metadata = MetadataLog(path)
        metadata.append([{"type": "test", "n": 0}])
        disk.fill()
        for n in (1, 2):  # the controller's next commits fail too
            with pytest.raises(errors.KafkaStorageError, match="No space left"):
                metadata.append([{"type": "test", "n": n}])
        assert metadata.next_offset == 1
        disk.free()
        metadata.append([{"type": "test", "n": 3}])
        assert [r["n"] for r in MetadataLog(path).read_all()] == [0, 3]
        table = DeltaTable(path).to_pyarrow_table().sort_by("offset")
        assert table.column("offset").to_pylist() == [0, 1]  # no gap where the failures were


# ---- a cluster's replicas on a full disk ------------------------------------------------------


def test_a_topic_on_a_full_disk_answers_storage_error_and_takes_writes_when_room_returns(
        cluster, topic_name: str, history: History) -> None:
    """The topic's directory (every replica of it) on a small disk, mounted before the topic
    is created: a full disk refuses writes with KAFKA_STORAGE_ERROR, the high watermark
    never passes what the replicas' tables hold, the tables stay readable, and the producer
    waiting in its retries gets its records in once the room is back."""
    root = cluster.config.root
    with FullDisk(topic_path(root, topic_name), SMALL_DISK_BYTES, history=history) as disk:
        create(cluster, topic_name, replication_factor=3, min_insync_replicas=2)
        leader = partition_state(cluster, topic_name).leader
        with Producer(cluster.bootstrap_servers, acks="all") as producer:
            acked = send(producer, history, topic_name, [f"before-{i}" for i in range(20)])
            disk.fill()
            refused = raw_produce(cluster, topic_name, b"refused-0", history)
            assert refused.error_code == errors.KafkaStorageError.code, refused
            waiting = [(value, producer.send(topic_name, value.encode(), partition=0))
                       for value in (f"during-{i}" for i in range(20))]
            for value, _ in waiting:
                history.invoke("producer", "send", value)
            for n in range(1, 4):  # each refusal is the broker's answer during the fault
                answer = raw_produce(cluster, topic_name, f"refused-{n}".encode(), history)
                assert answer.error_code == errors.KafkaStorageError.code, answer
                high_watermark = end_offset(cluster, topic_name)
                assert high_watermark <= min(table_end(cluster, topic_name, r)
                                             for r in range(3)), "the HW passed the tables"
                assert high_watermark == 20
            assert partition_state(cluster, topic_name).leader == leader  # it still leads
            for r in range(3):  # delta-rs reads every replica while the disk is full
                assert DeltaTable(replica_path(root, topic_name, 0, r)).to_pyarrow_table(
                    ).num_rows == 20
            assert not any(future.done() for _, future in waiting)  # retrying, none acked
            disk.free()
            acked += [received(history, value, future) for value, future in waiting]
        check(history, read_records(cluster.bootstrap_servers, topic_name, 1, len(acked)))
        wait_for_identical_replicas(cluster, topic_name)  # quiet before the mount ends


def test_a_follower_on_a_full_disk_leaves_the_isr_and_catches_up_when_room_returns(
        cluster, topic_name: str, history: History) -> None:
    """One follower's replica on a small disk (mounted after the topic's tables were made,
    before any record): the leader goes on with the other follower (min.insync.replicas=2),
    the full one leaves the ISR, and it copies what it missed and joins again afterwards."""
    root = cluster.config.root
    create(cluster, topic_name, replication_factor=3, min_insync_replicas=2,
           replica_assignment={0: [0, 1, 2]})
    full = 2
    with FullDisk(replica_path(root, topic_name, 0, full), SMALL_DISK_BYTES,
                  history=history) as disk:
        with Producer(cluster.bootstrap_servers, acks="all") as producer:
            acked = send(producer, history, topic_name, [f"before-{i}" for i in range(20)])
            wait_for_identical_replicas(cluster, topic_name)
            disk.fill()
            during = send(producer, history, topic_name, [f"during-{i}" for i in range(20)])
            acked += during
            # Acknowledged only once min.insync.replicas tables hold them (the leader's and
            # the follower with room), and the full one is out of the ISR by then.
            assert min(table_end(cluster, topic_name, r) for r in (0, 1)) >= 40
            wait_until(lambda: partition_state(cluster, topic_name).isr == (0, 1),
                       "the full follower to leave the ISR", WAIT_S)
            assert partition_state(cluster, topic_name).leader == 0
            assert table_end(cluster, topic_name, full) == 20  # it copied nothing since
            assert DeltaTable(replica_path(root, topic_name, 0, full)).to_pyarrow_table(
                ).num_rows == table_end(cluster, topic_name, full)
            disk.free()
            acked += send(producer, history, topic_name, [f"after-{i}" for i in range(20)])
        wait_for_identical_replicas(cluster, topic_name)  # back in the ISR, holding it all
        check(history, read_records(cluster.bootstrap_servers, topic_name, 1, len(acked)))


@pytest.mark.timeout(300 + ACKED_BEFORE_FILL // 100)  # the load before the fault, and a margin
def test_a_topic_under_steady_load_takes_writes_again_once_the_room_is_back(
        cluster, topic_name: str, history: History) -> None:
    """The soak's full disk, focused: acks=all producers at a steady rate on 4 partitions (RF 3,
    min.insync.replicas=2), the topic's disk filled for the soak's 10 s and freed. In the soak a
    partition took no write for 35 s after the room was back, where Kafka's takes writes again
    within a second or two. The cause: every refused write (a leader's append, a follower's
    copy) made the log forget its producers, recent records and leader epochs and rebuild them
    from every data file of its table, the producers under the log's lock, so fetches (the
    followers' too) waited behind each rebuild, followers fell out of the ISR, and each
    producer's first write once the room was back paid for one more rebuild.

    So every leader refuses a write with KAFKA_STORAGE_ERROR within the request's timeout; as
    Kafka's DescribeProducers shows it, every replica, leader or follower, keeps the producers
    it knew while its writes are refused; and writes resume on every partition, with nothing
    acknowledged lost. How long each partition took to take a write again is printed
    and kept in the history (`writes-resumed`); DELTABUS_FULL_DISK_ACKED_BEFORE sets the load
    before the fault (the longer, the larger the tables: the soak's was a few minutes')."""
    root = cluster.config.root
    plan = FaultPlan(topic_name, partitions=LOADED_PARTITIONS)
    ledger = Ledger(history)
    senders = [DeltabusSender(f"p{i}", cluster.bootstrap_servers, plan, ledger)
               for i in range(LOADED_PRODUCERS)]
    with FullDisk(topic_path(root, topic_name), LOADED_DISK_BYTES, history=history) as disk:
        create(cluster, topic_name, partitions=LOADED_PARTITIONS, replication_factor=3,
               min_insync_replicas=2)
        admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
        try:
            for sender in senders:
                sender.start()
            wait_until(lambda: ledger.acked_count() >= ACKED_BEFORE_FILL,
                       "the load acknowledged before the fault", WAIT_S + ACKED_BEFORE_FILL / 100)
            known = producers_everywhere(cluster, admin, topic_name)
            wait_until(lambda: all(  # as the soak's nemesis waits before each fault
                set(partition_state(cluster, topic_name, p).isr)
                == set(partition_state(cluster, topic_name, p).replicas)
                for p in range(LOADED_PARTITIONS)), "every replica in sync", WAIT_S)
            disk.fill()
            held_until = time.monotonic() + FULL_HOLD_S
            with ThreadPoolExecutor(LOADED_PARTITIONS) as pool:  # each leader's own answer
                refusals = dict(enumerate(pool.map(lambda p: raw_produce(
                    cluster, topic_name, f"refused-{p}".encode(), history, p).error_code,
                    range(LOADED_PARTITIONS))))
            forgot: set[str] = set()
            while True:  # sampled through the fault
                now = producers_by_replica(cluster, admin, topic_name)
                forgot |= {f"partition {p} broker {b} forgot {sorted(known[p] - now[p, b])}"
                           for p, b in now if not known[p] <= now[p, b]}
                if time.monotonic() >= held_until:
                    break
            disk.free()
            wait_until(lambda: len(writes_resumed(history)) == LOADED_PARTITIONS,
                       "every partition to take writes again", RESUME_WAIT_S)
            resumed = writes_resumed(history)
            history.info("checker", "writes-resumed", resumed)
            print(f"writes resumed (ms after the room was back, by partition): {resumed}")
        finally:
            admin.close()
            for sender in senders:
                sender.stop(plan.flush_s + 30)
        assert [s.error for s in senders] == [None] * LOADED_PRODUCERS
        assert ledger.failed_sends == 0
        # Refused within the request's timeout (else REQUEST_TIMED_OUT): b245a78's leaders
        # were rebuilding their producers from the table under the log's lock.
        assert refusals == dict.fromkeys(range(LOADED_PARTITIONS), errors.KafkaStorageError.code)
        assert not forgot, f"replicas forgot producers while the disk was full: {sorted(forgot)}"
        check_acknowledged(cluster, topic_name, ledger)
        for partition in range(LOADED_PARTITIONS):  # quiet before the mount ends
            wait_for_identical_replicas(cluster, topic_name, partition)


# ---- helpers ------------------------------------------------------------------------------------


def half_written(path: str) -> list[str]:
    """Files a failed write left half written in a table's folder: temporaries in its
    `_delta_log`, and data files that are not whole Parquet files."""
    log_dir = os.path.join(path, "_delta_log")
    found = [os.path.join(log_dir, n) for n in os.listdir(log_dir) if n.startswith(".")]
    for name in os.listdir(path):
        if name.endswith(".parquet"):
            try:
                pq.read_metadata(os.path.join(path, name))
            except (OSError, pa.ArrowInvalid):
                found.append(os.path.join(path, name))
    return found


def data_file_scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter (its one item) of the scans of a log's data files from now on: every rebuild
    of producers, leader epochs or transactions from the table opens them all
    (PartitionReader.parquet_files). Logs opened afterwards are counted."""
    scans = [0]
    scan = PartitionReader.parquet_files

    def counted(reader: PartitionReader) -> Iterator[pq.ParquetFile]:
        scans[0] += 1
        return scan(reader)
    monkeypatch.setattr(PartitionReader, "parquet_files", counted)
    return scans


def append_as(log: PartitionLog, producer_id: int, sequence: int) -> Future[AppendResult]:
    """Append the record v<sequence> as idempotent producer `producer_id` (epoch 0)."""
    return log.append(produce_batch([f"v{sequence}".encode()]), leader_epoch=0,
                      producer=ProducerState(producer_id, 0, sequence))


def values(path: str) -> list[bytes]:
    return DeltaTable(path).to_pyarrow_table().sort_by("offset").column("value").to_pylist()


def offset_commit(group: str, partition: int, offset: int) -> OffsetCommit:
    return OffsetCommit(group, "t", partition, OffsetAndMetadata(offset))


def committed(store: OffsetStore, group: str) -> dict[int, int]:
    return {p: o.offset for (_, p), o in store.offsets(group).items()}


def group_coordinator(offsets_path: str) -> GroupCoordinator:
    """A group coordinator over the offsets table at `offsets_path`, for topic t (1 partition)."""
    image = MetadataImage(1, "c", 0, (), {"t": TopicState("t", "t-id", (
        PartitionState(0, 0, 0, (0,), (0,)),))})
    return GroupCoordinator(OffsetStore(offsets_path, commit_linger_ms=0), GroupConfig(),
                            metadata=lambda: image)


def offset_commit_answer(coordinator: GroupCoordinator, history: History,
                         offset: int) -> errors.DeltaBusError | None:
    """OffsetCommit of group g's offset of t-0 by a consumer outside group management: the
    coordinator's answer (None: committed)."""
    history.invoke("consumer", "commit", offset)
    try:
        answers = coordinator.commit_offsets("g", -1, "", {("t", 0): OffsetAndMetadata(
            offset)}).result(10)
    except errors.DeltaBusError as e:
        history.fail("consumer", "commit", {"offset": offset, "error": e.name})
        return e
    history.ok("consumer", "commit", {"offset": offset})
    return answers[("t", 0)]


def committed_offsets(coordinator: GroupCoordinator) -> dict[tuple[str, int], int]:
    return {tp: om.offset for tp, om in coordinator.fetch_offsets("g").items()}

def create(cluster, topic: str, *, replication_factor: int, min_insync_replicas: int,
           replica_assignment: dict[int, list[int]] | None = None, partitions: int = 1) -> None:
    configs = {"min.insync.replicas": str(min_insync_replicas)}
    new = (NewTopic(topic, configs=configs, replica_assignment=replica_assignment)
           if replica_assignment else NewTopic(topic, partitions, replication_factor, configs))
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([new])
    wait_until(lambda: all(len(partition_state(cluster, topic, p).isr) == replication_factor
                           for p in range(partitions)), f"every replica of {topic} in sync")


def partition_state(cluster, topic: str, partition: int = 0):
    return cluster.controller.image().partition(topic, partition)


def send(producer: Producer, history: History, topic: str, values: list[str]) -> list[
        tuple[str, int]]:
    """Send `values` to partition 0 and wait for each: (value, offset) as acknowledged."""
    futures = []
    for value in values:
        history.invoke("producer", "send", value)
        futures.append((value, producer.send(topic, value.encode(), partition=0)))
    return [received(history, value, future) for value, future in futures]


def received(history: History, value: str, future) -> tuple[str, int]:
    offset = future.get(WAIT_S).offset
    history.ok("producer", "send", {"value": value, "offset": offset})
    return value, offset


def raw_produce(cluster, topic: str, value: bytes, history: History,
                partition: int = 0) -> pb.PartitionProduceResponse:
    """One Produce request (acks=all, no retries) to the partition's leader: its own answer."""
    leader = cluster.controller.image().broker(
        partition_state(cluster, topic, partition).leader).address
    client = ClusterClient(leader)
    history.invoke("raw", "send", value.decode())
    try:
        answer = client.call(leader, "Produce", pb.ProduceRequest(
            acks=-1, timeout_ms=10_000, partitions=[pb.PartitionProduceData(
                topic=topic, partition=partition,
                arrow_records=to_ipc(produce_batch([value])))]))
    finally:
        client.close()
    result = answer.partitions[0]
    outcome = history.ok if result.error_code == 0 else history.fail
    outcome("raw", "send", {"value": value.decode(), "error_code": result.error_code,
                            "offset": result.base_offset})
    return result


def end_offset(cluster, topic: str) -> int:
    """The high watermark, as consumers see it (ListOffsets latest)."""
    consumer = Consumer(cluster.bootstrap_servers)
    try:
        return consumer.end_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]
    finally:
        consumer.close()


def table_end(cluster, topic: str, broker: int, partition: int = 0) -> int:
    """One past the last offset in a replica's Delta table, read from disk (0: empty)."""
    table = DeltaTable(replica_path(cluster.config.root, topic, partition, broker))
    offsets = table.to_pyarrow_table(columns=["offset"]).column("offset")
    return 0 if len(offsets) == 0 else max(offsets.to_pylist()) + 1


def wait_for_identical_replicas(cluster, topic: str, partition: int = 0) -> None:
    def identical() -> bool:
        state = partition_state(cluster, topic, partition)
        if sorted(state.isr) != sorted(state.replicas):
            return False
        ends = {table_end(cluster, topic, r, partition) for r in state.replicas}
        return len(ends) == 1
    wait_until(identical, f"every replica of {topic}-{partition} in sync, holding the same "
               "records", WAIT_S)


def producers_by_replica(cluster, admin: KafkaAdminClient, topic: str
                         ) -> dict[tuple[int, int], set[int]]:
    """(partition, broker) -> the producer ids each replica knows, as Kafka's
    DescribeProducers asks every replica of every partition."""
    out = {}
    for partition in range(LOADED_PARTITIONS):
        tp = KafkaTopicPartition(topic, partition)
        for broker in partition_state(cluster, topic, partition).replicas:
            out[partition, broker] = {p.producer_id for p in admin.describe_producers(
                [tp], broker_id=broker)[tp].active_producers}
    return out


def producers_everywhere(cluster, admin: KafkaAdminClient, topic: str) -> dict[int, set[int]]:
    """partition -> the producer ids its leader knows, once every replica knows them too (the
    followers from the records they copied)."""
    def same() -> bool:
        by_replica = producers_by_replica(cluster, admin, topic)
        return all(len({frozenset(by_replica[p, b]) for b in
                        partition_state(cluster, topic, p).replicas}) == 1
                   and by_replica[p, partition_state(cluster, topic, p).leader]
                   for p in range(LOADED_PARTITIONS))
    wait_until(same, "every replica to know the producers", WAIT_S)
    by_replica = producers_by_replica(cluster, admin, topic)
    return {p: by_replica[p, partition_state(cluster, topic, p).leader]
            for p in range(LOADED_PARTITIONS)}


def writes_resumed(history: History) -> dict[int, float]:
    """partition -> ms from the room coming back (the last stop-full-disk) to the partition's
    first acknowledged send after it; partitions with none yet are left out."""
    operations = read_history(history.path)
    freed = [op["time_ms"] for op in operations if op["f"] == "stop-full-disk"]
    first: dict[int, float] = {}
    for op in operations:
        if (freed and op["f"] == "send" and op["type"] == OK and op["time_ms"] >= freed[-1]
                and isinstance(op["value"], list)):
            first.setdefault(op["value"][1], round(op["time_ms"] - freed[-1], 1))
    return first


def check_acknowledged(cluster, topic: str, ledger: Ledger) -> None:
    """Every acknowledged record is in the log at the (partition, offset) it was acknowledged
    at, once."""
    records = read_records(cluster.bootstrap_servers, topic, LOADED_PARTITIONS,
                           len(ledger.acked), timeout_s=RESUME_WAIT_S)
    stored: dict[bytes, list[tuple[int, int]]] = {}
    for r in records:
        stored.setdefault(r.value, []).append((r.partition, r.offset))
    wrong = [(value, where, stored.get(value)) for value, where in ledger.acked.items()
             if stored.get(value) != [where]]
    assert wrong == [], f"{len(wrong)} acknowledged records not where acknowledged: {wrong[:5]}"


def check(history: History, records: list) -> None:
    """Every acknowledged send is read once, in order, at its acknowledged offset; any other
    value is read at most once."""
    acked = sorted(((op["value"]["offset"], op["value"]["value"])
                    for op in read_history(history.path)
                    if op["type"] == OK and op["f"] == "send"), key=lambda pair: pair[0])
    read = [(r.offset, r.value.decode()) for r in records]
    acked_values = {value for _, value in acked}
    assert [pair for pair in read if pair[1] in acked_values] == acked, "acked records lost, " \
        "moved or read twice"
    others = [value for _, value in read if value not in acked_values]
    assert len(others) == len(set(others)), f"unacknowledged records read twice: {others}"
    assert history.count("start-full-disk", "info") == history.count("stop-full-disk", "info")
