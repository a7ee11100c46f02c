"""Every node's Prometheus metrics on a running cluster, found the way Prometheus finds them:
through the driver's HTTP service discovery. What the brokers count must agree with what the
test produced through both doors and consumed in a group, and the driver's consumer lag with
what the group committed."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable

from confluent_kafka import Producer as KafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tests.conftest import read_records, wait_until

PARTITIONS = 3
PER_DOOR = 30


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.read()


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample one node serves."""
    text = _get(url).decode()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


def total(samples: Iterable[tuple[str, dict[str, str], float]], name: str,
          **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    return sum(value for n, have, value in samples
               if n == name and all(have.get(k) == v for k, v in labels.items()))


def targets(cluster) -> dict[str, str]:
    """broker id ("-1": the driver) -> its /metrics URL, from the driver's service discovery."""
    groups = json.loads(_get(cluster.prometheus_sd_url))
    return {g["labels"]["broker"]: f"{g['labels']['__scheme__']}://{g['targets'][0]}"
                                   f"{g['labels']['__metrics_path__']}" for g in groups}


def everywhere(cluster) -> list[tuple[str, dict[str, str], float]]:
    return [s for broker, url in targets(cluster).items() if broker != "-1" for s in scrape(url)]


def test_brokers_count_what_both_doors_carried_and_the_driver_says_each_groups_lag(
        cluster, topic_name) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 3)])
    assert set(targets(cluster)) == {"-1", "0", "1", "2"}

    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        for i in range(PER_DOOR):
            producer.send(topic_name, f"grpc-{i}".encode(), partition=i % PARTITIONS)
        producer.flush(60)
    kafka = KafkaProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers, "acks": "all"})
    for i in range(PER_DOOR):
        kafka.produce(topic_name, f"kafka-{i}".encode(), partition=i % PARTITIONS)
    assert kafka.flush(60) == 0
    assert len(read_records(cluster.bootstrap_servers, topic_name, PARTITIONS,
                            2 * PER_DOOR)) == 2 * PER_DOOR

    samples = everywhere(cluster)
    # the leaders counted each record once, whichever door brought it
    assert total(samples, "kafka_server_brokertopicmetrics_messagesin_total",
                 topic=topic_name) == 2 * PER_DOOR
    assert total(samples, "kafka_server_brokertopicmetrics_bytesin_total", topic=topic_name) > 0
    assert total(samples, "kafka_server_brokertopicmetrics_bytesout_total", topic=topic_name) > 0
    for door in ("grpc", "kafka"):
        assert total(samples, "kafka_network_requestmetrics_requests_total", request="Produce",
                     door=door) > 0, door
        assert total(samples, "kafka_network_requestmetrics_totaltimems_count",
                     request="Produce", door=door) > 0, door
    # every replica reports its log; the leaders' log end offsets add up to what was produced
    ends = [(labels, value) for name, labels, value in samples
            if name == "kafka_log_log_logendoffset" and labels["topic"] == topic_name]
    assert len(ends) == PARTITIONS * 3
    assert sum(value for _, value in ends) == 3 * 2 * PER_DOOR
    assert total(samples, "deltabus_log_files", topic=topic_name) >= PARTITIONS * 3
    assert total(samples, "deltabus_log_commit_seconds_count") > 0

    driver = scrape(targets(cluster)["-1"])
    assert total(driver, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert total(driver, "kafka_controller_kafkacontroller_offlinepartitionscount") == 0
    # every partition has one leader among the brokers
    assert (total(samples, "kafka_server_replicamanager_leadercount")
            == total(driver, "kafka_controller_kafkacontroller_globalpartitioncount"))

    group = f"{topic_name}-readers"
    committed = {0: 4, 1: 10, 2: 0}
    consumer = Consumer(cluster.bootstrap_servers, group_id=group)
    consumer.commit({TopicPartition(topic_name, p): offset for p, offset in committed.items()})
    consumer.close()
    expected = 2 * PER_DOOR - sum(committed.values())

    def lag() -> float:
        return total(scrape(targets(cluster)["-1"]), "kafka_consumergroup_lag",
                     consumergroup=group, topic=topic_name)
    # the leaders report their high watermarks every offsets.report.interval.ms
    wait_until(lambda: lag() == expected, f"the driver to report a lag of {expected}")
    driver = scrape(targets(cluster)["-1"])
    assert total(driver, "kafka_consumergroup_current_offset", consumergroup=group,
                 topic=topic_name, partition="1") == 10
    assert total(driver, "kafka_consumergroup_lag_seconds", consumergroup=group,
                 topic=topic_name, partition="0") > 0
