"""Where every byte deltabus keeps lives: the cluster root (a local or FUSE folder, or an object
store) and the options to reach it, in one object handed to everything that touches storage.

delta-rs commits and loads the Delta tables; deltabus itself also reads Parquet files, writes the
files its cleaner merges, copies a leader's files to followers and deletes folders. Before this
module the two went through different clients: delta-rs took storage options, pyarrow's
filesystem took none and knew fewer schemes, so a root on S3 worked only with credentials in
every process's environment, and Azure not at all (issue 18). Now both are built from the same
root and options: delta-rs gets `delta_options`, and deltabus's own file operations go through
`obstore`, the Python binding of the `object_store` crate delta-rs uses, which takes the same
option names. Local and FUSE paths (`/Volumes/...`, `/dbfs/...`) use pyarrow's native local
filesystem, whose Parquet reads are the fastest here.

Roots: local paths, `file://`, `dbfs:/` (read through its FUSE mount, /dbfs), `s3://` and `s3a://`,
`az://`, `abfs://`, `abfss://`, `gs://`. Options are never printed: `repr` names the root only.
"""

from __future__ import annotations

import itertools
import os
import posixpath
import re
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any, cast
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from deltabus import errors

OBJECT_STORE_SCHEMES = {"s3", "s3a", "az", "abfs", "abfss", "azure", "gs"}
LOCAL_SCHEMES = {"file", "dbfs"}
_TEMPORARY = ".tmp"  # put_if_absent's temporary files end so (hidden: they begin with a dot)
# object_store's client settings (its ClientConfigKey): delta-rs takes them with a provider
# prefix (AWS_ALLOW_HTTP), obstore only as client options without one.
_CLIENT_KEYS = {
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type",
    "http1_only", "http2_only", "http2_keep_alive_interval", "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle", "http2_max_frame_size", "pool_idle_timeout",
    "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate", "proxy_excludes",
    "randomize_addresses", "timeout", "user_agent",
}
_PROVIDER_PREFIXES = ("aws_", "azure_", "google_")
# delta-rs's retry options (its storage_options), which object_store's RetryConfig holds: how
# many times, for how long and how far apart a failing request is tried again.
_RETRY_KEYS = {"max_retries", "retry_timeout", "backoff_config.init_backoff",
               "backoff_config.max_backoff", "backoff_config.base"}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ns|us|ms|s|sec|secs|m|min|mins|h|d)\s*")
_DURATION_UNITS_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "secs": 1, "m": 60,
                     "min": 60, "mins": 60, "h": 3600, "d": 86400}


