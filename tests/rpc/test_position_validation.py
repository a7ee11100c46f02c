"""Consumer positions across leader changes (Kafka's KIP-320): a clean failover never moves a
position; after an unclean election truncated records a consumer had read, it validates its
position with OffsetForLeaderEpoch and moves back to where the logs part, never to the start."""

from __future__ import annotations

import logging
import time

import pytest

from deltabus import AdminClient, Consumer, NewTopic, TopicPartition, errors
from tests.cluster.test_replication import kill_and_hold, raw_produce, state
from tests.conftest import wait_until


def poll_until(consumer: Consumer, want: int, what: str) -> list:
    """Poll until `want` records came back (waiting on progress, failing after a minute)."""
    records: list = []
    deadline = time.monotonic() + 60
    while len(records) < want:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        records.extend(consumer.poll(200))
    return records


def test_a_consumer_past_an_unclean_leaders_log_end_moves_to_where_the_logs_part(
        cluster, topic_name, all_brokers_back, caplog) -> None:
    leader, follower = 1, 2
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, configs={
            "unclean.leader.election.enable": "true"},
            replica_assignment={0: [leader, follower]})])
    assert raw_produce(cluster, topic_name, [b"both-0", b"both-1", b"both-2"],
                       acks=-1).error_code == 0
    kill_and_hold(cluster, follower)
    wait_until(lambda: state(cluster, topic_name).isr == (leader,), "the ISR to shrink")
    assert raw_produce(cluster, topic_name, [b"lost-3", b"lost-4"], acks=-1).error_code == 0
    tp = TopicPartition(topic_name, 0)
    earliest = Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest")
    strict = Consumer(cluster.bootstrap_servers, auto_offset_reset="none")
    try:
        earliest.assign([tp])
        strict.assign([tp])
        strict.seek(tp, 0)
        for consumer in (earliest, strict):
            read = poll_until(consumer, 5, "the records before the election")
            assert [r.offset for r in read] == [0, 1, 2, 3, 4]
            assert consumer.position(tp) == 5
        kill_and_hold(cluster, leader)
        cluster.start_broker(follower)
        wait_until(lambda: state(cluster, topic_name).leader == follower, "an unclean election")
        answers: list[int] = []
        wait_until(lambda: answers.append(raw_produce(cluster, topic_name, [b"new-3"],
                                                      acks=-1).error_code)
                   or answers[-1] != errors.NotLeaderOrFollowerError.code, "the new leader")
        assert answers[-1] == 0
        with caplog.at_level(logging.WARNING, logger="deltabus.client.consumer"):
            after = poll_until(earliest, 1, "the new leader's record")
        # Back to where the logs part (offset 3), not to the start of the log.
        assert [(r.offset, r.value) for r in after] == [(3, b"new-3")]
        assert "Truncation detected for partition" in caplog.text
        with pytest.raises(errors.LogTruncationError, match="Truncation detected"):
            poll_until(strict, 1, "a truncation error")
    finally:
        earliest.close()
        strict.close()
