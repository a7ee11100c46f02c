"""The storage layer (deltabus/storage.py) on a local folder, moto's S3 server and Azurite: roots
and schemes, every file operation deltabus makes, delta-rs and obstore reaching the same
store from one options dict with no AWS variable in the environment, and options kept out of
what is printed."""

from __future__ import annotations

import os
import pickle
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from deltabus import errors
from deltabus.log_tables.partition_log import PartitionLog
from deltabus.records import normalize_produce, produce_batch
from deltabus.storage import Storage, normalize_root


@pytest.fixture(autouse=True)
def no_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Options reach the store only through Storage, as a notebook user passes them."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)


@pytest.mark.parametrize(("root", "expected"), [
    ("file:///data/deltabus", "/data/deltabus"),
    ("dbfs:/mnt/deltabus", "/dbfs/mnt/deltabus"),
    ("/Volumes/main/default/deltabus", "/Volumes/main/default/deltabus"),
    ("s3://bucket/deltabus/", "s3://bucket/deltabus"),
    ("s3a://bucket/deltabus", "s3a://bucket/deltabus"),
    ("abfss://data@account.dfs.core.windows.net/deltabus",
     "abfss://data@account.dfs.core.windows.net/deltabus"),
    ("az://data/deltabus", "az://data/deltabus"),
    ("gs://bucket/deltabus", "gs://bucket/deltabus"),
])
def test_roots_are_normalized_by_scheme(root: str, expected: str) -> None:
    assert normalize_root(root) == expected


def test_a_relative_root_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert normalize_root("data") == str(tmp_path / "data")


@pytest.mark.parametrize(("root", "named"), [
    ("hdfs://namenode/deltabus", "unknown scheme hdfs://"),
    ("s3:///deltabus", "names no bucket"),
    ("", "must not be empty"),
])
def test_a_root_it_cannot_reach_is_refused_naming_why(root: str, named: str) -> None:
    with pytest.raises(errors.InvalidConfigError, match=named):
        normalize_root(root)


def _exercise(storage: Storage) -> None:
    """Every operation deltabus makes on files, under `storage`'s root."""
    table = pa.table({"offset": pa.array(range(1000), pa.int64())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=100)
    data = sink.getvalue()
    source = storage.join("t", "0", "replica-0", "part-1.parquet")
    assert storage.write(source, data) == data.size
    assert storage.size(source) == data.size
    assert pq.ParquetFile(storage.open_input(source)).read_row_group(3).column(
        "offset").to_pylist() == list(range(300, 400))
    target = storage.join("t", "0", "replica-1", "part-1.parquet")
    storage.copy(source, target)
    assert storage.read_bytes(target) == data.to_pybytes()
    assert storage.exists(storage.join("t", "0")) and not storage.exists(storage.join("u"))
    storage.delete(target)
    storage.delete(target)  # a missing file is no error
    assert not storage.exists(target)
    for missing in (storage.size, storage.read_bytes, storage.read_parquet):
        with pytest.raises(errors.KafkaStorageError):  # what brokers answer, on every store
            missing(target)
    folder = storage.join("t", "0", "replica-0")
    storage.write(f"{folder}/sub/deeper.json", b"{}")
    listed = dict(storage.list_modified(folder))  # the folder's own files, not its subfolders'
    assert set(listed) == {"part-1.parquet"}
    assert abs(listed["part-1.parquet"] - time.time()) < 600  # seconds since the epoch
    storage.delete_all(folder, ["part-1.parquet", "gone.parquet"])  # a missing one is no error
    assert storage.list_modified(folder) == []
    storage.delete_tree(storage.join("t"))
    assert not storage.exists(storage.join("t"))
    storage.delete_tree(storage.join("t"))  # nor a missing folder


def test_file_operations_on_a_local_root(tmp_path: Path) -> None:
    _exercise(Storage(str(tmp_path / "root")))


def test_delta_rs_retry_options_become_obstores_retry_config() -> None:
    """The options delta-rs takes for its retries (tests/faults/test_slow_failing_s3.py shows
    them bounding deltabus's own requests), durations as delta-rs writes them."""
    from datetime import timedelta

    from deltabus.storage import _retry_config

    assert _retry_config("s3://b", {"AWS_REGION": "x"}) is None  # object_store's defaults
    assert _retry_config("s3://b", {
        "max_retries": "2", "RETRY_TIMEOUT": "1m 30s", "backoff_config.init_backoff": "10ms",
        "backoff_config.max_backoff": "2s", "backoff_config.base": "3"}) == {
        "max_retries": 2, "retry_timeout": timedelta(seconds=90), "backoff": {
            "init_backoff": timedelta(milliseconds=10), "max_backoff": timedelta(seconds=2),
            "base": 3.0}}
    storage = Storage("s3://bucket/root", {"retry_timeout": "soon"})
    with pytest.raises(errors.InvalidConfigError, match="'soon' is not a duration"):
        storage.exists(storage.join("t"))


def test_local_failures_are_storage_errors_naming_the_file(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path))
    (tmp_path / "a-file").write_bytes(b"x")
    inside = str(tmp_path / "a-file" / "part-1.parquet")  # under a file, not a folder
    for operation in (lambda: storage.write(inside, b"y"),
                      lambda: storage.copy(str(tmp_path / "a-file"), inside),
                      lambda: storage.delete(inside)):
        with pytest.raises(errors.KafkaStorageError, match="a-file/part-1.parquet"):
            operation()
    assert (tmp_path / "a-file").read_bytes() == b"x"