class Storage:
    """A cluster root and the options that reach it. Thread-safe; pickles (root and options)
    to executors, where it opens its own connections."""

    def __init__(self, root: str, options: Mapping[str, str] | None = None) -> None:
        self.root = normalize_root(root)
        self.options: dict[str, str] = {str(k): str(v) for k, v in (options or {}).items()}
        scheme = urlsplit(self.root).scheme if "://" in self.root else ""
        self.is_local = scheme == ""
        self._lock = threading.Lock()
        self._stores: dict[str, Any] = {}  # bucket URI -> obstore store, opened on first use
        self._local = pafs.LocalFileSystem() if self.is_local else None

    def __repr__(self) -> str:
        return f"Storage({self.root!r})"  # never the options: they hold secrets

    def __reduce__(self) -> tuple[Any, ...]:
        return (Storage, (self.root, self.options))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Storage) and other.root == self.root
                and other.options == self.options)

    def __hash__(self) -> int:
        return hash(self.root)

    # ---- what delta-rs gets ----------------------------------------------------------------

    @property
    def delta_options(self) -> dict[str, str] | None:
        """The options for delta-rs (DeltaTable, write_deltalake), as the user gave them; none
        for a local or FUSE root, which needs none (a notebook's options for its object store
        must not reach a local table)."""
        return dict(self.options) if self.options and not self.is_local else None

    def join(self, *parts: str) -> str:
        """A location under the root."""
        return posixpath.join(self.root, *parts)

    # ---- deltabus's own file operations -----------------------------------------------------

    def open_input(self, uri: str) -> Any:
        """A file to read (random access, for pyarrow.parquet.ParquetFile)."""
        with _failures(f"cannot open {uri}"):
            if self._local is not None:
                return self._local.open_input_file(_local_path(uri))
            import obstore

            store, key = self._store(uri)
            return pa.PythonFile(_ObjectFile(obstore.open_reader(store, key)), mode="r")

    def open_parquet(self, uri: str) -> pq.ParquetFile:
        """A Parquet file to read, its footer read: a file that is not there fails here, as
        KAFKA_STORAGE_ERROR (`is_missing` tells it from other failures)."""
        with _failures(f"cannot open {uri}"):
            return pq.ParquetFile(self.open_input(uri))

    def read_parquet(self, uri: str, schema: pa.Schema | None = None) -> pa.Table:
        """A whole Parquet file (as `schema`, when given)."""
        with self.open_input(uri) as source, _failures(f"cannot read {uri}"):
            return pq.read_table(source, schema=schema)

    def read_bytes(self, uri: str) -> bytes:
        """A whole file."""
        with _failures(f"cannot read {uri}"):
            if self._local is not None:
                with self._local.open_input_stream(_local_path(uri)) as source:
                    return bytes(source.read())
            import obstore

            store, key = self._store(uri)
            return obstore.get(store, key).bytes().to_bytes()

    def read_if_present(self, uri: str) -> bytes | None:
        """A whole file, or None when there is none at `uri` (a Delta writer looking for the
        commits made after the one it lost to)."""
        with _failures(f"cannot read {uri}"):
            try:
                if self._local is not None:
                    with open(_local_path(uri), "rb") as source:
                        return source.read()
                import obstore
                from obstore.exceptions import NotFoundError

                store, key = self._store(uri)
                try:
                    return obstore.get(store, key).bytes().to_bytes()
                except NotFoundError:
                    return None
            except FileNotFoundError:
                return None

    def write(self, uri: str, data: bytes | pa.Buffer) -> int:
        """Write a whole file (replacing any); returns its size. On a local disk a write that
        fails (a full disk) deletes what it wrote of the file: cut short, it is no file anyone
        may name, and left behind it would hold the room that was left until vacuum deletes it
        an hour later. An object store's put lands whole or not at all."""
        with _failures(f"cannot write {uri}"):
            if self._local is not None:
                path = _local_path(uri)
                self._local.create_dir(posixpath.dirname(path), recursive=True)
                try:
                    with self._local.open_output_stream(path) as out:
                        out.write(data)
                except BaseException:
                    with suppress(OSError):
                        os.unlink(path)
                    raise
                return len(data) if isinstance(data, bytes) else data.size
            import obstore

            store, key = self._store(uri)
            payload = data.to_pybytes() if isinstance(data, pa.Buffer) else data
            obstore.put(store, key, payload)
            return len(payload)

    def put_if_absent(self, uri: str, data: bytes) -> bool:
        """Write a whole file only if none is at `uri`, atomically: True if this call wrote it,
        False if another writer's was there first. How each store makes it atomic: a local
        disk links a finished temporary file to the name (a link never replaces), S3 and Azure
        put with `If-None-Match: *`, GCS with `ifGenerationMatch=0` (obstore's create mode).
        A temporary file that cannot be written whole (a full disk) is deleted at once, as a
        linked one is: only a killed process leaves one behind.
        On an object store, False may also be this call's own put: one whose answer was lost
        lands, and object_store's retry of it is refused by the file it left; and a put that
        raised may have landed. A caller whose data is unique reads the file back and compares
        (DeltaCommitWriter does)."""
        with _failures(f"cannot write {uri}"):
            if self._local is not None:
                path = _local_path(uri)
                folder, name = os.path.split(path)
                temporary = os.path.join(
                    folder, f".{name}.{os.getpid()}.{threading.get_ident()}{_TEMPORARY}")
                try:
                    with open(temporary, "wb") as out:
                        out.write(data)
                    os.link(temporary, path)
                    return True
                except FileExistsError:
                    return False
                finally:
                    with suppress(FileNotFoundError):
                        os.unlink(temporary)
            import obstore
            from obstore.exceptions import AlreadyExistsError, PreconditionError

            store, key = self._store(uri)
            try:
                obstore.put(store, key, data, mode="create")
            except (AlreadyExistsError, PreconditionError):
                return False
            return True

    def delete_stale_temporaries(self, folder_uri: str, older_than_s: float) -> int:
        """Delete the temporary files `put_if_absent` left in `folder_uri` over `older_than_s`
        ago: a process killed between writing one and linking it leaves it behind (Delta
        readers skip its hidden name; a live writer holds one for microseconds). Object stores
        put in one request and leave none. Returns how many went."""
        if self._local is None:
            return 0
        folder = _local_path(folder_uri)
        cutoff = time.time() - older_than_s
        gone = 0
        with _failures(f"cannot clean {folder_uri}"):
            for entry in os.scandir(folder):
                if not (entry.name.startswith(".") and entry.name.endswith(_TEMPORARY)):
                    continue
                # Gone since the listing (its writer linked and removed it, or another
                # cleaner deleted it): one less to delete.
                with suppress(FileNotFoundError):
                    if entry.stat().st_mtime < cutoff:
                        os.unlink(entry.path)
                        gone += 1
        return gone

    def sync(self, uris: Sequence[str]) -> None:
        """Make written files durable: on a local disk, fsync each and then each folder holding
        them (so their names survive a power cut too); object stores are durable when a write
        returns, and there is nothing to do."""
        if self._local is None or not uris:
            return
        paths = [_local_path(uri) for uri in uris]
        with _failures(f"cannot fsync {uris[0]}"):
            for path in [*paths, *dict.fromkeys(os.path.dirname(p) for p in paths)]:
                descriptor = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(descriptor)
                finally:
                    os.close(descriptor)

    def copy(self, source: str, target: str) -> None:
        """Copy a file: server-side within one object store, so its bytes do not pass here."""
        with _failures(f"cannot copy {source} to {target}"):
            if self._local is not None:
                target_path = _local_path(target)
                self._local.create_dir(posixpath.dirname(target_path), recursive=True)
                self._local.copy_file(_local_path(source), target_path)
                return
            import obstore

            store, key = self._store(source)
            target_store, target_key = self._store(target)
            if target_store is store:
                obstore.copy(store, key, target_key)
            else:  # another bucket: through this process
                obstore.put(target_store, target_key, obstore.get(store, key).bytes())

    def size(self, uri: str) -> int:
        """A file's size in bytes."""
        with _failures(f"cannot find {uri}"):
            if self._local is not None:
                info = self._local.get_file_info(_local_path(uri))
                if info.type == pafs.FileType.NotFound:
                    raise errors.KafkaStorageError(f"{uri} does not exist")
                return int(info.size)
            import obstore

            store, key = self._store(uri)
            return int(obstore.head(store, key)["size"])

    def delete(self, uri: str) -> None:
        """Delete a file; a missing one is no error."""
        with _failures(f"cannot delete {uri}"):
            try:
                if self._local is not None:
                    self._local.delete_file(_local_path(uri))
                    return
                import obstore

                store, key = self._store(uri)
                obstore.delete(store, key)
            except FileNotFoundError:
                pass

    def volume_bytes(self) -> tuple[int, int]:
        """(total, usable) bytes of the volume a local root is on, as Kafka's DescribeLogDirs
        tells of a log dir; (-1, -1) for an object store (no volume) or when the root is not
        there to ask."""
        if not self.is_local:
            return -1, -1
        try:
            usage = shutil.disk_usage(_local_path(self.root))
        except OSError:
            return -1, -1
        return usage.total, usage.free

    def exists(self, uri: str) -> bool:
        """Whether `uri` is a file or a folder holding anything (an object store has no empty
        folders, so a local empty one does not count either)."""
        if self._local is not None:
            path = _local_path(uri)
            with _failures(f"cannot list {uri}"):
                if os.path.isdir(path):
                    with os.scandir(path) as entries:  # the first entry is enough
                        return next(entries, None) is not None
                return os.path.exists(path)
        return next(self._keys(uri), None) is not None

    def list_modified(self, folder_uri: str) -> list[tuple[str, float]]:
        """The files directly in `folder_uri`: (name, last modified, in seconds since the
        epoch). An object store's listing is recursive: what lies in subfolders is left out."""
        with _failures(f"cannot list {folder_uri}"):
            if self._local is not None:
                out = []
                with os.scandir(_local_path(folder_uri)) as entries:
                    for entry in entries:
                        with suppress(FileNotFoundError):  # deleted since the listing
                            if entry.is_file():
                                out.append((entry.name, entry.stat().st_mtime))
                return out
            _, key = self._store(folder_uri)
            prefix = key.rstrip("/") + "/" if key else ""
            return [(meta["path"][len(prefix):], meta["last_modified"].timestamp())
                    for meta in self._objects(folder_uri)
                    if "/" not in meta["path"][len(prefix):]]

    def delete_all(self, folder_uri: str, names: Sequence[str]) -> None:
        """Delete the files `names` of `folder_uri` (missing ones are no error): on an object
        store in requests of up to 1,000 keys (S3's DeleteObjects), not one each."""
        with _failures(f"cannot delete in {folder_uri}"):
            if self._local is not None:
                for name in names:
                    with suppress(FileNotFoundError):
                        os.unlink(os.path.join(_local_path(folder_uri), name))
                return
            store, key = self._store(folder_uri)
            _delete_keys(store, [posixpath.join(key, name) for name in names])

    def delete_tree(self, uri: str) -> None:
        """Delete a folder and everything under it; a missing one is no error."""
        with _failures(f"cannot delete {uri}"):
            if self._local is not None:
                path = _local_path(uri)
                if self._local.get_file_info(path).type != pafs.FileType.NotFound:
                    self._local.delete_dir(path)
                return
            store, _ = self._store(uri)
            _delete_keys(store, self._keys(uri))

    def _keys(self, uri: str) -> Iterator[str]:
        """The keys of the objects under folder `uri`."""
        return (meta["path"] for meta in self._objects(uri))

    def _objects(self, uri: str) -> Iterator[Any]:
        """obstore's metadata (path, last_modified, size) of the objects under folder `uri`."""
        import obstore

        store, key = self._store(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        with _failures(f"cannot list {uri}"):
            for chunk in obstore.list(store, prefix or None):
                yield from chunk

    def _store(self, uri: str) -> tuple[Any, str]:
        """The obstore store of `uri`'s bucket (or container), opened once, and its key."""
        bucket, key = _split_object_uri(uri)
        with self._lock:
            store = self._stores.get(bucket)
            if store is None:
                store = self._stores[bucket] = _open_store(bucket, self.options)
        return store, key


class _ObjectFile:
    """obstore's ReadableFile (ranged GETs, buffered) as the file object pyarrow reads."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        """Bytes from the position; obstore's failures as the OSErrors pyarrow's readers
        expect of a file (FileNotFoundError for an object that is not there). obstore's
        exceptions are imported only on a failure: this runs for every ranged read."""
        try:
            return self._reader.read(None if size < 0 else size).to_bytes()
        except Exception as e:
            from obstore.exceptions import BaseError, NotFoundError

            if isinstance(e, NotFoundError):
                raise FileNotFoundError(_first_line(e)) from e
            if isinstance(e, BaseError):
                raise OSError(_first_line(e)) from e
            raise

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return int(self._reader.seek(offset, whence))

    def tell(self) -> int:
        return int(self._reader.tell())

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._reader.close()


SPARK_CONF_PREFIX = "spark.deltabus.storage."


def spark_storage_options(spark: Any) -> dict[str, str]:
    """Storage options set in a SparkSession's conf as spark.deltabus.storage.KEY (where a
    Databricks cluster policy or spark-defaults.conf puts them), by KEY."""
    try:
        pairs = spark.sparkContext.getConf().getAll()
    except Exception:  # a session without a SparkContext of its own (Spark Connect)
        return {}
    return {key[len(SPARK_CONF_PREFIX):]: value for key, value in pairs
            if key.startswith(SPARK_CONF_PREFIX) and len(key) > len(SPARK_CONF_PREFIX)}


def normalize_root(root: str) -> str:
    """An absolute local path, or an object-store URI without a trailing slash. `file://` and
    Databricks' `dbfs:/` (through its FUSE mount) are local paths."""
    if not root:
        raise errors.InvalidConfigError("the cluster root must not be empty")
    split = urlsplit(root)
    scheme = split.scheme.lower() if (":/" in root and len(split.scheme) > 1) else ""
    if scheme == "file":
        return os.path.abspath(split.path)
    if scheme == "dbfs":
        return posixpath.join("/dbfs", split.path.lstrip("/"))
    if scheme in OBJECT_STORE_SCHEMES:
        if not split.netloc:
            raise errors.InvalidConfigError(
                f"the cluster root {root!r} names no bucket or container")
        return root.rstrip("/")
    if scheme:
        raise errors.InvalidConfigError(
            f"the cluster root {root!r} has an unknown scheme {scheme}://; use a local path, "
            "file://, dbfs:/, s3://, s3a://, az://, abfs://, abfss:// or gs://")
    return os.path.abspath(os.path.expanduser(root))


