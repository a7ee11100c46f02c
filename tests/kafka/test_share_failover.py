"""Share groups through a leader kill and a broker restart (acks=all, RF 3): the new leader
resumes the group from `__share_group_state`. Every acknowledged record is consumed by some
member; a record whose acceptance a leader confirmed (durable) is never delivered again; what
was acquired and not acknowledged when the leader died is delivered again, not lost. Members
come through both doors: deltabus's ShareConsumer (explicit acknowledgements, each confirmed by
`commit`) and confluent-kafka's (implicit)."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import ShareConsumer as KafkaShareConsumer

from deltabus import AcknowledgeType, AdminClient, NewTopic, Producer, ShareConsumer
from tests.cluster.test_replication import state
from tests.conftest import wait_until
from tests.kafka.test_failover_consumers import all_in_sync


class Member(threading.Thread):
    """A deltabus share consumer accepting each record and confirming with `commit`."""

    def __init__(self, cluster, group: str, topic: str, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.consumer = ShareConsumer(cluster.bootstrap_servers, group_id=group,
                                      acknowledgement_mode="explicit", max_poll_records=50)
        self.consumer.subscribe([topic])
        self.delivered: list[tuple[float, int, int]] = []  # (when, offset, delivery count)
        self.confirmed: list[tuple[float, int]] = []  # (when, offset): durable acceptance
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                records = self.consumer.poll(200)
                for r in records:
                    self.delivered.append((time.monotonic(), r.offset, r.delivery_count))
                    self.consumer.acknowledge(r, AcknowledgeType.ACCEPT)
                if records:
                    results = self.consumer.commit()
                    done = time.monotonic()
                    if all(e is None for e in results.values()):
                        self.confirmed += [(done, r.offset) for r in records]
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.consumer.close()


@pytest.mark.timeout(1200)  # its waits are generous for a loaded machine: past the default
def test_share_groups_through_a_leader_kill_and_a_restart(cluster, topic_name,
                                                          all_brokers_back) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3, {"min.insync.replicas": "2"})])
    group = f"{topic_name}-share"
    store = cluster.coordinator.share_state
    members = [Member(cluster, group, topic_name, f"member-{i}") for i in range(2)]
    kafka_member = KafkaShareConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                                       "group.id": group, "max.poll.records": 50})
    kafka_member.subscribe([topic_name])
    kafka_read: list[int] = []
    for m in members:
        m.start()
    wait_until(lambda: not kafka_member.poll(0.1)
               and store.read(group, topic_name, 0) is not None,
               what="the group to start on the partition")
    acked: list[int] = []
    stop = threading.Event()

    def keep_producing() -> None:
        with Producer(cluster.bootstrap_servers, acks="all", enable_idempotence=True,
                      linger_ms=2) as producer:
            i = 0
            while not stop.is_set():
                future = producer.send(topic_name, f"v{i}".encode(), partition=0)
                future.add_done_callback(
                    lambda f: f.exception() is None and acked.append(f.get().offset))
                i += 1
                time.sleep(0.01)
            producer.flush()

    def consumed() -> int:
        for m in members:
            assert m.error is None, (m.name, m.error)
        kafka_read.extend(msg.offset() for msg in kafka_member.poll(0.1))
        return len({o for m in members for _, o, _ in m.delivered} | set(kafka_read))

    writer = threading.Thread(target=keep_producing)
    writer.start()
    try:
        # Generous waits: on a loaded machine a broker relaunched by another test may still be
        # catching up, and each wait fails the test, where slowness only delays it.
        wait_until(lambda: consumed() > 100, what="the members consuming", timeout_s=240)
        for stop_leader in (lambda b: cluster.kill_broker(b), cluster.restart_broker):
            wait_until(lambda: all_in_sync(cluster, topic_name),
                       what="every broker back and every replica in the ISR", timeout_s=240)
            leader = state(cluster, topic_name).leader
            before = consumed()
            stop_leader(leader)
            wait_until(lambda old=leader: state(cluster, topic_name).leader not in (old, -1),
                       what="a new leader", timeout_s=240)
            wait_until(lambda c=before: consumed() > c + 100,
                       what="the members consuming from the new leader", timeout_s=240)
    finally:
        stop.set()
        writer.join(90)
    end = max(acked) + 1
    try:
        wait_until(lambda: consumed() >= end and store.read(group, topic_name, 0)
                   .start_offset >= end, what="every acknowledged record consumed and accepted",
                   timeout_s=300)
    finally:
        for m in members:
            m.stop.set()
            m.join(60)
        kafka_member.close()
    for m in members:
        assert m.error is None, (m.name, m.error)
    seen = {o for m in members for _, o, _ in m.delivered} | set(kafka_read)
    missing = sorted(set(acked) - seen)
    assert not missing, (len(missing), missing[:10])  # nothing acknowledged was lost
    # A confirmed acceptance is durable: the record never comes again, through a failover too.
    confirmed = {o: when for m in members for when, o in m.confirmed}
    again = [(o, count) for m in members for when, o, count in m.delivered
             if o in confirmed and when > confirmed[o]]
    assert not again, again[:10]
    redelivered = sum(1 for m in members for _, _, count in m.delivered if count > 1)
    print(f"{len(acked)} records, {len(seen)} consumed, {redelivered} delivered again after "
          f"a failover (acquired, not acknowledged, when the leader went)")
