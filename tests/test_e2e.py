"""A fresh clone of the repository runs the whole stage graph with `dvc repro` on a micro budget."""
import json
import math
import subprocess
from pathlib import Path

import pytest
import yaml
from stagekit import ROOT, env

pytestmark = pytest.mark.slow

MICRO = {
    "fetch": {"max_docs": 4},
    "tokenize": {"val_tokens": 8192},
    "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32},
    "train": {"micro_batch": 4, "total_batch_tokens": 128, "max_steps": 6, "warmup_steps": 2, "eval_every": 3,
              "val_tokens": 1024, "ckpt_every": 3},
    "eval": {"val_tokens": 2048, "cloze_examples": 20, "cloze_context": 16, "cloze_ending": 4, "samples": 1,
             "sample_tokens": 8},
}


def run(cmd: list[str], cwd: Path) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env() | {"PYTHONPATH": ""}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def finite_numbers(d):
    for v in d.values():
        if isinstance(v, dict):
            yield from finite_numbers(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield v


def test_fresh_clone_dvc_repro_micro(tmp_path):
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(ROOT), str(clone)], tmp_path)
    params = yaml.safe_load((clone / "params.yaml").read_text())
    for section, values in MICRO.items():
        params[section].update(values)
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["dvc", "repro"], clone)
    for name in ("metrics/train/metrics.json", "metrics/eval.json", "metrics/summary.json"):
        data = json.loads((clone / name).read_text())
        values = list(finite_numbers(data))
        assert values and all(math.isfinite(v) for v in values), (name, data)
    eval_json = json.loads((clone / "metrics/eval.json").read_text())
    assert eval_json["cloze"]["count"] == 20
    assert (clone / "model/model.pt").exists() and (clone / "metrics/samples.txt").exists()
    shown = run(["dvc", "metrics", "show"], clone)
    assert "val_loss_vs_gpt2" in shown and "metrics/eval.json" in shown
    # Nothing changed: a second repro reruns nothing.
    assert "didn't change" in run(["dvc", "repro"], clone) or "up to date" in run(["dvc", "status"], clone)
