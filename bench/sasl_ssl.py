"""Bench step (m): produce and fetch over SASL_SSL beside the same over PLAINTEXT, in one run
(issue 16's target: SASL_SSL at least 80% of the PLAINTEXT rate).

PLAINTEXT runs on the bench's cluster; SASL_SSL on a small cluster of its own (2 brokers, on
the bench's Spark session) whose listeners use TLS with certificates made here by trustme (a
development dependency, as the bench is a development tool) and SCRAM-SHA-256, with an
authorizer on and the bench's user a super user. Both run the workload of steps (b) and (d),
bulk produce with send_batch (acks=1) then a fetch of the whole topic with poll_batch, each
round on a fresh 1-partition topic; the rounds alternate between the two clusters, so a slow
moment of this machine falls on both, and the medians are compared.
"""

from __future__ import annotations

import contextlib
import secrets
import statistics
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.produce_fetch import bulk_produce, fetch_all
from deltabus import config as cfg
from deltabus.client.admin import AdminClient
from deltabus.metadata import NewTopic

MECHANISM = "SCRAM-SHA-256"
USER = "bench"
BROKERS = 2


def sasl_ssl_vs_plaintext(spark: Any, plaintext_bootstrap: str, root: str, values: pa.Table,
                          records: int, rounds: int) -> dict[str, Any]:
    """records/s of produce and fetch over each protocol (medians of `rounds`) and their
    ratios, SASL_SSL over PLAINTEXT. Scratch files (the secured cluster's data, the CA) go
    under `root`, which the caller removes."""
    run_id = uuid.uuid4().hex[:8]
    rates: dict[str, dict[str, list[float]]] = {
        p: {"produce_rps": [], "fetch_rps": []} for p in ("plaintext", "sasl_ssl")}
    with _secured_cluster(spark, root) as (secured_bootstrap, client):
        sides = {"plaintext": (plaintext_bootstrap, {}), "sasl_ssl": (secured_bootstrap, client)}
        for round_ in range(rounds):
            for protocol, (bootstrap, security) in sides.items():
                topic = f"bench-{protocol.replace('_', '-')}-{run_id}-{round_}"
                produce_rps, fetch_rps = _produce_then_fetch(bootstrap, security, topic,
                                                             values, records)
                rates[protocol]["produce_rps"].append(produce_rps)
                rates[protocol]["fetch_rps"].append(fetch_rps)
    medians = {p: {k: statistics.median(v) for k, v in figures.items()}
               for p, figures in rates.items()}
    return {"records": records, "rounds": rounds, "mechanism": MECHANISM, "brokers": BROKERS,
            **medians,
            "produce_ratio": medians["sasl_ssl"]["produce_rps"]
            / medians["plaintext"]["produce_rps"],
            "fetch_ratio": medians["sasl_ssl"]["fetch_rps"] / medians["plaintext"]["fetch_rps"]}


def _produce_then_fetch(bootstrap: str, security: dict[str, Any], topic: str,
                        values: pa.Table, records: int) -> tuple[float, float]:
    """(produce records/s, fetch records/s) on a fresh topic, deleted afterwards."""
    with AdminClient(bootstrap, **security) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
        try:
            produce_rps = bulk_produce(bootstrap, topic, values, records, security=security)
            fetched, fetch_rps = fetch_all(bootstrap, topic, security=security)
        finally:
            admin.delete_topics([topic])
    if fetched != records + 1:  # and the warm-up record
        raise RuntimeError(f"fetched {fetched} of {records + 1} records from {topic}")
    return produce_rps, fetch_rps


@contextlib.contextmanager
def _secured_cluster(spark: Any, root: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A 2-broker SASL_SSL cluster with one super user, for the duration: its bootstrap and
    the client settings of that user."""
    import trustme

    from deltabus.cluster.cluster import Cluster

    folder = Path(root) / "sasl-ssl"
    folder.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca_file = str(folder / "ca.pem")
    ca.cert_pem.write_to_path(ca_file)
    host = cfg.ClusterConfig(root=str(folder)).host
    server = ca.issue_cert(*dict.fromkeys((host, "127.0.0.1", "localhost")))
    security = cfg.ListenerSecurity(
        security_protocol="SASL_SSL", ssl_key=server.private_key_pem.bytes(),
        ssl_certificate=b"".join(p.bytes() for p in server.cert_chain_pems),
        ssl_ca=ca.cert_pem.bytes())
    cluster = Cluster(spark, root=str(folder / "data"), brokers=BROKERS, port=0, kafka_port=-1,
                      security=security, authorizer=True,
                      super_users=(f"User:{USER}",)).start()
    try:
        password = secrets.token_urlsafe(16)
        cluster.add_scram_user(USER, password, mechanism=MECHANISM)
        yield cluster.bootstrap_servers, {
            "security_protocol": "SASL_SSL", "sasl_mechanism": MECHANISM,
            "sasl_username": USER, "sasl_password": password, "ssl_ca_location": ca_file}
    finally:
        cluster.stop()
