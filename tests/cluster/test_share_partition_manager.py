"""A leader's share groups (cluster/share_partition_manager.py) against a share state store
that answers at once: a write whose future is done before the leader waits on it (the store
was quick, or refused at once) must be handled like a slow one, not deadlock the leader. The
failover test found it: after a broker restart, every ShareFetch on the new leader hung."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from deltabus import errors
from deltabus.cluster.handler import AcknowledgementBatch, ShareFetchRequest
from deltabus.cluster.share_partition import ACCEPT
from deltabus.cluster.share_partition_manager import SharePartitionManager
from deltabus.offsets.share_state_store import ShareState
from tests.client.fake_cluster import FakeBroker, FakeCluster

TOPIC = "jobs"


class AnsweredAtOnce:
    """The real `__share_group_state` store, each write already done when it is returned:
    written (`refuse` None) or refused with `refuse`."""

    def __init__(self, store, refuse: errors.DeltaBusError | None = None) -> None:
        self._store = store
        self.refuse = refuse

    def claim(self, group_id: str, topic: str, partition: int, leader_epoch: int):
        return self._store.claim(group_id, topic, partition, leader_epoch)

    def alter(self, group_id: str, topic: str, partition: int, start_offset: int):
        return self._store.alter(group_id, topic, partition, start_offset)

    def write(self, state: ShareState) -> Future[None]:
        if self.refuse is not None:
            failed: Future[None] = Future()
            failed.set_exception(self.refuse)
            return failed
        written = self._store.write(state)
        written.result(30)
        return written


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    cluster = FakeCluster(brokers=1, share_groups=True)
    cluster.create_topic(TOPIC, 1, {})
    cluster.write(TOPIC, 0, [b"a", b"b", b"c"])
    yield cluster
    cluster.close()


def _in_thread(call, *args):
    """Run `call` on a thread and give back its result; a leader that deadlocks fails the
    test instead of hanging the suite."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(call(*args)), daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), f"{call.__name__} never returned: the leader deadlocked"
    return result[0]


@pytest.mark.parametrize("refuse", [None, errors.FencedLeaderEpochError("a newer leader")])
def test_a_store_answering_at_once_does_not_deadlock_the_leader(fake, refuse) -> None:
    store = AnsweredAtOnce(fake.coordinator.share_state)
    manager = SharePartitionManager(FakeBroker(fake, 0), store, fake.group_config)
    try:
        opened = ShareFetchRequest("g", "m1", 0, added=[(TOPIC, 0)])
        answer = _in_thread(manager.share_fetch, opened)
        assert answer.error is None
        acquired = [p for p in answer.complete() if p.acquired]
        # "latest": a group new to the partition starts after the three records written
        assert acquired == []
        fake.write(TOPIC, 0, [b"d", b"e"])
        answer = _in_thread(manager.share_fetch, ShareFetchRequest("g", "m1", 1))
        (data,) = answer.complete()
        assert [(a.first_offset, a.last_offset) for a in data.acquired] == [(3, 4)]
        store.refuse = refuse
        acked = ShareFetchRequest("g", "m1", 2, fetching=False, acknowledgements={
            (TOPIC, 0): [AcknowledgementBatch(3, 4, (ACCEPT,))]})
        answer = _in_thread(manager.share_fetch, acked)
        for future in answer.waiting_on:
            future.result(30)
        (data,) = answer.complete()
        if refuse is None:
            assert data.acknowledge_error is None
            assert fake.coordinator.share_state.read("g", TOPIC, 0).start_offset == 5
        else:  # refused: said so, and the leader reads the durable state again
            assert isinstance(data.acknowledge_error, errors.FencedLeaderEpochError)
            assert manager.share_partition("g", TOPIC, 0) is None
        # and the leader still answers
        store.refuse = None
        answer = _in_thread(manager.share_fetch, ShareFetchRequest("g", "m1", 3))
        assert answer.error is None
    finally:
        manager.close()
