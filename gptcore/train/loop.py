"""One training run, from its params to its last step: the `train:` section's schema (`TRAIN`, `TrainConfig`) and
every check before any weights exist (`preflight`); the evaluators of its eval cadence (val loss, HellaSwag, samples);
and the loop (gradient accumulation, DDP, mixed precision, clipping, checkpoints, resume), which knows a model, a
batch source (`next_batch`, `state_dict`, `grad_accum`), a checkpoint folder and a logger; not shards, not DVC."""
from __future__ import annotations

import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from gptcore import distributed
from gptcore.atomic import write_text
from gptcore.data import shards
from gptcore.data.tokenizers import Tokenizer
from gptcore.distributed import DEVICES, DTYPES, DistEnv, autocast_context, resolve_dtype
from gptcore.eval.score import hellaswag_examples, score_examples, val_loss, val_stream
from gptcore.model.gpt import GPT, estimate_mfu, model_sizes, sample
from gptcore.model.load import model_vocab, strip_prefixes
from gptcore.params import REQUIRED, Param, ParamError, Section, check_val_tokens
from gptcore.process import UserError, under_torchrun
from gptcore.report.steplog import StepLogger
from gptcore.train import checkpoint
from gptcore.train.optim import OPTIMIZERS, SCHEDULES, LRSchedule, build_optimizers, set_lr, wsd_decay_steps


# -- the train: section ------------------------------------------------------------------------------------------
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
    device = distributed.pick_device(train["device"], int(os.environ.get("LOCAL_RANK", "0")), key="train.device")
    if device.type != "cuda" or world == 1 or under_torchrun():
        vocab = model_vocab(model["vocab_size"], shards.read_manifest(shard_dir)["vocab_size"])
        distributed.check_fits(model, train, vocab, device, world)


# -- the evaluators: the loop knows only the `Evaluator` protocol, these know the tasks -------------------------
# an evaluator runs on every rank at the eval cadence: (model, step) -> metrics, the same on every rank, for rank 0
Evaluator = Callable[[torch.nn.Module, int], dict[str, float]]


def samples_folder(folder: Path, samples: int, is_main: bool) -> None:
    """metrics/train/samples, a declared out: made even when train.samples is 0, and then never empty (DVC warns of
    an empty out after every train)."""
    folder.mkdir(parents=True, exist_ok=True)
    if is_main and not samples:
        write_text(folder / "README.txt", "train.samples is 0: no samples\n")


def training_evaluators(train: dict[str, Any], tok: Tokenizer, shard_dir: Path, samples_dir: Path, block_size: int,
                        device: torch.device, dtype: torch.dtype | None, rank: int, world_size: int,
                        echo: Callable[[str], None] | None = None) -> list[Evaluator]:
    """The evaluators a `train:` section asks for (val loss, HellaSwag, samples), their data read before training."""
    is_main, batch = rank == 0, train["val_batch"]
    tokens = val_stream(shard_dir, train["val_tokens"], tok.vocab_size)
    out: list[Evaluator] = [lambda model, step: {"val_loss": val_loss(model, tokens, block_size, batch, device, dtype,
                                                                      rank, world_size, is_main)}]
    if train["hellaswag"]:
        examples = hellaswag_examples(tok, train["hellaswag_path"], train["hellaswag_examples"],
                                      "train.hellaswag_path", progress=is_main, block_size=block_size)

        def hellaswag(model: torch.nn.Module, step: int) -> dict[str, float]:
            r = score_examples(model, examples, tok.vocab_size, device=device, batch_size=batch, dtype=dtype,
                               progress=is_main)
            return {"hellaswag_acc_norm": r.acc_norm, "hellaswag_acc": r.acc}
        out.append(hellaswag)
    if train["samples"] > 0:
        prompt = train["sample_prompt"]

        def samples(model: torch.nn.Module, step: int) -> dict[str, float]:
            """Rank 0 writes samples_dir/step_NNNNNNN.txt; seeded by (seed, step), never the global RNG, so a run
            with samples resumes bit-exactly."""
            if is_main:
                texts = sample(model, tok, prompt, train["samples"], train["sample_tokens"],
                               seed=train["seed"] * 1_000_003 + step, device=device, dtype=dtype)
                body = "".join(f"--- step {step}, sample {i} ---\n{prompt}{t}\n\n" for i, t in enumerate(texts))
                write_text(samples_dir / f"step_{step:07d}.txt", body)
                if echo is not None:
                    echo(body.rstrip())
            return {}
        out.append(samples)
    return out


