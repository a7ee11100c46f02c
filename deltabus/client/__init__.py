"""What runs in the user's process: `Producer` (with its record accumulator, sender and
transaction manager), `Consumer` (with its subscription state, fetcher, offset fetcher, group
coordinator client and assignors), `AdminClient`, `ExactlyOncePipeline`, and the `ClusterClient`
they share.

Imports allowed: the pure modules (`deltabus.errors`, `config`, `metadata`, `records`,
`partitioner`), pyarrow, grpc and the wire code of `deltabus.rpc` (`v1`, `codec`, `status`).
Never deltalake, pyspark or a server module: `pip install` users and notebooks load the clients
fast, and their tests need no Spark (tests/client/test_layering.py pins this in a fresh
interpreter).
"""

from deltabus.client.admin import (
    AclBinding,
    AclBindingFilter,
    AdminClient,
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)
from deltabus.client.consumer import (
    CommitFailedError,
    Consumer,
    ConsumerRebalanceListener,
    OffsetAndMetadata,
    TopicPartition,
)
from deltabus.client.exactly_once import ExactlyOncePipeline
from deltabus.client.producer import FutureRecordMetadata, Producer, RecordMetadata
from deltabus.client.schema_cache import SchemaDeserializer
from deltabus.client.share_consumer import AcknowledgeType, ShareConsumer, ShareRecord

__all__ = [
    "AcknowledgeType",
    "AclBinding",
    "AclBindingFilter",
    "AdminClient",
    "CommitFailedError",
    "Consumer",
    "ConsumerRebalanceListener",
    "ExactlyOncePipeline",
    "FutureRecordMetadata",
    "OffsetAndMetadata",
    "Producer",
    "RecordMetadata",
    "SchemaDeserializer",
    "ScramCredentialInfo",
    "ShareConsumer",
    "ShareRecord",
    "TopicPartition",
    "UserScramCredentialDeletion",
    "UserScramCredentialUpsertion",
    "UserScramCredentialsDescription",
]
