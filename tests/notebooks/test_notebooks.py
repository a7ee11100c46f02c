"""Every notebook in notebooks/ runs top to bottom on a fresh Jupyter kernel (the assertions are
in the notebooks), and is committed without outputs."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = int(os.environ.get("DELTABUS_NOTEBOOK_CELL_TIMEOUT_S", "300"))

pytestmark = pytest.mark.spark


def test_there_are_the_seven_notebooks() -> None:
    assert [n.stem for n in NOTEBOOKS] == [
        "01_quick_start", "02_payments", "03_streaming_etl", "04_failover",
        "05_secure_cluster", "06_typed_payments", "07_scaling"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[n.stem for n in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[n.stem for n in NOTEBOOKS])
def test_notebook_runs_on_a_fresh_kernel(path: Path, tmp_path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    env = {"TMPDIR": str(tmp_path)}  # the notebook's cluster data goes under the test's folder
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client.execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
