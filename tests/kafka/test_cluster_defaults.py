"""The broker-wide defaults Kafka's server.properties sets (num.partitions,
default.replication.factor, log.retention.hours, ...), given in the Spark conf as
spark.deltabus.NAME (where a Databricks cluster's Spark config or spark-defaults.conf holds them):
a topic kafka-python's producer auto-creates, and one librdkafka's CreateTopics creates without
counts (-1), get them; DescribeConfigs shows a topic default as the broker's. One 2-broker
cluster of its own; the rest needs no start."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deltabus import AdminClient, Cluster, errors

SetConf = Callable[[str, str], None]


@pytest.fixture
def spark_conf(spark) -> Iterator[SetConf]:
    """Sets keys of the shared session's conf for one test, and unsets them after it."""
    keys: list[str] = []

    def set_conf(key: str, value: str) -> None:
        spark.conf.set(key, value)
        keys.append(key)

    yield set_conf
    for key in keys:
        spark.conf.unset(key)


@pytest.fixture
def cluster_with_defaults(spark, spark_conf: SetConf, tmp_path: Path) -> Iterator[Cluster]:
    spark_conf("spark.deltabus.num.partitions", "3")
    spark_conf("spark.deltabus.default.replication.factor", "2")
    spark_conf("spark.deltabus.log.retention.hours", "24")
    cluster = Cluster(spark, root=str(tmp_path / "data"), brokers=2, port=0).start()
    yield cluster
    cluster.stop()


def shape(cluster: Cluster, topic: str) -> list[int]:
    """The replica count of each partition of `topic`."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        (described,) = admin.describe_topics([topic])
    return [len(p.replicas) for p in sorted(described.partitions, key=lambda p: p.partition)]


def test_new_topics_get_the_cluster_defaults(cluster_with_defaults: Cluster) -> None:
    from confluent_kafka.admin import AdminClient as ConfluentAdmin
    from confluent_kafka.admin import ConfigResource, ConfigSource
    from confluent_kafka.admin import NewTopic as ConfluentNewTopic
    from kafka import KafkaProducer

    cluster = cluster_with_defaults
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        producer.send("auto-created", b"first").get(60)
    finally:
        producer.close()
    assert shape(cluster, "auto-created") == [2, 2, 2]

    librdkafka = ConfluentAdmin({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    librdkafka.create_topics([ConfluentNewTopic("counted-by-the-cluster", num_partitions=-1,
                                                replication_factor=-1)])[
        "counted-by-the-cluster"].result(60)
    assert shape(cluster, "counted-by-the-cluster") == [2, 2, 2]
    resource = ConfigResource("topic", "auto-created")
    retention = librdkafka.describe_configs([resource])[resource].result(30)["retention.ms"]
    assert (retention.value, retention.source) == (
        "86400000", ConfigSource.STATIC_BROKER_CONFIG.value)


def test_keyword_arguments_win_over_the_spark_conf_which_takes_only_broker_configs(
        spark, spark_conf: SetConf, tmp_path: Path) -> None:
    """Cluster(...)'s keyword arguments win over the Spark conf; a spark.deltabus. name that is
    no broker config deltabus takes is refused in one line naming it, before anything starts.
    spark.deltabus.storage. keys stay the storage options'."""
    spark_conf("spark.deltabus.num.partitions", "3")
    spark_conf("spark.deltabus.storage.SOME_OPTION", "x")
    root = str(tmp_path / "never-started")
    assert Cluster(spark, root=root, brokers=1, port=0).config.num_partitions == 3
    assert Cluster(spark, root=root, brokers=1, port=0,
                   num_partitions=5).config.num_partitions == 5
    spark_conf("spark.deltabus.log.dirs", "/var/kafka-logs")
    with pytest.raises(errors.InvalidConfigError) as refused:
        Cluster(spark, root=root, brokers=1, port=0)
    assert refused.value.message.startswith(
        "spark.deltabus.log.dirs is not a broker config deltabus takes")
    assert "\n" not in refused.value.message
