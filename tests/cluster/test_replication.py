"""Replication on the shared 3-broker cluster: followers copy the leader's log into their own Delta
tables, the ISR follows who keeps up, acks=all waits for it, and leaders fail over without losing
an acknowledged record. Brokers are killed with SIGKILL; every test leaves all three running."""

from __future__ import annotations

import threading
import time

import pytest
from deltalake import DeltaTable

from deltabus import AdminClient, NewTopic, Producer, errors
from deltabus.client.cluster_client import ClusterClient
from deltabus.log_tables.layout import replica_path
from deltabus.metadata import PartitionState
from deltabus.records import produce_batch, to_ipc
from deltabus.rpc.v1 import deltabus_pb2 as pb
from tests.conftest import read_records, wait_until

WAIT_S = 60


def state(cluster, topic: str, partition: int = 0) -> PartitionState:
    return cluster.controller.image().partition(topic, partition)


def create(cluster, topic: str, partitions: int, rf: int, **configs: str) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, partitions, rf, configs or None)])


def replica_records(cluster, topic: str, partition: int, broker: int) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in one replica's Delta table, read straight from disk."""
    path = replica_path(cluster.config.root, topic, partition, broker)
    table = DeltaTable(path).to_pyarrow_table(columns=["offset", "value"]).sort_by("offset")
    return list(zip(table.column("offset").to_pylist(), table.column("value").to_pylist(),
                    strict=True))


def wait_for_identical_replicas(cluster, topic: str, partitions: int) -> None:
    """Every replica of every partition in the ISR, holding exactly the leader's records."""
    def identical() -> bool:
        for p in range(partitions):
            s = state(cluster, topic, p)
            if s.leader < 0 or sorted(s.isr) != sorted(s.replicas):
                return False
            leader = replica_records(cluster, topic, p, s.leader)
            if any(replica_records(cluster, topic, p, r) != leader for r in s.replicas):
                return False
        return True
    wait_until(identical, f"every replica of {topic} to hold the leader's records")


def kill_and_hold(cluster, broker_id: int) -> None:
    """SIGKILL a broker and keep it down until start_broker; returns once it is fenced."""
    cluster.kill_broker(broker_id, relaunch=False)
    wait_until(lambda: broker_id not in cluster.controller.live_brokers(),
               f"broker {broker_id} to be fenced")


def raw_produce(cluster, topic: str, values: list[bytes], acks: int) -> pb.PartitionProduceResponse:
    """One Produce request to partition 0's leader, to see the broker's own answer."""
    leader = cluster.controller.image().broker(state(cluster, topic).leader).address
    client = ClusterClient(leader)
    try:
        request = pb.ProduceRequest(acks=acks, timeout_ms=10_000, partitions=[
            pb.PartitionProduceData(topic=topic, partition=0,
                                    arrow_records=to_ipc(produce_batch(values)))])
        return client.call(leader, "Produce", request).partitions[0]
    finally:
        client.close()


# ---- steady state -------------------------------------------------------------------------


def test_followers_copy_every_record_and_describe_shows_leader_replicas_isr(cluster, topic_name):
    create(cluster, topic_name, partitions=3, rf=3)
    with AdminClient(cluster.bootstrap_servers) as admin:
        (topic,) = admin.describe_topics([topic_name])
    assert topic.replication_factor == 3
    assert sorted(p.leader for p in topic.partitions) == [0, 1, 2]  # leaders spread
    for p in topic.partitions:
        assert sorted(p.replicas) == [0, 1, 2] and p.leader == p.replicas[0]
        assert sorted(p.isr) == [0, 1, 2]
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        futures = [producer.send(topic_name, f"v-{i}".encode(), partition=i % 3)
                   for i in range(3000)]
        producer.flush(WAIT_S)
    assert all(f.get(0).offset >= 0 for f in futures)
    records = read_records(cluster.bootstrap_servers, topic_name, 3, 3000)
    assert len(records) == 3000
    wait_for_identical_replicas(cluster, topic_name, 3)
    for p in range(3):  # the follower tables hold the same offsets as the leader's
        assert [o for o, _ in replica_records(cluster, topic_name, p, 0)] == list(range(1000))


