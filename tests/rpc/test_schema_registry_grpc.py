"""The schema registry over gRPC on a running cluster: the same registry whichever server is
asked (a broker forwards every call to the controller), Confluent's error codes in the answer,
and the cluster's ACLs guard it (tests/cluster/test_schema_registry.py: the REST door)."""

from __future__ import annotations

import json

import pytest

from deltabus import AdminClient
from deltabus.schemas import Compatibility, SchemaRegistryError, SchemaType

PAYMENT = json.dumps({"type": "record", "name": "Payment",
                      "fields": [{"name": "id", "type": "string"}]})
WITH_AMOUNT = json.dumps({"type": "record", "name": "Payment",
                          "fields": [{"name": "id", "type": "string"},
                                     {"name": "amount", "type": "double"}]})


def test_a_schema_registered_at_a_broker_is_the_controllers_and_every_server_sees_it(
        cluster, topic_name) -> None:
    subject = f"{topic_name}-value"
    broker = cluster.controller.image().brokers[0]
    with AdminClient(f"{broker.host}:{broker.port}") as at_broker, \
            AdminClient(cluster.bootstrap_servers) as at_driver:
        held = at_broker.schema_registry.register_schema(subject, "AVRO", PAYMENT, [])
        assert held.version == 1
        assert cluster.controller.schema_registry.subject_version(subject, -1, False) == held
        stored = at_driver.schema_registry.schema_by_id(held.schema_id)
        assert stored.schema_type == SchemaType.AVRO and json.loads(stored.text) == json.loads(
            PAYMENT)
        assert subject in at_driver.schema_registry.subjects(False, "")
        assert at_broker.schema_registry.test_compatibility(subject, None, "AVRO", WITH_AMOUNT,
                                                            [])  # a field without a default
        with pytest.raises(SchemaRegistryError) as refused:
            at_broker.schema_registry.register_schema(subject, "AVRO", WITH_AMOUNT, [])
        assert refused.value.error_code == 409
        assert at_broker.schema_registry.set_compatibility_level(subject, "FORWARD") == \
            Compatibility.FORWARD
        assert at_driver.schema_registry.compatibility_level(subject, False) == \
            Compatibility.FORWARD
        assert at_broker.schema_registry.register_schema(subject, "AVRO", WITH_AMOUNT,
                                                         []).version == 2
        assert [v.version for v in at_driver.schema_registry.subject_versions(
            subject, False)] == [1, 2]
        with pytest.raises(SchemaRegistryError) as missing:
            at_broker.schema_registry.subject_version(subject, 9, False)
        assert missing.value.error_code == 40402
        assert at_broker.schema_registry.delete_subject(subject, False) == [1, 2]
        assert subject not in at_driver.schema_registry.subjects(False, "")
