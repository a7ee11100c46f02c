"""Bench step (v): what keeping metrics costs produce and fetch (issue 42's target: at most 3 %
of throughput).

Two 1-broker clusters of their own on the bench's Spark session, alike but for metrics.port:
0 on one (every node counts and times its requests and serves /metrics), -1 on the other
(nothing is counted). Each round runs bulk produce (send_batch, acks=1), a fetch of the whole
topic (poll_batch) and a per-record send() loop (where a per-request cost shows most) on a
fresh 1-partition topic of each cluster, the clusters alternating within the round so a slow
moment of this machine falls on both; the medians are compared. While it runs, the metrics
cluster's nodes are scraped every second, as a Prometheus would, so serving counts too.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.produce_fetch import bulk_produce, fetch_all, send_each
from deltabus.client.admin import AdminClient
from deltabus.metadata import NewTopic

SCRAPE_INTERVAL_S = 1.0
SIDES = ("metrics_on", "metrics_off")


def metrics_overhead(spark: Any, root: str, values: pa.Table, records: int, send_records: int,
                     rounds: int) -> dict[str, Any]:
    """Records/s of bulk produce, fetch and send() with metrics kept and served against
    without (medians of `rounds`), and their ratios. Scratch files go under `root`."""
    run_id = uuid.uuid4().hex[:8]
    rates: dict[str, dict[str, list[float]]] = {
        side: {"produce_rps": [], "fetch_rps": [], "send_rps": []} for side in SIDES}
    with _cluster(spark, root, "metrics-on", 0) as on, \
            _cluster(spark, root, "metrics-off", -1) as off, _scraping(on):
        for round_ in range(rounds):
            for side, cluster in (("metrics_on", on), ("metrics_off", off)):
                topic = f"bench-{side.replace('_', '-')}-{run_id}-{round_}"
                bootstrap = cluster.bootstrap_servers
                with AdminClient(bootstrap) as admin:
                    admin.create_topics([NewTopic(topic, 1, 1)])
                    try:
                        rates[side]["produce_rps"].append(
                            bulk_produce(bootstrap, topic, values, records))
                        fetched, fetch_rps = fetch_all(bootstrap, topic)
                        if fetched != records + 1:  # and the warm-up record
                            raise RuntimeError(f"fetched {fetched} of {records + 1} records")
                        rates[side]["fetch_rps"].append(fetch_rps)
                        rates[side]["send_rps"].append(send_each(bootstrap, topic,
                                                                 send_records))
                    finally:
                        admin.delete_topics([topic])
    medians = {side: {k: statistics.median(v) for k, v in figures.items()}
               for side, figures in rates.items()}
    return {"records": records, "send_records": send_records, "rounds": rounds, **medians,
            **{k.replace("_rps", "_ratio"): medians["metrics_on"][k] / medians["metrics_off"][k]
               for k in ("produce_rps", "fetch_rps", "send_rps")}}


@contextlib.contextmanager
def _cluster(spark: Any, root: str, name: str, metrics_port: int) -> Iterator[Any]:
    from deltabus.cluster.cluster import Cluster

    folder = Path(root) / name
    folder.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(spark, root=str(folder), brokers=1, port=0, kafka_port=-1,
                      metrics_port=metrics_port, console_port=-1).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def _scraping(cluster: Any) -> Iterator[None]:
    """Scrape every node of `cluster` every SCRAPE_INTERVAL_S until the block ends."""
    import json

    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(SCRAPE_INTERVAL_S):
            with urllib.request.urlopen(cluster.prometheus_sd_url, timeout=10) as answer:
                groups = json.loads(answer.read())
            for g in groups:
                url = f"{g['labels']['__scheme__']}://{g['targets'][0]}/metrics"
                with urllib.request.urlopen(url, timeout=10) as answer:
                    answer.read()

    thread = threading.Thread(target=scrape, name="bench-scraper", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
