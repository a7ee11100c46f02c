"""Fast tests, no cluster: what the commands print, line for line as Kafka's tools print it."""

from __future__ import annotations

import json
import re

from deltabus.cli.console_consumer import MessageFormatter
from deltabus.cli.consumer_performance import HEADER, figures_for, stats_line
from deltabus.cli.producer_performance import LatencyStats, fixed_values, summary_line
from deltabus.cli.results import write_json
from deltabus.cli.topic_command import format_partition, format_topic, matching
from deltabus.metadata import PartitionState, TopicState
from deltabus.records import CREATE_TIME, LOG_APPEND_TIME, ConsumerRecord


def record(key: bytes | None = b"k", value: bytes | None = b"v", *, headers: list | None = None,
           timestamp_type: int = CREATE_TIME) -> ConsumerRecord:
    return ConsumerRecord("t", 2, 41, 1700000000123, timestamp_type, key, value, headers or [])


def test_describe_lines() -> None:
    state = TopicState("orders", "abc123", (
        PartitionState(0, 1, 0, (1, 2), (1, 2)),
        PartitionState(1, -1, 3, (2, 0), (0,)),
    ), {"retention.ms": "1000", "cleanup.policy": "delete"})
    assert format_topic(state) == (
        "Topic: orders\tTopicId: abc123\tPartitionCount: 2\tReplicationFactor: 2\t"
        "Configs: cleanup.policy=delete,retention.ms=1000")
    assert format_partition("orders", state.partitions[0]) == (
        "\tTopic: orders\tPartition: 0\tLeader: 1\tReplicas: 1,2\tIsr: 1,2")
    assert format_partition("orders", state.partitions[1]) == (
        "\tTopic: orders\tPartition: 1\tLeader: none\tReplicas: 2,0\tIsr: 0")
    empty = TopicState("e", "id", (PartitionState(0, 0, 0, (0,), (0,)),))
    assert format_topic(empty).endswith("\tConfigs: ")


def test_topic_patterns_are_kafka_regexes() -> None:
    names = ["a.b", "aXb", "orders", "orders-eu", "__consumer_offsets"]
    assert matching(names, None) == sorted(names)
    assert matching(names, "a.b") == ["a.b"]  # the literal name wins when it exists
    assert matching(names, "orders.*") == ["orders", "orders-eu"]
    assert matching(names, "order") == []  # full match, not search
    assert matching(names, "(") == []


def test_consumer_prints_values_by_default() -> None:
    assert MessageFormatter().format(record()) == "v\n"
    assert MessageFormatter().format(record(value=None)) == "null\n"
    assert MessageFormatter().format(record(value=b"ok \xff")) == "ok \ufffd\n"


def test_consumer_prints_like_default_message_formatter() -> None:
    everything = MessageFormatter({
        "print.timestamp": "true", "print.partition": "true", "print.offset": "true",
        "print.key": "true"})
    assert everything.format(record()) == "CreateTime:1700000000123\tPartition:2\tOffset:41\tk\tv\n"
    assert everything.format(record(key=None)) == (
        "CreateTime:1700000000123\tPartition:2\tOffset:41\tnull\tv\n")
    keyed = MessageFormatter({"print.key": "true", "key.separator": ":", "print.value": "true"})
    assert keyed.format(record()) == "k:v\n"
    appended = MessageFormatter({"print.timestamp": "TRUE", "print.value": "false"})
    assert appended.format(record(timestamp_type=LOG_APPEND_TIME)) == (
        "LogAppendTime:1700000000123\n")
    headers = MessageFormatter({"print.headers": "true", "null.literal": "-"})
    assert headers.format(record(headers=[("h1", b"x"), ("h2", None)])) == "h1:x,h2:-\tv\n"
    assert headers.format(record()) == "NO_HEADERS\tv\n"


def test_producer_perf_summary_line() -> None:
    stats = LatencyStats(record_size=100)
    for latency in range(1, 1001):
        stats.record(float(latency), weight=1)
    figures = stats.summary()
    assert figures["records"] == 1000
    assert figures["latency_p50_ms"] == 501 and figures["latency_p999_ms"] == 1000
    line = summary_line(figures)
    assert re.fullmatch(
        r"1000 records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), 500\.50 ms avg latency, "
        r"1000\.00 ms max latency, 501 ms 50th, 951 ms 95th, 991 ms 99th, 1000 ms 99\.9th\.",
        line), line
    assert re.fullmatch(r"1000 records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), 500\.5 ms avg "
                        r"latency, 1000\.0 ms max latency\.", stats.window_line())
    assert stats.window_line().startswith("0 records sent")


def test_producer_perf_counts_weighted_samples_and_errors() -> None:
    stats = LatencyStats(record_size=10)
    stats.record(5.0, weight=100)
    stats.record(0.0, weight=50, error=RuntimeError("boom"))
    figures = stats.summary()
    assert figures["records"] == 100 and figures["errors"] == 50
    assert figures["latency_avg_ms"] == 5.0


def test_consumer_perf_line() -> None:
    figures = figures_for(1000, 1024 * 1024, start=10.0, fetch_start=10.5, end=12.0)
    assert figures["rebalance_time_ms"] == 500 and figures["fetch_time_ms"] == 1500
    line = stats_line(figures, 1700000000.0, 1700000002.0)
    fields = line.split(", ")
    assert len(fields) == len(HEADER.split(", ")) == 10
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:000", fields[0])
    assert fields[2:] == ["1.0000", "0.5000", "1000", "500.0000", "500", "1500", "0.6667",
                          "666.6667"]


def test_fixed_values() -> None:
    values = fixed_values(3, b"abc")
    assert values.to_pylist() == [b"abc"] * 3
    assert fixed_values(2, b"").to_pylist() == [b"", b""]


def test_write_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "deep" / "r.json"
    write_json(str(path), {"rps": 1.23456, "nested": {"x": [2.0004]}})
    assert json.loads(path.read_text()) == {"rps": 1.235, "nested": {"x": [2.0]}}
