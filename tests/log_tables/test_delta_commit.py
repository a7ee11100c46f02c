"""The Delta commit writer (delta_commit.py) against delta-rs and the stores: what it commits is a
plain Delta table to delta-rs at every version, after a checkpoint and after vacuum, and to the
partition log that reads it; racing writers on a local disk, moto's S3 server and Azurite each
get whole versions, never the same one, with no gap; a lost version to another writer of the
same log fences, one to a schema change conflicts.

`golden/orders-0` is a partition table written by deltabus's write_deltalake path (eight appends
of three records, checkpoint interval 5): the writer must append to tables made before it."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltabus.config import LogConfig
from deltabus.log_tables.appender import LOG_TXN_APP_ID
from deltabus.log_tables.delta_commit import (
    CommitConflict,
    DeltaCommitWriter,
    FencedWriter,
    indexed_columns,
)
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.log_tables.retention import vacuum
from deltabus.records import normalize_produce, produce_batch, to_log_batch
from deltabus.storage import Storage

GOLDEN = Path(__file__).with_name("golden") / "orders-0"
GOLDEN_RECORDS = 24


def _batch(first: int, count: int, tag: str = "new") -> pa.Table:
    """`count` log records from offset `first`, as a leader appends them."""
    records = normalize_produce(produce_batch(
        [f"{tag}-{first + i}".encode() for i in range(count)],
        keys=[f"k{i}".encode() for i in range(count)]))
    return to_log_batch(records, base_offset=first, now_ms=1_700_000_000_000 + first,
                        leader_epoch=1)


def _golden_copy(tmp_path: Path) -> str:
    path = tmp_path / "orders-0"
    shutil.copytree(GOLDEN, path)
    return str(path)


def _writer(path: str, **kwargs: Any) -> DeltaCommitWriter:
    table = DeltaTable(path)
    return DeltaCommitWriter(Storage(path), path, table.version(),
                             indexed_columns=indexed_columns(table.metadata().configuration),
                             **kwargs)


def test_appends_to_an_old_table_read_back_at_every_version_with_stats_and_history(
        tmp_path: Path) -> None:
    path = _golden_copy(tmp_path)
    writer = _writer(path, fence_app_id=LOG_TXN_APP_ID)
    start = writer.version
    offset = GOLDEN_RECORDS
    for _ in range(6):
        data = writer.write_file(_batch(offset, 3))
        offset += 3
        writer.commit(adds=[data], txns={LOG_TXN_APP_ID: offset},
                      info={"deltabus.baseOffset": str(offset - 3),
                            "deltabus.lastOffset": str(offset - 1)})
    assert writer.version == start + 6
    for i in range(7):  # time travel: each version holds what was committed up to it
        rows = DeltaTable(path, version=start + i).to_pyarrow_table().num_rows
        assert rows == GOLDEN_RECORDS + 3 * i
    table = DeltaTable(path)
    read = table.to_pyarrow_table().sort_by("offset")
    assert read.column("offset").to_pylist() == list(range(offset))
    assert read.column("value").to_pylist()[-1] == f"new-{offset - 1}".encode()
    assert table.transaction_version(LOG_TXN_APP_ID) == offset
    history = {h["version"]: h for h in table.history()}
    assert all(history[start + i]["operation"] == "WRITE" for i in range(1, 7))
    assert history[start + 6]["deltabus.lastOffset"] == str(offset - 1)
    # delta-rs reads each new file's statistics (its file pruning works from them)
    adds = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    new = [i for i, p in enumerate(adds["path"]) if p.endswith(".append.snappy.parquet")]
    assert len(new) == 6
    assert sorted(adds["min.offset"][i] for i in new) == list(range(GOLDEN_RECORDS, offset, 3))
    assert all(adds["max.offset"][i] == adds["min.offset"][i] + 2 for i in new)
    assert all(adds["num_records"][i] == 3 and adds["null_count.offset"][i] == 0 for i in new)
    assert all(adds["min.timestamp"][i] is not None for i in new)
    pruned = table.to_pyarrow_dataset().filter(pa.compute.field("offset") >= offset - 3)
    assert pruned.to_table().num_rows == 3


def test_a_checkpoint_and_vacuum_by_delta_rs_and_the_partition_log_read_its_commits(
        tmp_path: Path) -> None:
    path = _golden_copy(tmp_path)
    writer = _writer(path, fence_app_id=LOG_TXN_APP_ID)
    orphan = writer.write_file(_batch(99, 1, "never-committed"))  # a crash before its commit
    offset = GOLDEN_RECORDS
    for _ in range(3):
        writer.commit(adds=[writer.write_file(_batch(offset, 3))],
                      txns={LOG_TXN_APP_ID: offset + 3})
        offset += 3
    table = DeltaTable(path)
    table.create_checkpoint()
    writer.commit(adds=[writer.write_file(_batch(offset, 3))], txns={LOG_TXN_APP_ID: offset + 3})
    offset += 3
    table = DeltaTable(path)
    assert table.to_pyarrow_table().num_rows == offset
    assert table.transaction_version(LOG_TXN_APP_ID) == offset
    young = writer.write_file(_batch(100, 1, "being-committed"))
    two_hours_ago = time.time() - 7200
    os.utime(Path(path) / orphan.path, (two_hours_ago, two_hours_ago))
    vacuum(table)
    assert not (Path(path) / orphan.path).exists()  # the crash's file went, nothing else
    assert (Path(path) / young.path).exists()  # a commit being made keeps its file
    assert DeltaTable(path).to_pyarrow_table().num_rows == offset
    log = PartitionLog(path, topic="orders", partition=0, config=LogConfig())
    try:
        assert log.log_end_offset == offset
        assert [r for r in log.read(0, 1 << 20).column("offset").to_pylist()] == list(
            range(offset))
    finally:
        log.close()


def test_a_version_lost_to_another_writer_of_the_log_fences(tmp_path: Path) -> None:
    path = _golden_copy(tmp_path)
    leader = _writer(path, fence_app_id=LOG_TXN_APP_ID)
    usurper = _writer(path, fence_app_id=LOG_TXN_APP_ID)
    usurper.commit(adds=[usurper.write_file(_batch(24, 3, "usurper"))],
                   txns={LOG_TXN_APP_ID: 27})
    lost = leader.write_file(_batch(24, 3, "leader"))
    with pytest.raises(FencedWriter):
        leader.commit(adds=[lost], txns={LOG_TXN_APP_ID: 27})
    values = DeltaTable(path).to_pyarrow_table().column("value").to_pylist()
    assert b"usurper-24" in values and b"leader-24" not in values


def test_a_version_lost_to_a_schema_change_conflicts_and_commits_nothing(tmp_path: Path) -> None:
    path = _golden_copy(tmp_path)
    writer = _writer(path)
    wider = _batch(24, 1, "wider").append_column("extra", pa.array(["x"]))
    write_deltalake(path, wider, mode="append", schema_mode="merge")
    with pytest.raises(CommitConflict):
        writer.commit(adds=[writer.write_file(_batch(25, 1))])
    assert DeltaTable(path).to_pyarrow_table().num_rows == GOLDEN_RECORDS + 1


@pytest.fixture(params=["local", "s3", "azurite"])
def table_uri(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A copy of the golden table on a local disk or a new bucket of an emulator."""
    if request.param == "local":
        return _golden_copy(tmp_path), {}
    store = request.getfixturevalue(request.param)
    uri = f"{store.create_bucket(f'commits-{uuid.uuid4().hex[:8]}')}/orders-0"
    storage = Storage(uri, store.options())
    for file in GOLDEN.rglob("*"):
        if file.is_file():
            storage.write(f"{uri}/{file.relative_to(GOLDEN).as_posix()}", file.read_bytes())
    return uri, store.options()


