"""The presets of conf/preset/: each listed with its one-line description, and what one composes to (conf/config.yaml's
defaults under the preset's values, as `dvc exp run -S preset=<name>` writes params.yaml with no other -S). Train
compares a replaced run's params with it, so its note names an -S that an earlier experiment had and the next
`dvc exp run` dropped.

    python -m gptcore.presets  # every preset with its description, the default marked
"""
from __future__ import annotations

import argparse
import itertools
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gptcore.errors import UserError
from gptcore.model.config import ModelConfig
from gptcore.train.config import TrainConfig
from gptcore.user_files import read_yaml

CONF = Path(__file__).resolve().parents[1] / "conf"
CONFIG, PRESETS = CONF / "config.yaml", CONF / "preset"


def composed(preset: str, folder: Path = PRESETS) -> dict[str, dict[str, Any]]:
    """The sections `dvc exp run -S preset=<preset>` composes with no other -S: conf/config.yaml's defaults under the
    preset's values, and under those of the presets it builds on (its `defaults:` list, as Hydra merges them)."""
    def merge(into: dict, values: dict) -> None:
        for section, body in values.items():
            if isinstance(body, dict):
                into.setdefault(section, {}).update(body)

    def layer(name: str, into: dict) -> None:
        text = read_yaml(Path(folder) / f"{name}.yaml") or {}
        for base in text.get("defaults", []):
            if isinstance(base, str) and base != "_self_":
                layer(base, into)
        merge(into, text)

    out: dict[str, dict[str, Any]] = {}
    merge(out, read_yaml(CONFIG))
    layer(preset, out)
    return out


def preset_values(preset: str | None) -> dict[str, Any]:
    """The preset's `model:` and `train:` values as the stages read them, by dotted key ({} for no or an unknown
    preset): what a run has where no -S changed it."""
    if not preset or not (PRESETS / f"{preset}.yaml").is_file():
        return {}
    try:
        sections = composed(preset)
        read = {"model": ModelConfig.read(sections["model"]), "train": TrainConfig.read(sections["train"])}
    except (UserError, OSError, KeyError):  # leaves something to -S, or does not compose: no values
        return {}
    return {f"{name}.{key}": value for name, cfg in read.items() for key, value in asdict(cfg).items()}


def preset_table(folder: Path = PRESETS) -> dict[str, dict[str, Any]]:
    """Every preset's values (`preset_values`) by name: what train compares a replaced run's params with."""
    return {path.stem: preset_values(path.stem) for path in sorted(Path(folder).glob("*.yaml"))}


def _first_sentence(text: str) -> str:
    """Up to the first full stop outside brackets that a space or the end follows (`1.26` or `(x.py)` ends none)."""
    depth = 0
    for i, c in enumerate(text):
        depth += (c in "([") - (c in ")]")
        if c == "." and depth <= 0 and (i + 1 == len(text) or text[i + 1].isspace()):
            return text[: i + 1]
    return text


def preset_descriptions(folder: Path = PRESETS) -> dict[str, str]:
    """Each preset of conf/preset/ (its file name) with a one-line description: the first sentence of the comment
    that opens the file, after Hydra's `# @package` line ('' if the file opens with none)."""
    out = {}
    for path in sorted(Path(folder).glob("*.yaml")):
        opening = itertools.takewhile(lambda line: line.startswith("#"), path.read_text(encoding="utf-8").splitlines())
        words = [line.lstrip("#").strip() for line in opening if not line.lstrip("# ").startswith("@package")]
        out[path.stem] = _first_sentence(" ".join(w for w in words if w))
    return out


def list_presets(folder: Path = PRESETS) -> list[str]:
    """The lines `--presets` prints: each preset, the default marked, with its description; then how to pick one."""
    default = next((d["preset"] for d in read_yaml(CONFIG)["defaults"]
                    if isinstance(d, dict) and "preset" in d), None)
    found = preset_descriptions(folder)
    names = {name: name + (" (default)" if name == default else "") for name in found}
    width = max(map(len, names.values()), default=0)
    lines = [f"{names[name]:<{width}}  {about or '(no description: open the file with a comment saying what it is)'}"
             for name, about in found.items()]
    return lines + ["run one: dvc exp run -S preset=<name>"]


def main(argv: list[str] | None = None) -> None:
    """Print the presets of conf/preset/, each with its description, the default marked."""
    argparse.ArgumentParser(prog="python -m gptcore.presets", description=main.__doc__).parse_args(argv)
    print("\n".join(list_presets()))


if __name__ == "__main__":
    main()
