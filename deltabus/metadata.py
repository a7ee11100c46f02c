"""Cluster metadata: what the controller decides and every broker and client caches.

The controller's state is a log of metadata records (persisted as a Delta table); its in-memory
state is what replaying them gives (`cluster.metadata_state`), so loading after a restart is the
same replay. `MetadataImage` is an immutable snapshot of it, given to clients in Metadata
responses. Brokers are not sent images: they replay the same records into an image of their own
(`MetadataBatch`, from the position they are at); users' SCRAM credentials go to brokers only.

Invariants: a partition's leader is one of its replicas or -1 (no live leader); leader epochs only
grow; `version` grows with every change a broker or client could see.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from deltabus.errors import (
    DeltaBusError,
    DuplicateResourceError,
    ResourceNotFoundError,
)
from deltabus.quotas import ClientQuotas
from deltabus.security.acls import AclBinding
from deltabus.security.scram import ScramCredential

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
    group_instance_id: str | None = None  # a static member's (KIP-345)


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


# What ShareGroupDescribe and DescribeShareGroupOffsets answer (share groups, KIP-932).
@dataclass(frozen=True)
class ShareMemberDescription:
    member_id: str
    client_id: str
    client_host: str
    member_epoch: int
    subscribed_topic_names: tuple[str, ...]
    assignment: dict[str, tuple[int, ...]]  # topic -> partitions
    rack_id: str = ""


@dataclass(frozen=True)
class ShareGroupDescription:
    group_id: str
    state: str  # Empty, Stable; Dead for a group the coordinator does not have
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: list[ShareMemberDescription]


@dataclass(frozen=True)
class ShareGroupOffset:
    """A share group's place in a partition: records below `start_offset` are done."""

    start_offset: int  # -1: the group never started the partition
    leader_epoch: int = -1
    lag: int = -1  # records past the start not yet acknowledged or archived; -1: not known


# ---- users' SCRAM credentials (Kafka's AlterUserScramCredentials / Describe...) ------------------

@dataclass(frozen=True)
class ScramCredentialUpsertion:
    """Set a user's credential for one mechanism, as Kafka's request carries it: the client
    salted the password (`scram.salted_password`), so the password itself never leaves it."""

    name: str
    mechanism: str  # "SCRAM-SHA-256" or "SCRAM-SHA-512"
    iterations: int
    salt: bytes = field(repr=False)
    salted_password: bytes = field(repr=False)


@dataclass(frozen=True)
class ScramCredentialDeletion:
    """Remove a user's credential for one mechanism."""

    name: str
    mechanism: str


@dataclass(frozen=True)
class ScramCredentialInfo:
    """A credential as DescribeUserScramCredentials shows it: never the salt or the keys."""

    mechanism: str
    iterations: int


@dataclass(frozen=True)
class UserScramCredentialsDescription:
    """One user's credentials, sorted by mechanism."""

    user: str
    scram_credential_infos: tuple[ScramCredentialInfo, ...]


ScramCredentials = Mapping[str, Mapping[str, ScramCredential]]  # user -> mechanism -> credential
# DescribeUserScramCredentials' answer: per user, the description or why there is none.
ScramDescriptions = dict[str, "UserScramCredentialsDescription | DeltaBusError"]


def describe_scram_credentials(credentials: ScramCredentials,
                               users: Sequence[str] | None) -> ScramDescriptions:
    """Kafka's DescribeUserScramCredentials over a set of credentials (the controller's, or a
    broker's image: Kafka's brokers answer it from their metadata). `users` None or empty:
    every user with a credential. A named user without one gets RESOURCE_NOT_FOUND, one named
    twice DUPLICATE_RESOURCE."""
    names = list(users or sorted(credentials))
    out: ScramDescriptions = {}
    for user in dict.fromkeys(names):
        if names.count(user) > 1:
            out[user] = DuplicateResourceError(
                f"Cannot describe SCRAM credentials for the same user twice in a single "
                f"request: {user}")
        elif not credentials.get(user):
            out[user] = ResourceNotFoundError(
                f"Attempt to describe a user credential that does not exist: {user}")
        else:
            out[user] = UserScramCredentialsDescription(user, tuple(
                ScramCredentialInfo(mechanism, c.iterations)
                for mechanism, c in sorted(credentials[user].items())))
    return out


