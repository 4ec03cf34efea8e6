"""conf/: every params.yaml section's config class in pipeline order, and conf/config.yaml written from them, one
source for each key's default and description (gptcore/presets.py reads the presets beside it).

    python -m gptcore.conf            # rewrite conf/config.yaml from the config classes
    python -m gptcore.conf --check    # exit 1 if conf/config.yaml is not what the classes give

Unlike the ground floor (gptcore/params.py holds the mechanics), this module imports the config class of each folder.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from gptcore.data.config import FetchConfig, TokenizeConfig
from gptcore.eval.config import EvalConfig
from gptcore.model.config import ModelConfig
from gptcore.params import REQUIRED, Section
from gptcore.report.config import CompareConfig
from gptcore.train.config import TrainConfig

# every section's class, in pipeline order: conf/config.yaml lists them so
SECTIONS: tuple[type[Section], ...] = (FetchConfig, TokenizeConfig, ModelConfig, TrainConfig, EvalConfig,
                                       CompareConfig)
CONFIG = Path(__file__).resolve().parents[1] / "conf" / "config.yaml"

HEADER = """\
# Hydra entry point for DVC experiments (`dvc config hydra.enabled True`): `dvc exp run` composes params.yaml
# from this file and one preset in conf/preset/, then runs the pipeline.
#   dvc exp run                                         # the default preset (quickstart)
#   dvc exp run -S preset=gpt2_124m                     # another preset
#   dvc exp run -S preset=gpt2_124m -S train.max_lr=1e-3  # a preset plus an override
# Here: the schema of params.yaml (key order included) and each key's default; `???` marks what each preset must
# set itself. A key that is not in this file needs `+` on the command line (-S +train.foo=1).
# `dvc exp run` rewrites params.yaml from here, so change values in conf/ or with -S, not in params.yaml.
# Written by `python -m gptcore.conf` from the config classes gptcore/conf.py collects: edit those.
defaults:
  - _self_
  - preset: quickstart

preset: ???  # the preset's own name, so params.yaml and `dvc exp show` say which one ran
"""


def _scalar(value: Any) -> str:
    """A default as YAML 1.2 reads it back the same (DVC's parser) as PyYAML does (the stages')."""
    if value is REQUIRED:
        return "???"
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def render() -> str:
    """conf/config.yaml as the config classes give it: every section, key, default and description, in order."""
    lines = [HEADER.rstrip("\n")]
    for section in SECTIONS:
        lines.append(f"{section.section}:")
        for key, param in section.params().items():
            doc = f"  # {param.doc}" if param.doc else ""
            lines.append(f"  {key}: {_scalar(param.default)}{doc}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Write conf/config.yaml from the config classes (--check: say whether it is up to date)."""
    ap = argparse.ArgumentParser(prog="python -m gptcore.conf", description=main.__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if the file differs from what the classes give")
    ap.add_argument("--path", type=Path, default=CONFIG)
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if args.path.read_text(encoding="utf-8") != text:
            sys.exit(f"{args.path}: out of date with the config classes; run `python -m gptcore.conf`")
        return
    args.path.write_text(text, encoding="utf-8")
    print(f"wrote {args.path}")


if __name__ == "__main__":
    main()
