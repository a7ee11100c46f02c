"""Object-store emulators for tests, started from the registries' packages on loopback: moto's
S3 server (`moto[server]`). Each runs as a process of its own for a test session; tests reach
it only through the storage options they pass, never through environment variables."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
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
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"moto's S3 server exited with {process.returncode}")
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto's S3 server did not answer on {endpoint}") from None
                time.sleep(0.1)
        yield S3Server(endpoint)
    finally:
        process.terminate()
        process.wait(30)
