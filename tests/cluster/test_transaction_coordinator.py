"""The transaction coordinator in a real controller (real metadata log under tmp_path), its
markers going through a fake `send_markers` (the partition side is another branch): states,
fencing by epoch, markers retried until every partition has one, offsets written only on
commit, the state kept across a controller restart, timed-out transactions aborted, and the
open transactions brokers see in their image."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster import transaction_control
from deltabus.cluster import transaction_coordinator as tc
from deltabus.cluster.controller import Controller
from deltabus.cluster.metadata_loader import MetadataLoader
from deltabus.cluster.metadata_records import (
    TransactionalIdRecord,
    TransactionRecord,
    deserialize,
    serialize,
)
from deltabus.cluster.metadata_state import MetadataState
from deltabus.cluster.txn_marker_channel import MarkerAnswers
from deltabus.log_tables.control_records import TxnMarker
from deltabus.metadata import EMPTY, MetadataPosition, NewTopic
from deltabus.offsets.offset_store import OffsetAndMetadata
from tests.cluster.controller_server import LiveBrokers
from tests.conftest import wait_until


class Leaders:
    """A fake of the partition leaders: records every marker; `failing` partitions answer
    NOT_LEADER_OR_FOLLOWER that many more times."""

    def __init__(self) -> None:
        self.markers: list[tuple[int, TxnMarker]] = []
        self.failing: dict[tuple[str, int], int] = {}
        self.down = False
        self._lock = threading.Lock()

    def __call__(self, broker_id: int, markers: list[TxnMarker]) -> MarkerAnswers:
        if self.down:
            raise ConnectionError("leader unreachable")
        answers: MarkerAnswers = {}
        with self._lock:
            for m in markers:
                for t, p in m.partitions:
                    if self.failing.get((t, p), 0) > 0:
                        self.failing[(t, p)] -= 1
                        answers[(m.producer_id, t, p)] = errors.NotLeaderOrFollowerError()
                    else:
                        self.markers.append((broker_id, TxnMarker(
                            m.producer_id, m.producer_epoch, m.committed, m.coordinator_epoch,
                            ((t, p),))))
                        answers[(m.producer_id, t, p)] = None
        return answers

    def marked(self) -> set[tuple[str, int, bool, int]]:
        return {(m.partitions[0][0], m.partitions[0][1], m.committed, m.producer_epoch)
                for _, m in self.markers}


class Offsets:
    """Collects the offsets a committed transaction writes into its groups."""

    def __init__(self) -> None:
        self.written: dict[str, dict[tuple[str, int], OffsetAndMetadata]] = {}

    def __call__(self, group: str, offsets: dict[tuple[str, int], OffsetAndMetadata]
                 ) -> Future[None]:
        self.written.setdefault(group, {}).update(offsets)
        done: Future[None] = Future()
        done.set_result(None)
        return done


def _controller(tmp_path: Path, leaders: Leaders) -> Controller:
    controller = Controller(cfg.ClusterConfig(root=str(tmp_path), brokers=2, kafka_port=-1),
                            send_markers=leaders)
    LiveBrokers(controller, 2)  # heartbeating until the controller shuts down
    return controller


@pytest.fixture
def leaders() -> Leaders:
    return Leaders()


@pytest.fixture
def controller(tmp_path: Path, leaders: Leaders) -> Controller:
    controller = _controller(tmp_path, leaders)
    controller.create_topics([NewTopic("orders", replica_assignment={0: [0, 1], 1: [1, 0]})],
                             timeout_ms=0)
    yield controller
    controller.begin_shutdown()


def _state(controller: Controller, txn_id: str) -> str:
    txn = controller.describe_transactions([txn_id])[txn_id]
    assert txn is not None
    return txn.state


def test_a_commit_writes_markers_on_every_partition_then_the_offsets(
        controller: Controller, leaders: Leaders) -> None:
    offsets = Offsets()
    controller.markers.offsets_writer = offsets
    pid, epoch = controller.init_transactional_producer("tx", 60_000)
    assert epoch == 0 and _state(controller, "tx") == EMPTY
    parts = [("orders", 0), ("orders", 1)]
    assert controller.add_partitions_to_txn("tx", pid, epoch, parts) == dict.fromkeys(parts)
    assert controller.image().open_transactions == {tp: frozenset({pid}) for tp in parts}
    controller.add_offsets_to_txn("tx", pid, epoch, "g")
    committed = {("orders", 0): (7, 1, "m")}
    assert controller.txn_offset_commit("tx", "g", pid, epoch, committed) == {
        ("orders", 0): None}
    assert not offsets.written  # held until the commit
    controller.end_txn("tx", pid, epoch, committed=True)
    wait_until(lambda: _state(controller, "tx") == "CompleteCommit", "tx CompleteCommit")
    assert leaders.marked() == {("orders", 0, True, 0), ("orders", 1, True, 0)}
    assert {b for b, _ in leaders.markers} == {0, 1}  # each partition's leader
    assert offsets.written == {"g": {("orders", 0): OffsetAndMetadata(7, 1, "m")}}
    assert controller.image().open_transactions == {}
    controller.end_txn("tx", pid, epoch, committed=True)  # a retry: answered NONE
    with pytest.raises(errors.InvalidTxnStateError):
        controller.end_txn("tx", pid, epoch, committed=False)


def test_an_abort_drops_the_offsets(controller: Controller, leaders: Leaders) -> None:
    offsets = Offsets()
    controller.markers.offsets_writer = offsets
    pid, epoch = controller.init_transactional_producer("tx", 60_000)
    controller.add_partitions_to_txn("tx", pid, epoch, [("orders", 0)])
    controller.add_offsets_to_txn("tx", pid, epoch, "g")
    controller.txn_offset_commit("tx", "g", pid, epoch, {("orders", 0): (7, -1, "")})
    controller.end_txn("tx", pid, epoch, committed=False)
    wait_until(lambda: _state(controller, "tx") == "CompleteAbort", "tx CompleteAbort")
    assert leaders.marked() == {("orders", 0, False, 0)}
    assert offsets.written == {}


def test_errors_of_requests_out_of_order(controller: Controller) -> None:
    pid, epoch = controller.init_transactional_producer("tx", 60_000)
    with pytest.raises(errors.InvalidProducerIdMappingError):
        controller.add_partitions_to_txn("tx", pid + 1, epoch, [("orders", 0)])
    with pytest.raises(errors.InvalidProducerIdMappingError):
        controller.end_txn("nobody", pid, epoch, committed=True)
    with pytest.raises(errors.InvalidTxnStateError):  # nothing open to commit
        controller.end_txn("tx", pid, epoch, committed=True)
    controller.add_partitions_to_txn("tx", pid, epoch, [("orders", 0)])
    with pytest.raises(errors.InvalidTxnStateError):  # the group was never added
        controller.txn_offset_commit("tx", "g", pid, epoch, {("orders", 0): (1, -1, "")})
    answers = controller.add_partitions_to_txn("tx", pid, epoch, [("orders", 1), ("nope", 0)])
    assert isinstance(answers[("nope", 0)], errors.UnknownTopicOrPartitionError)
    assert isinstance(answers[("orders", 1)], errors.OperationNotAttemptedError)
    for timeout_ms in (0, cfg.TRANSACTION_MAX_TIMEOUT_MS + 1):
        with pytest.raises(errors.InvalidTransactionTimeoutError):
            controller.init_transactional_producer("other", timeout_ms)


def test_a_new_producer_fences_the_old_and_aborts_its_transaction(
        controller: Controller, leaders: Leaders, monkeypatch: pytest.MonkeyPatch) -> None:
    # The retries below wait for the abort's markers this long before their answer.
    monkeypatch.setattr(transaction_control, "TXN_ENDING_WAIT_MS", 300)
    pid, epoch = controller.init_transactional_producer("tx", 60_000)
    controller.add_partitions_to_txn("tx", pid, epoch, [("orders", 1)])
    leaders.down = True  # the abort cannot finish yet
    with pytest.raises(errors.ConcurrentTransactionsError):
        controller.init_transactional_producer("tx", 60_000)
    assert _state(controller, "tx") == "PrepareAbort"
    with pytest.raises(errors.ConcurrentTransactionsError):  # the client retries meanwhile
        controller.init_transactional_producer("tx", 60_000)
    leaders.down = False
    wait_until(lambda: _state(controller, "tx") == "CompleteAbort", "tx CompleteAbort")
    assert leaders.marked() == {("orders", 1, False, epoch + 1)}  # under the fencing epoch
    assert controller.init_transactional_producer("tx", 60_000) == (pid, epoch + 2)
    with pytest.raises(errors.ProducerFencedError):
        controller.add_partitions_to_txn("tx", pid, epoch, [("orders", 0)])
    with pytest.raises(errors.ProducerFencedError):
        controller.end_txn("tx", pid, epoch, committed=True)
    with pytest.raises(errors.ProducerFencedError):  # KIP-360: an old producer's own id
        controller.init_transactional_producer("tx", 60_000, expected=(pid, epoch))


def test_markers_are_sent_again_until_every_leader_has_one(
        controller: Controller, leaders: Leaders) -> None:
    pid, epoch = controller.init_transactional_producer("tx", 60_000)
    controller.add_partitions_to_txn("tx", pid, epoch, [("orders", 0), ("orders", 1)])
    leaders.failing = {("orders", 0): 3}
    controller.end_txn("tx", pid, epoch, committed=True)
    wait_until(lambda: _state(controller, "tx") == "CompleteCommit", "tx CompleteCommit")
    assert leaders.marked() == {("orders", 0, True, 0), ("orders", 1, True, 0)}
    assert leaders.failing == {("orders", 0): 0}


def test_a_restarted_controller_keeps_transactions_and_ends_the_ones_being_ended(
        tmp_path: Path, leaders: Leaders) -> None:
    first = _controller(tmp_path, leaders)
    first.create_topics([NewTopic("orders", replica_assignment={0: [0, 1]})], timeout_ms=0)
    pid, epoch = first.init_transactional_producer("ending", 60_000)
    first.add_partitions_to_txn("ending", pid, epoch, [("orders", 0)])
    first.add_offsets_to_txn("ending", pid, epoch, "g")
    first.txn_offset_commit("ending", "g", pid, epoch, {("orders", 0): (5, -1, "")})
    other, other_epoch = first.init_transactional_producer("open", 60_000)
    first.add_partitions_to_txn("open", other, other_epoch, [("orders", 0)])
    leaders.down = True
    first.end_txn("ending", pid, epoch, committed=True)
    first.begin_shutdown()
    assert _state(first, "ending") == "PrepareCommit"

    again = Leaders()
    offsets = Offsets()
    second = _controller(tmp_path, again)
    second.markers.offsets_writer = offsets
    try:
        wait_until(lambda: _state(second, "ending") == "CompleteCommit", "ending CompleteCommit")
        assert again.marked() == {("orders", 0, True, epoch)}
        assert offsets.written == {"g": {("orders", 0): OffsetAndMetadata(5, -1, "")}}
        assert _state(second, "open") == "Ongoing"
        assert second.image().open_transactions == {("orders", 0): frozenset({other})}
        assert second.init_transactional_producer("ending", 60_000) == (pid, epoch + 1)
    finally:
        second.begin_shutdown()


def test_a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced(
        controller: Controller, leaders: Leaders) -> None:
    pid, epoch = controller.init_transactional_producer("slow", 100)
    controller.add_partitions_to_txn("slow", pid, epoch, [("orders", 0)])
    fast, fast_epoch = controller.init_transactional_producer("fast", 60_000)
    controller.add_partitions_to_txn("fast", fast, fast_epoch, [("orders", 1)])
    wait_until(lambda: controller.abort_timed_out_transactions() == ["slow"], "a timeout")
    wait_until(lambda: _state(controller, "slow") == "CompleteAbort", "slow CompleteAbort")
    assert leaders.marked() == {("orders", 0, False, epoch + 1)}
    with pytest.raises(errors.ProducerFencedError):
        controller.end_txn("slow", pid, epoch, committed=True)
    assert _state(controller, "fast") == "Ongoing"


def test_brokers_replaying_the_records_see_the_open_transactions(
        controller: Controller) -> None:
    pid, epoch = controller.init_transactional_producer("tx", 60_000)
    controller.add_partitions_to_txn("tx", pid, epoch, [("orders", 1)])
    loader = MetadataLoader(controller.config.root)
    position = MetadataPosition(0)
    while True:
        _, batch, _ = controller.heartbeat(0, controller.broker_epochs()[0], 0, 0,
                                           position=position)
        if batch is None:
            break
        loader.replay(batch)
        position = batch.end
    assert loader.image is not None
    assert loader.image.open_transactions == {("orders", 1): frozenset({pid})}
    record = TransactionRecord("tx", pid, epoch, "Ongoing", 1000, ("orders",), (1,), ("g",), 5)
    assert deserialize(serialize(record)) == record


def test_an_exhausted_epoch_moves_the_transactional_id_to_a_new_producer_id() -> None:
    state = MetadataState(producer_ids_end=2000)
    state.replay(TransactionalIdRecord("tx", 5))
    state.replay(TransactionRecord("tx", 5, cfg.PRODUCER_EPOCH_MAX - 1, EMPTY, 1000))
    result = tc.init_producer_id(state, 1000, "tx", 1000, now_ms=0)
    assert result.response == (1000, 0)
    for record in result.records:
        state.replay(record)
    assert state.transactional_ids["tx"] == 1000


def test_grpc_init_producer_id_keeps_the_epoch(controller: Controller) -> None:
    """The exactly-once pipeline's InitProducerId never bumps the epoch (its sequences go on)."""
    assert controller.init_producer_id("sink") == controller.init_producer_id("sink")
    pid, epoch = controller.init_producer_id("sink")
    assert controller.init_transactional_producer("sink", 60_000) == (pid, epoch + 1)
    assert controller.init_producer_id("sink") == (pid, epoch + 1)


def test_the_log_cleaner_is_told_which_transactions_are_open_where(
        controller: Controller, leaders: Leaders) -> None:
    """Compaction stays below the last stable offset: its tasks carry the producers with a
    transaction open on their partition, and when that was read."""
    pid, epoch = controller.init_transactional_producer("tx", 60_000)
    controller.add_partitions_to_txn("tx", pid, epoch, [("orders", 1)])
    before_ms = int(time.time() * 1000)
    tasks = {t.partition: t for t in controller.cleaner_tasks() if t.topic == "orders"}
    assert tasks[1].open_producers == (pid,) and tasks[0].open_producers == ()
    assert before_ms <= tasks[1].open_as_of_ms <= int(time.time() * 1000)
    controller.end_txn("tx", pid, epoch, committed=False)
    wait_until(lambda: _state(controller, "tx") == "CompleteAbort", "tx CompleteAbort")
    assert all(t.open_producers == () for t in controller.cleaner_tasks())
