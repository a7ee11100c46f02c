"""DeleteRecords through deltabus's own door (gRPC, AdminClient.delete_records): the low
watermark per partition, Kafka's errors per partition, and afterwards neither the brokers nor the
Spark source (which reads the Delta tables itself) serve a record below the new log start."""

from __future__ import annotations

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition, errors


def produce_one_file(cluster, topic: str, count: int) -> None:
    with Producer(cluster.bootstrap_servers) as producer:
        for i in range(count):
            producer.send(topic, f"v{i}".encode(), partition=0)
        producer.flush()


def test_admin_client_deletes_records_per_partition(cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 2, 3)])
        produce_one_file(cluster, topic_name, 10)
        answered = admin.delete_records({
            (topic_name, 0): 6, (topic_name, 1): 1, (topic_name, 9): 0,
            ("no-such-topic", 0): 0})
    assert answered[TopicPartition(topic_name, 0)].low_watermark == 6
    assert isinstance(answered[TopicPartition(topic_name, 1)].error,
                      errors.OffsetOutOfRangeError)  # it holds nothing: its high watermark is 0
    for missing in (TopicPartition(topic_name, 9), TopicPartition("no-such-topic", 0)):
        assert isinstance(answered[missing].error, errors.UnknownTopicOrPartitionError)
    tp = TopicPartition(topic_name, 0)
    with Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest") as consumer:
        assert consumer.beginning_offsets([tp])[tp] == 6
        consumer.assign([tp])
        records: list = []
        while not records:
            records = consumer.poll(500)
        assert records[0].offset == 6


def test_the_spark_source_reads_nothing_below_the_log_start(spark, cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, 1, 3)])
        produce_one_file(cluster, topic_name, 10)  # one file: it straddles the new log start
        assert admin.delete_records({(topic_name, 0): 4})[
            TopicPartition(topic_name, 0)].low_watermark == 4

    def offsets(**options: str) -> list[int]:
        df = (spark.read.format("deltabus")
              .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
              .option("subscribe", topic_name))
        for name, value in options.items():
            df = df.option(name, value)
        return sorted(r.offset for r in df.load().select("offset").collect())

    assert offsets() == list(range(4, 10))  # earliest: the log start
    # asked for offsets that are gone, with data loss allowed: still nothing below it
    assert offsets(startingOffsets=f'{{"{topic_name}":{{"0":0}}}}',
                   failOnDataLoss="false") == list(range(4, 10))