CONTROLLER_NODE_ID = -1  # the controller's node id where an API names a node (FindCoordinator)


def coordinator_node(key: str, node_ids: Iterable[int]) -> int:
    """The broker Kafka clients are sent to for a group or transactional id: one of the live
    brokers `node_ids`, by the key's hash, so keys spread over the brokers as Kafka's
    coordinators spread over the leaders of __consumer_offsets (-1: none is up). The
    coordinators themselves live in the driver and every broker passes their requests on, so
    a broker that leaves moves only its own keys, whose clients look their coordinator up
    again as they would on Kafka."""
    ids = sorted(node_ids)
    return ids[zlib.crc32(key.encode()) % len(ids)] if ids else -1


@dataclass(frozen=True)
class ListenerEndpoint:
    """Where clients reach one named listener of a node (its advertised address)."""

    name: str
    door: str  # deltabus.listeners.GRPC or KAFKA
    host: str
    port: int


class LogReport(NamedTuple):
    """A led partition's log as its leader reports it to the controller, now and then: what
    consumer lag and the console read of it."""

    high_watermark: int
    size_bytes: int  # of its Delta table's live data files
    files: int


@dataclass(frozen=True)
class BrokerEndpoint:
    """A node as the metadata names it. `host` and `port` are its inter-broker gRPC listener
    (followers fetch there), `kafka_port` its first Kafka listener's port (0: none);
    `listeners` every named listener it has. Clients are told the endpoints of the listener
    they came in on (`on_listener`), never the others."""

    broker_id: int
    host: str
    port: int
    rack: str = ""
    kafka_port: int = 0
    listeners: tuple[ListenerEndpoint, ...] = ()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def listener(self, door: str, name: str) -> ListenerEndpoint | None:
        return next((e for e in self.listeners if e.door == door and e.name == name), None)

    def on_listener(self, name: str) -> BrokerEndpoint | None:
        """This node as a client of gRPC listener `name` sees it: that listener's host and
        port, the port of the Kafka listener of the same name (0: none), no other listener.
        A node without named listeners, or `name` "", is as it is; None: it has no `name`."""
        if not name or not self.listeners:
            return self
        grpc = self.listener("grpc", name)
        if grpc is None:
            return None
        kafka = self.listener("kafka", name)
        return BrokerEndpoint(self.broker_id, grpc.host, grpc.port, self.rack,
                              kafka.port if kafka is not None else 0)

    def kafka_address(self, name: str) -> tuple[str, int] | None:
        """Where a client of Kafka listener `name` reaches this node (None: not there)."""
        if not name or not self.listeners:
            return (self.host, self.kafka_port) if self.kafka_port > 0 else None
        kafka = self.listener("kafka", name)
        return (kafka.host, kafka.port) if kafka is not None else None


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


# Kafka's transaction states (TransactionState), by the names ListTransactions answers.
EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT = "Empty", "Ongoing", "PrepareCommit", "PrepareAbort"
COMPLETE_COMMIT, COMPLETE_ABORT = "CompleteCommit", "CompleteAbort"
TXN_STATES = (EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT)
# The states whose partitions may hold records of the transaction with no marker yet.
TXN_OPEN_STATES = (ONGOING, PREPARE_COMMIT, PREPARE_ABORT)


