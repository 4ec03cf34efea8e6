"""Stage `train`: params -> model + loader + trainer -> checkpoints/, model/, metrics/train/ (dvclive).

`python -m stages.train` (dvc.yaml's cmd) validates params.yaml first; with train.nproc > 1 it then starts
torchrun itself, with an argument list (no shell ever sees a param). Under torchrun (e.g. README's multi-node
commands) each process runs the training directly.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from gptcore import distributed
from gptcore.atomic import write_json
from gptcore.data import shards
from gptcore.data.loader import TokenLoader
from gptcore.data.tokenizers import load_tokenizer
from gptcore.eval import hellaswag
from gptcore.eval import val_loss as evaluation
from gptcore.eval.sampling import TrainingSamples
from gptcore.model.load import init_model, padded_vocab
from gptcore.model.params import MODEL
from gptcore.precision import resolve_dtype
from gptcore.process import FolderBusyError, FolderLock, lock_for_all_ranks, reading, run_child, stage_lifetime
from gptcore.report.steplog import StepLogger
from gptcore.report.wandb_log import wandb_sinks
from gptcore.train import checkpoint, memory
from gptcore.train.loop import TrainConfig, Trainer
from gptcore.train.params import TRAIN, check_run, fingerprint_params
from stages.common import load_params, user_errors

SHARDS = Path("data/shards")
CKPT_DIR = Path("checkpoints")
MODEL_DIR = Path("model")
LIVE_DIR = Path("metrics/train")


def under_torchrun() -> bool:
    """True in a process torchrun started (it sets LOCAL_RANK and WORLD_SIZE)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def check_params() -> tuple[dict[str, Any], dict[str, Any]]:
    """The validated model: and train: sections, checked against each other and the val split (cheap: headers)."""
    model_params, train = load_params(MODEL), load_params(TRAIN)
    world_size = int(os.environ["WORLD_SIZE"]) if under_torchrun() else train["nproc"]
    val_split = sum(len(shards.load_tokens(p)) for p in shards.open_split(SHARDS, "val"))
    check_run(model_params, train, world_size, val_split)
    device = distributed.pick_device(train["device"], int(os.environ.get("LOCAL_RANK", "0")), key="train.device")
    if device.type != "cuda" or not train["nproc"] > 1 or under_torchrun():  # a launcher keeps off the GPUs
        vocab = model_params["vocab_size"]
        vocab = padded_vocab(shards.read_manifest(SHARDS)["vocab_size"]) if vocab == "auto" else vocab
        memory.check_fits(model_params, train, vocab, device, world_size)
    return model_params, train


def preflight(model_params: dict[str, Any], train: dict[str, Any]) -> None:
    """What rank 0 would refuse on the user's input, checked once before torchrun starts, so a mistake is one line
    rather than one per rank plus torchrun's report: the tokenizer, and the starting weights (built on the CPU and
    dropped)."""
    vocab_size = load_tokenizer(SHARDS).vocab_size
    init_model(model_params, vocab_size, seed=train["seed"])  # dropped at once: only its errors matter here


