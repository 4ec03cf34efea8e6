"""The `train:` section of params.yaml (`TRAIN`, `TrainConfig`) and every check a run gets before any weights exist
(`preflight`): against the processes, the data and the device's memory."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gptcore import device
from gptcore.data import shards
from gptcore.device import DEVICES, DTYPES
from gptcore.lifetime import under_torchrun
from gptcore.model.load import model_vocab
from gptcore.params import REQUIRED, Param, ParamError, Section, check_val_tokens
from gptcore.train import memory
from gptcore.train.optim import OPTIMIZERS
from gptcore.train.schedule import SCHEDULES, wsd_decay_steps


def _relations(p: dict[str, Any]) -> None:
    if p["warmup_steps"] > p["max_steps"]:
        raise ParamError("train.warmup_steps", p["warmup_steps"], f"must be <= train.max_steps={p['max_steps']}")
    decay = wsd_decay_steps(p["max_steps"], p["decay_frac"])
    if p["schedule"] == "wsd" and p["warmup_steps"] + decay > p["max_steps"]:
        raise ParamError("train.warmup_steps", p["warmup_steps"],
                         f"with train.schedule wsd, warmup plus the decay's {decay} steps (train.decay_frac="
                         f"{p['decay_frac']} of {p['max_steps']}) must fit in train.max_steps")


# resume_ok=True marks what changes how a run executes or reports but not its weights: it may differ on resume
TRAIN = Section("train", {
    "nproc": Param(int, 1, "processes (GPUs) torchrun starts on this machine", min=1, resume_ok=True),
    "device": Param(str, "auto", "auto (cuda, else mps, else cpu) | cpu | cuda | cuda:N | mps", pattern=DEVICES,
                    what="auto, cpu, cuda, cuda:N or mps", resume_ok=True),
    "micro_batch": Param(int, REQUIRED, "sequences per forward pass on each process", min=1, resume_ok=True),
    "total_batch_tokens": Param(int, REQUIRED, "tokens per optimizer step, over all processes and micro steps",
                                min=1),
    "max_steps": Param(int, REQUIRED, "optimizer steps (0: only evaluate and export the starting weights)", min=0),
    "warmup_steps": Param(int, REQUIRED, "linear learning-rate warmup steps", min=0),
    "max_lr": Param(float, REQUIRED, "AdamW's peak learning rate (the default of embed_lr, head_lr and scalar_lr; "
                                     "with optimizer adamw also the hidden matrices')", above=0.0),
    "embed_lr": Param(float, None, "AdamW's peak rate of the token and position tables (null: max_lr); modded-"
                                   "nanogpt's record 2024-11-03 gave the untied token table its own rate",
                      above=0.0, also=(None,)),
    "head_lr": Param(float, None, "AdamW's peak rate of lm_head, or of the one tied matrix (null: max_lr); "
                                  "modded-nanogpt record 2024-11-03", above=0.0, also=(None,)),
    "scalar_lr": Param(float, None, "AdamW's peak rate of gains and biases (null: max_lr); modded-nanogpt gives "
                                    "its scalars their own Adam rate", above=0.0, also=(None,)),
    "optimizer": Param(str, "adamw", "adamw | muon (Muon for the blocks' 2-D weights, each fused q/k/v or gate/up "
                                     "matrix orthogonalised per matrix; AdamW for the rest)", choices=OPTIMIZERS),
    "muon_lr": Param(float, 0.02, "Muon's peak rate (optimizer muon); the schedule scales it with max_lr", above=0.0),
    "muon_momentum": Param(float, 0.95, "Muon's Nesterov momentum (optimizer muon)", min=0.0, below=1.0),
    "muon_clip": Param(bool, True, "the gradient-norm clip covers Muon's matrices too (false: AdamW's parameters "
                                   "only, as modded-nanogpt, which clips nothing Muon updates)"),
    "schedule": Param(str, "cosine", "cosine (warmup, cosine decay to min_lr) | wsd (warmup, max_lr held, linear "
                                     "decay over the last decay_frac of max_steps: modded-nanogpt, nanochat)",
                      choices=SCHEDULES),
    "decay_frac": Param(float, 0.2, "schedule wsd: the fraction of max_steps spent decaying to min_lr",
                        above=0.0, max=1.0),
    "min_lr_ratio": Param(float, 0.1, "final learning rate of the decay, as a fraction of each group's peak",
                          min=0.0, max=1.0),
    "weight_decay": Param(float, 0.1, "AdamW weight decay of the 2-D weights", min=0.0),
    "beta1": Param(float, 0.9, "AdamW beta1", min=0.0, below=1.0),
    "beta2": Param(float, 0.95, "AdamW beta2", min=0.0, below=1.0),
    "eps": Param(float, 1.0e-08, "AdamW epsilon", above=0.0),
    "grad_clip": Param(float, 1.0, "clip the global gradient norm to this", above=0.0),
    "dtype": Param(str, "bfloat16", "autocast precision (float32 turns it off)", choices=tuple(sorted(DTYPES))),
    "compile": Param(bool, False, "torch.compile the model", resume_ok=True),
    "seed": Param(int, 1337, "seed of the initial weights, dropout and shuffling", min=0),
    "eval_every": Param(int, REQUIRED, "evaluate every this many steps (0: only at the end)", min=0, resume_ok=True),
    "val_tokens": Param(int, REQUIRED, "val loss over the first val_tokens tokens of the val split", min=1,
                        resume_ok=True),
    "val_batch": Param(int, 32, "sequences per forward pass when evaluating", min=1, resume_ok=True),
    "ckpt_every": Param(int, REQUIRED, "save a checkpoint every this many steps", min=1, resume_ok=True),
    "keep_checkpoints": Param(int, 2, "newest checkpoints kept in checkpoints/", min=1, resume_ok=True),
    "shuffle": Param(bool, True, "shuffle shard and window order each epoch"),
    "log_every": Param(int, 1, "log train metrics every this many steps", min=1, resume_ok=True),
    "hellaswag": Param(bool, False, "HellaSwag at every eval (GPT-2 BPE data only)", resume_ok=True),
    "hellaswag_path": Param(str, None, "a local HellaSwag val jsonl (null: download it)", also=(None,),
                            resume_ok=True),
    "hellaswag_examples": Param(int, None, "score the first this many HellaSwag examples (null: all 10,042)", min=1,
                                also=(None,), resume_ok=True),
    "samples": Param(int, 0, "text samples at each eval, written to metrics/train/samples/", min=0, resume_ok=True),
    "sample_prompt": Param(str, "", "prompt of those samples", resume_ok=True),
    "sample_tokens": Param(int, 32, "tokens per sample", min=1, resume_ok=True),
    "wandb_log": Param(bool, False, "also log the step metrics to Weights & Biases (rank 0; dvclive stays)",
                       resume_ok=True),
    "wandb_project": Param(str, "gptcore", "the W&B project of those runs (each named after the DVC experiment)",
                           resume_ok=True),
    "export": Param(str, "final", "what model/ gets: final (the last weights) | best (those of the lowest val loss)",
                    choices=("final", "best")),
}, _relations)

RESUME_OK = frozenset(k for k, p in TRAIN.params.items() if p.resume_ok)


@TRAIN.config(frozen=True)
class TrainConfig:
    """A `train:` section as TRAIN validated it, typed: what the loop reads."""


def check_run(model: dict[str, Any], train: dict[str, Any], world_size: int,
              val_split_tokens: int | None = None) -> None:
    """Checks between validated `model:` and `train:` sections, the process count and the val split's size."""
    block = model["block_size"]
    per_step = train["micro_batch"] * block * world_size
    if train["total_batch_tokens"] % per_step:
        raise ParamError("train.total_batch_tokens", train["total_batch_tokens"],
                         f"must be a multiple of train.micro_batch * model.block_size * processes = "
                         f"{train['micro_batch']} * {block} * {world_size} = {per_step}")
    check_val_tokens("train.val_tokens", train["val_tokens"], block, val_split_tokens)