def test_acks_all_needs_min_insync_replicas_and_appends_nothing_without(
        cluster, topic_name, all_brokers_back):
    create(cluster, topic_name, partitions=1, rf=3, **{"min.insync.replicas": "2"})
    assert raw_produce(cluster, topic_name, [b"before"], acks=-1).error_code == 0
    s = state(cluster, topic_name)
    followers = [r for r in s.replicas if r != s.leader]
    kill_and_hold(cluster, followers[0])
    # Two of three in sync: acks=all still succeeds.
    assert raw_produce(cluster, topic_name, [b"two-in-sync"], acks=-1).error_code == 0
    kill_and_hold(cluster, followers[1])
    wait_until(lambda: state(cluster, topic_name).isr == (s.leader,), "the ISR to shrink")
    shrunk = cluster.controller.image().version  # the leader checks its own view of the ISR
    wait_until(lambda: cluster.controller.applied_version(s.leader) >= shrunk,
               "the leader to apply the shrunk ISR")
    answer = raw_produce(cluster, topic_name, [b"refused"], acks=-1)
    assert answer.error_code == errors.NotEnoughReplicasError.code
    assert "min.insync.replicas=2" in answer.error_message
    with Producer(cluster.bootstrap_servers, acks="all", delivery_timeout_ms=1500,
                  request_timeout_ms=1000) as producer:
        with pytest.raises(errors.NotEnoughReplicasError):
            producer.send(topic_name, b"refused too").get(10)
    # acks=1 still writes; consumers read everything committed.
    assert raw_produce(cluster, topic_name, [b"acks-1"], acks=1).error_code == 0
    values = [r.value for r in read_records(cluster.bootstrap_servers, topic_name, 1, 3)]
    assert values == [b"before", b"two-in-sync", b"acks-1"]
    # The followers come back, catch up and rejoin; acks=all works again.
    cluster.start_broker(followers[0])
    cluster.start_broker(followers[1])
    wait_for_identical_replicas(cluster, topic_name, 1)
    assert raw_produce(cluster, topic_name, [b"after"], acks=-1).error_code == 0


def test_killed_follower_leaves_the_isr_then_rejoins_and_catches_up(
        cluster, spark, topic_name, all_brokers_back):
    """Producing goes on while a follower is down; before it is relaunched, the catch-up
    Spark job copies what it missed; it rejoins the ISR with every record."""
    create(cluster, topic_name, partitions=1, rf=3, **{"min.insync.replicas": "2"})
    s = state(cluster, topic_name)
    follower = next(r for r in s.replicas if r != s.leader)
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        for i in range(500):
            producer.send(topic_name, f"a-{i}".encode())
        producer.flush(WAIT_S)
        kill_and_hold(cluster, follower)
        assert follower not in state(cluster, topic_name).isr
        futures = [producer.send(topic_name, f"b-{i}".encode()) for i in range(500)]
        producer.send_batch(topic_name, [f"c-{i}".encode() for i in range(20_000)], partition=0)
        producer.flush(WAIT_S)
        assert all(f.get(0).offset >= 0 for f in futures)  # producing goes on with 2 in sync
    tracker = spark.sparkContext.statusTracker()
    group = cluster.job_group("catch-up-broker", follower)
    jobs_before = set(tracker.getJobIdsForGroup(group))
    cluster.start_broker(follower)
    wait_for_identical_replicas(cluster, topic_name, 1)
    assert len(replica_records(cluster, topic_name, 0, follower)) == 21_000
    jobs = set(tracker.getJobIdsForGroup(group)) - jobs_before
    assert [tracker.getJobInfo(j).status for j in jobs] == ["SUCCEEDED"]


# ---- failover -----------------------------------------------------------------------------


