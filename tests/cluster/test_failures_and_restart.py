"""Brokers die and come back; clusters restart on the same root. Nothing acknowledged is lost."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from deltabus import AdminClient, Cluster, NewTopic, Producer
from deltabus.client.cluster_client import ClusterClient
from deltabus.listeners import ListenerBindError
from deltabus.rpc.v1 import deltabus_pb2 as pb
from tests.conftest import free_port_block, read_records, wait_until

_read_all = read_records


def _new_producer_id(bootstrap: str) -> int:
    client = ClusterClient(bootstrap)
    try:
        return client.call_any("InitProducerId", pb.InitProducerIdRequest()).producer_id
    finally:
        client.close()


def _kill_leader_and_await_relaunch(cluster, topic: str) -> int:
    """SIGKILL the process of partition 0's leader; return its id once a new process serves."""
    leader = cluster.controller.image().partition(topic, 0).leader
    old_pid = cluster.broker_pids()[leader]
    cluster.kill_broker(leader)
    _wait_for_relaunch(cluster, leader, old_pid)
    return leader


def _wait_for_relaunch(cluster, broker_id: int, old_pid: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = cluster.broker_pids().get(broker_id)
        if pid is not None and pid != old_pid:
            return
        time.sleep(0.05)
    raise AssertionError(f"broker {broker_id} was not relaunched in {timeout_s} s")


def test_killing_a_leader_during_produce_loses_no_acknowledged_record(cluster, topic_name):
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 3, 1)])
    acked: list[tuple[int, int, bytes]] = []
    failed: list[BaseException] = []
    stop = threading.Event()
    producer = Producer(cluster.bootstrap_servers, linger_ms=1, delivery_timeout_ms=60_000)

    def on_done(value: bytes):
        def callback(future):
            error = future.exception()
            if error is None:
                meta = future.get()
                acked.append((meta.partition, meta.offset, value))
            else:
                failed.append(error)
        return callback

    sent = [0]

    def produce() -> None:
        while not stop.is_set():
            i = sent[0]
            value = f"record-{i}".encode()
            producer.send(topic_name, value, key=str(i % 30)).add_done_callback(on_done(value))
            sent[0] = i + 1
            if i % 200 == 0:
                time.sleep(0.01)

    sender = threading.Thread(target=produce)
    sender.start()
    try:
        wait_until(lambda: len(acked) >= 200, "records acknowledged before the kill")
        victim = _kill_leader_and_await_relaunch(cluster, topic_name)
        relaunched_at = sent[0]
        # Replication factor 1: partition 0 is back only on the relaunched broker, which must take
        # records sent after it came back.
        wait_until(lambda: any(p == 0 and int(v.split(b"-")[1]) >= relaunched_at
                               for p, _, v in list(acked)),
                   "a record sent after the relaunch acknowledged by the relaunched broker", 120)
    finally:
        stop.set()
        sender.join()
    producer.flush(60)
    producer.close()

    assert not failed, failed[:3]
    assert len(acked) > 0
    records = _read_all(cluster.bootstrap_servers, topic_name, 3, len(acked))
    stored = {(r.partition, r.offset): r.value for r in records}
    missing = [a for a in acked if a[1] >= 0 and stored.get((a[0], a[1])) != a[2]]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:3]}"
    values = [r.value for r in records]
    assert {a[2] for a in acked} <= set(values)
    assert len(values) == len(set(values)), "the idempotent producer wrote a record twice"
    for p in range(3):  # per-partition send order holds through the failure
        sent = [int(r.value.split(b"-")[1]) for r in records if r.partition == p]
        assert sent == sorted(sent)
    for p in range(3):  # offsets stay contiguous through the failure
        offsets = sorted(o for (q, o) in stored if q == p)
        assert offsets == list(range(len(offsets)))
    assert cluster.relaunches[victim] >= 1