def fingerprint_params(model: dict[str, Any], train: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """The params that shape the weights of a run; a checkpoint resumes only into a run with the same ones."""
    shaping = {k: v for k, v in train.items() if k not in RESUME_OK}
    if train["optimizer"] == "adamw":  # Muon's settings do not touch an AdamW run
        shaping = {k: v for k, v in shaping.items() if not k.startswith("muon_")}
    if train["schedule"] == "cosine":
        shaping.pop("decay_frac", None)
    return {"model": dict(model), "train": shaping, "data": dict(data)}


def preflight(model: dict[str, Any], train: dict[str, Any], shard_dir: Path) -> None:
    """Every check of validated `model:` and `train:` sections against the processes, the data and the memory, before
    any weights exist: the same in a torchrun launcher (which keeps off the GPUs: its ranks check theirs) and a rank."""
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else train["nproc"]
    check_run(model, train, world, shards.split_tokens(shard_dir, "val"))
    dev = device.pick_device(train["device"], int(os.environ.get("LOCAL_RANK", "0")), key="train.device")
    if dev.type != "cuda" or world == 1 or under_torchrun():
        vocab = model_vocab(model["vocab_size"], shards.read_manifest(shard_dir)["vocab_size"])
        memory.check_fits(model, train, vocab, dev, world)
