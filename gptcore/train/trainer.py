"""The Trainer: a run wired from its params sections and data (`Trainer.build`), then the loop (gradient accumulation,
DDP or FSDP, mixed precision, clipping, evals at a cadence, checkpoints, bit-exact resume) and the export of model/.
The loop itself knows a model, a batch source (`next_batch`, `state_dict`, `grad_accum`), a checkpoint folder and a
logger; nothing here knows what a DVC stage is."""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import torch
from tqdm import tqdm

from gptcore import device, distributed
from gptcore.data.loader import TokenLoader
from gptcore.data.shard_set import ShardSet
from gptcore.device import autocast_context, resolve_dtype
from gptcore.distributed import DistEnv
from gptcore.errors import UserError
from gptcore.eval.config import EvalConfig, check_scoring
from gptcore.eval.tasks import tasks_named
from gptcore.folders import staged_dir
from gptcore.lifetime import Interrupted, StopRequest, stop_requests, under_torchrun
from gptcore.model.config import ModelConfig
from gptcore.model.export import export_model
from gptcore.model.gpt import GPT
from gptcore.model.lm_loss import loss_chunk_rows
from gptcore.model.load import check_spec, init_model
from gptcore.params import choose
from gptcore.report.curves import LiveCurves
from gptcore.report.flops import estimate_mfu, model_sizes
from gptcore.report.steplog import StepLogger, wandb_sinks
from gptcore.train import checkpoints, memory, run_folder
from gptcore.train.config import TrainConfig, check_run, fingerprint_params
from gptcore.train.evaluators import Evaluator, samples_folder, training_evaluators
from gptcore.train.optimizers import build_optimizers, optimizer_kind
from gptcore.train.optimizers.base import set_lr
from gptcore.train.parallel import clip_grad_norm, empty_gpt, evaluating, parallel_mode, whole_model, whole_state
from gptcore.train.schedule import SCHEDULES, LRSchedule

TIMINGS = ("tokens_per_sec", "step_ms", "mfu")  # vary between two runs of the same params: metrics/train only


def preflight(model: ModelConfig, train: TrainConfig, data: ShardSet, model_dir: Path,
              evaluation: EvalConfig | None = None) -> None:
    """Every check of the `model:` and `train:` sections against the processes, the data, the memory and the folder
    model/ is swapped into at the end, before any weights exist: the same in a torchrun launcher (which keeps off the
    GPUs: its ranks check theirs) and a rank. With `evaluation` (the eval: section), also what evaluate will check
    of this run's model, so a mistake there never waits for the end of training."""
    staged_dir(model_dir)  # a link or a mount point at model/ would refuse the export only after training
    if evaluation is not None and evaluation.model == "checkpoint":
        check_scoring(evaluation, model.block_size, data)
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else train.nproc
    check_run(model, train, world, data.tokens["val"])
    if model.init_from != "scratch":
        try:
            check_spec(model.init_from)
        except UserError as e:
            raise UserError(f"model.init_from={model.init_from!r}: {e}") from None
    # the parts the names pick, each from its table: an unknown name is one line naming its key
    mode = parallel_mode(train)
    optimizer_kind(train)
    choose(SCHEDULES, "train.schedule", train.schedule)
    tasks_named(train.tasks, "train.tasks")
    dev = device.pick_device(train.device, int(os.environ.get("LOCAL_RANK", "0")), key="train.device")
    looks = dev.type != "cuda" or world == 1 or under_torchrun()  # a torchrun launcher keeps off the GPUs
    mode.check(train, dev if looks else None)
    if looks:
        memory.check_fits(model, train, model.vocab(data.vocab_size), dev, world, mode)


def eval_line(step: int, train_loss: float | None, measured: dict[str, float]) -> str:
    """`step N: train loss X, val loss Y, hellaswag acc_norm Z`: what an eval measured (its val loss and each task's
    acc_norm), with the last train loss."""
    parts = [f"train loss {train_loss:.4f}"] if train_loss is not None else []
    parts += [f"val loss {measured['val_loss']:.4f}"] if "val_loss" in measured else []
    parts += [f"{name.removesuffix('_acc_norm')} acc_norm {value:.4f}" for name, value in measured.items()
              if name.endswith("_acc_norm")]
    return f"step {step}: {', '.join(parts)}"


