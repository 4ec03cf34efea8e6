"""Published reference figures (conf/baselines.yaml), read and named one way for compare, plots and README.

An entry such as `gpt2_124m` holds a `description` and figures (`val_loss`, `hellaswag_acc_norm`, each with a
`<figure>_source`); each figure's one name everywhere is `<entry>_<figure>`, e.g. `gpt2_124m_val_loss`.
"""
from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

import yaml

from gptcore.errors import UserError

FIGURES = ("val_loss", "hellaswag_acc_norm")
REQUIRED = {"gpt2_124m": FIGURES}  # the entry every run is set beside


def read_baselines(path: str | Path) -> dict[str, dict[str, Any]]:
    """conf/baselines.yaml, checked: each entry a mapping with a description and numeric figures; errors name the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"{path}: cannot read the baselines ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of baseline entries, got {type(data).__name__}")
    check_baselines(data, path)
    return data


def check_baselines(data: dict[str, Any], where: str | Path = "baselines") -> None:
    """Raise ValueError naming `where` unless every entry is a mapping whose figures are numbers."""
    for entry, need in REQUIRED.items():
        missing = [f for f in need if f not in (data.get(entry) or {})]
        if missing:
            raise UserError(f"{where}: {entry} needs numeric {' and '.join(missing)}")
    for entry, body in data.items():
        if not isinstance(body, dict):
            raise UserError(f"{where}: {entry} must be a mapping, got {body!r}")
        for figure in FIGURES:
            value = body.get(figure)
            if figure in body and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
                raise UserError(f"{where}: {entry}.{figure} must be a number, got {value!r}")


def baseline_values(data: dict[str, Any]) -> dict[str, float]:
    """Every figure as {"<entry>_<figure>": value}, e.g. {"gpt2_124m_val_loss": 3.2924, ...}, in file order."""
    check_baselines(data)
    return {f"{entry}_{figure}": float(body[figure])
            for entry, body in data.items() for figure in FIGURES if figure in body}
