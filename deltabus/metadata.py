"""Cluster metadata: what the controller decides and every broker and client caches.

The controller's state is a log of metadata records (persisted as a Delta table); the in-memory
`MetadataState` is what replaying them gives, so loading after a restart is the same replay.
`MetadataImage` is an immutable snapshot of it, sent to brokers in heartbeats and to clients in
Metadata responses.

Invariants: a partition's leader is one of its replicas or -1 (no live leader); leader epochs only
grow; `version` grows with every change a broker or client could see.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from typing import Any

from deltabus.errors import DeltaBusError

NO_LEADER = -1


@dataclass(frozen=True)
class NewTopic:
    """A topic to create, as Kafka's NewTopic: partitions and replication factor (-1: the
    cluster defaults), or an explicit `replica_assignment` {partition: [broker, ...]} whose first
    broker is each partition's preferred leader."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: dict[str, str] | None = None
    replica_assignment: dict[int, list[int]] | None = None


@dataclass(frozen=True)
class TopicResult:
    name: str
    error: DeltaBusError | None = None
    topic_id: str = ""
    num_partitions: int = -1
    replication_factor: int = -1


# What DescribeGroups answers (AdminClient.describe_consumer_groups, the Kafka door, the CLI).
@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupDescription:
    """A group as DescribeGroups answers it: members carry their protocol metadata and
    assignment as the opaque bytes the clients sent."""

    group_id: str
    state: str
    protocol_type: str
    protocol: str
    generation_id: int
    leader_id: str
    members: list[MemberDescription]


CONTROLLER_NODE_ID = -1  # the controller's node id where an API names a node (FindCoordinator)


@dataclass(frozen=True)
class BrokerEndpoint:
    broker_id: int
    host: str
    port: int
    rack: str = ""
    kafka_port: int = 0  # the Kafka protocol listener (0: none)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class PartitionState:
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    # A reassignment in progress: replicas being added (catching up) and to be removed after.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    @property
    def offline_replicas(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.isr)


@dataclass(frozen=True)
class TopicState:
    name: str
    topic_id: str
    partitions: tuple[PartitionState, ...]
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0].replicas) if self.partitions else 0


@dataclass(frozen=True)
class MetadataImage:
    """An immutable snapshot of the cluster metadata at `version`."""

    version: int
    cluster_id: str
    controller_id: int
    brokers: tuple[BrokerEndpoint, ...]
    topics: dict[str, TopicState]
    # Where the partition tables live (`log_tables.layout`): Spark reads topics from there
    # directly, with no broker in the data path.
    log_root: str = ""

    def broker(self, broker_id: int) -> BrokerEndpoint | None:
        return next((b for b in self.brokers if b.broker_id == broker_id), None)

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        state = self.topics.get(topic)
        if state is None or not 0 <= partition < len(state.partitions):
            return None
        return state.partitions[partition]


def empty_image() -> MetadataImage:
    return MetadataImage(0, "", -1, (), {})


class MetadataState:
    """The controller's metadata, built only by replaying records. Driver only; not thread-safe
    (the controller holds its lock around it)."""

    def __init__(self) -> None:
        self.cluster_id = ""
        self.topics: dict[str, dict[str, Any]] = {}
        self.offset = -1  # offset of the last replayed record
        self.producer_ids_end = 0  # producer ids below this were handed out (or reserved)
        # A stable producer id per transactional id: an exactly-once pipeline that restarts
        # writes with the same id and sequences, so the leaders drop what it wrote before.
        self.transactional_ids: dict[str, int] = {}

    def replay(self, record: dict[str, Any]) -> None:
        """Apply one record. Record types follow KRaft's: cluster, topic, partition,
        partition_change, remove_topic, config, producer_ids."""
        kind = record["type"]
        if kind == "cluster":
            self.cluster_id = record["cluster_id"]
        elif kind == "topic":
            self.topics[record["name"]] = {
                "topic_id": record["topic_id"], "partitions": {}, "configs": {}}
        elif kind == "partition":
            self.topics[record["topic"]]["partitions"][record["partition"]] = {
                "replicas": list(record["replicas"]), "isr": list(record["isr"]),
                "leader": record["leader"], "leader_epoch": record["leader_epoch"]}
        elif kind == "partition_change":
            state = self.topics[record["topic"]]["partitions"][record["partition"]]
            for key in ("leader", "isr", "replicas", "leader_epoch", "adding", "removing"):
                if key in record:
                    state[key] = copy.copy(record[key])
        elif kind == "producer_ids":
            self.producer_ids_end = record["end"]
        elif kind == "transactional_id":
            self.transactional_ids[record["id"]] = record["producer_id"]
        elif kind == "remove_topic":
            self.topics.pop(record["name"], None)
        elif kind == "config":
            configs = self.topics[record["topic"]]["configs"]
            if record["value"] is None:
                configs.pop(record["key"], None)
            else:
                configs[record["key"]] = record["value"]
        else:
            raise ValueError(f"unknown metadata record type {kind!r}")

    def topic_states(self) -> dict[str, TopicState]:
        out = {}
        for name, t in self.topics.items():
            parts = tuple(
                PartitionState(p, s["leader"], s["leader_epoch"], tuple(s["replicas"]),
                               tuple(s["isr"]), tuple(s.get("adding", ())),
                               tuple(s.get("removing", ())))
                for p, s in sorted(t["partitions"].items())
            )
            out[name] = TopicState(name, t["topic_id"], parts, dict(t["configs"]))
        return out


def new_topic_id() -> str:
    return uuid.uuid4().hex


def new_cluster_id() -> str:
    return uuid.uuid4().hex[:22]