class NonFiniteLoss(UserError):
    """The training loss became NaN or infinite; the run stops without saving."""


class Trainer:
    """The training loop over a GPT: DDP or FSDP, gradient accumulation, mixed precision, clipping, evals,
    checkpoints."""

    def __init__(self, model: GPT, loader: Any, cfg: TrainConfig, env: DistEnv, ckpt_dir: Path, logger: StepLogger,
                 run_params: dict[str, Any], evaluators: list[Evaluator] | None = None,
                 resume_from: dict[str, Any] | None = None) -> None:
        self.cfg, self.env, self.loader = cfg, env, loader
        self.ckpt_dir, self.logger = Path(ckpt_dir), logger
        self.run_params, self.fingerprint = run_params, run_folder.run_fingerprint(run_params)
        self.evaluators = evaluators or []
        self.device, self.dtype = env.device, resolve_dtype(cfg.dtype, env.device)
        self.autocast = autocast_context(self.device, self.dtype)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        self.mode = parallel_mode(cfg)
        self.mode.check(cfg, self.device)
        self.raw_model = model
        # the LM head's path, recorded with the run (a resume keeps it, whatever GPTCORE_LOSS_CHUNK_ELEMENTS says now)
        head = model.lm_head.weight
        model.loss_chunk_rows = loss_chunk_rows(self.device.type, head.size(0), head.size(1))
        self.mode.prepare(model, env, self.dtype, cfg.compile)  # before the optimizers: they hold what it places
        self.optimizer = build_optimizers(self.raw_model, cfg, self.device.type)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        self.schedule = LRSchedule(cfg.max_lr, cfg.max_lr * cfg.min_lr_ratio, cfg.warmup_steps, cfg.max_steps,
                                   cfg.schedule, cfg.decay_frac)
        self.step, self.memory_probe, self.memory_steps = 0, None, 0
        # export=best: the lowest val loss seen at the eval cadence, its step and the sha256 of its weights' file
        # (checkpoints/best_*.pt)
        self.best_val_loss, self.best_step, self.best_sha256 = math.inf, None, None
        self.saved_step: int | None = None  # the step of the newest checkpoint on disk this run wrote or resumed
        self.final: dict[str, float] = {}  # the last value of each metric, carried by checkpoints (see fit)
        self._first_bad = torch.full((), -1, dtype=torch.long, device=self.device)  # see train_step
        if resume_from is not None:
            self._restore(resume_from)
        else:  # dropout and any sampling differ per rank; weights start equal (DDP also broadcasts rank 0's)
            torch.manual_seed(cfg.seed + env.rank)

        self.model = self.mode.wrap(model, env, cfg.compile)  # what the loop calls: compiled, wrapped

    @classmethod
    def build(cls, model_cfg: ModelConfig, cfg: TrainConfig, data: ShardSet, ckpt_dir: Path, live_dir: Path,
              presets: run_folder.Presets | None = None, results: list[Path] = (), curves: Path | None = None
              ) -> tuple[Trainer, list[str]]:
        """A run wired from its sections and its data: this process's place in the process group, the starting
        weights, the loader, the evaluators, the step logger (and the curves the plots read, in `curves`, kept in
        step), and the checkpoint to resume from (a collective: rank 0 decides, moving a previous run aside, and with
        it `results`, the later stages' files); also what resuming decided, as lines to show. `presets`: what each
        preset composes to and this run's, so a replaced run's note names a preset switch, or the -S it lost."""
        env = distributed.setup(cfg.device, key="train.device", timeouts=distributed.Timeouts(
            cfg.init_timeout, cfg.dist_timeout, "train.init_timeout", "train.dist_timeout"))
        model = init_model(model_cfg, data.vocab_size, seed=cfg.seed)
        loader = TokenLoader(data.splits["train"], cfg.micro_batch, model.config.block_size, cfg.total_batch_tokens,
                             env.rank, env.world_size, shuffle=cfg.shuffle, seed=cfg.seed, vocab_size=data.vocab_size)
        evaluators = training_evaluators(cfg, data, live_dir / "samples", model.config.block_size, env,
                                         resolve_dtype(cfg.dtype, env.device), echo=tqdm.write)
        run_params = fingerprint_params(model_cfg, cfg, data.record())
        resume, notes = run_folder.prepare_resume(ckpt_dir, run_params, env.is_main, also=[live_dir], presets=presets,
                                                  results=results)
        samples_folder(live_dir / "samples", cfg.samples, env.is_main)  # after a previous run's moved aside
        live = [LiveCurves(live_dir, curves)] if curves is not None else []
        sinks = [*live, *wandb_sinks(cfg, {"model": asdict(model_cfg), "train": asdict(cfg)}, env.is_main)]
        keep_to = resume["step"] if resume else None  # the curves after a checkpoint's step are redone on resume
        if keep_to is not None and 0 < cfg.max_steps <= keep_to:
            keep_to += 1  # a finished run is not redone (fit returns at once): its final eval's row stays
        logger = StepLogger(live_dir, enabled=env.is_main, resume_step=keep_to, also=sinks)
        for sink in live if env.is_main else ():
            sink.update(force=True)  # the run before's curves go now: a fresh run's are empty, a resumed one's cut
        return cls(model, loader, cfg, env, ckpt_dir, logger, run_params, evaluators, resume_from=resume), notes

    # -- checkpoints -------------------------------------------------------------------------------------------
    def _restore(self, ckpt: dict[str, Any]) -> None:
        # the checkpoint's weights and optimizer states by name, into this run's layout, whichever mode wrote it
        checkpoints.load(ckpt, self.raw_model, self.optimizer)
        if ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.loader.load_state_dict(ckpt["loader"])
        self.step = self.saved_step = int(ckpt["step"])
        self.final = dict(ckpt.get("final") or {})
        self.raw_model.loss_chunk_rows = int(ckpt["lm_loss_chunk_rows"])  # the path the run started with
        best = ckpt.get("best") or {}
        if best.get("step") is not None:
            self.best_val_loss, self.best_step = float(best["val_loss"]), int(best["step"])
            self.best_sha256 = best.get("sha256")
        rngs = ckpt["rng"]
        if self.env.rank < len(rngs):
            checkpoints.restore_rng(rngs[self.env.rank])
        else:  # more ranks than the run was saved with: the new ranks start fresh streams
            torch.manual_seed(self.cfg.seed + self.env.rank + 7919 * self.step)

    def save(self) -> Path:
        """After `check_finite`, collective: every rank writes its part of the checkpoint of this step (a sharded
        model's shards; a whole model's weights spread over the ranks), rank 0 the record (with every rank's RNG
        state) and the digests."""
        self.check_finite()
        rngs = distributed.all_gather_objects(checkpoints.capture_rng())
        record = {"model_config": asdict(self.raw_model.config),
                  "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
                  "loader": self.loader.state_dict(), "rng": rngs,
                  "params": self.run_params, "fingerprint": self.fingerprint,
                  "best": {"val_loss": self.best_val_loss, "step": self.best_step, "sha256": self.best_sha256},
                  "final": dict(self.final), "lm_loss_chunk_rows": self.raw_model.loss_chunk_rows}
        path = checkpoints.save(self.ckpt_dir, self.step, self.raw_model, self.optimizer, record,
                                self.cfg.keep_checkpoints)
        self.saved_step = self.step
        if self.env.is_main:
            # best weights of steps before this checkpoint that it does not point at can go (newer ones never exist)
            checkpoints.prune_best(self.ckpt_dir, keep_step=self.best_step)
        return path

    def describe(self) -> str:
        """One line: parameters, processes x device, precision, gradient accumulation, tokens per step, the LM head's
        path."""
        n = sum(p.numel() for p in self.raw_model.parameters())  # a DTensor's numel is the whole weight's
        rows = self.raw_model.loss_chunk_rows
        head = f"LM head loss in chunks of {rows} rows" if rows else "LM head loss over all logits at once"
        return (f"{n / 1e6:.2f}M params, {self.env.world_size} x {self.device}{self.mode.about}, {self.dtype}, grad "
                f"accumulation {self.loader.grad_accum}, {self.cfg.total_batch_tokens:,} tokens/step, {head}")

    def export(self, model_dir: Path, data: ShardSet, final: dict[str, float]) -> list[str]:
        """After `fit`: close the step logger, on rank 0 write model/ (train.export's weights, the record of the run and
        its data, the tokenizer), then leave the process group; the lines worth showing."""
        self.logger.close()
        notes = []
        distributed.progress(self.step, "exporting")
        weights, record = self.export_weights()  # every rank: a sharded model's weights are gathered together
        if self.env.is_main:
            record.update(final=final, shards_digest=data.identity)  # the shards it trained on
            notes = export_model(model_dir, weights, data.tokenizer, record,
                                 {"device": self.device.type, "processes": self.env.world_size})
        distributed.teardown()  # every rank leaves the process group once rank 0 has written model/
        return notes

    def export_weights(self) -> tuple[GPT | None, dict[str, Any]]:
        """What model/ gets (train.export: the last weights, or the lowest val loss's) and the record saying so; the
        weights are on the CPU, whole (a collective: every rank calls it, rank 0 gets them, the others None), so that
        model/ is the same bytes whatever the device or train.parallel."""
        record: dict[str, Any] = {"step": self.step, "export": self.cfg.export,
                                  "lm_loss_chunk_rows": self.raw_model.loss_chunk_rows}
        if self.cfg.export != "best":
            return whole_model(self.raw_model), record
        if self.best_step is None:
            raise UserError("train.export=best: no finite val loss was measured, so there are no best weights to "
                             "export (see val_loss in metrics/train)")
        record.update(step=self.best_step, best_step=self.best_step, best_val_loss=self.best_val_loss,
                      trained_steps=self.step)
        if not self.env.is_main:
            return None, record
        weights = empty_gpt(self.raw_model.config)
        weights.load_state_dict(checkpoints.load_best(self.ckpt_dir, self.best_step, self.fingerprint,
                                                      self.best_sha256)["model"])
        weights.loss_chunk_rows = self.raw_model.loss_chunk_rows
        return weights, record

    # -- the steps ---------------------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """After `check_finite`, every evaluator on the raw model at this step; their metrics, merged and logged. With
        export=best, rank 0 keeps a new lowest val loss's weights (checkpoints/best_<step>.pt survives a kill)."""
        self.check_finite()
        out: dict[str, float] = {}
        with evaluating(self.raw_model):  # a sharded model: every rank runs every evaluator's passes
            for ev in self.evaluators:
                out.update(ev(self.raw_model, self.step))
        if self.cfg.export == "best" and (val_loss := out.get("val_loss")) is not None:
            if val_loss < self.best_val_loss:  # NaN never counts as better
                self.best_val_loss, self.best_step = val_loss, self.step
                state = whole_state(self.raw_model)  # every rank: a sharded model's weights are gathered together
                if self.env.is_main:
                    self.best_sha256 = checkpoints.save_best(self.ckpt_dir, self.step, state,
                                                             asdict(self.raw_model.config), val_loss, self.fingerprint)
            out.update(best_val_loss=self.best_val_loss, best_step=self.best_step)
        self.logger.log(self.step, out)
        if self.env.is_main:  # nanoGPT's line, above the progress bar
            tqdm.write(eval_line(self.step, self.final.get("train_loss"), out))
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
            # ddp: only the last micro step all-reduces gradients. fsdp reduce-scatters every micro step's: a rank
            # holds only its shard of the gradients, never the whole (the memory fsdp is chosen for), and each
            # block's weights are gathered again for each micro step's forward and backward
            with self.mode.no_sync(self.model, last_micro=micro == accum - 1):
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
        grad_norm = clip_grad_norm(clipped, cfg.grad_clip)
        for opt in self.optimizer:
            self.scaler.step(opt)
        self.scaler.update()
        return {"train_loss": loss_sum, "lr": lr, "grad_norm": grad_norm}

    def measured_step(self) -> dict[str, Any]:
        """`train_step`, out of memory as one line naming train.micro_batch; the first two steps' peak (the second holds
        the optimizer state) stops a run that nearly does not fit (gptcore/train/memory.py)."""
        cfg = self.cfg
        sequences = cfg.total_batch_tokens // (self.raw_model.config.block_size * self.env.world_size)
        if self.memory_steps == 0:
            self.memory_probe = memory.FirstSteps(self.device, self.raw_model, self.optimizer)
        with memory.out_of_memory_named(cfg.micro_batch, sequences, self.device):
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
                                f"{checkpoints.latest_checkpoint(self.ckpt_dir) or 'none'}. Lower train.max_lr or "
                                f"check the data; the run stopped without saving.")

    def fit(self) -> dict[str, float]:
        """Train to max_steps, evaluating, logging and checkpointing; the last value of each metric but TIMINGS (the
        same for a rerun: checkpoints carry them). The host waits for the device only at train.log_every and around
        evals and saves; tokens_per_sec and step_ms are the mean since the last log. SIGINT, SIGTERM or the warning
        signal (gptcore.lifetime.stop_requests) finish the step in flight: every rank then saves the checkpoint of
        that step and raises Interrupted, whose line says what was kept."""
        if 0 < self.cfg.max_steps <= self.step:  # a finished run resumed: its final eval and checkpoint stand as are
            return {k: v for k, v in self.final.items() if k not in TIMINGS}
        with stop_requests() as stop:
            try:
                return self._fit(stop)
            except Interrupted as e:
                if e.line is not None:
                    raise
                # a second signal: it ended whatever ran, a save included (its temp folder is dropped)
                raise Interrupted(e.signum, f"asked twice: stopped at once; {self._resumes_from()}") from None

    def _fit(self, stop: StopRequest) -> dict[str, float]:
        cfg, env, final = self.cfg, self.env, self.final
        step_tokens = cfg.total_batch_tokens
        bar = tqdm(total=cfg.max_steps, initial=self.step, desc="train", unit="step", disable=not env.is_main,
                   dynamic_ncols=True)
        started, elapsed, steps = None, 0.0, 0  # the timer: wall time of the steps since the last log
        sync = torch.cuda.synchronize if self.device.type == "cuda" else lambda: None
        # what makes runs of other shapes comparable, in W&B's summary (DVC's table computes them from params)
        self.logger.log_constants(model_sizes(self.raw_model))

        def pause() -> float:
            sync()
            return elapsed + (time.perf_counter() - started if started is not None else 0.0)

        while self.step < cfg.max_steps:
            if cfg.eval_every > 0 and self.step % cfg.eval_every == 0:
                elapsed, started = pause(), None
                distributed.progress(self.step, "evaluating")  # the heartbeat: the stage watches for a stalled rank
                self.evaluate()
                if signum := distributed.max_over_ranks(stop.signum):  # a signal during the eval: its step is done
                    bar.close()
                    self.stop(signum)
            if started is None:
                sync()
                started = time.perf_counter()
            distributed.progress(self.step, "training")
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
                distributed.progress(self.step, "saving")
                self.save()
            # every rank stops after the same step, or none does: one small all-reduce a step (on the CPU), read by
            # the host, which does not wait for the device for it. At max_steps the run's own end follows.
            if self.step < cfg.max_steps and (signum := distributed.max_over_ranks(stop.signum)):
                bar.close()
                self.stop(signum)
        bar.close()
        distributed.progress(self.step, "evaluating")
        self.evaluate()
        if self.step > 0:  # max_steps 0 (evaluate a starting point) leaves nothing worth resuming
            distributed.progress(self.step, "saving")
            self.save()
        if signum := distributed.max_over_ranks(stop.signum):  # a signal during the last eval or save
            self.stop(signum)
        return {k: v for k, v in final.items() if k not in TIMINGS}

    def stop(self, signum: int) -> NoReturn:
        """Collective, after a step (or its eval): save this step's checkpoint unless it is on disk already, then
        raise Interrupted with the line saying what a rerun does (after the stage's `interrupted (SIGNAME); `)."""
        if self.step == 0:
            raise Interrupted(signum, "before the first step ended: nothing to save, a rerun starts from step 0")
        if self.saved_step != self.step:
            distributed.progress(self.step, "saving")
            self.save()
        then = ("a rerun only exports model/" if self.step >= self.cfg.max_steps else "a rerun resumes there")
        raise Interrupted(signum, f"saved step {self.step}: {then}")

    def _resumes_from(self) -> str:
        """What a rerun resumes from, said after a stop that saved nothing new."""
        newest = checkpoints.latest_checkpoint(self.ckpt_dir)
        if newest is None:
            return "nothing was saved: a rerun starts from step 0"
        return f"a rerun resumes from step {int(newest.name.split('_')[1])} ({newest})"
