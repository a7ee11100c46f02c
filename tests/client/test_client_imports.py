"""The clients load without Spark, Delta or any server module (they run in the user's process)."""

from __future__ import annotations

import json
import subprocess
import sys

SERVER_PACKAGES = ("deltabus.cluster", "deltabus.log_tables", "deltabus.offsets",
                   "deltabus.spark", "deltabus.cli", "deltabus.rpc.server", "deltabus.rpc.kafka",
                   "deltabus.rpc.group_servicer")


def _modules_after(statement: str) -> list[str]:
    """The modules a fresh interpreter holds after running `statement`."""
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_import_deltabus_client_loads_no_server_delta_or_spark_module() -> None:
    loaded = _modules_after("import deltabus.client")
    assert "deltabus.client.producer" in loaded and "deltabus.client.consumer" in loaded
    unwanted = [m for m in loaded if m.split(".")[0] in ("deltalake", "pyspark", "py4j")
                or any(m == p or m.startswith(p + ".") for p in SERVER_PACKAGES)]
    assert unwanted == []


def test_import_deltabus_loads_spark_only_when_cluster_is_asked_for() -> None:
    loaded = _modules_after("import deltabus\nfrom deltabus import Producer, Consumer")
    assert not [m for m in loaded if m.split(".")[0] in ("deltalake", "pyspark")]
    loaded = _modules_after("from deltabus import Cluster")
    assert "deltabus.cluster.cluster" in loaded and "pyspark" in loaded