def _delete_keys(store: Any, keys: Iterable[str]) -> None:
    """Delete `keys` of an object store in requests of up to 1,000 (S3's DeleteObjects takes
    no more); a missing key is no error (Azure's bulk delete fails on one: that batch is
    deleted again a key at a time)."""
    import obstore

    keys = iter(keys)
    while batch := list(itertools.islice(keys, 1_000)):
        try:
            obstore.delete(store, batch)
        except FileNotFoundError:
            for one in batch:
                with suppress(FileNotFoundError):
                    obstore.delete(store, one)


def _local_path(uri: str) -> str:
    return urlsplit(uri).path if uri.startswith("file://") else uri


def _split_object_uri(uri: str) -> tuple[str, str]:
    """(the bucket's URI, the key within it) of an object-store URI. abfs(s)'s container is
    the user part of its host (container@account.dfs.core.windows.net)."""
    split = urlsplit(uri)
    scheme = "s3" if split.scheme == "s3a" else split.scheme
    return f"{scheme}://{split.netloc}", split.path.lstrip("/")


def _open_store(bucket: str, options: Mapping[str, str]) -> Any:
    """An obstore store for `bucket` from delta-rs-style options: keys lower-cased, client
    settings (AWS_ALLOW_HTTP...) as client options, keys obstore does not know (delta-rs's
    own, such as AWS_S3_LOCKING_PROVIDER) left to delta-rs."""
    from obstore.exceptions import UnknownConfigurationKeyError
    from obstore.store import from_url

    config: dict[str, str] = {}
    client: dict[str, str] = {}
    for key, value in options.items():
        lowered = key.lower()
        bare = next((lowered[len(p):] for p in _PROVIDER_PREFIXES if lowered.startswith(p)),
                    lowered)
        if bare in _CLIENT_KEYS:
            client[bare] = value
        elif lowered not in _RETRY_KEYS:
            config[lowered] = value
    retry = _retry_config(bucket, options)
    while True:
        try:
            return from_url(bucket, config=cast(Any, config or None),
                            client_options=cast(Any, client or None),
                            retry_config=cast(Any, retry))
        except UnknownConfigurationKeyError as e:
            unknown = next((k for k in config if f"'{k}'" in str(e)), None)
            if unknown is None:
                raise errors.InvalidConfigError(
                    f"storage options for {bucket}: {_first_line(e)}") from None
            del config[unknown]
        except Exception as e:
            raise errors.InvalidConfigError(
                f"cannot reach {bucket}: {_first_line(e)}") from None


