"""A real Prometheus (Debian's package, set up by `make setup`) scraping the shared cluster
through the driver's service discovery, as monitoring/prometheus.yml configures it: its answers
about records in and a group's lag agree with what the test produced and committed, the
alert rules load, and every query of the Grafana dashboard runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tests.conftest import free_port_block, wait_until

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
PARTITIONS = 2
RECORDS = 400
RECORDS_PER_S = 40  # paced, so rate() has a known answer


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, (f"{name} is missing: `make setup` installs Debian's prometheus package "
                  "(apt-get install -y prometheus)")
    return path


@pytest.fixture(scope="module")
def prometheus(cluster, tmp_path_factory) -> Iterator[str]:
    """Prometheus on loopback, scraping every second what the driver's discovery lists, with
    the repository's alert rules; yields its HTTP API's base URL."""
    folder = tmp_path_factory.mktemp("prometheus")
    config = folder / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(MONITORING / "deltabus-alerts.yml")],
        "scrape_configs": [{"job_name": "deltabus", "http_sd_configs": [
            {"url": cluster.prometheus_sd_url, "refresh_interval": "1s"}]}]}))
    subprocess.run([_tool("promtool"), "check", "config", str(config)], check=True,
                   capture_output=True)
    port = free_port_block(1)
    log = (folder / "prometheus.log").open("w")
    process = subprocess.Popen(
        [_tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url), "Prometheus to start", timeout_s=120)
        yield url
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def query(url: str, expr: str) -> Any:
    """Prometheus' answer to an instant query (its `data`); fails on a query it refuses."""
    with urllib.request.urlopen(f"{url}/api/v1/query?"
                                + urllib.parse.urlencode({"query": expr}), timeout=30) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return body["data"]


def scalar(url: str, expr: str) -> float | None:
    result = query(url, expr)["result"]
    return float(result[0]["value"][1]) if result else None


def test_the_alert_rules_are_valid_for_promtool() -> None:
    checked = subprocess.run([_tool("promtool"), "check", "rules",
                              str(MONITORING / "deltabus-alerts.yml")],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_prometheus_finds_every_node_and_agrees_with_what_was_produced_and_committed(
        cluster, prometheus, topic_name) -> None:
    wait_until(lambda: scalar(prometheus, 'count(up{job="deltabus"} == 1)') == 4,
               "Prometheus to scrape the driver and the three brokers")
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic_name, PARTITIONS, 3)])
    started = time.monotonic()
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        for i in range(RECORDS):  # paced: record i leaves at i / RECORDS_PER_S
            time.sleep(max(0.0, started + i / RECORDS_PER_S - time.monotonic()))
            producer.send(topic_name, f"{i}".encode(), partition=i % PARTITIONS)
            if i == RECORDS * 3 // 4:  # while records flow: the rate over the last 5 s
                rate = scalar(prometheus, "sum(rate(kafka_server_brokertopicmetrics_"
                                          f'messagesin_total{{topic="{topic_name}"}}[5s]))')
        producer.flush(60)
    assert rate is not None and RECORDS_PER_S / 3 < rate < RECORDS_PER_S * 3, rate

    messages_in = f'sum(kafka_server_brokertopicmetrics_messagesin_total{{topic="{topic_name}"}})'
    wait_until(lambda: scalar(prometheus, messages_in) == RECORDS,
               f"Prometheus to count the {RECORDS} records the leaders took")

    group = f"{topic_name}-readers"
    consumer = Consumer(cluster.bootstrap_servers, group_id=group)
    consumer.commit({TopicPartition(topic_name, 0): 50, TopicPartition(topic_name, 1): 100})
    consumer.close()
    lag = f'sum(kafka_consumergroup_lag{{consumergroup="{group}",topic="{topic_name}"}})'
    wait_until(lambda: scalar(prometheus, lag) == RECORDS - 150,
               f"Prometheus to see group {group} lag by {RECORDS - 150} records")

    with urllib.request.urlopen(prometheus + "/api/v1/rules", timeout=30) as answer:
        groups = json.loads(answer.read())["data"]["groups"]
    assert [g["name"] for g in groups] == ["deltabus"]
    assert {r["name"] for r in groups[0]["rules"]} >= {
        "DeltabusUnderReplicatedPartitions", "DeltabusOfflinePartitions", "DeltabusBrokerDown",
        "DeltabusConsumerLagGrowing"}
    assert all(r["health"] == "ok" for r in groups[0]["rules"]), groups[0]["rules"]


def test_every_query_of_the_grafana_dashboard_runs_and_finds_series(cluster, prometheus) -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        query(prometheus, expr)  # Prometheus refuses a query it cannot parse
    wait_until(lambda: query(prometheus, "sum by (broker) (kafka_server_replicamanager_"
                                         "leadercount)")["result"] != [],
               "leaders per broker to be scraped")