def launch_torchrun(nproc: int) -> None:
    """Run this stage under torchrun on `nproc` processes (an argv list: no shell) and exit with its status.

    This process takes the run's lock first (a busy folder is refused before torchrun starts) and holds it while
    torchrun runs as its child: torchrun, and through it every worker, dies with this process (kill -9 of dvc
    included), and Ctrl-C or SIGTERM stop them all with one line."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={int(nproc)}",
            "-m", "stages.train"]
    try:
        lock = FolderLock(CKPT_DIR, "train").acquire()  # rank 0 finds it held by its ancestor: this process
    except FolderBusyError as e:
        sys.exit(f"[train] {e}")
    sys.stdout.flush()
    status = run_child(argv)
    lock.release()
    sys.exit(status if status >= 0 else 128 - status)  # killed by a signal: the shell's 128 + N


def main() -> None:
    """Validate params, build the model, loader and evaluators, resume if the params match, train, save model/."""
    with user_errors("train", quiet=os.environ.get("RANK", "0") != "0"):
        model_params, train = check_params()
        launcher = not under_torchrun() and train["nproc"] > 1
        if launcher:
            preflight(model_params, train)
    if launcher:
        launch_torchrun(train["nproc"])
    cfg = TrainConfig.from_params(train)
    env = distributed.setup(train["device"], key="train.device")
    try:  # one training per checkpoints/ (and the model/ and metrics/train/ it writes): refuse before any work
        run_lock = lock_for_all_ranks(CKPT_DIR, "train", env.is_main)  # noqa: F841  (held until the process ends)
        # every rank reads the shards: each holds the folder's reader lock, so no tokenize swaps them meanwhile
        shards_lock = reading(SHARDS, "train").acquire()  # noqa: F841  (held until the process ends)
    except FolderBusyError as e:
        sys.exit(f"[train] {e}" if env.is_main else 1)
    with user_errors("train", quiet=os.environ.get("RANK", "0") != "0"):
        # everything that can fail on the user's input happens before a checkpoint or a metric is touched
        tok = load_tokenizer(SHARDS)
        data = tok.record()  # name, vocab_size, eot: part of what a checkpoint must match to resume
        model = init_model(model_params, data["vocab_size"], seed=cfg.seed)
        block_size = model.config.block_size
        loader = TokenLoader(shards.open_split(SHARDS, "train"), train["micro_batch"], block_size,
                             cfg.total_batch_tokens, env.rank, env.world_size, shuffle=train["shuffle"], seed=cfg.seed,
                             vocab_size=data["vocab_size"])
        val_tokens = evaluation.val_stream(SHARDS, train["val_tokens"], data["vocab_size"])
        dtype = resolve_dtype(cfg.dtype, env.device)
        evaluators = [evaluation.ValLoss(val_tokens, block_size, train["val_batch"], env.device, dtype, env.rank,
                                         env.world_size, env.is_main)]
        if train["hellaswag"]:
            path = hellaswag.fetch_hellaswag("data/hellaswag", path=train["hellaswag_path"], progress=env.is_main,
                                             key="train.hellaswag_path")
            examples = hellaswag.load_hellaswag(path, tok, limit=train["hellaswag_examples"])
            evaluators.append(evaluation.ChoiceTask("hellaswag", examples, train["val_batch"], env.device, dtype,
                                                    env.is_main))

    run_params = fingerprint_params(model_params, train, data)
    resume = None
    if env.is_main:
        # rank 0 alone sets aside unreadable checkpoints and moves a previous run with other params aside
        _, resume, why = checkpoint.find_resume(CKPT_DIR, run_params)
        print(f"[train] {why}", flush=True)
        if resume is None:
            moved = checkpoint.move_aside(CKPT_DIR, also=[LIVE_DIR])
            if moved is not None:
                print(f"[train] the previous run's checkpoints and metrics/train/ are kept in {moved}", flush=True)
    distributed.barrier()
    if not env.is_main:
        last = checkpoint.latest_checkpoint(CKPT_DIR)  # rank 0 left only the run to resume, if any
        resume = checkpoint.load_checkpoint(last) if last else None

    (LIVE_DIR / "samples").mkdir(parents=True, exist_ok=True)  # a declared out, even when no samples are asked for
    if train["samples"] > 0:
        evaluators.append(TrainingSamples(tok, LIVE_DIR / "samples", train["sample_prompt"], train["samples"],
                                          train["sample_tokens"], cfg.seed, env.device, env.is_main, dtype))
    logger = StepLogger(LIVE_DIR, enabled=env.is_main, resume_step=resume["step"] if resume else None,
                        also=wandb_sinks(train, {"model": model_params, "train": train}, env.is_main))
    trainer = Trainer(model, loader, cfg, env, CKPT_DIR, logger, run_params, evaluators=evaluators,
                      resume_from=resume)
    if env.is_main:
        n = sum(p.numel() for p in model.parameters())
        print(f"[train] {n / 1e6:.2f}M params, {env.world_size} x {env.device}, {trainer.dtype}, "
              f"grad accumulation {loader.grad_accum}, {cfg.total_batch_tokens:,} tokens/step", flush=True)
    final = trainer.fit()
    logger.close()
    if env.is_main:
        model, step, export = trainer.raw_model, trainer.step, {"export": cfg.export}
        if cfg.export == "best":  # the weights of the lowest val loss seen, as nanoGPT keeps them
            if trainer.best_step is None:
                raise SystemExit("[train] train.export=best: no finite val loss was measured, so there are no best "
                                 "weights to export (see val_loss in metrics/train)")
            best = checkpoint.load_best(CKPT_DIR, trainer.best_step, trainer.fingerprint)
            model.load_state_dict(best["model"])
            step = trainer.best_step
            export.update(best_step=trainer.best_step, best_val_loss=trainer.best_val_loss, trained_steps=trainer.step)
        checkpoint.save_final(model, MODEL_DIR, {"data": data, "step": step, "final": final, **export},
                              tokenizer=tok)
        # The model folder carries its tokenizer, so sampling and evaluation need nothing else.
        tok.save(MODEL_DIR)
        # where it trained: the compare stage turns training hours into GPU-hours with it
        write_json(MODEL_DIR / "manifest.json", {"tokenizer": data, "step": step, **export,
                                                 "hardware": {"device": env.device.type, "processes": env.world_size}})
        if cfg.export == "best":
            print(f"[train] model/: the best weights, step {step} of {trainer.step} (val_loss "
                  f"{trainer.best_val_loss:.4f})", flush=True)
    distributed.teardown()


if __name__ == "__main__":
    # dies with its parent (dvc, or torchrun for a worker; the death signal survives the exec into torchrun);
    # Ctrl-C / SIGTERM: one line from rank 0, none from others
    with stage_lifetime("train", quiet=os.environ.get("RANK", "0") != "0"):
        main()
