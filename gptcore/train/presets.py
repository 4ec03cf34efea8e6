"""What a preset composes to: conf/config.yaml's defaults under a preset's values, as `dvc exp run -S preset=<name>`
writes params.yaml with no other -S. Train compares a replaced run's params with it, so its note names an -S that an
earlier experiment had and the next `dvc exp run` dropped."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from gptcore.errors import UserError
from gptcore.model.load import ModelConfig
from gptcore.train.config import TrainConfig

CONF = Path(__file__).resolve().parents[2] / "conf"
CONFIG, PRESETS = CONF / "config.yaml", CONF / "preset"


def composed(preset: str, folder: Path = PRESETS) -> dict[str, dict[str, Any]]:
    """The sections `dvc exp run -S preset=<preset>` composes with no other -S: conf/config.yaml's defaults under the
    preset's values, and under those of the presets it builds on (its `defaults:` list, as Hydra merges them)."""
    def merge(into: dict, values: dict) -> None:
        for section, body in values.items():
            if isinstance(body, dict):
                into.setdefault(section, {}).update(body)

    def layer(name: str, into: dict) -> None:
        text = yaml.safe_load((Path(folder) / f"{name}.yaml").read_text(encoding="utf-8")) or {}
        for base in text.get("defaults", []):
            if isinstance(base, str) and base != "_self_":
                layer(base, into)
        merge(into, text)

    out: dict[str, dict[str, Any]] = {}
    merge(out, yaml.safe_load(CONFIG.read_text(encoding="utf-8")))
    layer(preset, out)
    return out


def preset_values(preset: str | None) -> dict[str, Any]:
    """The preset's `model:` and `train:` values as the stages read them, by dotted key ({} for no or an unknown
    preset): what a run has where no -S changed it."""
    if not preset or not (PRESETS / f"{preset}.yaml").is_file():
        return {}
    sections = composed(preset)
    try:
        read = {"model": ModelConfig.read(sections["model"]), "train": TrainConfig.read(sections["train"])}
    except UserError:  # a preset that leaves something to -S: no values to compare with
        return {}
    return {f"{name}.{key}": value for name, cfg in read.items() for key, value in asdict(cfg).items()}