def test_leader_kill_under_acks_all_loses_nothing_and_replicas_converge(
        cluster, topic_name, all_brokers_back):
    """Two idempotent producers send with acks=all while partition 0's leader is SIGKILLed:
    every acknowledged record is there exactly once, in send order, on the new leader and, once
    the old leader is back, on every replica."""
    partitions = 3
    create(cluster, topic_name, partitions=partitions, rf=3, **{"min.insync.replicas": "2"})
    old = state(cluster, topic_name)
    acked: list[tuple[int, int, bytes]] = []
    failed: list[BaseException] = []
    stop = threading.Event()

    sent = {"p": 0, "q": 0}

    def produce(name: str) -> None:
        with Producer(cluster.bootstrap_servers, acks="all", linger_ms=2,
                      delivery_timeout_ms=60_000) as producer:
            while not stop.is_set():
                i = sent[name]
                value = f"{name}-{i:07d}".encode()
                future = producer.send(topic_name, value, key=f"{name}-{i % 7}")
                future.add_done_callback(lambda f, v=value: _record(f, v, acked, failed))
                sent[name] = i + 1
                if i % 100 == 0:
                    time.sleep(0.005)
            producer.flush(WAIT_S)

    def acked_since(marks: dict[str, int]) -> bool:
        """A record of partition 0 sent after `marks` (per producer) is acknowledged."""
        for p, _, value in list(acked):
            name, i = value.decode().split("-")
            if p == 0 and int(i) >= marks[name]:
                return True
        return False

    senders = [threading.Thread(target=produce, args=(n,)) for n in ("p", "q")]
    for t in senders:
        t.start()
    try:
        wait_until(lambda: acked_since({"p": 0, "q": 0}), "records acknowledged before the kill")
        cluster.kill_broker(old.leader, relaunch=False)
        wait_until(lambda: state(cluster, topic_name).leader not in (old.leader, -1),
                   "a new leader from the ISR")
        new = state(cluster, topic_name)
        assert new.leader_epoch > old.leader_epoch and new.leader in old.isr
        elected = dict(sent)
        wait_until(lambda: acked_since(elected), "records acknowledged by the new leader", WAIT_S)
        cluster.start_broker(old.leader)
        restarted = dict(sent)
        wait_until(lambda: acked_since(restarted), "records acknowledged after the old leader "
                   "came back", WAIT_S)
    finally:
        stop.set()
        for t in senders:
            t.join()
    assert not failed, failed[:3]
    records = read_records(cluster.bootstrap_servers, topic_name, partitions, len(acked))
    stored = {(r.partition, r.offset): r.value for r in records}
    lost = [a for a in acked if stored.get((a[0], a[1])) != a[2]]
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:3]}"
    values = [r.value for r in records]
    assert len(values) == len(set(values)), "a record was written twice"
    for p in range(partitions):
        for name in (b"p", b"q"):  # per producer and partition, send order holds
            sent = [r.value for r in records if r.partition == p and r.value.startswith(name)]
            assert sent == sorted(sent)
    wait_for_identical_replicas(cluster, topic_name, partitions)


