"""The public API is what `deltabus.__all__` names; this pins it so changes are deliberate."""

import deltabus


def test_public_api_is_pinned():
    assert sorted(deltabus.__all__) == [
        "AcknowledgeType", "AclBinding", "AclBindingFilter", "AdminClient", "AlterConfigOp",
        "Cluster",
        "CommitFailedError", "ConfigEntry", "Consumer",
        "ConsumerRebalanceListener",
        "ConsumerRecord", "DeltaBusError", "ExactlyOncePipeline", "FutureRecordMetadata",
        "NewTopic",
        "OffsetAndMetadata", "Producer", "RecordMetadata", "SchemaDeserializer",
        "ScramCredentialInfo", "ShareConsumer", "ShareRecord", "TopicPartition",
        "UserScramCredentialDeletion", "UserScramCredentialUpsertion",
        "UserScramCredentialsDescription", "acls", "errors", "local_spark",
    ]
    for name in deltabus.__all__:
        assert hasattr(deltabus, name), name


def test_every_kafka_error_is_a_deltabus_error():
    for cls in deltabus.errors.ERRORS_BY_CODE.values():
        assert issubclass(cls, deltabus.DeltaBusError)
