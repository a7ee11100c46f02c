"""Where things live under a cluster root (a local folder or an object-store URI).

    {root}/__cluster_metadata/                     the controller's metadata log (a Delta table)
    {root}/topics/{topic}/{partition}/replica-{b}  one Delta table per topic-partition replica
    {root}/topics/{topic}/{partition}              a diskless topic's partition: one table

A Kafka user finds a partition as `topic-partition` in log.dirs; here it is one folder per topic
with one Delta table per replica, so a query over a topic reads
`{root}/topics/{topic}/*/replica-*`. A diskless topic (diskless.enable) keeps no replicas: its
partition folder is the table, whichever broker leads it.
"""

from __future__ import annotations

import posixpath


def metadata_path(root: str) -> str:
    return posixpath.join(root, "__cluster_metadata")


def consumer_offsets_path(root: str) -> str:
    """Consumer groups' committed offsets (Kafka's __consumer_offsets), one Delta table."""
    return posixpath.join(root, "__consumer_offsets")


def share_group_state_path(root: str) -> str:
    """Share groups' start offsets and in-flight records (Kafka's __share_group_state)."""
    return posixpath.join(root, "__share_group_state")


def log_dir(root: str) -> str:
    """Where every broker's replica tables are (Kafka's log.dirs, one for the whole cluster:
    the brokers share the root, each with its own table per replica)."""
    return posixpath.join(root, "topics")


def topic_path(root: str, topic: str) -> str:
    return posixpath.join(log_dir(root), topic)


def replica_path(root: str, topic: str, partition: int, broker_id: int) -> str:
    return posixpath.join(topic_path(root, topic), str(partition), f"replica-{broker_id}")


def partition_path(root: str, topic: str, partition: int) -> str:
    """A diskless partition's one table: its leader, whichever broker, commits to it."""
    return posixpath.join(topic_path(root, topic), str(partition))


def log_path(root: str, topic: str, partition: int, broker_id: int, diskless: bool) -> str:
    """The table broker `broker_id` writes for a partition: its replica's, or the diskless
    partition's own."""
    return (partition_path(root, topic, partition) if diskless
            else replica_path(root, topic, partition, broker_id))
