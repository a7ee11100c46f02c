"""Where things live under a cluster root (a local folder or an object-store URI).

    {root}/__cluster_metadata/                     the controller's metadata log (a Delta table)
    {root}/topics/{topic}/{partition}/replica-{b}  one Delta table per topic-partition replica

A Kafka user finds a partition as `topic-partition` in log.dirs; here it is one folder per topic
with one Delta table per replica, so a query over a topic reads
`{root}/topics/{topic}/*/replica-*`.
"""

from __future__ import annotations

import posixpath


def metadata_path(root: str) -> str:
    return posixpath.join(root, "__cluster_metadata")


def consumer_offsets_path(root: str) -> str:
    """Consumer groups' committed offsets (Kafka's __consumer_offsets), one Delta table."""
    return posixpath.join(root, "__consumer_offsets")


def topic_path(root: str, topic: str) -> str:
    return posixpath.join(root, "topics", topic)


def replica_path(root: str, topic: str, partition: int, broker_id: int) -> str:
    return posixpath.join(topic_path(root, topic), str(partition), f"replica-{broker_id}")
