"""Extension in one place: a toy optimizer and a toy eval task, each registered as a module of its own would register
it, run through the real train and evaluate stages (docs/architecture.md, Extending)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from stagekit import env, make_project, write_gpt2_shards

# what a module of its own would hold: the registration, then the stage runs as `python -m stages.<name>` would
PLUGIN = """
import sys
import torch
from gptcore.eval.scorer import Example
from gptcore.eval.tasks import TASKS
from gptcore.eval.tasks.base import Task
from gptcore.train.optimizers import OPTIMIZERS
from gptcore.train.optimizers.base import OptimizerKind, Optimizers


def sgd(model, cfg, device_type):
    return Optimizers({"sgd": torch.optim.SGD(model.parameters(), lr=cfg.max_lr, momentum=0.9)})


def next_pair(cfg, tok, tokens, block_size, progress):
    # the two tokens that follow 8 val tokens, against three other pairs of the val split
    pairs = lambda i: [tokens[j:j + 2].tolist() for j in (i + 8, i + 50, i + 90, i + 130)]
    return [Example(context=tokens[i:i + 8].tolist(), endings=pairs(i), label=0, index=n)
            for n, i in enumerate(range(0, 12 * 160, 160))]


OPTIMIZERS["toy_sgd"] = OptimizerKind(sgd, bytes_per_weight=12)
TASKS["toy_next"] = Task(next_pair)
from stages import train, evaluate
{"train": train, "evaluate": evaluate}[sys.argv[1]].main()
"""


def run(project, stage: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PLUGIN, stage], cwd=project, env=env(), capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow  # trains through the stages' code in subprocesses
def test_a_toy_optimizer_and_a_toy_task_run_through_train_and_evaluate(tmp_path):
    project = make_project(tmp_path / "p", write_gpt2_shards(tmp_path / "shards"), eval={"tasks": ["toy_next"]},
                           optimizer="toy_sgd", max_steps=4, eval_every=2)
    trained = run(project, "train")
    assert trained.returncode == 0, trained.stderr[-3000:]
    from gptcore.train import checkpoints

    record = checkpoints.read(checkpoints.latest_checkpoint(project / "checkpoints"))
    assert set(record["optimizer"]) == {"sgd"} and record["params"]["train"]["optimizer"] == "toy_sgd"
    evaluated = run(project, "evaluate")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    result = json.loads((project / "metrics" / "eval.json").read_text())
    assert result["toy_next"]["count"] == 12 and 0 <= result["toy_next"]["acc_norm"] <= 1
    # without the module, the names are refused like any unknown value, in one line naming the key
    plain = subprocess.run([sys.executable, "-m", "stages.evaluate"], cwd=project, env=env(), capture_output=True,
                           text=True, timeout=600)
    assert plain.returncode == 1 and plain.stderr.strip().splitlines() == [
        "[evaluate] params.yaml eval.tasks='toy_next': must be one of hellaswag, cloze"]
    assert yaml.safe_load((project / "params.yaml").read_text())["train"]["optimizer"] == "toy_sgd"
