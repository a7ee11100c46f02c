"""A node's metrics as Prometheus reads them: Kafka's JMX exporter names, a meter in all topics
beside one per topic, and consumer lag in seconds estimated from high watermark sightings."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from deltabus.cluster.driver_metrics import HighWatermarkHistory
from deltabus.metrics import NodeMetrics


def _samples(metrics: NodeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.exposition().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_topic_meters_are_exported_per_topic_and_in_all_as_kafkas_exporter_names_them() -> None:
    metrics = NodeMetrics()
    metrics.topics.produced("orders", 3, 300)
    metrics.topics.produced("payments", 2, 50)
    metrics.topics.add("bytesout", "orders", 120)
    samples = _samples(metrics)
    name = "kafka_server_brokertopicmetrics_messagesin_total"
    assert samples[(name, ())] == 5
    assert samples[(name, (("topic", "orders"),))] == 3
    assert samples[(name, (("topic", "payments"),))] == 2
    assert samples[("kafka_server_brokertopicmetrics_bytesin_total", ())] == 350
    assert samples[("kafka_server_brokertopicmetrics_bytesout_total",
                    (("topic", "orders"),))] == 120
    metrics.topics.forget_all_but(["orders"])  # a deleted topic's meters go, as its MBeans do
    assert (name, (("topic", "payments"),)) not in _samples(metrics)


def test_requests_are_counted_and_timed_per_api_and_door() -> None:
    metrics = NodeMetrics()
    metrics.requests.add_handler_threads(4)
    metrics.requests.answered("Produce", "kafka", 0.004, throttle_ms=0)
    metrics.requests.answered("Produce", "kafka", 0.030, throttle_ms=100)
    metrics.requests.answered("FetchConsumer", "grpc", 0.5)
    samples = _samples(metrics)
    produce = (("door", "kafka"), ("request", "Produce"))
    assert samples[("kafka_network_requestmetrics_requests_total", produce)] == 2
    assert samples[("kafka_network_requestmetrics_totaltimems_count", produce)] == 2
    assert samples[("kafka_network_requestmetrics_totaltimems_sum", produce)] == 34
    assert samples[("kafka_network_requestmetrics_totaltimems_bucket",
                    (*produce[:1], ("le", "5.0"), produce[1]))] == 1
    assert samples[("kafka_network_requestmetrics_throttletimems_sum", produce)] == 100
    assert samples[("kafka_network_requestmetrics_requests_total",
                    (("door", "grpc"), ("request", "FetchConsumer")))] == 1
    idle = samples[("kafka_server_kafkarequesthandlerpool_requesthandleravgidlepercent", ())]
    assert 0 <= idle < 1  # 0.534 s of work on 4 threads in far less time than 0.534 s


def test_consumer_lag_in_seconds_is_interpolated_between_high_watermark_sightings() -> None:
    history = HighWatermarkHistory()
    key = ("t", 0)
    history.observe({key: 100}, now_s=1000.0)
    history.observe({key: 200}, now_s=1010.0)
    history.observe({key: 300}, now_s=1020.0)
    # at the high watermark: no lag
    assert history.lag_seconds(key, 300, now_s=1030.0) == 0
    # offset 249 became readable when the high watermark passed 249, half way from 200 to 300
    assert abs(history.lag_seconds(key, 249, now_s=1030.0) - 15.0) < 1e-9
    # further behind than the sightings reach: at least the oldest sighting's age
    assert history.lag_seconds(key, 50, now_s=1030.0) == 30.0
    # a partition no longer reported is forgotten
    history.observe({}, now_s=1040.0)
    assert history.lag_seconds(key, 50, now_s=1040.0) == 0