def test_relaunched_broker_serves_its_partitions_again(cluster, topic_name):
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    with Producer(cluster.bootstrap_servers) as producer:
        producer.send(topic_name, b"before").get(10)
    leader = _kill_leader_and_await_relaunch(cluster, topic_name)
    with Producer(cluster.bootstrap_servers) as producer:
        assert producer.send(topic_name, b"after").get(30).offset == 1
    records = _read_all(cluster.bootstrap_servers, topic_name, 1, 2)
    assert [r.value for r in records] == [b"before", b"after"]
    client = ClusterClient(cluster.bootstrap_servers)
    state = client.refresh_metadata().partition(topic_name, 0)
    assert state.leader == leader and state.leader_epoch >= 2  # fenced, then led again
    client.close()


def test_a_rolling_restart_of_each_broker_returns_once_it_is_back(
        cluster, topic_name, all_brokers_back):
    """Cluster.restart_broker, as an operator's rolling restart: each broker in turn stops
    (leadership moving first) and registers again before the next. Spark often runs the new
    broker task in the same reused Python worker, so the restart cannot be told by a new
    process id (waiting for one hung): it is told by the broker's new epoch."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3, {"min.insync.replicas": "2"})])
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        for broker_id in range(cluster.config.brokers):
            before = cluster.controller.broker_epochs()[broker_id]
            cluster.restart_broker(broker_id, timeout_s=120)
            assert cluster.controller.broker_epochs()[broker_id] > before
            producer.send(topic_name, f"after {broker_id}".encode()).get(60)
    records = _read_all(cluster.bootstrap_servers, topic_name, 1, 3)
    assert [r.value for r in records] == [b"after 0", b"after 1", b"after 2"]


def test_cluster_restarted_on_the_same_root_keeps_topics_and_data(spark, tmp_path):
    root = str(tmp_path / "restart")
    first = Cluster(spark, root=root, brokers=3, port=0).start()
    try:
        with AdminClient(first.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("orders", 2, 1, {"retention.ms": "3600000"})])
        with Producer(first.bootstrap_servers) as producer:
            for i in range(100):
                producer.send("orders", f"o{i}", key=f"{i}")
        first_id = _new_producer_id(first.bootstrap_servers)
    finally:
        first.stop()
    second = Cluster(spark, root=root, brokers=3, port=0).start()
    try:
        with AdminClient(second.bootstrap_servers) as admin:
            (topic,) = admin.describe_topics(["orders"])
            assert len(topic.partitions) == 2
            assert topic.configs == {"retention.ms": "3600000"}
        records = _read_all(second.bootstrap_servers, "orders", 2, 100)
        assert sorted(r.value for r in records) == sorted(f"o{i}".encode() for i in range(100))
        with Producer(second.bootstrap_servers) as producer:
            meta = producer.send("orders", b"more", partition=0).get(30)
        assert meta.offset == sum(1 for r in records if r.partition == 0)
        assert _new_producer_id(second.bootstrap_servers) > first_id  # never handed out twice
    finally:
        second.stop()


def test_deleted_topic_is_gone_and_can_be_created_again(cluster, topic_name):
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
        with Producer(cluster.bootstrap_servers) as producer:
            producer.send(topic_name, b"old").get(10)
        admin.delete_topics([topic_name])
        assert topic_name not in admin.list_topics()
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    with Producer(cluster.bootstrap_servers) as producer:
        assert producer.send(topic_name, b"new").get(30).offset == 0
    assert [r.value for r in _read_all(cluster.bootstrap_servers, topic_name, 1, 1)] == [b"new"]


def test_pipelined_bulk_produce_through_a_leader_kill_is_exactly_once_in_order(cluster, topic_name):
    """Full batches go two deep per partition; the leader orders them by sequence, retries after
    the kill are not written twice, and none overtakes another."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 1)])
    producer = Producer(cluster.bootstrap_servers, batch_size=50_000, max_request_size=200_000,
                        delivery_timeout_ms=60_000)
    batches: list[tuple[int, list]] = []  # (first record, its chunks' futures)
    sent = [0]
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            first = sent[0]
            values = [f"bulk-{i:08d}".encode() for i in range(first, first + 3000)]
            batches.append((first, producer.send_batch(topic_name, values, partition=0)))
            sent[0] += 3000
            time.sleep(0.02)

    def acknowledged_from(record: int) -> bool:
        """A batch starting at or after `record` is acknowledged whole."""
        return any(first >= record and all(f.done() and f.exception() is None for f in chunks)
                   for first, chunks in list(batches))

    sender = threading.Thread(target=produce)
    sender.start()
    try:
        wait_until(lambda: acknowledged_from(0), "a batch acknowledged before the kill")
        _kill_leader_and_await_relaunch(cluster, topic_name)
        # The one replica is back: a batch sent after the relaunch is acknowledged by it.
        relaunched_at = sent[0]
        wait_until(lambda: acknowledged_from(relaunched_at),
                   "a batch sent after the relaunch acknowledged", 120)
    finally:
        stop.set()
        sender.join()
    producer.flush(60)
    producer.close()
    assert sent[0] >= 30_000
    futures = [f for _, chunks in batches for f in chunks]
    assert [f.exception() for f in futures if f.exception() is not None] == []
    values = [r.value for r in _read_all(cluster.bootstrap_servers, topic_name, 1, sent[0])]
    assert len(values) == len(set(values)), "a retried batch was written twice"
    assert values == sorted(values), "a batch overtook an earlier one"
    assert values == [f"bulk-{i:08d}".encode() for i in range(sent[0])], "records are missing"


