"""The `cli` fixture: `deltabus ...` run in-process against the session's shared cluster."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

from deltabus.cli.main import main


class Cli:
    """Runs `deltabus ...` in-process against the shared cluster; returns (rc, stdout, stderr)."""

    def __init__(self, cluster: Any, capsys: pytest.CaptureFixture[str],
                 monkeypatch: pytest.MonkeyPatch) -> None:
        self.bootstrap = cluster.bootstrap_servers
        self.capsys = capsys
        self.monkeypatch = monkeypatch

    def __call__(self, *argv: str, stdin: str | None = None) -> tuple[int, str, str]:
        if stdin is not None:
            self.monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        self.capsys.readouterr()
        rc = main([*argv, "--bootstrap-server", self.bootstrap])
        out, err = self.capsys.readouterr()
        return rc, out, err


@pytest.fixture
def cli(cluster: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> Cli:
    return Cli(cluster, capsys, monkeypatch)
