"""The controller's metadata log survives a restart, and replaying it rebuilds the same state."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltabus import errors
from deltabus.cluster.metadata_log import CHECKPOINT_COMMITS, SCHEMA, MetadataLog
from deltabus.cluster.metadata_state import MetadataState
from deltabus.metadata import PartitionState, TopicState


def _records() -> list[dict]:
    return [
        {"type": "cluster", "cluster_id": "c-1"},
        {"type": "topic", "name": "orders", "topic_id": "tid-orders"},
        {"type": "partition", "topic": "orders", "partition": 0, "replicas": [1, 2, 3],
         "isr": [1, 2, 3], "leader": 1, "leader_epoch": 0},
        {"type": "partition", "topic": "orders", "partition": 1, "replicas": [2, 3, 1],
         "isr": [2, 3, 1], "leader": 2, "leader_epoch": 0},
        {"type": "config", "topic": "orders", "key": "retention.ms", "value": "1000"},
        {"type": "partition_change", "topic": "orders", "partition": 0, "leader": 2,
         "isr": [2, 3], "leader_epoch": 1},
        {"type": "topic", "name": "gone", "topic_id": "tid-gone"},
        {"type": "partition", "topic": "gone", "partition": 0, "replicas": [1], "isr": [1],
         "leader": 1, "leader_epoch": 0},
        {"type": "config", "topic": "orders", "key": "cleanup.policy", "value": "compact"},
        {"type": "config", "topic": "orders", "key": "retention.ms", "value": None},
        {"type": "remove_topic", "name": "gone"},
    ]


EXPECTED_TOPICS = {
    "orders": TopicState(
        "orders", "tid-orders",
        (PartitionState(0, 2, 1, (1, 2, 3), (2, 3)),
         PartitionState(1, 2, 0, (2, 3, 1), (2, 3, 1))),
        {"cleanup.policy": "compact"},
    ),
}


def _replay(records: list[dict]) -> MetadataState:
    state = MetadataState()
    for r in records:
        state.replay(r)
    return state


def test_new_log_is_empty(tmp_path: Path) -> None:
    log = MetadataLog(str(tmp_path / "__cluster_metadata"))
    assert log.read_all() == []
    assert log.next_offset == 0


def test_records_survive_reopen_in_order(tmp_path: Path) -> None:
    path = str(tmp_path / "__cluster_metadata")
    records = _records()
    log = MetadataLog(path)
    log.append(records[:3])  # several commits, as the controller makes them
    log.append(records[3:4])
    log.append([])  # nothing to write: no commit
    log.append(records[4:])
    assert DeltaTable(path).version() == 3
    assert log.read_all() == records

    reopened = MetadataLog(path)
    assert reopened.read_all() == records
    assert reopened.next_offset == len(records)


def test_offsets_are_contiguous_and_continue_after_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "__cluster_metadata")
    records = _records()
    MetadataLog(path).append(records[:5])
    reopened = MetadataLog(path)
    assert reopened.read_all() == records[:5]
    reopened.append(records[5:])
    table = DeltaTable(path).to_pyarrow_table().sort_by("offset")
    assert table.schema.names == SCHEMA.names
    assert table.column("offset").to_pylist() == list(range(len(records)))
    assert table.column("type").to_pylist() == [r["type"] for r in records]
    assert MetadataLog(path).read_all() == records


def test_replay_of_all_record_types_gives_expected_topic_states() -> None:
    state = _replay(_records())
    assert state.cluster_id == "c-1"
    assert state.topic_states() == EXPECTED_TOPICS


def test_replay_after_restart_gives_the_same_state(tmp_path: Path) -> None:
    path = str(tmp_path / "__cluster_metadata")
    MetadataLog(path).append(_records())
    state = _replay(MetadataLog(path).read_all())
    assert state.topic_states() == EXPECTED_TOPICS


def test_partition_change_touches_only_the_fields_it_names() -> None:
    records = _records()[:4] + [
        {"type": "partition_change", "topic": "orders", "partition": 1, "isr": [2]},
    ]
    p1 = _replay(records).topic_states()["orders"].partitions[1]
    assert p1 == PartitionState(1, 2, 0, (2, 3, 1), (2,))
    assert p1.offline_replicas == (3, 1)


def test_replay_does_not_alias_record_lists() -> None:
    # State must not change when a caller later mutates a record it already replayed.
    change = {"type": "partition_change", "topic": "orders", "partition": 0, "isr": [1]}
    partition = {"type": "partition", "topic": "orders", "partition": 0, "replicas": [1, 2],
                 "isr": [1, 2], "leader": 1, "leader_epoch": 0}
    state = _replay([{"type": "topic", "name": "orders", "topic_id": "x"}, partition, change])
    partition["replicas"].append(9)
    change["isr"].append(9)
    assert state.topic_states()["orders"].partitions[0].replicas == (1, 2)
    assert state.topic_states()["orders"].partitions[0].isr == (1,)


def test_recreated_topic_starts_fresh() -> None:
    records = _records() + [
        {"type": "remove_topic", "name": "orders"},
        {"type": "topic", "name": "orders", "topic_id": "tid-new"},
    ]
    topics = _replay(records).topic_states()
    assert topics == {"orders": TopicState("orders", "tid-new", (), {})}


def test_unknown_record_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown"):
        MetadataState().replay({"type": "no_such_type"})


def test_a_second_controller_writing_the_log_fences_the_first_and_nothing_interleaves(
        tmp_path: Path) -> None:
    """A driver started twice on one root: the log's writers must not both append (their
    offsets would collide). The one that finds the other's commit is refused, and the log
    holds each accepted append once."""
    first = MetadataLog(str(tmp_path / "meta"))
    first.read_all()
    first.append([{"type": "cluster", "cluster_id": "c-1"}])
    second = MetadataLog(str(tmp_path / "meta"))
    second.read_all()
    second.append([{"type": "topic", "name": "b", "topic_id": "tid-b"}])
    with pytest.raises(errors.KafkaStorageError, match="another controller"):
        first.append([{"type": "topic", "name": "a", "topic_id": "tid-a"}])
    table = DeltaTable(str(tmp_path / "meta")).to_pyarrow_table().sort_by("offset")
    assert table.column("offset").to_pylist() == [0, 1]
    assert [r["type"] for r in MetadataLog(str(tmp_path / "meta")).read_all()] == [
        "cluster", "topic"]


def test_the_log_is_checkpointed_and_reopens_from_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "meta"
    log = MetadataLog(str(path))
    log.read_all()
    for i in range(CHECKPOINT_COMMITS + 1):
        log.append([{"type": "config", "topic": "t", "key": "k", "value": str(i)}])
    assert (path / "_delta_log" / f"{CHECKPOINT_COMMITS:020d}.checkpoint.parquet").exists()
    again = MetadataLog(str(path))
    assert [r["value"] for r in again.read_all()] == [str(i) for i in range(
        CHECKPOINT_COMMITS + 1)]
    assert again.next_offset == CHECKPOINT_COMMITS + 1
