"""The generated gRPC code must match the .proto: `make protos` regenerates it."""

from __future__ import annotations

import pathlib
import shutil

from grpc_tools import protoc  # a dev dependency: `make test` installs it

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTO = "deltabus/rpc/v1/deltabus.proto"
GENERATED = ["deltabus_pb2.py", "deltabus_pb2.pyi", "deltabus_pb2_grpc.py"]


def test_generated_code_matches_the_proto(tmp_path):
    (tmp_path / "deltabus/rpc/v1").mkdir(parents=True)
    shutil.copy(ROOT / PROTO, tmp_path / PROTO)
    code = protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}",
                        f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                        str(tmp_path / PROTO)])
    assert code == 0
    for name in GENERATED:
        fresh = (tmp_path / "deltabus/rpc/v1" / name).read_text()
        committed = (ROOT / "deltabus/rpc/v1" / name).read_text()
        assert fresh == committed, f"{name} is stale: run `make protos`"
