"""The leader's view of its followers (high watermark, ISR shrink and expansion, divergence) and
Kafka's rack-aware replica placement: pure logic over a real PartitionLog, with a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltabus import errors
from deltabus.cluster.partition import Partition
from deltabus.cluster.replica_placement import assign_replicas
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.metadata import PartitionState
from deltabus.records import normalize_produce, produce_batch, to_log_batch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def leader(tmp_path: Path):
    holder: list[Partition] = []  # the log calls back into its partition, as on a broker
    log = PartitionLog(str(tmp_path / "replica-0"), topic="t", partition=0, replicated=True,
                       on_append=lambda: holder[0].on_log_change() if holder else None)
    clock = Clock()
    partition = Partition("t", 0, 0, log, clock)
    holder.append(partition)
    partition.apply(PartitionState(0, 0, 3, (0, 1, 2), (0, 1, 2)), version=1)
    yield partition, clock
    log.close()


def log_rows(base_offset: int, n: int, leader_epoch: int):
    """`n` records as a leader wrote them: what a follower copies."""
    return to_log_batch(normalize_produce(produce_batch([b"x"] * n)), base_offset=base_offset,
                        now_ms=0, leader_epoch=leader_epoch)


def _append(partition: Partition, n: int) -> int:
    batch = normalize_produce(produce_batch([b"x"] * n))
    return partition.log.append(batch, leader_epoch=partition.leader_epoch).result(30).last_offset


def test_high_watermark_is_the_smallest_log_end_in_the_isr(leader) -> None:
    partition, _ = leader
    _append(partition, 10)
    assert partition.log.high_watermark == 0  # followers have not fetched yet
    partition.follower_fetched(1, 10)
    assert partition.log.high_watermark == 0
    partition.follower_fetched(2, 6)
    assert partition.log.high_watermark == 6
    partition.follower_fetched(2, 10)
    assert partition.log.high_watermark == 10


def test_acks_all_waits_for_the_isr_and_checks_min_insync(leader) -> None:
    partition, _ = leader
    batch = normalize_produce(produce_batch([b"a", b"b"]))
    done = partition.acknowledged(partition.log.append(batch, leader_epoch=3), 3, 2)
    partition.log.flush()
    assert not done.done()
    partition.follower_fetched(1, 2)
    partition.follower_fetched(2, 2)
    assert done.result(5).last_offset == 1
    partition.apply(PartitionState(0, 0, 3, (0, 1, 2), (0,)), version=2)
    with pytest.raises(errors.NotEnoughReplicasError, match="min.insync.replicas=2"):
        partition.check_min_isr(2)


def test_an_append_committed_after_losing_the_leadership_is_not_acknowledged(leader) -> None:
    """An append that commits after the leadership moved (it was queued before) must not be
    acknowledged, with acks=1 or when the high watermark passes its offsets as a follower
    (acks=all): the new leader's log truncates it and refills those offsets."""
    partition, _ = leader
    batch = normalize_produce(produce_batch([b"a", b"b"]))
    appended = partition.log.append(batch, leader_epoch=3)
    partition.apply(PartitionState(0, 1, 4, (0, 1, 2), (1, 2)), version=2)  # broker 1 leads
    acks_all = partition.acknowledged(appended, 3, 2)  # the handler gets here only now
    acks_1 = partition.acknowledged(appended, 3)
    appended.result(30)
    partition.follower_high_watermark(2)
    for done in (acks_all, acks_1):
        with pytest.raises(errors.NotLeaderOrFollowerError, match="epoch 3"):
            done.result(5)


def test_lagging_follower_is_proposed_out_and_a_caught_up_one_back_in(leader) -> None:
    partition, clock = leader
    _append(partition, 5)
    partition.follower_fetched(1, 5)
    partition.follower_fetched(2, 5)
    _append(partition, 5)
    clock.now += 3
    partition.follower_fetched(1, 10)  # broker 1 keeps up; broker 2 stops fetching
    assert partition.lagging_isr(lag_max_ms=5000) is None
    clock.now += 3
    assert partition.lagging_isr(lag_max_ms=5000) == [0, 1]
    partition.isr_committed((0, 1), version=5)
    assert partition.isr == (0, 1) and partition.log.high_watermark == 10
    assert partition.follower_fetched(2, 7) is None  # behind the high watermark: not yet
    assert partition.follower_fetched(2, 10) == [0, 1, 2]


def test_a_shrink_in_flight_already_counts_against_min_insync(leader) -> None:
    """Once the leader has proposed dropping a lagging follower, acks=all no longer counts it:
    otherwise a produce checked before the controller's answer arrives would be appended and
    then fail NOT_ENOUGH_REPLICAS_AFTER_APPEND instead of being refused with nothing written."""
    partition, clock = leader
    _append(partition, 5)
    partition.follower_fetched(1, 5)
    partition.follower_fetched(2, 5)
    partition.check_min_isr(2)
    clock.now += 6  # neither follower fetches again
    assert partition.lagging_isr(lag_max_ms=5000) == [0]  # proposed, not answered yet
    assert partition.isr == (0, 1, 2)
    with pytest.raises(errors.NotEnoughReplicasError, match=r"1 in-sync replicas \[0\]"):
        partition.check_min_isr(2)
    partition.isr_committed((0,), version=5)
    with pytest.raises(errors.NotEnoughReplicasError):
        partition.check_min_isr(2)


