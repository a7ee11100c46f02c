"""SQL over topics: each topic as a temporary view, so `SELECT ... FROM payments` works.

Two kinds of view, because Spark cannot have both at once from Python (issue 21):
- live (the default): a view over `format("deltabus")`, the Python data source, which resolves
  the high watermark and the table files again each time a query runs. So the view is the
  topic as consumers see it now, as a view over Spark's Kafka source is (its batch relation
  fetches the latest offsets per query) and as a Delta table in a catalog is.
- snapshot (`snapshot=True`): a view over `read_topic`'s DataFrame, Spark's own Parquet reader
  with no Python worker in the data path (about twice the live view's rate, see
  docs/performance.md), fixed at the high watermark and the files of the moment it was registered. A
  temporary view over `spark.read.parquet(files)` keeps that file list: no hook runs when a
  query starts, so it cannot move on by itself. Registering again moves it on; once the log
  cleaner deletes a file it lists (file.delete.delay.ms after a merge, retention or
  compaction), its queries fail with a missing file until it is registered again.

Live is the default because that is what a Kafka or Spark user expects a view named after a
topic to be: a view that silently stops at an old high watermark gives wrong answers with no
error. Snapshot views are for an analysis that wants the speed, or several queries over one
consistent cut of the topic.
"""

from __future__ import annotations

import re
from typing import Any

from deltabus.client.admin import AdminClient
from deltabus.client.security import security_from_properties
from deltabus.records import KEY_FIELDS, VALUE_FIELDS
from deltabus.spark.parquet_reads import read_topic
from deltabus.spark.source import TYPED_OPTIONS, schema_subjects


def view_name(topic: str) -> str:
    """A SQL identifier for a topic: Kafka allows '.' and '-' in names, SQL does not."""
    return re.sub(r"[^0-9A-Za-z_]", "_", topic)


def register_topic_views(spark: Any, bootstrap_servers: str, topics: list[str] | None = None,
                         options: dict[str, str] | None = None, *,
                         snapshot: bool = False, value_fields: bool = False,
                         key_fields: bool = False) -> dict[str, str]:
    """Register every topic (or these) as a temporary view with the Kafka source's columns and
    headers; returns {topic: view name}. A live view (the default) reads the topic's partition
    tables up to the high watermark each time a query runs, so it always shows what consumers
    can see; `snapshot=True` makes Spark's Parquet reader serve it, fixed at the high
    watermark of this call (module docstring). `options`: more source options, such as the
    `kafka.`-prefixed security settings of a secured cluster (kafka.security.protocol,
    kafka.sasl.jaas.config, kafka.ssl.ca.location). `value_fields`: a typed topic's decoded
    values as the struct column `value_fields` (`read_topic`, or the source's valueFields
    option; a live view of an untyped topic has no such column, a snapshot's is null).
    `key_fields`: likewise a topic's decoded keys (key.schema.subject), as `key_fields`."""
    extra = dict(options or {})
    names = topics
    wanted = [c for c, on in ((KEY_FIELDS, key_fields), (VALUE_FIELDS, value_fields)) if on]
    typed: dict[str, set[str]] = {c: set() for c in wanted}  # column -> topics typed so
    if names is None or (wanted and not snapshot):
        security = security_from_properties({k.lower(): v for k, v in extra.items()},
                                            prefix="kafka.")
        with AdminClient(bootstrap_servers, security=security) as admin:
            if names is None:
                names = admin.list_topics()
            if not snapshot:
                typed = {c: set(schema_subjects(admin, names, TYPED_OPTIONS[c][1]))
                         for c in wanted}
    views = {}
    for topic in names:
        name = view_name(topic)
        if snapshot:
            df = read_topic(spark, bootstrap_servers, topic, include_headers=True,
                            options=extra, value_fields=value_fields, key_fields=key_fields)
        else:
            df = (spark.read.format("deltabus").options(**extra)
                  .option("kafka.bootstrap.servers", bootstrap_servers)
                  .option("subscribe", topic).option("includeHeaders", "true")
                  .options(**{TYPED_OPTIONS[c][0]: str(topic in typed[c]).lower()
                              for c in wanted}).load())
        df.createOrReplaceTempView(name)
        views[topic] = name
    return views
