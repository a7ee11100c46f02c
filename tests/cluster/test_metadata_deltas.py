"""Heartbeats carry metadata records, not the image (issue 17): a broker is sent the records
since its position, or a snapshot when the controller no longer holds them (or the broker is
new), a bounded number at a time, and replays them with the controller's own replay into an
image equal to the controller's, whatever changed: topics created and deleted, partitions added,
configs, ISR changes, reassignments, ACLs, SCRAM credentials, fencing, controlled shutdown,
offline replicas, elections.

A real controller (its metadata log a Delta table under tmp_path, its replica tables created);
the broker's side is `MetadataLoader`, as `Broker` runs it, fed by the controller's heartbeat
answers: in this process, over real gRPC (`ControllerChannel`), and in real brokers (their
servers, heartbeats and fetchers in this process, as in a Spark task).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deltabus import config as cfg
from deltabus.cluster.broker import Broker, BrokerSpec
from deltabus.cluster.controller import Controller
from deltabus.cluster.metadata_deltas import MetadataDeltas
from deltabus.cluster.metadata_loader import MetadataLoader
from deltabus.cluster.metadata_records import deserialize
from deltabus.cluster.metadata_state import MetadataState
from deltabus.metadata import (
    BrokerEndpoint,
    MetadataBatch,
    MetadataImage,
    MetadataPosition,
    NewTopic,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
)
from deltabus.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    QuotaAlteration,
    QuotaEntity,
)
from deltabus.rpc.controller_channel import ControllerChannel
from deltabus.security.acls import (
    AclBinding,
    AclBindingFilter,
    AclCreation,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from deltabus.security.scram import salted_password
from tests.cluster.controller_server import ControllerServer
from tests.conftest import wait_until

ANSWERS_MAX = 10_000  # a bound on every catch-up loop here
SALT = b"0123456789abcdef"


class Observer:
    """One broker's metadata, as `Broker` keeps it: a loader fed by heartbeat answers. `send`
    is the heartbeat (in this process, or over gRPC)."""

    def __init__(self, root: str,
                 send: Callable[[int, MetadataPosition], MetadataBatch | None]) -> None:
        self.loader = MetadataLoader(root)
        self.image: MetadataImage | None = None
        self._send = send

    def catch_up(self) -> list[MetadataBatch]:
        """Heartbeat until the controller has nothing more; the batches it sent."""
        batches = []
        for _ in range(ANSWERS_MAX):
            batch = self._send(self.loader.applied_version, self.loader.position)
            if batch is None:
                return batches
            batches.append(batch)
            image = self.loader.replay(batch)
            self.image = image or self.image
        raise AssertionError(f"still not current after {ANSWERS_MAX} answers")


def in_process(controller: Controller, broker_id: int, epoch: int) -> Observer:
    def send(applied: int, position: MetadataPosition) -> MetadataBatch | None:
        return controller.heartbeat(broker_id, epoch, applied, 0, position=position)[1]
    return Observer(controller.config.root, send)


def with_limits(controller: Controller, **limits: int) -> None:
    """The controller's deltas with other limits, from its current version on (a test seam:
    the limits are constants of `config`)."""
    controller._deltas = MetadataDeltas(controller.image().version, **limits)


def _config(tmp_path: Path) -> cfg.ClusterConfig:
    return cfg.ClusterConfig(root=str(tmp_path), brokers=3, kafka_port=-1)


def _register(controller: Controller, broker_id: int) -> int:
    """Register a broker and unfence it, as its first heartbeat would; its epoch."""
    epoch = controller.register_broker(BrokerEndpoint(broker_id, "127.0.0.1", 9000 + broker_id),
                                       100 + broker_id)
    controller.heartbeat(broker_id, epoch, controller.image().version, 0)
    return epoch


def _acl(name: str, operation: Operation = Operation.READ) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, PatternType.LITERAL, "User:alice", "*",
                      operation, Permission.ALLOW)


def _upsert(user: str, mechanism: str) -> ScramCredentialUpsertion:
    return ScramCredentialUpsertion(user, mechanism, 4096, SALT,
                                    salted_password(mechanism, "secret", SALT, 4096))


def _change_isr(controller: Controller, epochs: dict[int, int], topic: str, partition: int,
                isr: list[int]) -> None:
    """The partition's leader asks for `isr` (AlterPartition)."""
    s = controller.image().partition(topic, partition)
    assert s is not None
    controller.alter_partition(s.leader, epochs[s.leader], topic, partition, s.leader_epoch,
                               list(s.isr), isr)