def _retry_config(bucket: str, options: Mapping[str, str]) -> dict[str, Any] | None:
    """obstore's RetryConfig from delta-rs's retry options (max_retries, retry_timeout,
    backoff_config.init_backoff, .max_backoff, .base; durations as delta-rs writes them, "10s",
    "100ms"), or None for object_store's defaults (10 retries within 3 minutes, backoff from
    100 ms to 15 s). Why: delta-rs honours them and obstore would not know them, so one root's
    options retried delta-rs's requests one way and deltabus's own commits another (a store
    that keeps failing held a commit for a minute whatever the options said)."""
    given = {k.lower(): v for k, v in options.items() if k.lower() in _RETRY_KEYS}
    if not given:
        return None
    try:
        retry: dict[str, Any] = {}
        backoff: dict[str, Any] = {}
        if "max_retries" in given:
            retry["max_retries"] = int(given["max_retries"])
        if "retry_timeout" in given:
            retry["retry_timeout"] = _duration(given["retry_timeout"])
        for name in ("init_backoff", "max_backoff"):
            if f"backoff_config.{name}" in given:
                backoff[name] = _duration(given[f"backoff_config.{name}"])
        if "backoff_config.base" in given:
            backoff["base"] = float(given["backoff_config.base"])
    except ValueError as e:
        raise errors.InvalidConfigError(f"storage options for {bucket}: {e}") from None
    if backoff:
        retry["backoff"] = backoff
    return retry


