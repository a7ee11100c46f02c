"""Typed metadata records keep the stored form deltabus has always written, byte for byte, and
every record, broker records too, comes back from its serialized form (what brokers are sent)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from deltabus.cluster.metadata_records import (
    BROKER_RECORD_TYPES,
    PERSISTED_RECORD_TYPES,
    AccessControlEntryRecord,
    BrokerRegistrationChangeRecord,
    ClientQuotaRecord,
    ClusterIdRecord,
    ConfigRecord,
    FenceBrokerRecord,
    GroupConfigRecord,
    MetadataRecord,
    OfflineReplicasRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdKeyRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveAccessControlEntryRecord,
    RemoveSchemaRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    SchemaCompatibilityRecord,
    SchemaRecord,
    TopicRecord,
    TransactionalIdRecord,
    TransactionRecord,
    TxnOffsetCommitRecord,
    UnfenceBrokerRecord,
    UserScramCredentialRecord,
    deserialize,
    from_stored,
    serialize,
    to_stored,
)
from deltabus.metadata import BrokerEndpoint, ListenerEndpoint
from deltabus.security.acls import AclBinding, Operation, PatternType, Permission, ResourceType

# Each record as the dict-based controller built it, and the same record typed.
OLD_AND_TYPED: list[tuple[dict[str, Any], MetadataRecord]] = [
    ({"type": "cluster", "cluster_id": "c-1"}, ClusterIdRecord("c-1")),
    ({"type": "topic", "name": "orders", "topic_id": "t1"}, TopicRecord("orders", "t1")),
    ({"type": "partition", "topic": "orders", "partition": 0, "replicas": [1, 2], "isr": [1, 2],
      "leader": 1, "leader_epoch": 0},
     PartitionRecord("orders", 0, (1, 2), (1, 2), 1, 0)),
    ({"type": "config", "topic": "orders", "key": "retention.ms", "value": "1000"},
     ConfigRecord("orders", "retention.ms", "1000")),
    ({"type": "config", "topic": "orders", "key": "retention.ms", "value": None},
     ConfigRecord("orders", "retention.ms", None)),
    ({"type": "partition_change", "topic": "orders", "partition": 0, "isr": [1]},
     PartitionChangeRecord("orders", 0, isr=(1,))),
    ({"type": "partition_change", "topic": "orders", "partition": 0, "leader": 2, "isr": [2],
      "leader_epoch": 1},
     PartitionChangeRecord("orders", 0, leader=2, leader_epoch=1, isr=(2,))),
    ({"type": "partition_change", "topic": "orders", "partition": 0, "replicas": [3, 2, 1],
      "adding": [3], "removing": [1]},
     PartitionChangeRecord("orders", 0, replicas=(3, 2, 1), adding_replicas=(3,),
                           removing_replicas=(1,))),
    ({"type": "partition_change", "topic": "orders", "partition": 0, "replicas": [3, 2],
      "isr": [3, 2], "adding": [], "removing": [], "leader": 3, "leader_epoch": 2},
     PartitionChangeRecord("orders", 0, leader=3, leader_epoch=2, isr=(3, 2), replicas=(3, 2),
                           adding_replicas=(), removing_replicas=())),
    ({"type": "remove_topic", "name": "orders", "topic_id": "t1"},
     RemoveTopicRecord("orders", "t1")),
    ({"type": "remove_topic", "name": "orders"}, RemoveTopicRecord("orders")),
    ({"type": "producer_ids", "end": 2000}, ProducerIdsRecord(2000)),
    ({"type": "transactional_id", "id": "tx-1", "producer_id": 7},
     TransactionalIdRecord("tx-1", 7)),
    # bytes as base64 text
    ({"type": "user_scram_credential", "name": "alice", "mechanism": "SCRAM-SHA-256",
      "salt": "c2FsdA==", "stored_key": "AAEC", "server_key": "/w==", "iterations": 8192},
     UserScramCredentialRecord("alice", "SCRAM-SHA-256", b"salt", b"\x00\x01\x02", b"\xff",
                               8192)),
    ({"type": "remove_user_scram_credential", "name": "alice", "mechanism": "SCRAM-SHA-512"},
     RemoveUserScramCredentialRecord("alice", "SCRAM-SHA-512")),
    ({"type": "producer_id_key", "key": "AAEC"}, ProducerIdKeyRecord(b"\x00\x01\x02")),
    # ACLs: Kafka's codes as numbers
    ({"type": "access_control_entry", "id": "a1", "resource_type": 2, "resource_name": "pay",
      "pattern_type": 4, "principal": "User:alice", "host": "*", "operation": 3,
      "permission": 3},
     AccessControlEntryRecord.of("a1", AclBinding(
         ResourceType.TOPIC, "pay", PatternType.PREFIXED, "User:alice", "*", Operation.READ,
         Permission.ALLOW))),
    ({"type": "remove_access_control_entry", "id": "a1"}, RemoveAccessControlEntryRecord("a1")),
    # client quotas: a default entity's name is null
    ({"type": "client_quota", "entity_types": ["client-id", "user"],
      "entity_names": ["app", None], "key": "producer_byte_rate", "value": 1024.0},
     ClientQuotaRecord(("client-id", "user"), ("app", None), "producer_byte_rate", 1024.0)),
    ({"type": "client_quota", "entity_types": ["user"], "entity_names": ["alice"],
      "key": "request_percentage", "value": None},
     ClientQuotaRecord(("user",), ("alice",), "request_percentage", None)),
    # group configs (a share group's): a null value removes the override
    ({"type": "group_config", "group": "workers", "key": "share.auto.offset.reset",
      "value": "earliest"},
     GroupConfigRecord("workers", "share.auto.offset.reset", "earliest")),
    ({"type": "group_config", "group": "workers", "key": "share.auto.offset.reset",
      "value": None},
     GroupConfigRecord("workers", "share.auto.offset.reset", None)),
    ({"type": "transaction", "id": "tx", "producer_id": 7, "producer_epoch": 2,
      "state": "Ongoing", "timeout_ms": 60000, "topics": ["orders", "orders"],
      "partitions": [0, 1], "groups": ["g"], "start_ms": 5, "update_ms": 6},
     TransactionRecord("tx", 7, 2, "Ongoing", 60000, ("orders", "orders"), (0, 1), ("g",), 5,
                       6)),
    ({"type": "txn_offset_commit", "id": "tx", "group_id": "g", "topics": ["orders"],
      "partitions": [0], "offsets": [42], "leader_epochs": [-1], "metadata": [""]},
     TxnOffsetCommitRecord("tx", "g", ("orders",), (0,), (42,), (-1,), ("",))),
    ({"type": "schema", "subject": "orders-value", "version": 2, "schema_id": 7,
      "schema_type": "AVRO", "schema": '"string"', "reference_names": ["shop.Money"],
      "reference_subjects": ["money"], "reference_versions": [1], "deleted": False},
     SchemaRecord("orders-value", 2, 7, "AVRO", '"string"', ("shop.Money",), ("money",), (1,))),
    ({"type": "remove_schema", "subject": "orders-value", "version": 2},
     RemoveSchemaRecord("orders-value", 2)),
    ({"type": "schema_compatibility", "subject": "", "compatibility": "FULL"},
     SchemaCompatibilityRecord("", "FULL")),
    ({"type": "schema_compatibility", "subject": "orders-value", "compatibility": None},
     SchemaCompatibilityRecord("orders-value", None)),
]


@pytest.mark.parametrize(("old", "typed"), OLD_AND_TYPED)
def test_typed_record_has_the_old_stored_form(old: dict[str, Any],
                                              typed: MetadataRecord) -> None:
    assert to_stored(typed) == old
    # What the metadata log writes (MetadataLog.append): the same JSON text.
    assert json.dumps(to_stored(typed), sort_keys=True) == json.dumps(old, sort_keys=True)
    assert from_stored(old) == typed
    assert from_stored(json.loads(json.dumps(old))) == typed


def test_every_persisted_type_is_covered() -> None:
    assert {typed.type for _, typed in OLD_AND_TYPED} == set(PERSISTED_RECORD_TYPES)


def test_stored_records_hold_no_tuples_and_typed_records_no_lists() -> None:
    record = from_stored({"type": "partition", "topic": "t", "partition": 0, "replicas": [1],
                          "isr": [1], "leader": 1, "leader_epoch": 0})
    assert isinstance(record, PartitionRecord)
    assert record.replicas == (1,) and record.isr == (1,)
    assert to_stored(record)["replicas"] == [1]


def test_unknown_keys_are_ignored_and_unknown_types_refused() -> None:
    assert from_stored({"type": "topic", "name": "a", "topic_id": "x", "later": 1}) == \
        TopicRecord("a", "x")
    with pytest.raises(ValueError, match="unknown metadata record type"):
        from_stored({"type": "no_such_type"})
    with pytest.raises(ValueError, match="unknown metadata record type"):
        from_stored({"name": "a"})


def test_a_credential_record_that_is_not_base64_is_refused() -> None:
    stored = to_stored(UserScramCredentialRecord("a", "SCRAM-SHA-256", b"s", b"k", b"k", 4096))
    with pytest.raises(ValueError, match="stored_key is not base64"):
        from_stored({**stored, "stored_key": "not base64!"})


def test_credential_records_show_no_salt_or_keys() -> None:
    record = UserScramCredentialRecord("alice", "SCRAM-SHA-256", b"pepper", b"stored-secret",
                                       b"server-secret", 4096)
    text = repr(record)
    assert "alice" in text and "4096" in text
    assert not any(s in text for s in ("pepper", "stored-secret", "server-secret"))


def test_broker_records_are_never_written() -> None:
    register = RegisterBrokerRecord(BrokerEndpoint(1, "127.0.0.1", 9000), 5, 123, 2)
    assert not register.persisted and register.broker_id == 1
    with pytest.raises(ValueError, match="never written"):
        to_stored(register)
    with pytest.raises(ValueError, match="never written"):
        to_stored(FenceBrokerRecord(1, 5))
    assert "register_broker" not in PERSISTED_RECORD_TYPES


def test_records_are_frozen() -> None:
    record = PartitionChangeRecord("orders", 0, isr=(1,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.isr = (2,)  # type: ignore[misc]


def test_producer_id_records_make_no_new_version() -> None:
    assert not ProducerIdsRecord(1000).changes_image
    assert not TransactionalIdRecord("tx", 1).changes_image
    assert PartitionChangeRecord("orders", 0, isr=(1,)).changes_image
    assert FenceBrokerRecord(1, 5).changes_image


BROKER_RECORDS: list[MetadataRecord] = [
    RegisterBrokerRecord(BrokerEndpoint(1, "10.0.0.1", 9000, "rack-a", 9092, (
        ListenerEndpoint("INTERNAL", "grpc", "10.0.0.1", 9000),
        ListenerEndpoint("EXTERNAL", "kafka", "broker1.example", 9092))), 5, 123, 2),
    RegisterBrokerRecord(BrokerEndpoint(2, "127.0.0.1", 9001), 6, 124, 3),
    UnfenceBrokerRecord(1, 5),
    FenceBrokerRecord(1, 5),
    BrokerRegistrationChangeRecord(1, 5, in_controlled_shutdown=True),
    OfflineReplicasRecord(1, 5, frozenset({("orders", 0), ("pay", 3)})),
    OfflineReplicasRecord(1, 5, frozenset()),
]


@pytest.mark.parametrize("record", [typed for _, typed in OLD_AND_TYPED] + BROKER_RECORDS,
                         ids=lambda r: r.type)
def test_every_record_comes_back_from_its_serialized_form(record: MetadataRecord) -> None:
    data = serialize(record)
    assert deserialize(data) == record
    if record.persisted:  # the stored form, as JSON
        assert json.loads(data) == to_stored(record)


def test_every_broker_record_type_is_covered() -> None:
    assert {r.type for r in BROKER_RECORDS} == set(BROKER_RECORD_TYPES)
    assert not set(BROKER_RECORD_TYPES) & set(PERSISTED_RECORD_TYPES)


@pytest.mark.parametrize("data", [b"not json", b"[1]", b'{"type": "no_such_type"}',
                                  b'{"type": "fence_broker", "broker_id": 1}',
                                  b'{"type": "register_broker", "broker_epoch": 1, "pid": 1,'
                                  b' "registered_version": 1, "endpoint": {"host": "h"}}',
                                  b"\xff\xfe"])
def test_what_is_no_serialized_record_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        deserialize(data)
