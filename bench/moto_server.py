"""moto's S3 server on loopback, a process of its own, and the process helpers emulators share.

Bench step (r) runs a cluster on it (bench/object_storage.py), and the tests start it from here
too (tests/object_stores.py, beside Azurite): the bench may not import the tests, the tests may
import the bench. moto is a development dependency (`moto[server]`), as both are development
tools. The server starts with no AWS_ variable in its environment, and clients reach it only
through the storage options `S3Server.options` gives (delta-rs's names). It is moto's own server
with three changes (`serve`): conditional writes are atomic, as S3's are; S3 requests skip
moto's per-request backend lookup; and a LIST with a prefix reads the keys under it from a
sorted index of the bucket's keys (`index_listings`), where moto reads every key of the bucket:
as a soak's buckets grow to a hundred thousand keys, a LIST took moto over 100 ms, holding the
interpreter, and every broker's request queued behind it. Real S3 lists from an index too.

With a `log` file, the server's stderr goes there: werkzeug writes one line per request served,
`127.0.0.1 - - [date] "GET /bucket?list-type=2&prefix=... HTTP/1.1" 200 -`, which
`served` reads.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

HOST = "127.0.0.1"
START_TIMEOUT_S = 120.0  # moto imports a great deal; a loaded machine is slow to start it
METHODS = ("PUT", "GET", "HEAD", "LIST", "DELETE", "POST")  # LIST: a GET listing a bucket
# The request line of werkzeug's access log; an error status colours it with ANSI escapes.
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (\S+) HTTP/[0-9.]+')


@dataclass(frozen=True)
class S3Server:
    """A running moto S3 server and the options that reach it (delta-rs's names)."""

    endpoint: str
    access_key: str = "deltabus-test-key"
    secret_key: str = "deltabus-test-secret-do-not-log"

    def options(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true"}

    def client(self) -> Any:
        """A boto3 S3 client of this server (boto3 comes with moto)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1")

    def create_bucket(self, name: str) -> str:
        """A new bucket; returns its URI (s3://name)."""
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Stop an emulator: asked first, then killed after 2 s (Azurite and fake-gcs-server wait
    for their clients' connections to close, which a test's pooled connections may never do,
    and the emulators keep nothing that a graceful exit would save)."""
    process.terminate()
    try:
        process.wait(2)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def await_ready(process: subprocess.Popen[bytes], name: str, probe: Callable[[], None]) -> None:
    """Until `probe()` stops raising OSError: the emulator answers. Raises if it exits, or
    has not answered within START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}")
        try:
            probe()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not answer in {START_TIMEOUT_S:.0f} s") from None
            time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@contextmanager
def s3_server(log: Path | None = None) -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port, for the duration; its access log in `log`
    (appended to), or nowhere."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    with open(log, "ab") if log else open(os.devnull, "wb") as err:
        process = subprocess.Popen(
            [sys.executable, __file__, str(port)],
            stdout=subprocess.DEVNULL, stderr=err, env=env)
    endpoint = f"http://{HOST}:{port}"
    try:
        await_ready(process, "moto's S3 server",
                    lambda: urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=5).close())
        yield S3Server(endpoint)
    finally:
        stop_process(process)


def log_mark(log: Path) -> int:
    """Where the access log's last complete line ends now: a mark for `served`,
    so a line the server is still writing falls wholly after it."""
    size = log.stat().st_size
    with open(log, "rb") as f:
        f.seek(max(0, size - 65536))  # a request line is far shorter
        tail = f.read(size - f.tell())
    return size - len(tail) + tail.rfind(b"\n") + 1


def served(log: Path, start: int = 0, end: int | None = None) -> list[tuple[str, str]]:
    """The S3 requests the server's access log holds between the byte offsets `start` and
    `end` (marks of `log_mark`; its end without), in order: each one's method, one of METHODS
    (a GET of a bucket itself, with no key, is a LIST: ListObjects, ListObjectsV2), and the key
    it names (a LIST's prefix; "" for a bucket's own requests, such as a multi-object delete).
    moto's own API (/moto-api/) is left out."""
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read(-1 if end is None else end - start).decode(errors="replace")
    out = []
    for method, target in _REQUEST.findall(text):
        url = urlsplit(target)
        if url.path.startswith("/moto-api"):
            continue
        key = url.path.lstrip("/").partition("/")[2]  # path-style: /bucket/key
        if method == "GET" and not key:
            method, key = "LIST", parse_qs(url.query).get("prefix", [""])[0]
        out.append((method, key))
    return out


def by_method(requests: list[tuple[str, str]], prefix: str = "") -> dict[str, int]:
    """How many of `requests` (from `served`) each method made, of those whose key starts
    with `prefix`."""
    counts = Counter({method: 0 for method in METHODS})
    counts.update(method for method, key in requests if key.startswith(prefix))
    return dict(counts)


def index_listings() -> None:
    """Make moto's S3 LISTs with a prefix cost the keys under the prefix, not the bucket's: each
    bucket's key store keeps its names sorted (kept up to date on every put and delete), and
    `list_objects` (which list_objects_v2 calls) looks at the names under the prefix only."""
    import bisect
    import threading
    import types

    from moto.s3.models import S3Backend
    from moto.s3.utils import _VersionedKeyStore

    lock = threading.Lock()

    def names(store: Any) -> list[str]:
        found = store.__dict__.get("_sorted_names")
        if found is None:
            found = store.__dict__["_sorted_names"] = sorted(dict.keys(store))
        return found

    def adding(method: Callable[..., Any]) -> Callable[..., Any]:
        def add(store: Any, key: str, value: Any) -> Any:
            with lock:
                new = not dict.__contains__(store, key)
                result = method(store, key, value)
                if new:
                    bisect.insort(names(store), key)
                return result
        return add

    def pop(store: Any, key: str) -> None:
        with lock:
            removing(store, key)
            listed = names(store)
            i = bisect.bisect_left(listed, key)
            if i < len(listed) and listed[i] == key:
                del listed[i]

    removing = _VersionedKeyStore.pop
    _VersionedKeyStore.__setitem__ = adding(_VersionedKeyStore.__setitem__)  # type: ignore
    _VersionedKeyStore.setlist = adding(_VersionedKeyStore.setlist)  # type: ignore
    _VersionedKeyStore.pop = pop  # type: ignore
    list_all = S3Backend.list_objects

    def list_objects(self: Any, bucket: Any, prefix: str | None, *args: Any,
                     **kwargs: Any) -> Any:
        if not prefix or not isinstance(bucket.keys, _VersionedKeyStore):
            return list_all(self, bucket, prefix, *args, **kwargs)
        with lock:
            listed = names(bucket.keys)
            under = listed[bisect.bisect_left(listed, prefix):
                           bisect.bisect_left(listed, prefix[:-1] + chr(ord(prefix[-1]) + 1))]
        keys = {name: bucket.keys.get(name) for name in under}
        view = types.SimpleNamespace(keys={k: v for k, v in keys.items() if v is not None})
        return list_all(self, view, prefix, *args, **kwargs)  # type: ignore[arg-type]

    S3Backend.list_objects = list_objects  # type: ignore


def serve(port: int) -> None:
    """moto.server's main on `HOST`:`port`, with its conditional writes made atomic. moto checks
    `If-None-Match: *` and then puts, with no lock between, so two racing creates of one key
    could both succeed (two Delta writers each got the same version); S3 lets exactly one, and
    the commit writer's put-if-absent relies on it. Conditional requests take turns; the others
    run in parallel as before."""
    import threading

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    os.environ.setdefault("MOTO_PORT", str(port))
    index_listings()
    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True  # type: ignore[attr-defined]  # as moto.server runs it
    conditional = threading.Lock()
    s3_app: list[Any] = []  # the S3 backend's app, found by the first S3 request

    def dispatch(environ: dict[str, Any], start_response: Any) -> Any:
        # moto's dispatcher finds the backend of every request anew, under one lock, listing
        # moto's package folder each time: at about 300 requests a second the soaks' brokers
        # queued behind it for seconds. Every request here but /moto-api/ is S3's.
        if environ.get("PATH_INFO", "").startswith("/moto-api"):
            return app(environ, start_response)
        if not s3_app:
            s3_app.append(app.get_application(environ))
        return s3_app[0](environ, start_response)

    def atomic(environ: dict[str, Any], start_response: Any) -> Any:
        if "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ:
            with conditional:
                return dispatch(environ, start_response)
        return dispatch(environ, start_response)

    run_simple(HOST, port, atomic, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