def _duration(text: str) -> timedelta:
    """A duration as delta-rs's options write one (humantime: "30s", "1m 30s", "250ms")."""
    if not text.strip():
        raise ValueError("an empty duration")
    seconds, at = 0.0, 0
    while at < len(text):
        match = _DURATION.match(text, at)
        if match is None:
            raise ValueError(f"{text!r} is not a duration (such as 30s or 250ms)")
        seconds += float(match.group(1)) * _DURATION_UNITS_S[match.group(2)]
        at = match.end()
    return timedelta(seconds=seconds)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


@contextmanager
def _failures(what: str) -> Iterator[None]:
    """Any failure of a file operation, local or remote, as KAFKA_STORAGE_ERROR naming `what`
    (a deltabus error raised inside passes as it is)."""
    try:
        yield
    except errors.DeltaBusError:
        raise
    except Exception as e:
        raise storage_error(e, what) from e


def is_missing(e: BaseException) -> bool:
    """Whether a storage failure (as raised here, or its cause) is a file that is not there:
    a reader listing files of an older table version finds one vacuum deleted."""
    from obstore.exceptions import NotFoundError

    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, (FileNotFoundError, NotFoundError)):
            return True
        cause = cause.__cause__
    return False


def storage_error(e: BaseException, what: str) -> errors.DeltaBusError:
    """The one place storage failures (delta-rs's, obstore's, the filesystem's) become
    deltabus errors: KAFKA_STORAGE_ERROR, with the failure's first line (never the options)."""
    return errors.KafkaStorageError(f"{what}: {type(e).__name__}: {_first_line(e)}")