def _reassign(controller: Controller, epochs: dict[int, int], topic: str, partition: int,
              target: list[int]) -> None:
    """A reassignment to its end: the added replicas join the ISR as their leader would let
    them once caught up, and the controller completes it."""
    assert controller.reassign_partitions({(topic, partition): target}) == {
        (topic, partition): None}
    wait_until(lambda: bool(getattr(controller.image().partition(topic, partition),
                                    "adding_replicas", ())), "the reassignment to start")
    s = controller.image().partition(topic, partition)
    assert s is not None
    _change_isr(controller, epochs, topic, partition, [*s.isr, *s.adding_replicas])
    wait_until(lambda: getattr(controller.image().partition(topic, partition), "replicas",
                               None) == tuple(target), "the reassignment to complete")


def changes(controller: Controller, epochs: dict[int, int]) -> Iterator[str]:
    """Every kind of metadata change, one after another; yields after each, naming it. Broker
    0 is never fenced (the observers heartbeat as it); 1 and 2 are."""
    controller.create_topics([NewTopic("orders", 3, 3),
                              NewTopic("pay", 2, 2, configs={"retention.ms": "1000"})],
                             timeout_ms=0)
    yield "topics created"
    controller.alter_configs({"orders": [cfg.AlterConfigOp("cleanup.policy", value="compact")],
                              "pay": [cfg.AlterConfigOp("retention.ms", "DELETE")]},
                             timeout_ms=0)
    yield "configs altered"
    s = controller.image().partition("orders", 0)
    assert s is not None
    _change_isr(controller, epochs, "orders", 0, [r for r in s.isr if r != s.replicas[-1]])
    yield "ISR shrunk"
    _change_isr(controller, epochs, "orders", 0, list(s.replicas))
    yield "ISR grown"
    controller.create_partitions({"orders": 5}, timeout_ms=0)
    yield "partitions added"
    controller.create_acls([AclCreation.of(_acl("orders")), AclCreation.of(_acl("pay")),
                            AclCreation.of(_acl("pay", Operation.WRITE))], timeout_ms=0)
    controller.delete_acls([AclBindingFilter(resource_name="pay", operation=Operation.WRITE)],
                           timeout_ms=0)
    yield "ACLs created and deleted"
    controller.alter_user_scram_credentials(
        [], [_upsert("alice", "SCRAM-SHA-256"), _upsert("alice", "SCRAM-SHA-512"),
             _upsert("bob", "SCRAM-SHA-256")], timeout_ms=0)
    controller.alter_user_scram_credentials([ScramCredentialDeletion("alice", "SCRAM-SHA-512")],
                                            [], timeout_ms=0)
    yield "SCRAM credentials set and deleted"
    alice, app = QuotaEntity.user("alice"), QuotaEntity.client(None)
    controller.alter_client_quotas([QuotaAlteration(alice, ((PRODUCER_BYTE_RATE, 1024.0),)),
                                    QuotaAlteration(app, ((CONSUMER_BYTE_RATE, 2048.0),))],
                                   timeout_ms=0)
    controller.alter_client_quotas([QuotaAlteration(app, ((CONSUMER_BYTE_RATE, None),))],
                                   timeout_ms=0)
    yield "client quotas set and removed"
    pay = controller.image().partition("pay", 0)
    assert pay is not None
    target = [b for b in range(3) if b not in pay.replicas] + [pay.replicas[0]]
    _reassign(controller, epochs, "pay", 0, target)
    yield "partition reassigned"
    controller.heartbeat(2, epochs[2], controller.image().version, 0, [("orders", 1)])
    yield "a replica reported offline"
    controller.fence_broker(2, "the test")
    yield "broker fenced"
    epochs[2] = _register(controller, 2)
    yield "broker registered again"
    assert controller.shut_down_broker(1)
    yield "controlled shutdown"
    controller.fence_broker(1, "the test")
    epochs[1] = _register(controller, 1)
    controller.elect_leaders("preferred")
    yield "leaders elected"
    controller.delete_topics(["pay"], timeout_ms=0)
    yield "topic deleted"


