"""Set-up compiles the pyspark.zip that Spark's Python workers import (deltabus/spark/
pyspark_zip.py): workers then load bytecode instead of compiling PySpark at each start."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from deltabus.spark import pyspark_zip


def test_a_zip_given_bytecode_is_imported_from_it_and_keeps_its_sources(tmp_path: Path) -> None:
    path = tmp_path / "lib.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/answer.py", "def answer():\n    return 42\n")
        z.writestr("pkg/sample.py", "def broken(:\n")  # not Python: left as it is
    assert pyspark_zip.add_bytecode(str(path)) == 2
    assert pyspark_zip.add_bytecode(str(path)) == 0  # run again: nothing to do
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        assert sorted(z.namelist()) == ["pkg/__init__.py", "pkg/__init__.pyc", "pkg/answer.py",
                                        "pkg/answer.pyc", "pkg/sample.py"]
        assert z.read("pkg/answer.py") == b"def answer():\n    return 42\n"
    imported = subprocess.run(
        [sys.executable, "-c", "import pkg.answer as a; print(a.__file__, a.answer())"],
        env={"PYTHONPATH": str(path)}, capture_output=True, text=True, check=True).stdout.split()
    assert imported == [f"{path}/pkg/answer.pyc", "42"]


def test_the_installed_pyspark_zip_is_compiled_by_set_up() -> None:
    with zipfile.ZipFile(pyspark_zip.pyspark_zip_path()) as z:
        names = set(z.namelist())
    assert "pyspark/worker.pyc" in names
    assert "pyspark/sql/streaming/python_streaming_source_runner.pyc" in names
