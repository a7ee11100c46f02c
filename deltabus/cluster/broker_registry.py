"""Which brokers are registered, with which epoch, and which may lead (the state and handlers of
KRaft's ClusterControlManager, and its BrokerHeartbeatManager's bookkeeping; `cluster_control`
runs them under the controller's lock). Runs in the driver, inside the controller.

Brokers are not in the metadata log: they register at every start (a new broker epoch each
time). The registry changes only by replaying broker registration records, which the handlers
here return and change nothing (brokers replay them too, into a registry of their own:
`metadata_loader`); the heartbeat times and applied versions in
`BrokerHeartbeatManager` are contact bookkeeping, not metadata, and change directly.

Invariants: a broker has at most one registration, and only its epoch is accepted (any other gets
STALE_BROKER_EPOCH); a new registration stays fenced (not in metadata, leads nothing) until the
broker has applied the metadata of its registration; broker epochs only grow.

Not thread-safe: the controller holds its lock around every call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from deltabus import errors
from deltabus.cluster.metadata_records import (
    BrokerRegistrationChangeRecord,
    ControllerResult,
    FenceBrokerRecord,
    MetadataRecord,
    OfflineReplicasRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
)
from deltabus.metadata import BrokerEndpoint


@dataclass(frozen=True)
class BrokerRegistration:
    endpoint: BrokerEndpoint
    epoch: int
    pid: int
    registered_version: int  # the metadata version it must apply before it is unfenced
    fenced: bool = True
    # Controlled shutdown: leadership moves off it, then its heartbeat tells it to stop.
    in_controlled_shutdown: bool = False
    # (topic, partition) replicas it cannot serve (their tables are lost): no leadership, no ISR
    offline_replicas: frozenset[tuple[str, int]] = frozenset()


@dataclass
class BrokerRegistry:
    """The current registration of each broker, built only by replaying broker records."""

    # The last epoch given out; the next registration gets a higher one.
    last_broker_epoch: int = 0
    registrations: dict[int, BrokerRegistration] = field(default_factory=dict)

    def replay(self, record: MetadataRecord) -> None:
        """Apply one broker registration record. A record naming an epoch that is not the
        broker's current one is stale and changes nothing."""
        if isinstance(record, RegisterBrokerRecord):
            self.last_broker_epoch = max(self.last_broker_epoch, record.broker_epoch)
            self.registrations[record.broker_id] = BrokerRegistration(
                record.endpoint, record.broker_epoch, record.pid, record.registered_version)
            return
        assert isinstance(record, (UnfenceBrokerRecord, FenceBrokerRecord,
                                   BrokerRegistrationChangeRecord, OfflineReplicasRecord)), record
        current = self.registrations.get(record.broker_id)
        if current is None or current.epoch != record.broker_epoch:
            return
        if isinstance(record, FenceBrokerRecord):
            del self.registrations[record.broker_id]
        elif isinstance(record, UnfenceBrokerRecord):
            self.registrations[record.broker_id] = dataclasses.replace(current, fenced=False)
        elif isinstance(record, OfflineReplicasRecord):
            self.registrations[record.broker_id] = dataclasses.replace(
                current, offline_replicas=record.replicas)
        else:
            self.registrations[record.broker_id] = dataclasses.replace(
                current, in_controlled_shutdown=record.in_controlled_shutdown)

    def replayed(self, records: Iterable[MetadataRecord]) -> BrokerRegistry:
        """A copy with `records` (broker records; others are skipped) applied: what the
        registry will be once they are committed. This registry does not change."""
        after = BrokerRegistry(self.last_broker_epoch, dict(self.registrations))
        for record in records:
            if not record.persisted:
                after.replay(record)
        return after

    def snapshot(self) -> list[MetadataRecord]:
        """Records that, replayed into an empty registry, give every registration as it is
        (`last_broker_epoch` aside: only the controller hands out epochs)."""
        records: list[MetadataRecord] = []
        for broker_id, r in sorted(self.registrations.items()):
            records.append(RegisterBrokerRecord(r.endpoint, r.epoch, r.pid,
                                                r.registered_version))
            if not r.fenced:
                records.append(UnfenceBrokerRecord(broker_id, r.epoch))
            if r.offline_replicas:
                records.append(OfflineReplicasRecord(broker_id, r.epoch, r.offline_replicas))
            if r.in_controlled_shutdown:
                records.append(BrokerRegistrationChangeRecord(broker_id, r.epoch,
                                                              in_controlled_shutdown=True))
        return records

    def get(self, broker_id: int) -> BrokerRegistration | None:
        return self.registrations.get(broker_id)

    def live_broker_ids(self) -> list[int]:
        """Registered and unfenced brokers, in id order (what metadata lists)."""
        return sorted(b for b, r in self.registrations.items() if not r.fenced)

    def leader_candidates(self, partition: tuple[str, int] | None = None) -> set[int]:
        """Brokers that may lead or join an ISR: live and not shutting down (and, for a
        `partition` (topic, partition), not reporting their replica of it offline)."""
        return {b for b, r in self.registrations.items()
                if not r.fenced and not r.in_controlled_shutdown
                and (partition is None or partition not in r.offline_replicas)}

    def offline(self, partition: tuple[str, int]) -> set[int]:
        """Registered brokers that report their replica of `partition` offline."""
        return {b for b, r in self.registrations.items() if partition in r.offline_replicas}

    def live_endpoints(self) -> tuple[BrokerEndpoint, ...]:
        return tuple(self.registrations[b].endpoint for b in self.live_broker_ids())

    def racks(self, broker_ids: Iterable[int]) -> dict[int, str]:
        return {b: self.registrations[b].endpoint.rack for b in broker_ids}

    def check_epoch(self, broker_id: int, epoch: int) -> BrokerRegistration:
        """The broker's registration, if `epoch` is its current one."""
        reg = self.registrations.get(broker_id)
        if reg is None or reg.epoch != epoch:
            raise errors.StaleBrokerEpochError(
                f"broker {broker_id} epoch {epoch} is not the registered one")
        return reg