@pytest.mark.parametrize("limits", [
    {},  # the defaults: every change in one answer
    {"records_max": 2},  # versions split over several answers
    {"bytes_max": 1},  # one record an answer
], ids=["defaults", "two-records", "one-record"])
def test_a_broker_replaying_the_records_ends_with_the_controllers_image(
        tmp_path: Path, limits: dict[str, int]) -> None:
    controller = Controller(_config(tmp_path))
    with_limits(controller, **limits)
    epochs = {b: _register(controller, b) for b in range(3)}
    current = in_process(controller, 0, epochs[0])
    current.catch_up()  # a snapshot: it is new
    behind = in_process(controller, 0, epochs[0])
    behind.catch_up()  # then left behind until the end
    for step in changes(controller, epochs):
        batches = current.catch_up()
        assert current.image == controller.image(), step
        assert all(b.start.snapshot is False for b in batches), step  # deltas, no snapshot
        records_max = limits.get("records_max", cfg.METADATA_FETCH_RECORDS_MAX)
        assert all(len(b.records) <= (1 if "bytes_max" in limits else records_max)
                   for b in batches), step
    assert behind.catch_up() and behind.image == controller.image()
    new = in_process(controller, 0, epochs[0])  # a new broker: a snapshot
    first = new.catch_up()[0]
    assert first.start == MetadataPosition(first.start.version, 0, snapshot=True)
    assert new.image == controller.image()


def test_a_version_too_big_for_one_answer_is_published_only_once_whole(tmp_path: Path) -> None:
    controller = Controller(_config(tmp_path))
    with_limits(controller, records_max=4)
    epochs = {b: _register(controller, b) for b in range(3)}
    observer = in_process(controller, 0, epochs[0])
    observer.catch_up()
    before = controller.image()
    controller.create_topics([NewTopic("big", 10, 1)], timeout_ms=0)  # 11 records, 1 version
    batches = observer.catch_up()
    assert [len(b.records) for b in batches] == [4, 4, 3]
    assert [b.end for b in batches] == [MetadataPosition(before.version, 4),
                                        MetadataPosition(before.version, 8),
                                        MetadataPosition(before.version + 1)]
    assert observer.image == controller.image()


def test_an_isr_change_is_one_record_however_big_the_cluster(tmp_path: Path) -> None:
    controller = Controller(_config(tmp_path))
    epochs = {b: _register(controller, b) for b in range(3)}
    controller.create_topics([NewTopic(f"t{i}", 20, 3) for i in range(5)], timeout_ms=0)
    observer = in_process(controller, 0, epochs[0])
    observer.catch_up()
    s = controller.image().partition("t3", 7)
    assert s is not None
    _change_isr(controller, epochs, "t3", 7, [r for r in s.isr if r != s.replicas[-1]])
    (batch,) = observer.catch_up()
    (record,) = [deserialize(r) for r in batch.records]
    assert record.type == "partition_change" and len(batch.records[0]) < 100
    assert observer.image == controller.image()


def test_a_broker_behind_the_retained_records_loads_a_snapshot(tmp_path: Path) -> None:
    controller = Controller(_config(tmp_path))
    with_limits(controller, records_retained_max=4, records_max=2)
    epochs = {b: _register(controller, b) for b in range(3)}
    behind = in_process(controller, 0, epochs[0])
    behind.catch_up()
    current = in_process(controller, 0, epochs[0])
    current.catch_up()
    for step in changes(controller, epochs):
        current.catch_up()
        assert current.image == controller.image(), step
    batches = behind.catch_up()
    assert batches[0].start.snapshot and batches[0].start.index == 0
    assert len(batches) > 1 and all(len(b.records) <= 2 for b in batches)  # in pieces
    assert behind.image == controller.image()


