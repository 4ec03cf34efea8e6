"""Stage `train`: params -> model + loader + evaluators -> checkpoints/, model/, metrics/train/ (dvclive).

With train.nproc > 1 it validates params.yaml, then starts torchrun on itself (an argument list: no shell sees a
param); under torchrun (also README's multi-node commands) each process trains.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from tqdm import tqdm

from gptcore import distributed
from gptcore.data import shards
from gptcore.data.loader import TokenLoader
from gptcore.data.tokenizers import load_tokenizer
from gptcore.eval.hooks import training_evaluators
from gptcore.model.load import init_model, model_vocab
from gptcore.model.params import MODEL
from gptcore.precision import resolve_dtype
from gptcore.process import launch_torchrun, lock_for_all_ranks, reading, stage_lifetime, under_torchrun
from gptcore.report.steplog import StepLogger
from gptcore.report.wandb_log import wandb_sinks
from gptcore.train import checkpoint, memory
from gptcore.train.export import export_model
from gptcore.train.loop import TrainConfig, Trainer
from gptcore.train.params import TRAIN, check_run, fingerprint_params
from stages.common import load_params, user_errors

SHARDS, CKPT_DIR, MODEL_DIR, LIVE_DIR = Path("data/shards"), Path("checkpoints"), Path("model"), Path("metrics/train")
QUIET = os.environ.get("RANK", "0") != "0"  # ranks other than 0 meet the same mistakes: rank 0 alone says them


def say(lines: list[str]) -> None:
    """Print each line as this stage's."""
    for line in lines:
        print(f"[train] {line}", flush=True)


def main() -> None:
    """Validate, build (the launcher: then start torchrun), resume if the run is the same, train, export model/."""
    with user_errors("train", quiet=QUIET):
        model_params, train = load_params(MODEL), load_params(TRAIN)
        world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else train["nproc"]
        check_run(model_params, train, world, shards.split_tokens(SHARDS, "val"))
        device = distributed.pick_device(train["device"], int(os.environ.get("LOCAL_RANK", "0")), key="train.device")
        if device.type != "cuda" or world == 1 or under_torchrun():  # a launcher keeps off the GPUs
            vocab = model_vocab(model_params["vocab_size"], shards.read_manifest(SHARDS)["vocab_size"])
            memory.check_fits(model_params, train, vocab, device, world)
        tok = load_tokenizer(SHARDS)
        data = {**tok.record(), "shards": shards.identity(SHARDS)}  # a checkpoint resumes only on the same data
        model = init_model(model_params, data["vocab_size"], seed=train["seed"])
        if world > 1 and not under_torchrun():  # checked once here, so a mistake is one line, not one per rank
            sys.exit(launch_torchrun("stages.train", train["nproc"], CKPT_DIR, "train"))
        env = distributed.setup(train["device"], key="train.device")
        run_lock = lock_for_all_ranks(CKPT_DIR, "train", env.is_main)  # noqa: F841  (held until the process ends)
        shards_lock = reading(SHARDS, "train").acquire()  # noqa: F841  (no tokenize swaps the shards meanwhile)
        dtype = resolve_dtype(train["dtype"], env.device)
        loader = TokenLoader(shards.open_split(SHARDS, "train"), train["micro_batch"], model.config.block_size,
                             train["total_batch_tokens"], env.rank, env.world_size, shuffle=train["shuffle"],
                             seed=train["seed"], vocab_size=data["vocab_size"])
        evaluators = training_evaluators(train, tok, SHARDS, LIVE_DIR / "samples", model.config.block_size,
                                         env.device, dtype, env.rank, env.world_size, echo=tqdm.write)
        run_params = fingerprint_params(model_params, train, data)
        resume, notes = checkpoint.prepare_resume(CKPT_DIR, run_params, env.is_main, also=[LIVE_DIR])
    (LIVE_DIR / "samples").mkdir(parents=True, exist_ok=True)  # a declared out, even when no samples are asked for
    logger = StepLogger(LIVE_DIR, enabled=env.is_main, resume_step=resume["step"] if resume else None,
                        also=wandb_sinks(train, {"model": model_params, "train": train}, env.is_main))
    trainer = Trainer(model, loader, TrainConfig.from_params(train), env, CKPT_DIR, logger, run_params, evaluators,
                      resume_from=resume)
    say([*notes, trainer.describe()] if env.is_main else [])
    final = trainer.fit()
    logger.close()
    if env.is_main:
        with user_errors("train"):
            weights, record = trainer.export_weights()
            record.update(final=final, shards_digest=data["shards"])  # the shards it trained on
            say(export_model(MODEL_DIR, weights, tok, record, {"device": env.device.type,
                                                               "processes": env.world_size}))
    distributed.teardown()


if __name__ == "__main__":
    with stage_lifetime("train", quiet=QUIET):  # dies with dvc (or torchrun); Ctrl-C / SIGTERM: one line
        main()