def test_records_sent_while_a_partition_has_no_leader_wait_in_few_batches(
        cluster, topic_name, all_brokers_back):
    """While a partition's leader is away, records pile up in its open batch rather than in a
    queue of lingered little batches that would drain one round trip each once a leader is
    back: the backlog lands in a few Delta commits, fast, in order."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, replica_assignment={0: [1]})])
    path = replica_path(cluster.config.root, topic_name, 0, 1)
    with Producer(cluster.bootstrap_servers, acks="all", linger_ms=2) as producer:
        producer.send(topic_name, b"first").get(WAIT_S)
        kill_and_hold(cluster, 1)  # the only replica: the partition has no leader
        version_before = DeltaTable(path).version()
        futures = []
        for i in range(1000):  # over a second: hundreds of linger periods
            futures.append(producer.send(topic_name, f"v-{i:04d}".encode()))
            time.sleep(0.001)
        cluster.start_broker(1)
        producer.flush(WAIT_S)
    assert [f.get(0).offset for f in futures] == list(range(1, 1001))
    commits = DeltaTable(path).version() - version_before
    assert commits <= 10, f"the backlog took {commits} Delta commits"


def _record(future, value: bytes, acked: list, failed: list) -> None:
    error = future.exception()
    if error is None:
        meta = future.get(0)
        acked.append((meta.partition, meta.offset, value))
    else:
        failed.append(error)


def test_unclean_leader_election_off_by_default_and_honoured_when_set(
        cluster, topic_name, all_brokers_back):
    """A partition whose only in-sync replica dies stays offline, unless the topic allows an
    out-of-sync replica to lead; the old leader then comes back as a follower and truncates the
    records the new leader never had."""
    clean, unclean = f"{topic_name}-clean", f"{topic_name}-unclean"
    leader, follower = 1, 2  # the same replicas for both, so one pair of kills covers both
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([
            NewTopic(clean, replica_assignment={0: [leader, follower]}),
            NewTopic(unclean, configs={"unclean.leader.election.enable": "true"},
                     replica_assignment={0: [leader, follower]})])
    for topic in (clean, unclean):
        assert raw_produce(cluster, topic, [b"both-have"], acks=-1).error_code == 0
    kill_and_hold(cluster, follower)
    for topic in (clean, unclean):
        wait_until(lambda t=topic: state(cluster, t).isr == (leader,), "the ISR to shrink")
        assert raw_produce(cluster, topic, [b"only-leader"], acks=-1).error_code == 0
    kill_and_hold(cluster, leader)
    cluster.start_broker(follower)
    wait_until(lambda: state(cluster, unclean).leader == follower, "an unclean election")
    assert state(cluster, clean).leader == -1  # offline: waiting for its in-sync replica
    # The new leader may not have applied the metadata that elected it yet: as a client does,
    # retry NOT_LEADER_OR_FOLLOWER (which appends nothing) until it leads.
    answers: list[int] = []
    wait_until(lambda: answers.append(raw_produce(cluster, unclean, [b"new-leader"],
                                                  acks=-1).error_code)
               or answers[-1] != errors.NotLeaderOrFollowerError.code, "the new leader to lead")
    assert answers[-1] == 0
    cluster.start_broker(leader)
    wait_until(lambda: state(cluster, clean).leader == leader, "the clean leader to return")
    wait_for_identical_replicas(cluster, clean, 1)
    wait_for_identical_replicas(cluster, unclean, 1)
    assert [v for _, v in replica_records(cluster, clean, 0, follower)] == [
        b"both-have", b"only-leader"]
    # The old leader dropped the record the new one never had.
    assert [v for _, v in replica_records(cluster, unclean, 0, leader)] == [
        b"both-have", b"new-leader"]


# ---- controlled shutdown and preferred leaders ----------------------------------------------


def test_controlled_shutdown_moves_leadership_first_and_it_comes_back(
        cluster, topic_name, all_brokers_back):
    """Stopping a broker moves its leadership to an in-sync replica before it stops (the
    partition never goes leaderless, no acks=all send fails); once it is back in sync, the
    preferred leader election hands leadership back to it."""
    create(cluster, topic_name, partitions=1, rf=3, **{"min.insync.replicas": "2"})
    preferred = state(cluster, topic_name).leader
    leaders_seen: set[int] = set()
    acked: list[tuple[int, int, bytes]] = []
    failed: list[BaseException] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            leaders_seen.add(state(cluster, topic_name).leader)
            time.sleep(0.005)

    sent = [0]

    def produce() -> None:
        with Producer(cluster.bootstrap_servers, acks="all", linger_ms=2) as producer:
            while not stop.is_set():
                i = sent[0]
                value = f"{i:07d}".encode()
                producer.send(topic_name, value).add_done_callback(
                    lambda f, v=value: _record(f, v, acked, failed))
                sent[0] = i + 1
                if i % 50 == 0:
                    time.sleep(0.005)
            producer.flush(WAIT_S)

    def acked_from(mark: int) -> bool:
        return any(int(v) >= mark for _, _, v in list(acked))

    threads = [threading.Thread(target=watch), threading.Thread(target=produce)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: acked_from(0), "records acknowledged before the shutdown")
        cluster.stop_broker(preferred)
        moved = state(cluster, topic_name)
        assert moved.leader not in (preferred, -1) and preferred not in moved.isr
        mark = sent[0]
        wait_until(lambda: acked_from(mark), "records acknowledged by the new leader", WAIT_S)
        cluster.start_broker(preferred)
        wait_until(lambda: state(cluster, topic_name).leader == preferred,
                   "the preferred replica to lead again")
        mark = sent[0]
        wait_until(lambda: acked_from(mark), "records acknowledged by the preferred leader "
                   "again", WAIT_S)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert -1 not in leaders_seen and len(leaders_seen) >= 2
    assert not failed, failed[:3]
    records = read_records(cluster.bootstrap_servers, topic_name, 1, len(acked))
    assert sorted(r.value for r in records) == [r.value for r in records]  # in order
    assert {a[2] for a in acked} <= {r.value for r in records}
    assert len(records) == len({r.value for r in records})


def test_preferred_and_unclean_elections_on_request(cluster, topic_name):
    create(cluster, topic_name, partitions=2, rf=2)
    with AdminClient(cluster.bootstrap_servers) as admin:
        results = admin.elect_leaders("preferred", [(topic_name, 0), (topic_name, 1),
                                                    (topic_name, 7)])
        assert isinstance(results[(topic_name, 0)], errors.ElectionNotNeededError)
        assert isinstance(results[(topic_name, 7)], errors.UnknownTopicOrPartitionError)
        results = admin.elect_leaders("unclean", [(topic_name, 0)])
        assert isinstance(results[(topic_name, 0)], errors.ElectionNotNeededError)
        with pytest.raises(errors.InvalidRequestError):
            admin.elect_leaders("random")


# ---- reassignment ---------------------------------------------------------------------------


def test_reassign_partitions_moves_replicas_with_the_catch_up_job(
        cluster, spark, topic_name, tmp_path, capsys):
    """kafka-reassign-partitions habits: a 1-replica partition on broker 0 moves to brokers
    1 and 2. The new replicas are filled by the catch-up Spark job, join the ISR, and the old
    replica's table is dropped; no record is lost and producing goes on."""
    import json
    import os

    from deltabus.cli.main import main

    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, replica_assignment={0: [0]})])
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        producer.send_batch(topic_name, [f"v-{i}".encode() for i in range(20_000)], partition=0)
        producer.flush(WAIT_S)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic_name, "partition": 0, "replicas": [1, 2]}]}))
    args = ["reassign-partitions", "--bootstrap-server", cluster.bootstrap_servers,
            "--reassignment-json-file", str(plan)]
    jobs_before = set(spark.sparkContext.statusTracker().getJobIdsForGroup("deltabus-catch-up"))
    capsys.readouterr()
    assert main([*args, "--execute"]) == 0
    out = capsys.readouterr().out
    assert f'"topic":"{topic_name}","partition":0,"replicas":[0]' in out
    assert f"Successfully started partition reassignments for {topic_name}-0" in out

    def completed() -> bool:
        main([*args, "--verify"])
        return "is completed." in capsys.readouterr().out
    wait_until(completed, "the reassignment to complete")
    s = state(cluster, topic_name)
    assert s.replicas == (1, 2) and sorted(s.isr) == [1, 2] and s.leader in (1, 2)
    jobs = set(spark.sparkContext.statusTracker().getJobIdsForGroup("deltabus-catch-up"))
    assert jobs - jobs_before, "the new replicas were not caught up by a Spark job"
    old_table = replica_path(cluster.config.root, topic_name, 0, 0)
    wait_until(lambda: not os.path.exists(old_table), "the dropped replica's table to go")
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        producer.send(topic_name, b"after").get(WAIT_S)
    records = read_records(cluster.bootstrap_servers, topic_name, 1, 20_001)
    assert [r.value for r in records] == [f"v-{i}".encode() for i in range(20_000)] + [b"after"]
    wait_for_identical_replicas(cluster, topic_name, 1)
    with AdminClient(cluster.bootstrap_servers) as admin:  # None cancels: nothing to cancel
        cancelled = admin.alter_partition_reassignments({(topic_name, 0): None})
        assert isinstance(cancelled[(topic_name, 0)], errors.NoReassignmentInProgressError)
        with pytest.raises(errors.InvalidReplicaAssignmentError):  # empty is no cancel
            admin.alter_partition_reassignments({(topic_name, 0): []})