def test_a_snapshot_in_pieces_goes_on_while_the_metadata_changes(tmp_path: Path) -> None:
    """The snapshot a broker is loading stays while it can catch up from it; the changes
    meanwhile come after it, as deltas."""
    controller = Controller(_config(tmp_path))
    with_limits(controller, records_max=3)
    epochs = {b: _register(controller, b) for b in range(3)}
    controller.create_topics([NewTopic("orders", 6, 3)], timeout_ms=0)
    loader = MetadataLoader(controller.config.root)

    def heartbeat() -> MetadataBatch:
        batch = controller.heartbeat(0, epochs[0], loader.applied_version, 0,
                                     position=loader.position)[1]
        assert batch is not None
        return batch

    first = heartbeat()
    assert loader.replay(first) is None and first.end.snapshot  # not whole yet
    controller.create_topics([NewTopic("pay", 1, 1)], timeout_ms=0)  # a new version
    second = heartbeat()
    assert second.start == first.end  # the same snapshot, on from where it was
    loader.replay(second)
    image = None
    while loader.position.snapshot:
        image = loader.replay(heartbeat())
    assert image is not None and image.version == first.start.version  # the snapshot's own
    assert "pay" not in image.topics
    catch_up = Observer(controller.config.root, lambda applied, position: controller.heartbeat(
        0, epochs[0], applied, 0, position=position)[1])
    catch_up.loader = loader
    batches = catch_up.catch_up()
    assert batches and not any(b.start.snapshot for b in batches)
    assert catch_up.image == controller.image()


def test_a_snapshot_gone_while_loading_is_started_again(tmp_path: Path) -> None:
    controller = Controller(_config(tmp_path))
    with_limits(controller, records_retained_max=2, records_max=2)
    epochs = {b: _register(controller, b) for b in range(3)}
    controller.create_topics([NewTopic("orders", 3, 3)], timeout_ms=0)
    observer = in_process(controller, 0, epochs[0])
    first = controller.heartbeat(0, epochs[0], 0, 0, position=MetadataPosition(0))[1]
    assert first is not None and first.end.snapshot
    observer.loader.replay(first)
    controller.create_topics([NewTopic("pay", 3, 1)], timeout_ms=0)  # past the retention
    batches = observer.catch_up()
    assert batches[0].start == MetadataPosition(batches[0].start.version, 0, snapshot=True)
    assert batches[0].start.version > first.start.version  # a new snapshot, from its start
    assert observer.image == controller.image()


def test_a_position_this_controller_never_gave_gets_a_snapshot(tmp_path: Path) -> None:
    """A broker that heartbeated a controller before this one (its versions are that one's)
    starts over from a snapshot, as it does after registering again."""
    controller = Controller(_config(tmp_path))
    epochs = {b: _register(controller, b) for b in range(3)}
    for position in (MetadataPosition(10_000), MetadataPosition(controller.image().version - 1,
                                                                 5_000),
                     MetadataPosition(3, 7, snapshot=True)):
        batch = controller.heartbeat(0, epochs[0], 0, 0, position=position)[1]
        assert batch is not None and batch.start.snapshot and batch.start.index == 0


def test_the_loader_refuses_records_it_did_not_ask_for(tmp_path: Path) -> None:
    controller = Controller(_config(tmp_path))
    epochs = {b: _register(controller, b) for b in range(3)}
    observer = in_process(controller, 0, epochs[0])
    observer.catch_up()
    version = controller.image().version
    controller.create_topics([NewTopic("orders", 1, 1)], timeout_ms=0)
    controller.create_topics([NewTopic("pay", 1, 1)], timeout_ms=0)
    skipped = controller.heartbeat(0, epochs[0], version + 1, 0)[1]  # from a later version
    assert skipped is not None
    with pytest.raises(ValueError, match="the broker is at"):
        observer.loader.replay(skipped)
    observer.catch_up()
    assert observer.image == controller.image()


def test_a_snapshot_replays_to_the_same_image(tmp_path: Path) -> None:
    controller = Controller(_config(tmp_path))
    epochs = {b: _register(controller, b) for b in range(3)}
    for _ in changes(controller, epochs):
        state = MetadataState()
        for record in controller._state.snapshot():
            state.replay(record)
        assert state.image(7, "root") == controller._state.image(7, "root")


# ---- over gRPC, and in real brokers ----------------------------------------------------------

@pytest.fixture
def server(tmp_path: Path) -> Iterator[ControllerServer]:
    server = ControllerServer(tmp_path)
    yield server
    server.stop()