def test_a_broker_whose_port_is_taken_fails_the_start_naming_it(spark, tmp_path) -> None:
    """Broker b listens on port + 1 + b. When that port is taken the start fails at once with
    the address, as Kafka's "failed to bind" does, rather than relaunching the broker into the
    same taken port until the start-up times out with a word about task slots."""
    port = free_port_block(3)  # a port alone can have a taken neighbour (another test's)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 2))  # broker 1's gRPC port
        taken.listen()
        cluster = Cluster(spark, root=str(tmp_path), brokers=2, port=port, kafka_port=-1)
        with pytest.raises(ListenerBindError,
                           match=f"broker 1 cannot listen on 127.0.0.1:{port + 2}"):
            cluster.start()
    # What did start was stopped: the driver's and broker 0's ports are free again.
    for freed in (port, port + 1):
        wait_until(lambda p=freed: _bindable(p), f"port {freed} to be released")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_running_broker_the_controller_fences_stops_until_its_supervisor_relaunches_it(
        cluster, topic_name, monkeypatch):
    """The controller fences a broker that still runs (as for heartbeats missed on a loaded
    machine): its task is cancelled, and the supervisor catches its replicas up with a Spark
    job writing their tables, then starts a new task. The fenced process must not register
    again meanwhile: it was (STALE_BROKER_EPOCH, then a new registration), so it was live
    during the catch-up job and fenced its successor when it registered, and that one it."""
    with AdminClient(cluster.bootstrap_servers) as admin:  # replicas on the victim to copy
        admin.create_topics([NewTopic(topic_name, 3, 3)])
    with Producer(cluster.bootstrap_servers) as producer:
        for p in range(3):
            producer.send(topic_name, b"before", partition=p).get(30)
    controller, victim = cluster.controller, 1
    wait_until(lambda: victim in controller.live_brokers(), "the victim to be live", 60)
    registered: list[int] = []
    live_while_caught_up: list[bool] = []
    register, catch_up = controller.register_broker, cluster._catch_up_before_relaunch

    def register_broker(endpoint, pid):
        if endpoint.broker_id == victim:
            registered.append(pid)
        return register(endpoint, pid)

    def catch_up_before_relaunch(broker_id):
        if broker_id == victim:
            live_while_caught_up.append(victim in controller.live_brokers())
        catch_up(broker_id)

    monkeypatch.setattr(controller, "register_broker", register_broker)
    monkeypatch.setattr(cluster, "_catch_up_before_relaunch", catch_up_before_relaunch)
    relaunches = cluster.relaunches[victim]
    controller.fence_broker(victim, "the test: as for missed heartbeats")
    wait_until(lambda: cluster.relaunches[victim] > relaunches
               and victim in controller.live_brokers(), "the victim to be relaunched", 90)
    time.sleep(2)  # a fenced process registering again does so within a heartbeat or two
    assert live_while_caught_up == [False]
    assert len(registered) == 1, registered  # the relaunched task's registration only
    records = _read_all(cluster.bootstrap_servers, topic_name, 3, 3)
    assert [r.value for r in records] == [b"before"] * 3