def _hammer(uri: str, options: dict[str, str], name: str, commits: int) -> list[int]:
    """One writer's commits to the table at `uri`, each a file of one record: the versions it
    got."""
    storage = Storage(uri, options)
    writer = DeltaCommitWriter(storage, uri, DeltaTable(uri, storage_options=options).version(),
                               retries=commits * 8)
    return [writer.commit(adds=[writer.write_file(_batch(i, 1, name))],
                          info={"deltabus.writer": name}) for i in range(commits)]


def _check_versions(uri: str, options: dict[str, str], got: dict[str, list[int]],
                    commits: int) -> None:
    """Every version from the golden table's last on is one writer's, none twice, none
    missing, and the table holds each writer's records once."""
    versions = sorted(v for vs in got.values() for v in vs)
    base = 8
    assert versions == list(range(base + 1, base + 1 + len(versions)))
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == versions[-1]
    values = table.to_pyarrow_table().column("value").to_pylist()
    assert len(values) == len(set(values)) == GOLDEN_RECORDS + commits * len(got)
    for name in got:
        assert {f"{name}-{i}".encode() for i in range(commits)} <= set(values)
    for version in versions:  # and each commit file is whole: its writer's file, one line each
        lines = Storage(uri, options).read_bytes(
            f"{uri}/_delta_log/{version:020d}.json").decode().splitlines()
        writer = json.loads(lines[0])["commitInfo"]["deltabus.writer"]
        assert version in got[writer]