def test_isr_expansion_in_flight_holds_the_high_watermark_until_answered(leader) -> None:
    """While the controller is committing an expansion, metadata it sent earlier (still showing
    the old ISR) must not make the leader forget the joining replica: the controller will count
    it as in sync, and may elect it, so the high watermark must not pass what it holds. A lost
    answer keeps the change pending too, for a while."""
    partition, clock = leader
    partition.apply(PartitionState(0, 0, 3, (0, 1, 2), (0, 2)), version=2)  # 1 fell out
    _append(partition, 10)
    partition.follower_fetched(2, 10)
    assert partition.log.high_watermark == 10
    assert partition.follower_fetched(1, 10) == [0, 1, 2]  # caught up: expansion proposed
    _append(partition, 5)
    partition.follower_fetched(2, 15)
    assert partition.log.high_watermark == 10  # broker 1 counts already
    partition.apply(PartitionState(0, 0, 3, (0, 1, 2), (0, 2)), version=3)  # older news
    partition.follower_fetched(2, 15)
    assert partition.maximal_isr == (0, 2, 1) and partition.log.high_watermark == 10
    partition.isr_committed((0, 1, 2), version=4)
    partition.follower_fetched(1, 15)
    assert partition.log.high_watermark == 15

    partition.apply(PartitionState(0, 0, 3, (0, 1, 2), (0, 2)), version=5)
    _append(partition, 5)
    partition.follower_fetched(2, 20)
    assert partition.follower_fetched(1, 15) is None  # behind: not proposed
    assert partition.follower_fetched(1, 20) == [0, 1, 2]
    partition.isr_change_failed(outcome_known=False)
    partition.apply(PartitionState(0, 0, 3, (0, 1, 2), (0, 2)), version=6)
    assert 1 in partition.maximal_isr  # no answer: the controller may have taken it
    clock.now += 31
    partition.apply(PartitionState(0, 0, 3, (0, 1, 2), (0, 2)), version=7)
    assert partition.maximal_isr == (0, 2)
    partition.isr_change_failed()  # a refusal is an answer: nothing stays pending
    assert partition.follower_fetched(1, 20) == [0, 1, 2]
    partition.isr_change_failed()
    assert partition.maximal_isr == (0, 2)


def test_divergence_is_found_by_leader_epoch(leader) -> None:
    partition, _ = leader
    _append(partition, 4)  # epoch 3, offsets 0..3
    assert partition.diverging_epoch(4, 3) is None
    assert partition.diverging_epoch(6, 3) == (3, 4)  # the follower holds more of epoch 3
    assert partition.diverging_epoch(2, 1) == (1, 0)  # an epoch older than all of ours
    assert partition.diverging_epoch(9, -1) == (-1, 4)


def test_replicas_spread_across_racks_and_leaders_across_brokers() -> None:
    racks = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    assignment = assign_replicas(list(racks), 12, 3, racks)
    for replicas in assignment:
        assert len({racks[b] for b in replicas}) == 3  # one replica per host
    leaders = [r[0] for r in assignment]
    assert sorted(leaders.count(b) for b in racks) == [2] * 6
    for replicas in assign_replicas([0, 1, 2], 6, 3):  # one rack: still distinct brokers
        assert sorted(replicas) == [0, 1, 2]


def test_a_new_leader_with_a_lagging_high_watermark_serves_no_records_past_it(tmp_path) -> None:
    """A follower elected leader holds records up to its log end but only knows the old
    leader's high watermark of its last fetch. Until its followers fetch from it, a consumer
    already past that high watermark gets no records (never OFFSET_OUT_OF_RANGE), "latest" is
    OFFSET_NOT_AVAILABLE (retriable) rather than an offset in the past, and OffsetForLeaderEpoch
    tells where each epoch ends, so positions validate."""
    holder: list[Partition] = []
    log = PartitionLog(str(tmp_path / "replica-1"), topic="t", partition=0, replicated=True,
                       on_append=lambda: holder[0].on_log_change() if holder else None)
    partition = Partition("t", 0, 1, log, Clock())
    holder.append(partition)
    try:
        partition.apply(PartitionState(0, 0, 3, (0, 1, 2), (0, 1, 2)), version=1)  # follows 0
        log.append_copy(log_rows(0, 10, leader_epoch=3)).result(30)
        partition.follower_high_watermark(6)  # the leader's high watermark of the last fetch
        partition.apply(PartitionState(0, 1, 4, (0, 1, 2), (1, 2)), version=2)  # 0 died
        assert partition.is_leader and log.high_watermark == 6 and log.log_end_offset == 10
        assert log.read(8, 1 << 20).num_rows == 0  # a consumer at 8 read it from leader 0
        with pytest.raises(errors.OffsetNotAvailableError) as info:
            partition.check_offsets_available()
        assert info.value.retriable and info.value.code == 78
        assert partition.end_offset_for_epoch(3) == (3, 10)
        assert partition.end_offset_for_epoch(5) == (-1, -1)  # newer than this leader's
        partition.follower_fetched(2, 10)  # the other follower catches up
        assert log.high_watermark == 10
        partition.check_offsets_available()
        assert log.read(8, 1 << 20).column("offset").to_pylist() == [8, 9]
    finally:
        log.close()
