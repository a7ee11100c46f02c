"""Consumer groups on the shared cluster: members in separate processes share a topic's
partitions, rebalance when members come and go, and resume from offsets committed to
`__consumer_offsets`; the consumer-groups tool shows and resets them as Kafka's does."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors
from deltabus.cli.main import main
from deltabus.client.consumer import CommitFailedError, ConsumerRebalanceListener
from deltabus.log_tables.layout import consumer_offsets_path
from tests.conftest import wait_until

MEMBER = Path(__file__).with_name("group_member.py")
WAIT_S = 60


def create(cluster, topic: str, partitions: int) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, partitions)])


def produce(cluster, topic: str, values: list[str], partition: int | None = None) -> None:
    with Producer(cluster.bootstrap_servers) as producer:
        for v in values:
            producer.send(topic, v.encode(), partition=partition)
        producer.flush(WAIT_S)


class Member:
    """A group member in its own Python process (group_member.py), read line by line."""

    def __init__(self, cluster, topic: str, group: str, commit_every: int = 1) -> None:
        env = dict(os.environ, PYTHONPATH=str(MEMBER.parents[2]))
        self.process = subprocess.Popen(
            [sys.executable, str(MEMBER), cluster.bootstrap_servers, topic, group,
             str(commit_every)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=env)
        self.events: queue.Queue[dict] = queue.Queue()
        self.assigned: list[tuple[str, int]] | None = None
        self.records: list[tuple[int, int, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if not line.startswith("{"):  # the member's log: shown if the test fails
                print(f"member {self.process.pid}: {line}", end="", file=sys.stderr)
                continue
            event = json.loads(line)
            if "assigned" in event:
                self.assigned = [tuple(tp) for tp in event["assigned"]]
            if "record" in event:
                self.records.append(tuple(event["record"]))

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(WAIT_S)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(WAIT_S)


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        if m.process.poll() is None:
            m.kill()


def partitions_of(ms: list[Member]) -> list[tuple[str, int]]:
    return sorted(tp for m in ms for tp in (m.assigned or []))


def test_members_in_separate_processes_share_partitions_and_rebalance(
        cluster, topic_name, members):
    """The seeds' three cases: three members on three partitions get one each; with a fourth,
    one member is idle (which one, the range assignor's member order decides, as in Kafka);
    with one gone (left, or crashed past the session timeout) the others take over."""
    create(cluster, topic_name, 3)
    group = f"g-{topic_name}"
    members.extend(Member(cluster, topic_name, group) for _ in range(3))
    everything = [(topic_name, p) for p in range(3)]
    wait_until(lambda: all(m.assigned is not None and len(m.assigned) == 1 for m in members)
               and partitions_of(members) == everything, "one partition each")
    fourth = Member(cluster, topic_name, group)
    members.append(fourth)
    wait_until(lambda: fourth.assigned is not None and partitions_of(members) == everything
               and sorted(len(m.assigned or []) for m in members) == [0, 1, 1, 1],
               "the fourth member to join, one member idle")
    leaving = next(m for m in members if m.assigned)
    leaving.stop()  # close(): leaves the group at once
    rest = [m for m in members if m is not leaving]
    wait_until(lambda: partitions_of(rest) == everything
               and all(len(m.assigned or []) == 1 for m in rest), "the idle member to take over")
    crashing = rest[0]
    crashing.kill()  # no LeaveGroup: the session timeout (3 s) removes it
    survivors = rest[1:]
    wait_until(lambda: partitions_of(survivors) == everything, "the survivors to take over")
    assert sorted(len(m.assigned or []) for m in survivors) == [1, 2]
    produce(cluster, topic_name, [f"v{i}" for i in range(30)])
    wait_until(lambda: sum(len(m.records) for m in survivors) >= 30, "the records")
    assert sorted(v for m in survivors for _, _, v in m.records) == sorted(
        f"v{i}" for i in range(30))


def test_crash_before_commit_redelivers_never_loses(cluster, topic_name, members):
    """At-least-once: a member that processed records but crashed before committing them gets
    them delivered again to its successor; nothing is lost."""
    create(cluster, topic_name, 1)
    group = f"g-{topic_name}"
    produce(cluster, topic_name, [f"a{i}" for i in range(10)])
    first = Member(cluster, topic_name, group, commit_every=10)  # commits after all 10
    members.append(first)
    wait_until(lambda: len(first.records) >= 10, "the first batch")
    with Consumer(cluster.bootstrap_servers, group_id=group) as probe:
        wait_until(lambda: (probe.committed(TopicPartition(topic_name, 0)) or (0,))[0] == 10,
                   "the commit of the first 10")
    produce(cluster, topic_name, [f"b{i}" for i in range(5)])
    wait_until(lambda: len(first.records) >= 15, "the second batch")  # processed, not committed
    first.kill()
    second = Member(cluster, topic_name, group)
    members.append(second)
    wait_until(lambda: len(second.records) >= 5, "the redelivery")
    assert [v for _, _, v in second.records] == [f"b{i}" for i in range(5)]
    processed = {v for m in (first, second) for _, _, v in m.records}
    assert processed == {f"a{i}" for i in range(10)} | {f"b{i}" for i in range(5)}


def test_commit_committed_and_rebalance_listener(cluster, topic_name):
    """commit() writes the positions of assigned partitions to __consumer_offsets; committed()
    reads them back; a second consumer in the group starts there. The rebalance listener's
    on_partitions_revoked runs before partitions move, so it can commit."""
    create(cluster, topic_name, 2)
    group = f"g-{topic_name}"
    produce(cluster, topic_name, [f"v{i}" for i in range(20)], partition=0)
    revoked: list[list[TopicPartition]] = []

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
            revoked.append(partitions)

    first = Consumer(cluster.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                     enable_auto_commit=False, session_timeout_ms=3000,
                     heartbeat_interval_ms=300)
    first.subscribe([topic_name], listener=Listener())
    got: list = []
    wait_until(lambda: bool(got.extend(first.poll(200)) or len(got) >= 20), "20 records")
    first.commit()
    tp0 = TopicPartition(topic_name, 0)
    assert first.committed(tp0).offset == 20
    table = DeltaTable(consumer_offsets_path(cluster.config.root)).to_pyarrow_table()
    rows = [r for r in table.to_pylist() if r["group_id"] == group and r["partition"] == 0]
    assert rows[-1]["committed_offset"] == 20  # queryable as a plain Delta table
    second = Consumer(cluster.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                      session_timeout_ms=3000, heartbeat_interval_ms=300)
    second.subscribe([topic_name])
    wait_until(lambda: (first.poll(100), second.poll(100))
               and len(first.assignment()) == 1 and len(second.assignment()) == 1,
               "the partitions split between the two")
    assert revoked and tp0 in revoked[0]  # everything revoked first (eager range assignor)
    owner = first if tp0 in first.assignment() else second
    assert owner.position(tp0) == 20  # the committed offset, not auto_offset_reset
    second.close()
    first.close()


def test_commit_from_a_stale_generation_fails_cleanly(cluster, topic_name):
    """A member that missed a rebalance cannot commit: CommitFailedError, and it rejoins."""
    create(cluster, topic_name, 1)
    group = f"g-{topic_name}"
    consumer = Consumer(cluster.bootstrap_servers, group_id=group, session_timeout_ms=3000,
                        heartbeat_interval_ms=300, enable_auto_commit=False)
    consumer.subscribe([topic_name])
    wait_until(lambda: consumer.poll(100) is not None and bool(consumer.assignment()),
               "the assignment")
    assert consumer._group is not None
    consumer._group.generation_id -= 1  # as if a rebalance happened behind its back
    with pytest.raises(CommitFailedError):
        consumer.commit({TopicPartition(topic_name, 0): 0})
    consumer.close()


def test_console_consumer_group_replays_once_and_tool_shows_lag(
        cluster, topic_name, capsys):
    """The seeds' walkthrough: a new group with --from-beginning replays everything; run again,
    nothing, because the group's committed offsets win. consumer-groups shows the lag, resets
    offsets (dry run, then --execute) and deletes the group."""
    create(cluster, topic_name, 1)
    produce(cluster, topic_name, [f"m{i}" for i in range(5)])
    group = f"g-{topic_name}"
    common = ["--bootstrap-server", cluster.bootstrap_servers]
    consume = ["console-consumer", *common, "--topic", topic_name, "--group", group,
               "--from-beginning", "--timeout-ms", "3000"]
    capsys.readouterr()
    assert main(consume) == 0
    assert capsys.readouterr().out.split() == [f"m{i}" for i in range(5)]
    assert main(consume) == 0
    assert capsys.readouterr().out == ""
    produce(cluster, topic_name, [f"n{i}" for i in range(3)])
    assert main(["consumer-groups", *common, "--list"]) == 0
    assert group in capsys.readouterr().out.split()
    assert main(["consumer-groups", *common, "--describe", "--group", group]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"Consumer group '{group}' has no active members." in out
    header = next(line for line in out if line.startswith("GROUP"))
    assert header.split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET",
                              "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"]
    row = out[out.index(header) + 1].split()
    assert row == [group, topic_name, "0", "5", "8", "3", "-", "-", "-"]
    reset = ["consumer-groups", *common, "--reset-offsets", "--group", group, "--topic",
             topic_name, "--to-earliest"]
    assert main(reset) == 0  # a dry run by default
    assert capsys.readouterr().out.split()[-4:] == [group, topic_name, "0", "0"]
    with AdminClient(cluster.bootstrap_servers) as admin:
        assert admin.list_consumer_group_offsets(group) == {(topic_name, 0): 5}
    assert main([*reset, "--execute"]) == 0
    capsys.readouterr()
    with AdminClient(cluster.bootstrap_servers) as admin:
        assert admin.list_consumer_group_offsets(group) == {(topic_name, 0): 0}
    assert main(consume) == 0
    assert len(capsys.readouterr().out.split()) == 8  # replayed from the reset offset
    assert main(["consumer-groups", *common, "--delete", "--group", group]) == 0
    assert f"Deletion of requested consumer groups ('{group}') was successful." in \
        capsys.readouterr().out
    assert main(["consumer-groups", *common, "--describe", "--group", group]) == 1
    assert f"Consumer group '{group}' does not exist." in capsys.readouterr().err


def test_resetting_or_deleting_an_active_group_is_refused(cluster, topic_name, capsys):
    create(cluster, topic_name, 1)
    group = f"g-{topic_name}"
    consumer = Consumer(cluster.bootstrap_servers, group_id=group, session_timeout_ms=3000,
                        heartbeat_interval_ms=300)
    consumer.subscribe([topic_name])
    wait_until(lambda: consumer.poll(100) is not None and bool(consumer.assignment()),
               "the assignment")
    common = ["--bootstrap-server", cluster.bootstrap_servers]
    capsys.readouterr()
    assert main(["consumer-groups", *common, "--reset-offsets", "--group", group,
                 "--all-topics", "--to-latest", "--execute"]) == 1
    assert (f"Assignments can only be reset if the group '{group}' is inactive, but the "
            "current state is Stable.") in capsys.readouterr().err
    assert main(["consumer-groups", *common, "--describe", "--group", group,
                 "--members"]) == 0
    members = capsys.readouterr().out.splitlines()
    assert members[-1].split()[-1] == "1"  # #PARTITIONS of the one member
    with AdminClient(cluster.bootstrap_servers) as admin:
        results = admin.delete_consumer_groups([group])
    assert isinstance(results[group], errors.NonEmptyGroupError)
    consumer.close()


def test_offsets_survive_a_cluster_restart(spark, tmp_path):
    from deltabus import Cluster

    root = str(tmp_path / "root")
    first = Cluster(spark, root=root, brokers=1, port=0).start()
    try:
        create(first, "t", 1)
        produce(first, "t", ["a", "b", "c"])
        with Consumer(first.bootstrap_servers, group_id="g", auto_offset_reset="earliest",
                      enable_auto_commit=False, session_timeout_ms=3000,
                      heartbeat_interval_ms=300) as consumer:
            consumer.subscribe(["t"])
            got: list = []
            wait_until(lambda: bool(got.extend(consumer.poll(200)) or len(got) >= 2), "records")
            consumer.commit({TopicPartition("t", 0): 2})
    finally:
        first.stop()
    second = Cluster(spark, root=root, brokers=1, port=0).start()
    try:
        with Consumer(second.bootstrap_servers, group_id="g", auto_offset_reset="earliest",
                      session_timeout_ms=3000, heartbeat_interval_ms=300) as consumer:
            assert consumer.committed(TopicPartition("t", 0)).offset == 2
            consumer.subscribe(["t"])
            got = []
            wait_until(lambda: bool(got.extend(consumer.poll(200)) or got), "the rest")
            assert [r.value for r in got] == [b"c"]
    finally:
        second.stop()


def _member(cluster, group: str, **settings) -> Consumer:
    return Consumer(cluster.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                    session_timeout_ms=3000, heartbeat_interval_ms=300, **settings)


def _poll_until(consumers: list[Consumer], condition: Callable[[], bool], what: str) -> None:
    """Poll every consumer (so they take part in rebalances) until the condition holds."""
    def polled() -> bool:
        for c in consumers:
            c.poll(50)
        return condition()
    wait_until(polled, what)


def test_pattern_subscription_and_cooperative_sticky_keep_partitions_in_place(
        cluster, topic_name):
    """subscribe(pattern=...) covers every matching topic; with cooperative-sticky a newcomer
    only takes what balance needs, and nobody else's partitions move."""
    create(cluster, f"{topic_name}-a", 2)
    create(cluster, f"{topic_name}-b", 2)
    group = f"g-{topic_name}"
    first = _member(cluster, group, partition_assignment_strategy=["cooperative-sticky"])
    first.subscribe(pattern=f"{topic_name}-.*")
    _poll_until([first], lambda: len(first.assignment()) == 4, "all four partitions")
    assert first.subscription() == {f"{topic_name}-a", f"{topic_name}-b"}
    before = set(first.assignment())
    second = _member(cluster, group, partition_assignment_strategy=["cooperative-sticky"])
    second.subscribe(pattern=f"{topic_name}-.*")
    _poll_until([first, second],
                lambda: len(first.assignment()) == 2 and len(second.assignment()) == 2,
                "two partitions each")
    assert first.assignment() <= before  # first kept two of its own; nothing else moved
    second.close()
    first.close()


def test_a_member_that_stops_polling_leaves_after_max_poll_interval(cluster, topic_name):
    """max.poll.interval.ms: a member whose application stops calling poll() leaves the group,
    so a live member gets its partitions; its next poll joins again."""
    create(cluster, topic_name, 2)
    group = f"g-{topic_name}"
    stuck = _member(cluster, group, max_poll_interval_ms=2000)
    stuck.subscribe([topic_name])
    live = _member(cluster, group, max_poll_interval_ms=60_000)
    live.subscribe([topic_name])
    _poll_until([stuck, live], lambda: len(stuck.assignment()) == 1
                and len(live.assignment()) == 1, "one partition each")
    _poll_until([live], lambda: len(live.assignment()) == 2,
                "the live member to take everything while the other does not poll")
    _poll_until([stuck, live], lambda: len(stuck.assignment()) == 1
                and len(live.assignment()) == 1, "the stuck member back after polling again")
    stuck.close()
    live.close()


def test_reset_offsets_scenarios_follow_kafka(cluster, topic_name, capsys):
    create(cluster, topic_name, 1)
    produce(cluster, topic_name, [f"v{i}" for i in range(10)])
    group = f"g-{topic_name}"
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.alter_consumer_group_offsets(group, {(topic_name, 0): 5})
    base = ["consumer-groups", "--bootstrap-server", cluster.bootstrap_servers,
            "--reset-offsets", "--group", group, "--topic", f"{topic_name}:0"]

    def new_offset(*scenario: str) -> str:
        capsys.readouterr()
        assert main([*base, *scenario]) == 0
        return capsys.readouterr().out.split()[-1]

    assert new_offset("--to-offset", "3") == "3"
    assert new_offset("--shift-by", "-2") == "3"
    assert new_offset("--shift-by", "100") == "10"  # clamped to the log end, as Kafka does
    assert new_offset("--to-latest") == "10"
    assert new_offset("--to-current") == "5"
    assert new_offset("--to-datetime", "2000-01-01T00:00:00.000") == "0"
    assert new_offset("--by-duration", "PT1H") == "0"  # every record is younger than an hour
    assert main([*base, "--by-duration", "one hour"]) == 1
    assert "Error parsing duration" in capsys.readouterr().err
    with AdminClient(cluster.bootstrap_servers) as admin:
        assert admin.list_consumer_group_offsets(group) == {(topic_name, 0): 5}  # all dry runs


def test_describe_shows_lag_and_owners_while_producers_and_consumers_run(
        cluster, topic_name, capsys):
    create(cluster, topic_name, 2)
    group = f"g-{topic_name}"
    stop = threading.Event()
    produced = [0]

    def producing() -> None:
        with Producer(cluster.bootstrap_servers, linger_ms=1) as producer:
            while not stop.is_set():
                producer.send(topic_name, b"x", partition=produced[0] % 2)
                produced[0] += 1
                if produced[0] % 50 == 0:
                    producer.flush(WAIT_S)
                    time.sleep(0.01)

    member = _member(cluster, group, enable_auto_commit=False, client_id="lag-watcher")
    member.subscribe([topic_name])
    sender = threading.Thread(target=producing)
    sender.start()
    try:
        _poll_until([member], lambda: len(member.assignment()) == 2, "the assignment")
        for _ in range(3):
            for _ in range(5):
                member.poll(50, max_records=20)  # consume slower than the producer
            member.commit()
            capsys.readouterr()
            assert main(["consumer-groups", "--bootstrap-server", cluster.bootstrap_servers,
                         "--describe", "--group", group]) == 0
            lines = capsys.readouterr().out.splitlines()
            header = next(i for i, line in enumerate(lines) if line.startswith("GROUP"))
            rows = [line.split() for line in lines[header + 1:]]
            committed = member.committed([TopicPartition(topic_name, p) for p in (0, 1)])
            for row in rows:
                partition, current, end, lag = (int(x) for x in row[2:6])
                assert current == committed[TopicPartition(topic_name, partition)].offset
                assert lag == end - current and 0 <= current <= end <= produced[0]
                assert row[6] == member._group.member_id and row[8] == "lag-watcher"
                assert row[7].startswith("/127.0.0.1")
            assert len(rows) == 2
    finally:
        stop.set()
        sender.join()
        member.close()


def test_adding_partitions_rebalances_the_group(cluster, topic_name, capsys):
    """kafka-topics --alter --partitions: the group notices the new partitions (at most
    metadata.max.age.ms later) and rebalances to cover them."""
    create(cluster, topic_name, 1)
    group = f"g-{topic_name}"
    member = _member(cluster, group, metadata_max_age_ms=500)
    member.subscribe([topic_name])
    _poll_until([member], lambda: len(member.assignment()) == 1, "the one partition")
    common = ["--bootstrap-server", cluster.bootstrap_servers, "--topic", topic_name]
    capsys.readouterr()
    assert main(["topics", "--alter", *common, "--partitions", "3"]) == 0
    out = capsys.readouterr().out
    assert "WARNING: If partitions are increased for a topic that has a key" in out
    assert "Adding partitions succeeded!" in out
    _poll_until([member], lambda: len(member.assignment()) == 3, "all three partitions")
    produce(cluster, topic_name, ["new"], partition=2)
    got: list = []
    wait_until(lambda: bool(got.extend(member.poll(100)) or got), "the record")
    assert [(r.partition, r.value) for r in got] == [(2, b"new")]
    assert main(["topics", "--alter", *common, "--partitions", "2"]) == 1
    assert ("Topic currently has 3 partitions, which is higher than the requested 2."
            in capsys.readouterr().err)
    member.close()


def test_group_and_offsets_carry_on_through_a_broker_kill(cluster, topic_name):
    """The coordinator lives in the driver: a broker dying (and relaunched) loses no committed
    offset and does not stop the group committing."""
    create(cluster, topic_name, 1)
    group = f"g-{topic_name}"
    member = _member(cluster, group, enable_auto_commit=False)
    member.subscribe([topic_name])
    _poll_until([member], lambda: len(member.assignment()) == 1, "the assignment")
    tp = TopicPartition(topic_name, 0)
    member.commit({tp: 0})
    old_pid = cluster.broker_pids()[0]
    cluster.kill_broker(0)
    member.commit({tp: 0})  # commits go on while the broker is down
    wait_until(lambda: cluster.broker_pids().get(0, old_pid) != old_pid, "the relaunch")
    produce(cluster, topic_name, ["a", "b"])
    got: list = []
    wait_until(lambda: bool(got.extend(member.poll(100)) or len(got) >= 2), "the records")
    member.commit()
    assert member.committed(tp).offset == 2
    member.close()
