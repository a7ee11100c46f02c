"""The generated gRPC code must match the .proto files: `make protos` regenerates it."""

from __future__ import annotations

import pathlib
import shutil

import pytest
from grpc_tools import protoc  # a dev dependency: `make test` installs it

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTOS = ["deltabus/rpc/v1/deltabus.proto", "deltabus/rpc/v1/internal.proto"]


@pytest.mark.parametrize("proto", PROTOS)
def test_generated_code_matches_the_proto(tmp_path: pathlib.Path, proto: str) -> None:
    (tmp_path / "deltabus/rpc/v1").mkdir(parents=True)
    for p in PROTOS:  # internal.proto imports deltabus.proto
        shutil.copy(ROOT / p, tmp_path / p)
    code = protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}",
                        f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                        str(tmp_path / proto)])
    assert code == 0
    stem = pathlib.Path(proto).stem
    for name in (f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"):
        fresh = (tmp_path / "deltabus/rpc/v1" / name).read_text()
        committed = (ROOT / "deltabus/rpc/v1" / name).read_text()
        assert fresh == committed, f"{name} is stale: run `make protos`"


def test_clients_never_see_the_internal_api() -> None:
    """Broker registration and follower fetches are not in the API clients are generated from."""
    public = (ROOT / PROTOS[0]).read_text()
    for internal in ("BrokerLifecycle", "RegisterBroker", "replica_id", "LogFile",
                     "diverging_epoch", "last_fetched_epoch"):
        assert internal not in public, internal
