"""torch.compile on the CPU (inductor, the C++ compiler): no graph breaks in the train step, compiled training equal
to eager through the trainer (both recipes, and 2 gloo ranks through the stage), no recompilation across steps,
evaluation, sampling and a short last val window, checkpoints and model/ without `_orig_mod.` keys; and bf16
autocast keeping RMSNorm and QK-norm on torch's fused kernel."""
import shutil
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch  # torch._dynamo loads on first use (torch's lazy module): not at every worker's collection
from stagekit import make_project, run_stage, tsv, write_gpt2_shards

from gptcore import distributed
from gptcore.data import shards as shard_io
from gptcore.data.loader import TokenLoader
from gptcore.data.shard_set import ShardSet
from gptcore.eval.val_loss import val_loss
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.report.steplog import StepLogger
from gptcore.train import checkpoints
from gptcore.train.config import TrainConfig
from gptcore.train.trainer import Trainer

GPT2 = {}
MODERN = {"bias": False, "pos_encoding": "rotary", "norm": "rmsnorm", "qk_norm": True, "mlp": "relu2",
          "tie_embeddings": False, "zero_init_proj": True, "logit_softcap": 30.0}
MODERN_TRAIN = {"optimizer": "muon", "muon_lr": 0.02, "weight_decay": 0.0}
RECIPES = {"gpt2": (GPT2, {}), "modern": (MODERN, MODERN_TRAIN)}
# compiled and eager fp32 differ by the order inductor sums in: about 1e-6 relative per step here
TOL = dict(rtol=1e-4, atol=1e-5)

needs_cc = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                              reason="inductor on the CPU needs a C++ compiler")


def tiny(switches: dict, vocab: int = 50304) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=vocab, **switches))


def test_bf16_autocast_keeps_rmsnorm_and_qk_norm_on_the_fused_kernel():
    model = tiny(MODERN, vocab=128)
    x = torch.randint(0, 128, (2, 32))
    with warnings.catch_warnings(record=True) as caught, torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("always")
        _, loss = model(x, x)
        loss.backward()
    assert not [w for w in caught if "fused implementation" in str(w.message)], [str(w.message) for w in caught]
    # the same numbers as nn.RMSNorm in fp32 (the gain cast is all that changed)
    h = torch.randn(3, 16)
    ours = model.transformer.h[0].attn.q_norm
    plain = torch.nn.RMSNorm(16, eps=ours.eps)
    plain.weight.data.copy_(torch.rand(16))
    ours.weight.data.copy_(plain.weight.data)
    torch.testing.assert_close(ours(h), plain(h))


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_graph_breaks_in_the_forward_and_loss(recipe, dtype):
    model = tiny(RECIPES[recipe][0], vocab=128)
    x, y = torch.randint(0, 128, (2, 32)), torch.randint(0, 128, (2, 32))
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        explained = torch._dynamo.explain(model)(x, y)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    return write_gpt2_shards(tmp_path_factory.mktemp("shards"))


def train(model: GPT, shard_dir: Path, cfg: TrainConfig, steps: int, between=None) -> tuple[list[float], Trainer, Path]:
    """`steps` trainer steps (`between(trainer)` after each); the losses, the trainer and a saved checkpoint."""
    env = distributed.setup("cpu")
    loader = TokenLoader(ShardSet.open(shard_dir).splits["train"], 4, model.config.block_size, cfg.total_batch_tokens)
    ckpt = Path(tempfile.mkdtemp())
    trainer = Trainer(model, loader, cfg, env, ckpt, StepLogger(ckpt, enabled=False), {"test": 1})
    losses = []
    for _ in range(steps):
        losses.append(float(trainer.train_step()["train_loss"]))
        trainer.step += 1
        if between is not None:
            between(trainer)
    return losses, trainer, trainer.save()


def saved_weights(folder: Path) -> list[str]:
    """The weight names a checkpoint's index lists (the shards hold every tensor under its name)."""
    index = checkpoints.read_index(folder / checkpoints.METADATA)
    return [k.removeprefix("model.") for k in index.state_dict_metadata if k.startswith("model.")]


@pytest.mark.slow
@needs_cc
@pytest.mark.parametrize("recipe", RECIPES)
def test_compiled_training_equals_eager_without_recompiling(recipe, shard_dir):
    switches, train_over = RECIPES[recipe]
    cfg = TrainConfig.read({
        "device": "cpu", "micro_batch": 4, "total_batch_tokens": 256, "max_steps": 4, "warmup_steps": 1,
        "max_lr": 1e-3, "eval_every": 0, "val_tokens": 33, "ckpt_every": 100, "dtype": "float32", **train_over})
    # a short last window
    val_tokens = shard_io.load_tokens(ShardSet.open(shard_dir).splits["val"][0])[: 32 * 3 + 10 + 1]

    def evaluate_and_sample(trainer: Trainer) -> None:
        # what the loop and the stages do between steps: val loss (a short last window included) and a sample,
        # both on the raw model; then training goes on, which must not recompile the step
        val_loss(trainer.raw_model, val_tokens, 32, 2, torch.device("cpu"))
        trainer.raw_model.generate(torch.zeros(1, 3, dtype=torch.long), 4, top_k=5,
                                   generator=torch.Generator().manual_seed(0), vocab_limit=50257)

    eager, _, _ = train(tiny(switches), shard_dir, cfg, 4)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):  # a recompilation is an error, not a slowdown
        compiled, trainer, path = train(tiny(switches), shard_dir, replace(cfg, compile=True), 4, evaluate_and_sample)
    assert trainer.model is not trainer.raw_model  # the step really ran compiled
    np.testing.assert_allclose(compiled, eager, **TOL)
    saved = saved_weights(path)
    assert not [k for k in saved if "_orig_mod" in k]
    tied = {"lm_head.weight"} if tiny(switches).config.tie_embeddings else set()  # stored once, as the token table
    assert sorted(saved) == sorted(set(tiny(switches).state_dict()) - tied)


@pytest.mark.slow
@needs_cc
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_compiled_two_gloo_ranks_equal_eager_one_rank_through_the_stage(tmp_path, shard_dir, parallel):
    """fsdp: the sharded model compiled whole (FSDP's hooks run eagerly between the compiled graphs)."""
    one = make_project(tmp_path / "one", shard_dir, model=MODERN, max_steps=4, eval_every=2, **MODERN_TRAIN)
    two = make_project(tmp_path / "two", shard_dir, model=MODERN, max_steps=4, eval_every=2, nproc=2,
                       compile=True, parallel=parallel, **MODERN_TRAIN)
    run_stage(one, "train", 1)
    out = run_stage(two, "train", 2)
    assert "2 x cpu" in out.stdout and ("(fsdp" in out.stdout) == (parallel == "fsdp")
    a, b = tsv(one, "train_loss"), tsv(two, "train_loss")
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(4))
    np.testing.assert_allclose([v for _, v in b], [v for _, v in a], **TOL)
    np.testing.assert_allclose([v for _, v in tsv(two, "val_loss")], [v for _, v in tsv(one, "val_loss")], **TOL)
    newest = checkpoints.latest_checkpoint(two / "checkpoints")
    for saved in (checkpoints.load_checkpoint(two / "model" / "model.pt")["model"], saved_weights(newest)):
        assert saved and not [k for k in saved if "_orig_mod" in k]
