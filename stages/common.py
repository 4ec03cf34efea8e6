"""What every stage recipe shares: where params.yaml is and how to read one section of it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def load_params(section: str, path: str | Path = "params.yaml") -> dict[str, Any]:
    """Return one top-level section of params.yaml, with a clear error when it is missing."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path.resolve()}: params file not found (run stages from the project root)")
    with open(path, encoding="utf-8") as f:
        params = yaml.safe_load(f) or {}
    if section not in params or not isinstance(params[section], dict):
        raise KeyError(f"{path}: no '{section}:' section (found: {', '.join(sorted(params)) or 'nothing'})")
    return dict(params[section])