# ---- handlers: records to write, changing nothing --------------------------------------------

def register_broker(registry: BrokerRegistry, endpoint: BrokerEndpoint, pid: int, *,
                    members: Collection[int], held: set[int],
                    version: int) -> ControllerResult[int]:
    """A broker (re)starts: a new epoch, fenced until it catches up with metadata `version`.
    A registration still current is of an older incarnation (Spark retried the task elsewhere
    before it was fenced): it is fenced now, so its partitions get new leader epochs. The answer
    is the new broker epoch."""
    broker_id = endpoint.broker_id
    if broker_id not in members:
        raise errors.InvalidRequestError(
            f"broker id {broker_id} is not one of this cluster's brokers {sorted(members)}")
    if broker_id in held:
        raise errors.BrokerNotAvailableError(
            f"broker {broker_id} is held down until it is started again")
    records: list[MetadataRecord] = []
    old = registry.get(broker_id)
    if old is not None:
        records.append(FenceBrokerRecord(broker_id, old.epoch))
    epoch = registry.last_broker_epoch + 1
    records.append(RegisterBrokerRecord(endpoint, epoch, pid, version))
    return ControllerResult(records, epoch)


def heartbeat(registry: BrokerRegistry, broker_id: int, epoch: int, applied_version: int,
              offline_replicas: frozenset[tuple[str, int]] = frozenset()
              ) -> ControllerResult[BrokerRegistration]:
    """A heartbeat from a registered broker: one that applied the metadata of its registration
    is unfenced (it may lead again), after the replicas it reports offline are recorded, so it
    is never elected for one of them. The answer is its registration."""
    reg = registry.check_epoch(broker_id, epoch)
    records: list[MetadataRecord] = []
    if offline_replicas != reg.offline_replicas:
        records.append(OfflineReplicasRecord(broker_id, epoch, offline_replicas))
    if reg.fenced and applied_version >= reg.registered_version:
        records.append(UnfenceBrokerRecord(broker_id, epoch))
    return ControllerResult(records, reg)


def fence_broker(registry: BrokerRegistry, broker_id: int) -> list[MetadataRecord]:
    """Declare a broker dead; nothing to do if it is not registered."""
    reg = registry.get(broker_id)
    return [] if reg is None else [FenceBrokerRecord(broker_id, reg.epoch)]


def shut_down_broker(registry: BrokerRegistry, broker_id: int) -> list[MetadataRecord]:
    """Controlled shutdown of a live broker; nothing to do if it is not running."""
    reg = registry.get(broker_id)
    if reg is None or reg.fenced:
        return []
    return [BrokerRegistrationChangeRecord(broker_id, reg.epoch, in_controlled_shutdown=True)]


# ---- contact bookkeeping ---------------------------------------------------------------------

@dataclass
class BrokerContact:
    last_heartbeat_s: float  # time.monotonic() of the last heartbeat (or the registration)
    applied_version: int = 0  # the metadata version the broker last said it applied


class BrokerHeartbeatManager:
    """When each broker was last heard from and which metadata it applied. Not metadata: it
    changes with every heartbeat and starts afresh with every registration."""

    def __init__(self) -> None:
        self._contacts: dict[int, BrokerContact] = {}

    def register(self, broker_id: int, now_s: float) -> None:
        self._contacts[broker_id] = BrokerContact(now_s)

    def touch(self, broker_id: int, now_s: float) -> None:
        self._contacts[broker_id].last_heartbeat_s = now_s

    def touch_current(self, registry: BrokerRegistry, broker_id: int, epoch: int,
                      now_s: float) -> None:
        """Count a heartbeat as contact the moment it arrives, without the controller's lock:
        one waiting for the lock behind a slow metadata commit (a store answering in seconds)
        must not expire its broker's session, and fencing it would bring more commits, so
        more waiting (Kafka's controller also updates the contact time outside its event
        queue). Only the current registration's epoch counts. Dict reads and an attribute
        write: safe beside the locked writers."""
        registration = registry.registrations.get(broker_id)
        contact = self._contacts.get(broker_id)
        if registration is not None and contact is not None and registration.epoch == epoch:
            contact.last_heartbeat_s = max(contact.last_heartbeat_s, now_s)

    def set_applied_version(self, broker_id: int, version: int) -> bool:
        """Returns True when the version changed (waiters on it should wake)."""
        contact = self._contacts[broker_id]
        changed = contact.applied_version != version
        contact.applied_version = version
        return changed

    def applied_version(self, broker_id: int) -> int:
        return self._contacts[broker_id].applied_version

    def expired(self, registry: BrokerRegistry, now_s: float, timeout_s: float) -> list[int]:
        """Registered brokers silent for longer than `timeout_s`."""
        return [b for b in registry.registrations
                if now_s - self._contacts[b].last_heartbeat_s > timeout_s]
