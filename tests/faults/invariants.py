"""What must hold of the cluster's own state after faults, read from its Delta tables (what a
restarted cluster would read back), apart from what the clients saw:

- replicas never diverge below the high watermark: every replica table of a partition holds,
  at each offset under the high watermark it has reached, the record the leader holds there;
- the metadata log never holds two leaders for one (partition, leader epoch): an election that
  does not raise the epoch would let a follower take an old leader's records as its own."""

from __future__ import annotations

import collections
import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import TableNotFoundError

from deltabus.config import is_diskless
from deltabus.log_tables.delta_reads import open_table
from deltabus.log_tables.layout import metadata_path, replica_path

COMPARED = ["offset", "key", "value", "producer_id", "sequence", "leader_epoch"]


def _replica(cluster, topic: str, partition: int, broker: int, below: int) -> pa.Table | None:
    """A replica's records under offset `below`, by offset; None if the broker holds none."""
    path = replica_path(cluster.config.root, topic, partition, broker)
    try:
        table = open_table(path, storage_options=cluster.config.storage.delta_options)
    except TableNotFoundError:  # not a replica (any more)
        return None
    records = table.to_pyarrow_dataset().to_table(
        columns=COMPARED, filter=pc.field("offset") < below)
    return records.sort_by("offset")


def diverged_replicas(cluster, topic: str, partitions: int,
                      high_watermarks: dict[int, int]) -> list[str]:
    """Each partition's replicas compared under its high watermark: the differences, named.
    (A diskless topic's partition is one table: nothing to compare.)"""
    found = []
    image = cluster.controller.image()
    if topic in image.topics and is_diskless(image.topics[topic].configs):
        return found
    for partition in range(partitions):
        state = cluster.controller.image().partition(topic, partition)
        if state is None:
            continue
        below = high_watermarks[partition]
        tables = {b: t for b in state.replicas
                  if (t := _replica(cluster, topic, partition, b, below)) is not None}
        if state.leader not in tables:
            found.append(f"{topic}-{partition}: the leader {state.leader} has no replica table")
            continue
        leader = tables.pop(state.leader)
        for broker, replica in tables.items():
            common = min(replica.num_rows, leader.num_rows)
            if replica.slice(0, common) != leader.slice(0, common):
                at = next(i for i in range(common)
                          if replica.slice(i, 1) != leader.slice(i, 1))
                found.append(f"{topic}-{partition}: replica {broker} differs from the "
                             f"leader {state.leader} at offset "
                             f"{leader.column('offset')[at].as_py()} (under the high watermark "
                             f"{below}): {replica.slice(at, 1).to_pylist()} against "
                             f"{leader.slice(at, 1).to_pylist()}")
            elif broker in state.isr and replica.num_rows < leader.num_rows:
                found.append(f"{topic}-{partition}: in-sync replica {broker} holds "
                             f"{replica.num_rows} records under the high watermark {below}, "
                             f"the leader {leader.num_rows}")
    return found


def leaders_per_epoch(cluster, topic: str) -> dict[tuple[int, int], set[int]]:
    """(partition, leader epoch) -> every leader the metadata log gave it."""
    table = open_table(metadata_path(cluster.config.root),
                       storage_options=cluster.config.storage.delta_options)
    rows = table.to_pyarrow_dataset().to_table(columns=["offset", "type", "record"])
    state: dict[int, dict[str, Any]] = {}
    leaders: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
    for row in rows.sort_by("offset").to_pylist():
        if row["type"] not in ("partition", "partition_change"):
            continue
        record = json.loads(row["record"])
        if record.get("topic") != topic:
            continue
        current = state.setdefault(record["partition"], {"leader": -1, "leader_epoch": -1})
        current.update({k: record[k] for k in ("leader", "leader_epoch")
                        if record.get(k) is not None})
        if current["leader"] >= 0:
            leaders[(record["partition"], current["leader_epoch"])].add(current["leader"])
    return leaders


def two_leaders_in_one_epoch(cluster, topic: str) -> list[str]:
    return [f"{topic}-{partition} epoch {epoch}: leaders {sorted(brokers)}"
            for (partition, epoch), brokers in sorted(leaders_per_epoch(cluster, topic).items())
            if len(brokers) > 1]
