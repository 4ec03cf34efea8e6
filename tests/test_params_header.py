"""params.yaml's header (where it comes from, where its keys are documented) survives `dvc exp run`: DVC's own
composition (dvc.utils.hydra.compose_and_dump, called as `dvc exp run` calls it) writes it, through
hydra_plugins/gptcore_params_header.py; and the committed params.yaml is that composition of the default preset."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from gptcore.config import SECTIONS

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "hydra_plugins" / "gptcore_params_header.py"

# In a fresh interpreter (Hydra scans for plugins once per process), as DVC's experiment queue composes params.yaml:
# plugins_path is the repo root joined with `hydra.plugins_path` (unset: ""). Also dumps a config of other keys.
COMPOSE = """
import json, os, sys
from dvc.utils.hydra import compose_and_dump
from omegaconf import OmegaConf
root, out = sys.argv[1], sys.argv[2]
for name, overrides in (("default", []), ("lr", ["train.max_lr=3e-3"]), ("again", [])):
    compose_and_dump(os.path.join(out, name + ".yaml"), os.path.join(root, "conf"), None, "config",
                     os.path.join(root, ""), overrides)
print(json.dumps(OmegaConf.to_yaml(OmegaConf.create({"a": 1, "b": {"c": 2}}))))
"""


def plugin_module():
    """The plugin's module, read without importing it (importing installs its wrapper)."""
    namespace: dict = {}
    source = PLUGIN.read_text(encoding="utf-8").replace("\ninstall()\n", "\n")
    exec(compile(source, str(PLUGIN), "exec"), namespace)
    return namespace


def test_dvc_composition_writes_the_header_once_and_the_same_params(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only DVC's plugins_path finds the plugin
    proc = subprocess.run([sys.executable, "-c", COMPOSE, str(ROOT), str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    header = plugin_module()["PARAMS_HEADER"]
    texts = {n: (tmp_path / f"{n}.yaml").read_text(encoding="utf-8") for n in ("default", "lr", "again")}
    for text in texts.values():
        assert text.startswith(header) and text.count(header) == 1
        assert not text[len(header):].startswith("#")
    assert "docs/params.md" in header and "conf/" in header and "-S" in header
    assert texts["again"] == texts["default"]
    default, lr = yaml.safe_load(texts["default"]), yaml.safe_load(texts["lr"])
    assert lr["train"]["max_lr"] == 3e-3 and {**lr, "train": {**lr["train"], "max_lr": 0}} == \
        {**default, "train": {**default["train"], "max_lr": 0}}
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == "a: 1\nb:\n  c: 2\n"  # another config: untouched
    # the committed params.yaml is the default preset's composition, header included (`dvc repro` reads it as is)
    assert (ROOT / "params.yaml").read_text(encoding="utf-8") == texts["default"]


def test_the_plugin_knows_params_yamls_top_level_and_dvc_scans_the_root():
    module = plugin_module()
    assert module["KEYS"] == {"preset"} | {s.name for s in SECTIONS}
    text = "preset: x\n"
    assert module["with_header"](text) == module["PARAMS_HEADER"] + text
    assert module["with_header"](module["with_header"](text)) == module["PARAMS_HEADER"] + text
    # a hydra_plugins/__init__.py would hide any installed Hydra plugin behind this folder
    assert not (PLUGIN.parent / "__init__.py").exists()
    from configobj import ConfigObj  # what DVC reads its config with

    hydra = ConfigObj(str(ROOT / ".dvc" / "config"))["hydra"]
    assert hydra["enabled"] in ("True", "true") and hydra.get("plugins_path", "") in ("", ".")
