"""The lm-eval task folder that ships, conf/lm_eval/local/, runs as docs/evaluation.md gives it, offline: the
documented `eval.lm_eval_include` and `eval.lm_eval_tasks` compose into eval params the stage accepts, and
gptcore's harness loads and scores the folder's tasks from a project root with the hub switched off, as the evaluate
stage calls it (`sentence_endings` over its committed file; `hellaswag_local` over a few rows in the official
HellaSwag file's format where `eval.task: hellaswag` puts that file)."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / "conf" / "lm_eval" / "local"
DOC = ROOT / "docs" / "evaluation.md"

# what stages/evaluate.py does with eval.lm_eval_*: load_tasks, then score_tasks on the run's model and tokenizer
SCORE = """
import json, sys, torch
from gptcore.data.tokenizers import GPT2Tokenizer
from gptcore.eval import harness
from gptcore.model.gpt import GPT, GPTConfig
include, names = sys.argv[1], sys.argv[2:]
tasks = harness.load_tasks(names, include, 0, echo=print)
torch.manual_seed(0)
model = GPT(GPTConfig(block_size=64, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)).eval()
metrics, _ = harness.score_tasks(model, GPT2Tokenizer(), tasks, 0, None, device=torch.device("cpu"),
                                 batch_size=8, progress=False)
print(json.dumps(metrics))
"""


def documented_runs() -> list[dict[str, str]]:
    """The -S values of each `dvc exp run` in docs/evaluation.md that names conf/lm_eval/local."""
    runs = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("dvc exp run") and "conf/lm_eval/local" in line:
            argv = shlex.split(line.split("  #")[0])
            runs.append(dict(argv[i + 1].split("=", 1) for i, w in enumerate(argv) if w == "-S"))
    return runs


def test_the_docs_run_the_shipped_folder_and_show_its_yaml():
    runs = documented_runs()
    assert [r["eval.lm_eval_tasks"] for r in runs] == ["[sentence_endings]", "[hellaswag_local]"]
    assert {r["eval.lm_eval_include"] for r in runs} == {"conf/lm_eval/local"}
    for r in runs:
        task = r["eval.lm_eval_tasks"].strip("[]")
        assert yaml.safe_load((LOCAL / f"{task}.yaml").read_text(encoding="utf-8"))["task"] == task
    shown = re.search(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S).group(1)
    assert yaml.safe_load(re.sub(r"^  ", "", shown, flags=re.M)) == \
        yaml.safe_load((LOCAL / "hellaswag_local.yaml").read_text(encoding="utf-8"))


def test_the_documented_overrides_are_eval_params_the_stage_accepts(tmp_path):
    from dvc.utils.hydra import compose_and_dump

    from gptcore.eval.config import EvalConfig

    for run in documented_runs():
        out = tmp_path / "params.yaml"
        compose_and_dump(out, str(ROOT / "conf"), None, "config", "", [f"{k}={v}" for k, v in run.items()])
        p = EvalConfig.read(yaml.safe_load(out.read_text(encoding="utf-8"))["eval"])
        assert p.lm_eval_include == "conf/lm_eval/local" and p.lm_eval_tasks == [run["eval.lm_eval_tasks"][1:-1]]


def test_sentence_endings_data_is_well_formed():
    rows = [json.loads(line) for line in (LOCAL / "sentence_endings.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 40 and len({r["ctx"] for r in rows}) == 40
    for r in rows:
        assert set(r) == {"ctx", "endings", "label"} and len(r["endings"]) == 4 and len(set(r["endings"])) == 4
        assert r["label"] in range(4) and not r["ctx"].endswith(" ")
    assert sorted({sum(r["label"] == k for r in rows) for k in range(4)}) == [10]  # chance is 0.25 exactly


def test_the_shipped_tasks_score_offline_from_a_project_root(tmp_path):
    project = tmp_path / "p"
    shutil.copytree(LOCAL, project / "conf" / "lm_eval" / "local")
    hellaswag = project / "data" / "hellaswag" / "hellaswag_val.jsonl"
    hellaswag.parent.mkdir(parents=True)
    rows = [{"ind": i, "activity_label": "Baking", "ctx_a": "She mixes the flour.", "ctx_b": "she",
             "ctx": "She mixes the flour. she", "split": "val", "split_type": "indomain", "label": i % 4,
             "endings": ["adds the eggs.", "paints the wall.", "flies away.", "reads a map."],
             "source_id": f"test~{i}"} for i in range(6)]
    hellaswag.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets")}
    proc = subprocess.run([sys.executable, "-c", SCORE, "conf/lm_eval/local", "sentence_endings", "hellaswag_local"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(metrics) == {"sentence_endings", "hellaswag_local"}
    assert (metrics["sentence_endings"]["samples"], metrics["sentence_endings"]["samples_total"]) == (40, 40)
    assert (metrics["hellaswag_local"]["samples"], metrics["hellaswag_local"]["samples_total"]) == (6, 6)
    for row in metrics.values():
        assert 0 <= row["acc"] <= 1 and 0 <= row["acc_norm"] <= 1 and row["num_fewshot"] == 0
    assert "the YAML " in proc.stdout and "conf/lm_eval/local/sentence_endings.yaml" in proc.stdout
