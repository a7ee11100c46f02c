"""`pip install deltabus` is the client: the wheel, installed with its base dependencies only in
a fresh virtual environment, brings no Spark, JVM or Delta, and produces and consumes against
the shared test cluster, as does its `deltabus` command; a server part asked for there says
which install it needs.

The wheel is built from a copy of the package's sources (`python -m build --wheel`), so the
checkout gets no build/ or egg-info; pip installs from PyPI through the machine's pip cache,
once per test session. The environment's Python runs isolated (`-I`: no PYTHONPATH, no current
folder), so what it imports is the installed wheel, never this checkout.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# What setuptools reads to build the wheel: the package and its metadata (README: the long
# description).
SOURCES = ("deltabus", "setup.cfg", "pyproject.toml", "README.md")
# The server's and the schema registry's packages and what they bring: none in a client install.
SERVER_DISTRIBUTIONS = ("pyspark", "py4j", "deltalake", "pandas", "kio", "kafka-python",
                        "obstore", "scramp", "lz4", "zstandard", "fastavro", "jsonschema",
                        "grpcio-tools")
STEP_TIMEOUT_S = 600  # one build, venv or install step; pip on a cold cache downloads ~100 MB
FROM_PYPI = "; this step installs packages from PyPI with pip: is PyPI reachable from here?"
# Installing from PyPI on a cold cache, then starting the shared cluster, outlasts the
# default 300 s of setup.cfg's [tool:pytest].
pytestmark = pytest.mark.timeout(2 * STEP_TIMEOUT_S)


def _run(argv: Sequence[str | pathlib.Path], what: str, hint: str = "", **kwargs: Any) -> str:
    """Run a step; on failure, fail the test saying which step, `hint` and what it printed
    last."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    try:
        out = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env,
                             timeout=STEP_TIMEOUT_S, **kwargs)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} took over {STEP_TIMEOUT_S} s{hint}")
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-15:])
        pytest.fail(f"{what} failed (exit {out.returncode}){hint}:\n{tail}")
    return out.stdout


class ClientInstall:
    """A fresh virtual environment holding the wheel and its base dependencies only."""

    def __init__(self, folder: pathlib.Path) -> None:
        self.folder = folder
        self.python = folder / "venv" / "bin" / "python"

    def build_and_install(self) -> None:
        source = self.folder / "source"
        source.mkdir()
        for name in SOURCES:
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, source / name,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(ROOT / name, source / name)
        dist = self.folder / "dist"
        _run([sys.executable, "-m", "build", "--wheel", "--outdir", dist, source],
             "building the wheel (python -m build --wheel)", FROM_PYPI)
        (wheel,) = dist.glob("deltabus-*.whl")
        _run([sys.executable, "-m", "venv", self.folder / "venv"], "creating the venv")
        _run([self.python, "-m", "pip", "install", "--quiet", wheel],
             f"pip install {wheel.name} (base dependencies only)", FROM_PYPI)

    def run(self, code: str, what: str, *args: str) -> Any:
        """Run `code` (its sys.argv[1:]: `args`) with the environment's Python, isolated, in
        its own folder; `code` prints one JSON value last, which this returns."""
        out = _run([self.python, "-I", "-c", code, *args], what, cwd=self.folder)
        return json.loads(out.strip().splitlines()[-1])

    def distributions(self) -> set[str]:
        """The names of the distributions installed in the environment, normalized."""
        names = self.run("import importlib.metadata as m, json\n"
                         "print(json.dumps([d.metadata['Name'] for d in m.distributions()]))",
                         "listing the installed distributions")
        return {n.lower().replace("_", "-") for n in names}


@pytest.fixture(scope="session")
def client_install(tmp_path_factory: pytest.TempPathFactory) -> ClientInstall:
    install = ClientInstall(tmp_path_factory.mktemp("client-install"))
    install.build_and_install()
    return install


def test_the_client_install_brings_no_spark_delta_or_server_library(
        client_install: ClientInstall) -> None:
    installed = client_install.distributions()
    assert {"deltabus", "grpcio", "protobuf", "pyarrow", "numpy"} <= installed
    assert sorted(installed & set(SERVER_DISTRIBUTIONS)) == []
    where = client_install.run("import deltabus, json; print(json.dumps(deltabus.__file__))",
                               "import deltabus")
    assert pathlib.Path(where).is_relative_to(client_install.folder / "venv")  # not the checkout


