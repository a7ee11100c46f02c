"""deltabus: Kafka-style event streaming inside Apache Spark.

Every topic-partition is a Delta table.

The public API is what `__all__` names (a test pins it); everything else may change.
"""

# pandas first: once a SparkSession exists, PySpark 4.3 has left half-imported pandas modules
# behind, and the first `import pandas` (pyarrow imports it for Delta reads) then fails.
import pandas  # noqa: F401, I001

from deltabus import errors
from deltabus.cluster.cluster import Cluster, local_spark
from deltabus.config import AlterConfigOp, ConfigEntry
from deltabus.errors import DeltaBusError
from deltabus.metadata import NewTopic
from deltabus.records import ConsumerRecord
from deltabus.rpc.admin import AdminClient
from deltabus.rpc.consumer import (
    CommitFailedError,
    Consumer,
    ConsumerRebalanceListener,
    OffsetAndMetadata,
    TopicPartition,
)
from deltabus.rpc.exactly_once import ExactlyOncePipeline
from deltabus.rpc.producer import FutureRecordMetadata, Producer, RecordMetadata

__all__ = [
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
    "TopicPartition",
    "errors",
    "local_spark",
]
