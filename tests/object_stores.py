"""Object-store emulators for tests, started from the registries' packages on loopback: moto's
S3 server (`moto[server]`) and Azurite's Blob server (npm `azurite`, installed by `make setup`
beside KafkaJS in tests/kafka/node). Each runs as a process of its own for a test session;
tests reach it only through the storage options they pass, never through environment
variables."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

HOST = "127.0.0.1"
START_TIMEOUT_S = 120.0  # moto imports a great deal; a loaded machine is slow to start it


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

    def create_bucket(self, name: str) -> str:
        """A new bucket; returns its URI (s3://name)."""
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                     aws_secret_access_key=self.secret_key,
                     region_name="us-east-1").create_bucket(Bucket=name)
        return f"s3://{name}"


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop an emulator: asked first, then killed (Azurite waits for its clients' connections
    to close, which a test's pooled connections may never do)."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _await_ready(process: subprocess.Popen[bytes], name: str, probe: Callable[[], None]) -> None:
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port, for the duration."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    endpoint = f"http://{HOST}:{port}"
    try:
        _await_ready(process, "moto's S3 server",
                     lambda: urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=5).close())
        yield S3Server(endpoint)
    finally:
        _stop(process)


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
    port = _free_port()
    process = subprocess.Popen(
        [str(AZURITE), "--blobHost", HOST, "--blobPort", str(port), "--location", str(location),
         "--skipApiVersionCheck", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _await_ready(process, "Azurite",
                     lambda: socket.create_connection((HOST, port), timeout=5).close())
        yield AzuriteServer(f"http://{HOST}:{port}/{AZURITE_ACCOUNT}")
    finally:
        _stop(process)
