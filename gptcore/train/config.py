"""params.yaml's `train:` section (`TrainConfig`), the checks between it and the `model:` section, and what of the two
makes a run's fingerprint. The names of optimizers, schedules, parallel modes and tasks are checked against their
tables where the Trainer picks its parts (`gptcore.params.choose`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gptcore.device import DEVICE_RULES, DTYPE_RULES
from gptcore.errors import DEV_INSTALL, require
from gptcore.eval.val_loss import scored_count
from gptcore.model.config import ModelConfig
from gptcore.params import REQUIRED, ParamError, Section, param
from gptcore.train.schedule import wsd_decay_steps


def _muon(cfg: TrainConfig) -> bool:
    return cfg.optimizer == "muon"  # Muon's settings shape only a Muon run's weights


def _wsd(cfg: TrainConfig) -> bool:
    return cfg.schedule == "wsd"


@dataclass(frozen=True, kw_only=True)
class TrainConfig(Section):
    """params.yaml's `train:` section: what the Trainer reads. `resume_ok` marks what changes how a run executes or
    reports but not its weights (it may differ on resume); every other key that applies is in the run's fingerprint."""

    section = "train"
    nproc: int = param(1, "processes (GPUs) torchrun starts on this machine", min=1, resume_ok=True)
    device: str = param(**DEVICE_RULES, resume_ok=True)
    micro_batch: int = param(REQUIRED, "sequences per forward pass on each process", min=1, resume_ok=True)
    total_batch_tokens: int = param(REQUIRED, "tokens per optimizer step, over all processes and micro steps", min=1)
    max_steps: int = param(REQUIRED, "optimizer steps (0: only evaluate and export the starting weights)", min=0)
    warmup_steps: int = param(REQUIRED, "linear learning-rate warmup steps", min=0)
    max_lr: float = param(REQUIRED, "AdamW's peak learning rate (the default of embed_lr, head_lr and scalar_lr; with "
                                    "optimizer adamw also the hidden matrices')", above=0.0)
    embed_lr: float | None = param(None, "AdamW's peak rate of the token and position tables (null: max_lr); "
                                         "modded-nanogpt's record 2024-11-03 gave the untied token table its own rate",
                                   above=0.0)
    head_lr: float | None = param(None, "AdamW's peak rate of lm_head, or of the one tied matrix (null: max_lr); "
                                        "modded-nanogpt record 2024-11-03", above=0.0)
    scalar_lr: float | None = param(None, "AdamW's peak rate of gains and biases (null: max_lr); modded-nanogpt gives "
                                          "its scalars their own Adam rate", above=0.0)
    optimizer: str = param("adamw", "adamw | muon (Muon for the blocks' 2-D weights, each fused q/k/v or gate/up "
                                    "matrix orthogonalised per matrix; AdamW for the rest): gptcore/train/optimizers/")
    muon_lr: float = param(0.02, "Muon's peak rate (optimizer muon); the schedule scales it with max_lr", above=0.0,
                           applies=_muon)
    muon_momentum: float = param(0.95, "Muon's Nesterov momentum (optimizer muon)", min=0.0, below=1.0,
                                 applies=_muon)
    muon_clip: bool = param(True, "the gradient-norm clip covers Muon's matrices too (false: AdamW's parameters "
                                  "only, as modded-nanogpt, which clips nothing Muon updates)", applies=_muon)
    schedule: str = param("cosine", "cosine (warmup, cosine decay to min_lr) | wsd (warmup, max_lr held, linear "
                                    "decay over the last decay_frac of max_steps: modded-nanogpt, nanochat)")
    decay_frac: float = param(0.2, "schedule wsd: the fraction of max_steps spent decaying to min_lr", above=0.0,
                              max=1.0, applies=_wsd)
    min_lr_ratio: float = param(0.1, "final learning rate of the decay, as a fraction of each group's peak", min=0.0,
                                max=1.0)
    weight_decay: float = param(0.1, "AdamW weight decay of the 2-D weights", min=0.0)
    beta1: float = param(0.9, "AdamW beta1", min=0.0, below=1.0)
    beta2: float = param(0.95, "AdamW beta2", min=0.0, below=1.0)
    eps: float = param(1.0e-08, "AdamW epsilon", above=0.0)
    grad_clip: float = param(1.0, "clip the global gradient norm to this", above=0.0)
    dtype: str = param(**DTYPE_RULES)
    compile: bool = param(False, "torch.compile the model", resume_ok=True)
    parallel: str = param("ddp", "ddp (every process holds the whole model) | fsdp (FSDP2: weights, gradients and "
                                 "optimizer state sharded over the processes) | hsdp (sharded inside a node, "
                                 "replicated across nodes): gptcore/train/parallel.py", resume_ok=True)
    # the bounds on every wait for another rank (docs/resume-and-failures.md), as torchtitan's init and train timeouts
    init_timeout: float = param(900.0, "seconds a rank of several may take to start: to join the others, read the data "
                                       "and the starting weights and finish its first step (its compile included)",
                                above=0.0, resume_ok=True)
    dist_timeout: float = param(600.0, "seconds a rank of several may then wait for the others in a collective, or go "
                                       "without progress (one step, eval or save); a rank that stalls is named and "
                                       "the run ended", above=0.0, resume_ok=True)
    stop_timeout: float = param(10.0, "seconds a SIGINT or SIGTERM to a train.nproc > 1 run waits for each rank to "
                                      "finish its step (an eval or save in flight: dist_timeout) before it kills it",
                                min=0.0, resume_ok=True)
    seed: int = param(1337, "seed of the initial weights, dropout and shuffling", min=0)
    eval_every: int = param(REQUIRED, "evaluate every this many steps (0: only at the end)", min=0, resume_ok=True)
    val_tokens: int | None = param(None, "val loss over at most the first val_tokens tokens of the val split (null: "
                                         "all of it)", min=1, resume_ok=True)
    eval_batch: int = param(32, "sequences per forward pass when evaluating", min=1, resume_ok=True)
    ckpt_every: int = param(REQUIRED, "save a checkpoint every this many steps", min=1, resume_ok=True)
    keep_checkpoints: int = param(2, "newest checkpoints kept in checkpoints/", min=1, resume_ok=True)
    shuffle: bool = param(True, "shuffle shard and window order each epoch")
    log_every: int = param(1, "log train metrics every this many steps", min=1, resume_ok=True)
    # the multiple-choice tasks at each eval: the same keys as eval:'s (tasks/base.py's TaskSettings)
    tasks: list[str] = param([], "multiple-choice tasks scored at each eval: hellaswag (GPT-2 BPE data only), cloze "
                                 "([]: none)", resume_ok=True)
    hellaswag_path: str | None = param(None, "a local HellaSwag val jsonl (null: download it)", resume_ok=True)
    hellaswag_examples: int | None = param(None, "score the first this many HellaSwag examples (null: all 10,042)",
                                           min=1, resume_ok=True)
    cloze_examples: int | None = param(500, "cloze questions cut from the scored val tokens (null: as many as they "
                                            "hold, at most 500)", min=1, resume_ok=True)
    cloze_context: int = param(64, "context tokens of a cloze question", min=1, resume_ok=True)
    cloze_ending: int = param(16, "tokens of each cloze ending", min=1, resume_ok=True)
    samples: int = param(0, "text samples at each eval, written to metrics/train/samples/", min=0, resume_ok=True)
    sample_prompt: str = param("", "prompt of those samples", resume_ok=True)
    sample_tokens: int = param(32, "tokens per sample", min=1, resume_ok=True)
    wandb_log: bool = param(False, "also log the step metrics to Weights & Biases (rank 0; dvclive stays)",
                            resume_ok=True)
    wandb_project: str = param("gptcore", "the W&B project of those runs (each named after the DVC experiment)",
                               resume_ok=True)
    export: str = param("final", "what model/ gets: final (the last weights) | best (those of the lowest val loss)",
                        choices=("final", "best"))

    def check(self) -> None:
        """Warmup fits in the run, and with WSD so does the decay; W&B is installed."""
        if self.wandb_log:
            require("wandb", "train.wandb_log", f"{DEV_INSTALL} (or pip install -e '.[wandb]')")
        if self.warmup_steps > self.max_steps:
            raise ParamError("train.warmup_steps", self.warmup_steps, f"must be <= train.max_steps={self.max_steps}")
        decay = wsd_decay_steps(self.max_steps, self.decay_frac)
        if self.schedule == "wsd" and self.warmup_steps + decay > self.max_steps:
            raise ParamError("train.warmup_steps", self.warmup_steps,
                             f"with train.schedule wsd, warmup plus the decay's {decay} steps (train.decay_frac="
                             f"{self.decay_frac} of {self.max_steps}) must fit in train.max_steps")