def test_import_deltabus_works_and_a_server_part_says_which_install_it_needs(
        client_install: ClientInstall) -> None:
    code = """
import json
import deltabus
from deltabus import AdminClient, Consumer, Producer, SchemaDeserializer  # noqa: F401
from deltabus import schemas
failures = {}
for name in ("Cluster", "local_spark"):
    try:
        exec(f"from deltabus import {name}")
    except ImportError as e:
        failures[name] = [type(e).__name__, str(e)]
try:
    schemas.parse(schemas.SchemaType.AVRO, '"string"', {})
except ImportError as e:
    failures["AVRO"] = [type(e).__name__, str(e)]
print(json.dumps(failures))
"""
    failures = client_install.run(code, "import deltabus, then ask for the server parts")
    assert failures == {
        "Cluster": ["ModuleNotFoundError", "deltabus.Cluster needs the server install (pyspark "
                    "is not installed): pip install 'deltabus[server]'"],
        "local_spark": ["ModuleNotFoundError", "deltabus.local_spark needs the server install "
                        "(pyspark is not installed): pip install 'deltabus[server]'"],
        "AVRO": ["ModuleNotFoundError", "the AVRO schema type needs the schemas install "
                 "(fastavro is not installed): pip install 'deltabus[schemas]'"],
    }


PRODUCE_AND_CONSUME = """
import json, sys, time
import pyarrow as pa
from deltabus import AdminClient, Consumer, NewTopic, Producer, TopicPartition

bootstrap, topic = sys.argv[1], sys.argv[2]
with AdminClient(bootstrap) as admin:
    admin.create_topics([NewTopic(topic, 2, 1)])
with Producer(bootstrap, acks="all") as producer:
    for i in range(10):
        producer.send(topic, f"value {i}".encode(), key=f"key {i}".encode()).get()
    for future in producer.send_batch(topic, pa.table({"value": [b"bulk 0", b"bulk 1"]})):
        future.get()

def read(consumer, expected):
    records, deadline = [], time.monotonic() + 60
    while len(records) < expected and time.monotonic() < deadline:
        records.extend(consumer.poll(500))
    return [[r.key.decode() if r.key else None, r.value.decode()] for r in records]

assigned = Consumer(bootstrap, auto_offset_reset="earliest")
assigned.assign([TopicPartition(topic, p) for p in range(2)])
by_assignment = read(assigned, 12)
assigned.close()
member = Consumer(bootstrap, group_id=topic + "-group", auto_offset_reset="earliest",
                  enable_auto_commit=False)
member.subscribe([topic])
in_group = read(member, 12)
member.commit()
member.close()
print(json.dumps({"assigned": by_assignment, "group": in_group}))
"""


def test_the_client_install_produces_and_consumes(client_install: ClientInstall,
                                                  cluster: Any) -> None:
    topic = f"client-install-{int(time.time())}"
    got = client_install.run(PRODUCE_AND_CONSUME, "producing and consuming with the client install",
                             cluster.bootstrap_servers, topic)
    expected = sorted([[f"key {i}", f"value {i}"] for i in range(10)]
                      + [[None, "bulk 0"], [None, "bulk 1"]], key=str)
    assert sorted(got["assigned"], key=str) == expected
    assert sorted(got["group"], key=str) == expected


def test_the_client_installs_command_talks_to_the_cluster_but_starts_none(
        client_install: ClientInstall, cluster: Any) -> None:
    command = client_install.python.parent / "deltabus"
    topic = f"client-install-cli-{int(time.time())}"
    bootstrap = ["--bootstrap-server", cluster.bootstrap_servers]
    _run([command, "topics", *bootstrap, "--create", "--topic", topic, "--partitions", "1",
          "--replication-factor", "1"], "deltabus topics --create", cwd=client_install.folder)
    listed = _run([command, "topics", *bootstrap, "--list"], "deltabus topics --list",
                  cwd=client_install.folder)
    assert topic in listed.split()
    start = subprocess.run([command, "cluster", "start", "--brokers", "1"], capture_output=True,
                           text=True, cwd=client_install.folder, timeout=STEP_TIMEOUT_S)
    assert (start.returncode, start.stderr) == (1, (
        "Error: deltabus cluster start needs the server install (pyspark is not installed): "
        "pip install 'deltabus[server]'\n"))