# -- the loop ---------------------------------------------------------------------------------------------------
TIMINGS = ("tokens_per_sec", "step_ms", "mfu")  # vary between two runs of the same params: metrics/train only


class NonFiniteLoss(UserError):
    """The training loss became NaN or infinite; the run stops without saving."""


class Trainer:
    """The training loop over a GPT: DDP, gradient accumulation, mixed precision, clipping, evals, checkpoints."""

    def __init__(self, model: GPT, loader: Any, cfg: TrainConfig, env: DistEnv, ckpt_dir: Path, logger: StepLogger,
                 run_params: dict[str, Any], evaluators: list[Evaluator] | None = None,
                 resume_from: dict[str, Any] | None = None) -> None:
        self.cfg, self.env, self.loader = cfg, env, loader
        self.ckpt_dir, self.logger = Path(ckpt_dir), logger
        self.run_params, self.fingerprint = run_params, checkpoint.run_fingerprint(run_params)
        self.evaluators = evaluators or []
        self.device, self.dtype = env.device, resolve_dtype(cfg.dtype, env.device)
        self.autocast = autocast_context(self.device, self.dtype)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        self.raw_model = model.to(self.device)
        self.optimizer = build_optimizers(
            self.raw_model, cfg.optimizer, cfg.max_lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), cfg.eps,
            self.device.type, muon_lr=cfg.muon_lr, muon_momentum=cfg.muon_momentum, embed_lr=cfg.embed_lr,
            head_lr=cfg.head_lr, scalar_lr=cfg.scalar_lr, muon_clip=cfg.muon_clip)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        self.schedule = LRSchedule(cfg.max_lr, cfg.max_lr * cfg.min_lr_ratio, cfg.warmup_steps, cfg.max_steps,
                                   cfg.schedule, cfg.decay_frac)
        self.step, self.memory_probe, self.memory_steps = 0, None, 0
        # export=best: the lowest val loss seen at the eval cadence and its step (weights in checkpoints/best_*.pt)
        self.best_val_loss, self.best_step = math.inf, None
        self.final: dict[str, float] = {}  # the last value of each metric, carried by checkpoints (see fit)
        self._first_bad = torch.full((), -1, dtype=torch.long, device=self.device)  # see train_step
        if resume_from is not None:
            self._restore(resume_from)
        else:  # dropout and any sampling differ per rank; weights start equal (DDP also broadcasts rank 0's)
            torch.manual_seed(cfg.seed + env.rank)

        self.model: torch.nn.Module = torch.compile(self.raw_model) if cfg.compile else self.raw_model
        if env.ddp:
            self.model = DDP(self.model, device_ids=[env.local_rank] if self.device.type == "cuda" else None)

    # -- checkpoints -------------------------------------------------------------------------------------------
    def _restore(self, ckpt: dict[str, Any]) -> None:
        self.raw_model.load_state_dict(strip_prefixes(ckpt["model"]))
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.loader.load_state_dict(ckpt["loader"])
        self.step = int(ckpt["step"])
        self.final = dict(ckpt.get("final") or {})
        best = ckpt.get("best") or {}
        if best.get("step") is not None:
            self.best_val_loss, self.best_step = float(best["val_loss"]), int(best["step"])
        rngs = ckpt["rng"]
        if self.env.rank < len(rngs):
            checkpoint.restore_rng(rngs[self.env.rank])
        else:  # more ranks than the run was saved with: the new ranks start fresh streams
            torch.manual_seed(self.cfg.seed + self.env.rank + 7919 * self.step)

    def save(self) -> Path | None:
        """After `check_finite`, collective (gathers every rank's RNG state); rank 0 writes."""
        self.check_finite()
        rngs = distributed.all_gather_objects(checkpoint.capture_rng())
        if not self.env.is_main:
            return None
        state = {"model": self.raw_model.state_dict(), "model_config": asdict(self.raw_model.config),
                 "optimizer": self.optimizer.state_dict(),
                 "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
                 "loader": self.loader.state_dict(), "rng": rngs, "step": self.step,
                 "params": self.run_params, "fingerprint": self.fingerprint,
                 "best": {"val_loss": self.best_val_loss, "step": self.best_step}, "final": dict(self.final)}
        path = checkpoint.save_checkpoint(self.ckpt_dir, self.step, state, self.cfg.keep_checkpoints)
        # best weights of steps before this checkpoint that it does not point at can go (newer ones never exist here)
        checkpoint.prune_best(self.ckpt_dir, keep_step=self.best_step)
        return path

    def describe(self) -> str:
        """One line: parameters, processes x device, precision, gradient accumulation, tokens per step."""
        n = sum(p.numel() for p in self.raw_model.parameters())
        return (f"{n / 1e6:.2f}M params, {self.env.world_size} x {self.device}, {self.dtype}, grad accumulation "
                f"{self.loader.grad_accum}, {self.cfg.total_batch_tokens:,} tokens/step")

    def export_weights(self) -> tuple[GPT, dict[str, Any]]:
        """What model/ gets (train.export: the last weights, or the lowest val loss's) and the record saying so."""
        record: dict[str, Any] = {"step": self.step, "export": self.cfg.export}
        if self.cfg.export != "best":
            return self.raw_model, record
        if self.best_step is None:
            raise UserError("train.export=best: no finite val loss was measured, so there are no best weights to "
                             "export (see val_loss in metrics/train)")
        best = checkpoint.load_best(self.ckpt_dir, self.best_step, self.fingerprint)
        self.raw_model.load_state_dict(best["model"])
        return self.raw_model, {**record, "step": self.best_step, "best_step": self.best_step,
                                "best_val_loss": self.best_val_loss, "trained_steps": self.step}

    # -- the steps ---------------------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """After `check_finite`, every evaluator on the raw model at this step; their metrics, merged and logged. With
        export=best, rank 0 keeps a new lowest val loss's weights (checkpoints/best_<step>.pt survives a kill)."""
        self.check_finite()
        out: dict[str, float] = {}
        for ev in self.evaluators:
            out.update(ev(self.raw_model, self.step))
        if self.cfg.export == "best" and (val_loss := out.get("val_loss")) is not None:
            if val_loss < self.best_val_loss:  # NaN never counts as better
                self.best_val_loss, self.best_step = val_loss, self.step
                if self.env.is_main:
                    checkpoint.save_best(self.ckpt_dir, self.step, self.raw_model, val_loss, self.fingerprint)
            out.update(best_val_loss=self.best_val_loss, best_step=self.best_step)
        self.logger.log(self.step, out)
        self.final.update(out)
        return out

    def train_step(self) -> dict[str, Any]:
        """One optimizer update over total_batch_tokens tokens: the rank-averaged loss and grad norm stay on the device
        (reading them syncs the host: `fit` does so at the logging cadence), and so does a non-finite loss's step."""
        cfg, accum = self.cfg, self.loader.grad_accum
        self.model.train()
        lr = self.schedule(self.step)
        set_lr(self.optimizer, lr, cfg.max_lr)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(accum):
            x, y = (t.to(self.device, non_blocking=True) for t in self.loader.next_batch())
            # Only the last micro step all-reduces gradients.
            sync = nullcontext() if (not self.env.ddp or micro == accum - 1) else self.model.no_sync()
            with sync:
                with self.autocast:
                    _, loss = self.model(x, y)
                loss = loss / accum
                loss_sum += loss.detach()
                self.scaler.scale(loss).backward()
        distributed.all_reduce_mean(loss_sum)
        # the first step whose loss was not finite, kept on the device: no host sync here
        self._first_bad = torch.where((self._first_bad < 0) & ~torch.isfinite(loss_sum), self.step, self._first_bad)
        for opt in self.optimizer:  # GradScaler keeps per-optimizer state: unscale and step each
            self.scaler.unscale_(opt)
        # train.muon_clip false: the clip (and grad_norm) covers AdamW's parameters only
        clipped = self.raw_model.parameters() if self.optimizer.clip_params is None else self.optimizer.clip_params
        grad_norm = torch.nn.utils.clip_grad_norm_(clipped, cfg.grad_clip)
        for opt in self.optimizer:
            self.scaler.step(opt)
        self.scaler.update()
        return {"train_loss": loss_sum, "lr": lr, "grad_norm": grad_norm}

    def measured_step(self) -> dict[str, Any]:
        """`train_step`, out of memory as one line naming train.micro_batch; the first two steps' peak (the second holds
        the optimizer state) stops a run that nearly does not fit (gptcore.distributed)."""
        cfg = self.cfg
        sequences = cfg.total_batch_tokens // (self.raw_model.config.block_size * self.env.world_size)
        if self.memory_steps == 0:
            self.memory_probe = distributed.FirstSteps(self.device, self.raw_model, self.optimizer)
        with distributed.out_of_memory_named(cfg.micro_batch, sequences, self.device):
            out = self.train_step()
        self.memory_steps += 1
        if self.memory_probe is not None and (self.memory_steps == 2 or self.step == cfg.max_steps - 1):
            self.memory_probe, probe = None, self.memory_probe
            probe.check(cfg.micro_batch, sequences, cfg.total_batch_tokens)
        return out

    def check_finite(self) -> None:
        """NonFiniteLoss if a step had a non-finite loss; a host sync, before every eval and save: a diverged run
        writes no weights."""
        bad = int(self._first_bad)
        if bad >= 0:
            raise NonFiniteLoss(f"non-finite training loss at step {bad}; last good checkpoint: "
                                f"{checkpoint.latest_checkpoint(self.ckpt_dir) or 'none'}. Lower train.max_lr or "
                                f"check the data; the run stopped without saving.")

    def fit(self) -> dict[str, float]:
        """Train to max_steps, evaluating, logging and checkpointing; the last value of each metric but TIMINGS (the
        same for a rerun: checkpoints carry them). The host waits for the device only at train.log_every and around
        evals and saves; tokens_per_sec and step_ms are the mean since the last log."""
        cfg, env, final = self.cfg, self.env, self.final
        step_tokens = cfg.total_batch_tokens
        bar = tqdm(total=cfg.max_steps, initial=self.step, desc="train", unit="step", disable=not env.is_main,
                   dynamic_ncols=True)
        started, elapsed, steps = None, 0.0, 0  # the timer: wall time of the steps since the last log
        sync = torch.cuda.synchronize if self.device.type == "cuda" else lambda: None
        # beside the curves: what makes runs of other shapes comparable (dvc exp show lists them)
        self.logger.log_constants(model_sizes(self.raw_model))

        def pause() -> float:
            sync()
            return elapsed + (time.perf_counter() - started if started is not None else 0.0)

        while self.step < cfg.max_steps:
            if cfg.eval_every > 0 and self.step % cfg.eval_every == 0:
                elapsed, started = pause(), None
                self.evaluate()
            if started is None:
                sync()
                started = time.perf_counter()
            out = self.measured_step()
            steps += 1
            if self.step % cfg.log_every == 0 or self.step == cfg.max_steps - 1:
                dt, started, elapsed, steps = pause() / steps, None, 0.0, 0
                self.check_finite()
                stats = {"train_loss": float(out["train_loss"]), "lr": out["lr"],
                         "grad_norm": float(out["grad_norm"]), "tokens_per_sec": step_tokens / dt,
                         "tokens_seen": (self.step + 1) * step_tokens, "step_ms": dt * 1e3}
                mfu = estimate_mfu(self.raw_model, stats["tokens_per_sec"] / env.world_size, self.device)
                if mfu is not None:
                    stats["mfu"] = mfu
                self.logger.log(self.step, stats)
                final.update(stats)
                bar.set_postfix(loss=f"{stats['train_loss']:.4f}", tok_s=f"{stats['tokens_per_sec']:,.0f}",
                                refresh=False)
            self.step += 1
            bar.update(1)
            if self.step % cfg.ckpt_every == 0 and self.step < cfg.max_steps:
                elapsed, started = pause(), None
                self.save()
        bar.close()
        self.evaluate()
        if self.step > 0:  # max_steps 0 (evaluate a starting point) leaves nothing worth resuming
            self.save()
        return {k: v for k, v in final.items() if k not in TIMINGS}