def test_writers_racing_in_threads_get_every_version_once(
        table_uri: tuple[str, dict[str, str]]) -> None:
    uri, options = table_uri
    commits = 15
    got: dict[str, list[int]] = {}
    threads = [threading.Thread(target=lambda n=n: got.__setitem__(
        n, _hammer(uri, options, n, commits))) for n in ("a", "b", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _check_versions(uri, options, got, commits)


def _hammer_in_process(uri: str, options: dict[str, str], name: str, commits: int,
                       out: Any) -> None:
    out.put((name, _hammer(uri, options, name, commits)))


def test_writers_racing_in_processes_get_every_version_once(
        table_uri: tuple[str, dict[str, str]]) -> None:
    (uri, options), commits = table_uri, 20
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    processes = [spawn.Process(target=_hammer_in_process, args=(uri, options, n, commits, out))
                 for n in ("p", "q")]
    for p in processes:
        p.start()
    got = dict(out.get(timeout=300) for _ in processes)
    for p in processes:
        p.join()
        assert p.exitcode == 0
    _check_versions(uri, options, got, commits)


def _append_killed(path: str, where: str) -> None:
    """In a process of its own: an append whose process is killed `where` ("commit": after
    the data file is written, as the commit file's put-if-absent begins; "link": inside it,
    after its temporary file is written and before it is linked to the version's name)."""
    def die(*_args: Any, **_kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "commit":
        Storage.put_if_absent = die  # type: ignore[method-assign]
    else:
        os.link = die
    log = PartitionLog(path, topic="orders", partition=0, config=LogConfig())
    log.append(normalize_produce(produce_batch([b"killed"], keys=[b"k"])),
               leader_epoch=1).result(60)


@pytest.mark.parametrize("where", ["commit", "link"])
def test_a_writer_killed_while_committing_leaves_the_log_whole_and_vacuum_cleans_up(
        tmp_path: Path, where: str) -> None:
    path = _golden_copy(tmp_path)
    version = DeltaTable(path).version()
    killed = multiprocessing.get_context("spawn").Process(target=_append_killed,
                                                          args=(path, where))
    killed.start()
    killed.join(120)
    assert killed.exitcode == -signal.SIGKILL
    log_dir = Path(path) / "_delta_log"
    assert not (log_dir / f"{version + 1:020d}.json").exists()  # nothing was committed
    committed = {os.path.basename(uri) for uri in DeltaTable(path).file_uris()}
    left = ({p.name for p in Path(path).glob("*.parquet")} - committed if where == "commit"
            else {p.name for p in log_dir.glob(".*.tmp")})
    assert len(left) == 1  # the killed writer's data file, or its temporary commit file

    log = PartitionLog(path, topic="orders", partition=0, config=LogConfig())
    try:  # the log is as it was before the append, and goes on from there
        assert log.log_end_offset == GOLDEN_RECORDS
        log.append(normalize_produce(produce_batch([b"after"], keys=[b"k"])),
                   leader_epoch=1).result(60)
        values = log.read(0, 1 << 20).column("value").to_pylist()
    finally:
        log.close()
    assert len(values) == GOLDEN_RECORDS + 1 and values[-1] == b"after"
    assert b"killed" not in values
    assert DeltaTable(path).version() == version + 1

    leftover = (Path(path) / next(iter(left)) if where == "commit"
                else log_dir / next(iter(left)))
    assert vacuum(DeltaTable(path)) == 0 and leftover.exists()  # young: perhaps in use
    two_hours_ago = time.time() - 7200
    os.utime(leftover, (two_hours_ago, two_hours_ago))
    assert vacuum(DeltaTable(path)) == 1 and not leftover.exists()
    assert DeltaTable(path).to_pyarrow_table().num_rows == GOLDEN_RECORDS + 1


def test_small_files_get_the_same_statistics_as_large_ones(monkeypatch) -> None:
    """Small columns take their bounds from Python lists, large ones from Arrow's kernel: a
    file's stats (delta-rs's pruning reads them) must not depend on which."""
    import datetime
    import decimal

    from deltabus.log_tables import delta_commit

    rows = 40
    day = datetime.date(2026, 1, 1)
    moment = datetime.datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=datetime.UTC)
    table = pa.table({
        "offset": pa.array(range(100, 100 + rows), pa.int64()),
        "small": pa.array([None if i % 7 == 0 else (i * 37) % 11 - 5 for i in range(rows)],
                          pa.int16()),
        "ts": pa.array([moment + datetime.timedelta(microseconds=i * 999) for i in range(rows)],
                       pa.timestamp("us", tz="UTC")),
        "day": pa.array([day + datetime.timedelta(days=(i * 13) % 17) for i in range(rows)]),
        "name": pa.array([None if i == 3 else f"name-é-{(i * 7) % 19}" + "x" * i
                          for i in range(rows)]),
        "amount": pa.array([decimal.Decimal(f"{(i * 29) % 23}.{i:02d}") for i in range(rows)],
                           pa.decimal128(6, 2)),
        "ratio": pa.array([float("nan") if i == 5 else i / 3 for i in range(rows)]),
        "nested": pa.array([{"a": i % 4, "b": f"s{i % 6}"} for i in range(rows)]),
        "all_null": pa.array([None] * rows, pa.int32()),
        "value": pa.array([b"v"] * rows, pa.binary()),
    })
    small = delta_commit.file_stats(table)
    monkeypatch.setattr(delta_commit, "LIST_BOUNDS_VALUES", 0)
    large = delta_commit.file_stats(table)
    assert small == large
    stats = json.loads(small)
    assert stats["minValues"]["offset"] == 100 and stats["maxValues"]["offset"] == 139
    assert stats["minValues"]["small"] == -5 and stats["nullCount"]["small"] == 6
    assert stats["minValues"]["nested"] == {"a": 0, "b": "s0"}
    assert "all_null" not in stats["minValues"] and stats["nullCount"]["all_null"] == rows
