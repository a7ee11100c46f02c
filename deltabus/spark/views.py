"""SQL over topics: each topic as a temporary view, so `SELECT ... FROM payments` works."""

from __future__ import annotations

import re
from typing import Any

from deltabus.client.admin import AdminClient
from deltabus.client.security import security_from_properties


def view_name(topic: str) -> str:
    """A SQL identifier for a topic: Kafka allows '.' and '-' in names, SQL does not."""
    return re.sub(r"[^0-9A-Za-z_]", "_", topic)


def register_topic_views(spark: Any, bootstrap_servers: str, topics: list[str] | None = None,
                         options: dict[str, str] | None = None) -> dict[str, str]:
    """Register every topic (or these) as a temporary view with the Kafka source's columns and
    headers; returns {topic: view name}. A view reads the topic's partition tables up to the
    high watermark each time a query runs, so it always shows what consumers can see.
    `options`: more source options, such as the `kafka.`-prefixed security settings of a
    secured cluster (kafka.security.protocol, kafka.sasl.jaas.config, kafka.ssl.ca.location)."""
    extra = dict(options or {})
    security = security_from_properties({k.lower(): v for k, v in extra.items()},
                                        prefix="kafka.")
    with AdminClient(bootstrap_servers, security=security) as admin:
        names = topics if topics is not None else admin.list_topics()
    views = {}
    for topic in names:
        name = view_name(topic)
        (spark.read.format("deltabus").options(**extra)
         .option("kafka.bootstrap.servers", bootstrap_servers)
         .option("subscribe", topic).option("includeHeaders", "true").load()
         .createOrReplaceTempView(name))
        views[topic] = name
    return views