def test_an_empty_local_folder_holds_nothing_as_on_an_object_store(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert not Storage(str(tmp_path)).exists(str(tmp_path / "empty"))


@pytest.fixture(params=["s3", "azurite"])
def store(request: pytest.FixtureRequest) -> Any:
    """An object-store emulator: moto's S3 server or Azurite (ADLS, abfss:// roots)."""
    return request.getfixturevalue(request.param)


def test_file_operations_on_object_stores(store) -> None:
    bucket = store.create_bucket(f"ops-{uuid.uuid4().hex[:8]}")
    _exercise(Storage(f"{bucket}/root", store.options()))


def test_delta_rs_and_deltabus_reach_azure_with_the_same_options(azurite) -> None:
    root = f"{azurite.create_bucket(f'delta-{uuid.uuid4().hex[:8]}')}/root"
    storage = Storage(root, azurite.options())
    path = storage.join("topics", "t", "0", "replica-0")
    write_deltalake(path, pa.table({"offset": pa.array([0, 1, 2], pa.int64())}),
                    storage_options=storage.delta_options)
    (name,) = DeltaTable(path, storage_options=storage.delta_options).file_uris()
    assert storage.read_parquet(name).column("offset").to_pylist() == [0, 1, 2]


def test_delta_rs_and_deltabus_reach_s3_with_the_same_options(s3) -> None:
    bucket = s3.create_bucket(f"delta-{uuid.uuid4().hex[:8]}")
    # keys only delta-rs knows (AWS_S3_ALLOW_UNSAFE_RENAME) go to delta-rs; obstore leaves them out
    storage = Storage(f"s3a://{bucket.removeprefix('s3://')}/root",
                      {**s3.options(), "AWS_S3_ALLOW_UNSAFE_RENAME": "true"})
    path = storage.join("topics", "t", "0", "replica-0")
    write_deltalake(path, pa.table({"offset": pa.array([0, 1, 2], pa.int64())}),
                    storage_options=storage.delta_options)
    table = DeltaTable(path, storage_options=storage.delta_options)
    (name,) = table.file_uris()
    assert pq.ParquetFile(storage.open_input(name)).read().column("offset").to_pylist() == [
        0, 1, 2]


def test_options_never_appear_in_what_is_printed(s3) -> None:
    bucket = s3.create_bucket(f"secret-{uuid.uuid4().hex[:8]}")
    storage = Storage(f"{bucket}/root", s3.options())
    assert s3.secret_key not in repr(storage) and s3.secret_key not in str(storage)
    with pytest.raises(errors.KafkaStorageError) as refused:
        storage.read_bytes(storage.join("missing"))
    assert s3.secret_key not in str(refused.value)


def test_a_storage_pickles_to_executors_with_its_options(s3) -> None:
    bucket = s3.create_bucket(f"pickle-{uuid.uuid4().hex[:8]}")
    storage = Storage(f"{bucket}/root", s3.options())
    storage.write(storage.join("a"), b"x")
    shipped = pickle.loads(pickle.dumps(storage))
    assert shipped == storage and shipped.read_bytes(shipped.join("a")) == b"x"


def test_deltabus_and_delta_rs_read_a_partition_log_on_gcs_with_the_options_only(
        gcs, tmp_path: Path) -> None:
    """GCS with options only, as far as an emulator from the registries allows: fake-gcs-server
    takes object_store's reads, listings and deletes but refuses its writes (so the cluster
    cannot run there in tests), and the log is written locally and uploaded through the
    emulator's JSON API. Then delta-rs opens the table, and deltabus's partition log reads
    every record back, through gs:// and the options alone."""
    local = tmp_path / "replica-0"
    log = PartitionLog(str(local), topic="t", partition=0)
    for i in range(5):  # five commits, five files
        values = [f"v{i}-{j}".encode() for j in range(100)]
        log.append(normalize_produce(produce_batch(values)), leader_epoch=0).result(30)
    written = log.read(0, 1 << 30)
    log.close()
    root = f"{gcs.create_bucket(f'log-{uuid.uuid4().hex[:8]}')}/deltabus"
    path = f"{root}/t/0/replica-0"
    assert gcs.upload_tree(local, path) >= 10
    storage = Storage(root, gcs.options())

    assert DeltaTable(path, storage_options=gcs.options()).version() == 5  # created, 5 appends
    remote = PartitionLog(path, topic="t", partition=0, storage=storage)
    try:
        assert (remote.log_start_offset, remote.log_end_offset) == (0, 500)
        assert remote.read(0, 1 << 30).equals(written)
        assert remote.read(250, 1 << 30).column("offset").to_pylist() == list(range(250, 500))
    finally:
        remote.close()
    files = DeltaTable(path, storage_options=gcs.options()).file_uris()
    assert storage.size(files[0]) > 0 and storage.read_parquet(files[0]).num_rows == 100
    storage.delete(files[0])
    assert not storage.exists(files[0])
    storage.delete_tree(root)
    assert not storage.exists(root)


def test_cleaning_temporaries_beside_a_writer_never_fails_on_one_it_renamed(
        tmp_path: Path) -> None:
    """The vacuum's sweep of stale put-if-absent temporaries lists the folder while a writer
    links and removes its own: one listed then gone is not an error (it failed a vacuum beside
    a leader appending, in tests/log_tables/test_cleaner_commits.py)."""
    import threading

    storage = Storage(str(tmp_path))
    done = threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for version in range(5_000):
                assert storage.put_if_absent(f"{tmp_path}/{version:020d}.json", b"{}\n")
        except BaseException as e:
            failures.append(e)
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    sweeps = 0
    try:
        while not done.is_set():
            assert storage.delete_stale_temporaries(str(tmp_path), 3600) == 0
            sweeps += 1
    finally:
        done.set()
        writer.join()
    assert not failures and sweeps > 0
    assert len(os.listdir(tmp_path)) == 5_000
