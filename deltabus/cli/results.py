"""Writing benchmark figures as JSON, the one format every perf command and the project's bench
(`make bench`) share, so runs can be compared by a script rather than by reading terminal output."""

from __future__ import annotations

import json
import os
from typing import Any


def write_json(path: str, figures: dict[str, Any]) -> None:
    """Write `figures` to `path` (parents created), floats rounded to keep the file readable."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_rounded(figures), f, indent=2, sort_keys=True)
        f.write("\n")


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value
