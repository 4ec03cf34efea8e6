"""README's first commands, copied in order into a fresh clone, each doing what its line says: the set-up line's
smoke run (the real smoke preset), then `dvc exp run`, which runs the quick start (here a micro default preset on
the quick start's data, so that the same command shapes cost seconds, not minutes). Before, the quick start's line
ended in `dvc repro`, which after the smoke run answered "Data and pipelines are up to date": the workspace held the
smoke run's params."""
from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml
from conftest import ROOT, run_in
from dvc.utils.hydra import compose_and_dump
from test_docs import readme_quick_start

# the quick start's data (so the smoke run's fetch and tokenize are reused, as README says), a micro model and budget
DEFAULT = """\
# @package _global_
# The test's default preset: the quick start's data, a 1-layer model, 6 steps.
defaults:
  - quickstart
  - _self_

preset: micro
model:
  n_layer: 1
  n_head: 2
  n_embd: 32
  block_size: 32
train:
  micro_batch: 8
  total_batch_tokens: 256
  max_steps: 6
  warmup_steps: 1
  eval_every: 3
  val_tokens: 1024
  eval_batch: 8
  ckpt_every: 100
eval:
  val_tokens: 2048
  eval_batch: 8
  cloze_examples: 20
  cloze_context: 16
  cloze_ending: 4
  samples: 1
  sample_tokens: 8
compare:
  target_val_loss: null
"""
SET_UP = ("python3 -m venv ", ". .venv/bin/activate", "pip install ")  # done: the tests run in such a venv


def read(clone, name: str) -> dict:
    return json.loads((clone / name).read_text(encoding="utf-8"))


@pytest.mark.slow
def test_readme_s_first_commands_in_order_in_a_fresh_clone(tmp_path):
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    (clone / "conf" / "preset" / "micro.yaml").write_text(DEFAULT, encoding="utf-8")
    config = clone / "conf" / "config.yaml"
    config.write_text(config.read_text(encoding="utf-8").replace("  - preset: quickstart\n", "  - preset: micro\n"),
                      encoding="utf-8")
    compose_and_dump(clone / "params.yaml", str(clone / "conf"), None, "config", "", [])  # as committed: the default
    run_in(clone, "git", "add", "-A")
    run_in(clone, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a micro default preset")

    first, second = readme_quick_start()
    commands = [c.strip() for c in first.split("&&")]
    assert [c for c in commands if c.startswith(SET_UP)] == commands[:-1], commands  # install, then one run
    smoke = run_in(clone, *commands[-1].split())
    assert commands[-1] == "dvc exp run -S preset=smoke"
    for stage in ("fetch", "tokenize", "train", "evaluate", "compare"):
        assert f"Running stage '{stage}'" in smoke, smoke[-3000:]
    assert yaml.safe_load((clone / "params.yaml").read_text(encoding="utf-8"))["preset"] == "smoke"
    assert read(clone, "metrics/train/metrics.json")["step"] == 40  # the smoke preset's 40 steps
    assert "[compare] measured: eval val_loss" in smoke
    smoke_eval = read(clone, "metrics/eval.json")

    quick = run_in(clone, *second.split())  # `dvc exp run`: the default preset, composed afresh
    assert second == "dvc exp run"
    assert "up to date" not in quick
    assert "Stage 'fetch' didn't change" in quick and "Stage 'tokenize' didn't change" in quick  # the smoke's data
    for stage in ("train", "evaluate", "compare"):
        assert f"Running stage '{stage}'" in quick, quick[-3000:]
    assert yaml.safe_load((clone / "params.yaml").read_text(encoding="utf-8"))["preset"] == "micro"
    assert read(clone, "metrics/train/metrics.json")["step"] == 6 and read(clone, "metrics/eval.json") != smoke_eval
    # the switch of preset is one short line, the smoke run kept
    switch = [ln for ln in quick.splitlines() if "starting fresh" in ln]
    assert len(switch) == 1 and re.search(r"starting fresh \(preset smoke -> micro, \d+ params differ\)$", switch[0])
    assert len(switch[0]) < 200 and "-S" not in switch[0], switch[0]
    assert "the previous run's checkpoints and metrics/train/ are kept in checkpoints/previous/" in quick
    shown = json.loads(run_in(clone, "dvc", "exp", "show", "--json"))
    presets = [r["data"]["params"]["params.yaml"]["data"]["preset"] for c in shown for e in c.get("experiments") or []
               for r in e["revs"]]
    assert sorted(presets) == ["micro", "smoke"], presets  # both runs are experiments `dvc exp show` lists