def batch_that_fits(total: int, micro_batch: int, row_tokens: int) -> str:
    """The -S that makes `total` tokens a step a whole number of micro steps of `row_tokens` a row: the largest
    smaller micro batch that divides it (the run stays the same), else the step sizes either side of `total`."""
    fits = next((m for m in range(micro_batch - 1, 0, -1) if total % (m * row_tokens) == 0), None)
    if fits is not None:
        return f"-S train.micro_batch={fits} fits (the tokens a step, and so the run, stay the same)"
    per_step = micro_batch * row_tokens
    below, above = total // per_step * per_step, (total // per_step + 1) * per_step
    sizes = f"{below} or {above}" if below else f"{above}"
    return f"no micro batch divides it: -S train.total_batch_tokens={sizes} fits"


def check_run(model: ModelConfig, train: TrainConfig, world_size: int, val_split_tokens: int | None = None) -> None:
    """Checks between the `model:` and `train:` sections, the process count and the val split's size."""
    block = model.block_size
    per_step = train.micro_batch * block * world_size
    if train.total_batch_tokens % per_step:
        raise ParamError("train.total_batch_tokens", train.total_batch_tokens,
                         f"must be a multiple of train.micro_batch * model.block_size * processes = "
                         f"{train.micro_batch} * {block} * {world_size} = {per_step}; "
                         f"{batch_that_fits(train.total_batch_tokens, train.micro_batch, block * world_size)}")
    scored_count("train.val_tokens", train.val_tokens, block, val_split_tokens)


def fingerprint_params(model: ModelConfig, train: TrainConfig, data: dict[str, Any]) -> dict[str, Any]:
    """The params that shape the weights of a run (each section's `fingerprint`) and the data's record; a checkpoint
    resumes only into a run with the same ones."""
    return {"model": asdict(model), "train": train.fingerprint(), "data": dict(data)}