@dataclass(frozen=True)
class TransactionMetadata:
    """A transactional id's transaction state (Kafka's TransactionMetadata), as its last
    `TransactionRecord` says."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    partitions: frozenset[tuple[str, int]] = frozenset()
    groups: frozenset[str] = frozenset()
    start_ms: int = -1
    update_ms: int = -1


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
    # Users' SCRAM credentials (Kafka's ScramImage): brokers get them with the metadata, from
    # the controller's heartbeat answer, to authenticate clients. Never in a client's Metadata
    # answer (`rpc.codec.image_to_proto` leaves them out) nor in a repr.
    scram_credentials: ScramCredentials = field(default_factory=dict, repr=False)
    # The ACLs (Kafka's AclsImage): brokers authorize requests against them.
    acls: tuple[AclBinding, ...] = ()
    # The key producer ids are bound to principals with (cluster/producer_id_control.py):
    # brokers check a producer's id with it. Like the credentials, never in a client's answer.
    producer_id_key: bytes = field(default=b"", repr=False)
    # Client quotas (Kafka's ClientQuotasImage): entity -> key -> value. Brokers throttle by
    # them; never in a client's Metadata answer.
    client_quotas: ClientQuotas = field(default_factory=dict)
    # The producers with a transaction open on each partition (the transaction coordinator's
    # AddPartitionsToTxn, until its marker): a leader that takes a partition over holds the
    # last stable offset at the first record of each, never serving read_committed past it.
    open_transactions: dict[tuple[str, int], frozenset[int]] = field(default_factory=dict)
    # Group configs (kafka-configs.sh --entity-type groups): group -> its overrides. Share
    # groups' leaders and coordinator read theirs here (config.ShareGroupSettings).
    group_configs: dict[str, dict[str, str]] = field(default_factory=dict)

    def broker(self, broker_id: int) -> BrokerEndpoint | None:
        return next((b for b in self.brokers if b.broker_id == broker_id), None)

    def on_listener(self, name: str) -> MetadataImage:
        """The image as a client of gRPC listener `name` is told it: each broker at its
        endpoint of that listener (`BrokerEndpoint.on_listener`), brokers without it left out."""
        if not name:
            return self
        brokers = (b.on_listener(name) for b in self.brokers)
        return replace(self, brokers=tuple(b for b in brokers if b is not None))

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        state = self.topics.get(topic)
        if state is None or not 0 <= partition < len(state.partitions):
            return None
        return state.partitions[partition]

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.scram_credentials.get(user, {}).get(mechanism)


@dataclass(frozen=True)
class MetadataPosition:
    """Where a broker is in the metadata records (`cluster.metadata_deltas`): it has replayed
    every record up to `version` and the first `index` records of the version after it; or,
    `snapshot`, the first `index` records of the snapshot of `version`, into a state of their
    own that replaces its metadata once the snapshot is whole. A broker publishes an image only
    at a version's end: at a position with `index` 0 that is no snapshot's."""

    version: int
    index: int = 0
    snapshot: bool = False

    @property
    def at_version_end(self) -> bool:
        return self.index == 0 and not self.snapshot


@dataclass(frozen=True)
class MetadataBatch:
    """What a heartbeat answer carries a broker (KRaft's metadata fetch): records that take it
    from `start` (the position it asked from, or a snapshot's first record) to `end`. Each is a
    metadata record in its serialized form (`cluster.metadata_records.serialize`), so this
    module and the doors never look inside."""

    start: MetadataPosition
    end: MetadataPosition
    records: tuple[bytes, ...] = field(repr=False)


def empty_image() -> MetadataImage:
    return MetadataImage(0, "", -1, (), {})


def new_topic_id() -> str:
    return uuid.uuid4().hex


def new_cluster_id() -> str:
    return uuid.uuid4().hex[:22]


# ---- brokers joining and leaving (cluster/balancer.py, cluster/scaling.py) ----------------

@dataclass(frozen=True)
class BrokerLoad:
    """What one broker holds: replicas, preferred leaderships and bytes in per second (as a
    leader from producers and as a follower from its leaders)."""

    broker_id: int
    rack: str
    replicas: int
    leaders: int
    bytes_in_per_s: float


@dataclass(frozen=True)
class BalancePlan:
    """`moves`: each changed partition's target replicas (first: preferred leader);
    `before`/`after`: the spread by broker; `unmet`: the goals the plan could not meet."""

    moves: dict[tuple[str, int], list[int]]
    before: list[BrokerLoad]
    after: list[BrokerLoad]
    unmet: list[str] = field(default_factory=list)
    copies: int = 0  # replicas the moves add, each a copy (a new leader order copies nothing)

    def reassignment_json(self) -> dict[str, object]:
        """The plan as kafka-reassign-partitions.sh reads it."""
        return {"version": 1, "partitions": [
            {"topic": t, "partition": p, "replicas": replicas, "log_dirs": ["any"] * len(replicas)}
            for (t, p), replicas in sorted(self.moves.items())]}


@dataclass(frozen=True)
class ScaleStatus:
    """Where the last scale of the cluster is (`deltabus cluster scale`): `state` (idle,
    scaling, done, failed), the broker count it aims at, `step` (what it is doing, what it
    did, or why it failed), and the cluster's brokers now."""

    state: str
    brokers: int
    step: str
    members: tuple[int, ...] = ()
