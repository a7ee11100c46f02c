"""deltabus: Kafka-style event streaming inside Apache Spark.

Every topic-partition is a Delta table.

The public API is what `__all__` names (a test pins it); everything else may change. `Cluster`
and `local_spark` load on first use, so `import deltabus` (and `import deltabus.client`) stays
free of Spark and Delta for users who only produce and consume. `pip install deltabus` installs
only what the clients need; without the server extra, asking for `Cluster` or `local_spark`
raises ModuleNotFoundError saying so: "deltabus.Cluster needs the server install (pyspark is
not installed): pip install 'deltabus[server]'" (deltabus/extras.py).

Packages, by the process they run in:
    client/      the user's process: Producer, Consumer, ShareConsumer, AdminClient,
                 ExactlyOncePipeline
    cluster/     the driver (controller, Cluster) and executors (brokers, partitions, fetchers)
    log_tables/  executors: partition logs as Delta tables
    offsets/     the driver: group coordinator, __consumer_offsets
    rpc/         the doors: gRPC servicers, the Kafka listener, generated code, codec
    spark/       Spark's data source and sink (driver and executors)
    cli/         the `deltabus` command
Pure modules (errors, config, metadata, records, topics) and packages (`schemas/`: Confluent's
schema types; `security/`: principals, ACLs, SCRAM) run anywhere. `security.acls` (the ACL types
and enums, Kafka's codes; also `deltabus.acls`) and `errors` are public modules.
"""

# pandas first: once a SparkSession exists, PySpark 4.3 has left half-imported pandas modules
# behind, and the first `import pandas` (pyarrow imports it for Delta reads) then fails. The
# client install has neither pandas nor PySpark: nothing to guard against there.
try:
    import pandas  # noqa: F401, I001
except ModuleNotFoundError as e:
    if e.name != "pandas":
        raise

from typing import Any

from deltabus import errors, extras
from deltabus.client import (
    AcknowledgeType,
    AdminClient,
    CommitFailedError,
    Consumer,
    ConsumerRebalanceListener,
    ExactlyOncePipeline,
    FutureRecordMetadata,
    OffsetAndMetadata,
    Producer,
    RecordMetadata,
    SchemaDeserializer,
    ScramCredentialInfo,
    ShareConsumer,
    ShareRecord,
    TopicPartition,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)
from deltabus.config import AlterConfigOp, ConfigEntry
from deltabus.errors import DeltaBusError
from deltabus.metadata import NewTopic
from deltabus.records import ConsumerRecord
from deltabus.security import acls
from deltabus.security.acls import AclBinding, AclBindingFilter

__all__ = [
    "AcknowledgeType",
    "AclBinding",
    "AclBindingFilter",
    "AdminClient",
    "AlterConfigOp",
    "Cluster",
    "CommitFailedError",
    "ConfigEntry",
    "Consumer",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "DeltaBusError",
    "ExactlyOncePipeline",
    "FutureRecordMetadata",
    "NewTopic",
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
    "acls",
    "errors",
    "local_spark",
]

# The server parts: they need the server extra (pyspark, deltalake), loaded when first asked for.
_LAZY = {"Cluster", "local_spark"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        with extras.needs(f"deltabus.{name}", extras.SERVER):
            from deltabus.cluster import cluster
        return getattr(cluster, name)
    raise AttributeError(f"module 'deltabus' has no attribute {name!r}")
