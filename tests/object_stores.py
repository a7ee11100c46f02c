"""Object-store emulators for tests, started from the registries' packages on loopback: moto's
S3 server (`moto[server]`; bench/moto_server.py starts it, for bench step (r) as well) and
Azurite's Blob server (npm `azurite`, installed by `make setup` beside KafkaJS in
tests/kafka/node). Each runs as a process of its own for a test session;
tests reach it only through the storage options they pass, never through environment
variables."""

from __future__ import annotations

import pathlib
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# moto's server and the process helpers emulators share live in the bench, which starts the
# server too and may not import the tests.
from bench.moto_server import HOST, S3Server, await_ready, free_port, s3_server, stop_process

__all__ = ["AzuriteServer", "S3Server", "azurite_server", "s3_server"]

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