def test_over_grpc_a_broker_ends_with_the_controllers_image(server: ControllerServer) -> None:
    controller = server.controller
    with_limits(controller, records_max=5)
    epochs = {b: _register(controller, b) for b in (1, 2)}
    channel = ControllerChannel(server.address, 0,
                                broker_secret=server.config.inter_broker_secret)
    try:
        epochs[0] = channel.register(BrokerEndpoint(0, "127.0.0.1", 9000), pid=1,
                                     incarnation_id="b0")

        def send(applied: int, position: MetadataPosition) -> MetadataBatch | None:
            return channel.heartbeat(0, epochs[0], applied, max_wait_ms=0,
                                     position=position).metadata

        observer = Observer(server.config.root, send)
        observer.catch_up()  # a snapshot: new
        for step in changes(controller, epochs):
            observer.catch_up()
            assert observer.image == controller.image(), step
    finally:
        channel.close()


def test_a_snapshot_sent_compressed_over_grpc_loads(server: ControllerServer) -> None:
    """Answers past METADATA_FETCH_COMPRESS_BYTES_MIN go gzip-compressed: the broker's channel
    takes them as any other."""
    controller = server.controller
    for b in (1, 2):
        _register(controller, b)
    (created,) = controller.create_topics([NewTopic("wide", 200, 1)], timeout_ms=0)
    assert created.error is None
    channel = ControllerChannel(server.address, 0,
                                broker_secret=server.config.inter_broker_secret)
    try:
        epoch = channel.register(BrokerEndpoint(0, "127.0.0.1", 9000), pid=1,
                                 incarnation_id="b0")
        batch = channel.heartbeat(0, epoch, 0, max_wait_ms=0).metadata
    finally:
        channel.close()
    assert batch is not None and batch.start.snapshot and not batch.end.snapshot  # whole
    assert sum(map(len, batch.records)) >= cfg.METADATA_FETCH_COMPRESS_BYTES_MIN
    image = MetadataLoader(server.config.root).replay(batch)
    assert image == controller.image()


def test_real_brokers_end_with_the_controllers_image(server: ControllerServer) -> None:
    controller = server.controller
    brokers: dict[int, Broker] = {}

    def start(broker_id: int) -> None:
        broker = brokers[broker_id] = Broker(BrokerSpec(broker_id, server.node, server.config))
        broker.start()
        wait_until(lambda: broker_id in controller.live_brokers(),
                   f"broker {broker_id} to be live", 30)

    def in_step(what: str) -> None:
        wait_until(lambda: all(b._image == controller.image() for b in brokers.values()),
                   f"every broker to have the controller's image after: {what}", 30)

    try:
        for b in range(3):
            start(b)
        controller.create_topics([NewTopic("orders", 4, 3), NewTopic("pay", 2, 2)],
                                 timeout_ms=30_000)
        in_step("topics created")
        controller.alter_configs({"orders": [cfg.AlterConfigOp("retention.ms", value="60000")]})
        controller.create_acls([AclCreation.of(_acl("orders"))])
        controller.alter_user_scram_credentials([], [_upsert("alice", "SCRAM-SHA-256")])
        in_step("config, ACL and credential changes")
        pay = controller.image().partition("pay", 1)
        assert pay is not None
        target = [b for b in range(3) if b not in pay.replicas] + [pay.replicas[0]]
        assert controller.reassign_partitions({("pay", 1): target}) == {("pay", 1): None}
        wait_until(lambda: getattr(controller.image().partition("pay", 1), "replicas",
                                   None) == tuple(target), "the reassignment to complete", 60)
        in_step("a reassignment (the new replica caught up and joined the ISR)")
        brokers.pop(2).close()
        controller.fence_broker(2, "stopped by the test")
        in_step("broker 2 fenced (it left every ISR)")
        start(2)
        wait_until(lambda: all(2 in p.isr for t in controller.image().topics.values()
                               for p in t.partitions if 2 in p.replicas),
                   "broker 2 to join its ISRs again (AlterPartition from the leaders)", 60)
        in_step("broker 2 back in its ISRs")
        controller.delete_topics(["pay"], timeout_ms=30_000)
        in_step("a topic deleted")
    finally:
        for broker in brokers.values():
            broker.close()
