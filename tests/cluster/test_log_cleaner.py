"""The log cleaner keeps cleaning when one topic cannot be cleaned: a topic config value stored
before its range was checked, a topic whose cleaner task cannot be built, a partition whose
table is gone. Each is logged as an error, and the other topics (and later rounds) go on.

Real metadata logs and partition tables under tmp_path; the cleaner's task body runs here as it
runs on an executor, and `LogCleaner.run` runs its real Spark job on the shared session.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from deltabus import config as cfg
from deltabus import errors
from deltabus.cluster.controller import Controller
from deltabus.cluster.log_cleaner import LogCleaner, cleaner_slices, run_cleaner
from deltabus.cluster.metadata_log import MetadataLog
from deltabus.config import LogConfig
from deltabus.log_tables.layout import metadata_path, replica_path
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.records import normalize_produce, produce_batch

HOUR_MS = 3_600_000
LONG_MAX = 2**63 - 1


def _stored_topic(name: str, configs: dict[str, str]) -> list[dict[str, Any]]:
    """A one-partition topic on broker 0 as the metadata log stores it."""
    return [{"type": "topic", "name": name, "topic_id": f"tid-{name}"},
            {"type": "partition", "topic": name, "partition": 0, "replicas": [0], "isr": [0],
             "leader": 0, "leader_epoch": 0},
            *({"type": "config", "topic": name, "key": k, "value": v}
              for k, v in sorted(configs.items()))]


def _controller(root: Path, topics: dict[str, dict[str, str]]) -> Controller:
    """A controller over a metadata log written directly, as an older deltabus (one that did
    not bound these values yet) left it."""
    metadata = MetadataLog(metadata_path(str(root)))
    metadata.append([{"type": "cluster", "cluster_id": "old-cluster"}])
    for name, configs in topics.items():
        metadata.append(_stored_topic(name, configs))
    return Controller(cfg.ClusterConfig(root=str(root), brokers=1, kafka_port=-1))


def _fill(root: Path, topic: str) -> None:
    """Four five-hour-old commits and a fresh one in broker 0's replica (a file each)."""
    log = PartitionLog(replica_path(str(root), topic, 0, 0), topic=topic, partition=0)
    now = int(time.time() * 1000)
    for c in range(5):
        ts = now if c == 4 else now - 5 * HOUR_MS
        batch = produce_batch([f"v{c}-{i}".encode() for i in range(10)], None, [ts] * 10)
        log.append(normalize_produce(batch), leader_epoch=0).result(30)
    log.close()


def test_a_delay_stored_before_it_was_bounded_does_not_stop_retention(tmp_path: Path) -> None:
    """A file.delete.delay.ms near 2^63 once overflowed the removal stamp (now + delay), and
    the topic's retention failed every round. One stored before the bound counts as the bound
    (a thousand years: forever)."""
    _fill(tmp_path, "orders")
    [task] = _controller(tmp_path, {"orders": {"retention.ms": str(HOUR_MS),
                                               "file.delete.delay.ms": str(LONG_MAX)}}
                         ).cleaner_tasks()
    result = run_cleaner(task)
    assert result.error == ""
    assert result.removed[0].files == 4
    assert result.vacuumed == 0  # the removed files stay on disk for the (very long) delay


def test_a_run_deletes_the_delta_log_below_a_checkpoint_older_than_the_delete_delay(
        tmp_path: Path) -> None:
    """A partition table's Delta log does not grow with every commit for 30 days (Delta's
    default): the cleaner deletes the commits and checkpoints below the newest checkpoint
    older than file.delete.delay.ms, and the table still reads whole."""
    path = replica_path(str(tmp_path), "orders", 0, 0)
    log = PartitionLog(path, topic="orders", partition=0, config=LogConfig(checkpoint_interval=2))
    for c in range(8):
        log.append(normalize_produce(produce_batch([f"v{c}".encode()] * 10)),
                   leader_epoch=0).result(30)
    log.close()
    before = len(list(Path(path, "_delta_log").iterdir()))
    [task] = _controller(tmp_path, {"orders": {"file.delete.delay.ms": "0"}}).cleaner_tasks()
    result = run_cleaner(task)
    assert result.error == "" and result.log_files_deleted > 0
    assert len(list(Path(path, "_delta_log").iterdir())) == before - result.log_files_deleted
    reopened = PartitionLog(path, topic="orders", partition=0)
    assert reopened.read(0, 1 << 20, to_log_end=True).num_rows == 80
    reopened.close()


def test_a_topic_whose_task_cannot_be_built_leaves_the_others_cleaned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    controller = _controller(tmp_path, {"broken": {"retention.ms": "1"},
                                        "orders": {"retention.ms": str(HOUR_MS)}})
    topic_config = cfg.ClusterConfig.topic_config

    def unreadable(self: cfg.ClusterConfig, overrides: dict[str, str]) -> cfg.TopicConfig:
        if overrides == {"retention.ms": "1"}:
            raise errors.InvalidConfigError("injected: an unreadable stored config")
        return topic_config(self, overrides)

    monkeypatch.setattr(cfg.ClusterConfig, "topic_config", unreadable)
    with caplog.at_level(logging.ERROR, logger="deltabus"):
        tasks = controller.cleaner_tasks()
    assert [t.topic for t in tasks] == ["orders"]
    assert any(r.levelno == logging.ERROR and "broken" in r.getMessage()
               for r in caplog.records)


def test_a_partition_that_cannot_be_cleaned_is_an_error_and_the_others_are_cleaned(
        spark, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _fill(tmp_path, "orders")
    controller = _controller(tmp_path, {"gone": {"retention.ms": str(HOUR_MS)},
                                        "orders": {"retention.ms": str(HOUR_MS)}})
    cleaner = LogCleaner(spark, controller.cleaner_tasks, controller.tables_changed, 60_000)
    with caplog.at_level(logging.INFO, logger="deltabus"):
        results = {r.task.topic: r for r in cleaner.run()}
    assert results["gone"].error  # its table is missing
    assert results["orders"].error == "" and results["orders"].removed[0].files == 4
    [failure] = [r for r in caplog.records if "gone-0" in r.getMessage()]
    assert failure.levelno == logging.ERROR


def test_a_run_leaves_the_brokers_slots_and_one_more_and_cleans_every_partition(
        spark, tmp_path: Path) -> None:
    """A cleaner run shares its partitions out over the task slots the brokers leave, less one
    kept for a killed broker's relaunch (a job of a task per partition held every free slot for
    minutes over 12,000 partitions): every partition is still cleaned."""
    assert [cleaner_slices(n, 8, 4) for n in (1, 3, 4, 12_000)] == [1, 3, 4, 4]
    assert cleaner_slices(12_000, 4, 4) == 1  # never none
    for topic in ("orders", "payments", "refunds"):
        _fill(tmp_path, topic)
    controller = _controller(tmp_path, {t: {"retention.ms": str(HOUR_MS)}
                                        for t in ("orders", "payments", "refunds")})
    reserved = spark.sparkContext.defaultParallelism  # one task for the three partitions
    cleaner = LogCleaner(spark, controller.cleaner_tasks, controller.tables_changed, 60_000,
                         reserved_slots=reserved)
    results = {r.task.topic: r for r in cleaner.run()}
    assert sorted(results) == ["orders", "payments", "refunds"]
    assert all(r.error == "" and r.removed[0].files == 4 for r in results.values())
