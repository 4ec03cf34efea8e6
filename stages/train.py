"""Stage `train`: params -> model + loader + trainer -> checkpoints/, model/, metrics/train/ (dvclive).

Run under torchrun (see dvc.yaml); a plain `python -m stages.train` runs one process.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from gptcore.model.load import init_model
from gptcore.train import checkpoint
from gptcore import distributed
from gptcore.eval import val_loss as evaluation
from gptcore.eval import hellaswag
from gptcore.data import shards
from gptcore.data.loader import TokenLoader
from gptcore.atomic import write_json
from gptcore.report.steplog import StepLogger
from gptcore.eval.sampling import TrainingSamples
from gptcore.data.tokenizers import load_tokenizer, save_beside_shards, tokenizer_record
from gptcore.precision import resolve_dtype
from gptcore.train.loop import Trainer, TrainConfig, run_fingerprint_params
from gptcore.process import FolderBusyError, lock_for_all_ranks, stage_lifetime
from stages.common import load_params

SHARDS = Path("data/shards")
CKPT_DIR = Path("checkpoints")
MODEL_DIR = Path("model")
LIVE_DIR = Path("metrics/train")


def main() -> None:
    """Build the model, loader and evaluators from params, resume if the params match, train, save model/."""
    model_params, cfg = load_params("model"), TrainConfig.from_params(load_params("train"))
    env = distributed.setup(cfg.device)
    try:  # one training per checkpoints/ (and the model/ and metrics/train/ it writes): refuse before any work
        run_lock = lock_for_all_ranks(CKPT_DIR, "train", env.is_main)  # noqa: F841  (held until the process ends)
    except FolderBusyError as e:
        sys.exit(f"[train] {e}" if env.is_main else 1)
    tok = load_tokenizer(SHARDS)
    data = tokenizer_record(tok)  # name, vocab_size, eot: part of what a checkpoint must match to resume

    model = init_model(model_params, data["vocab_size"], seed=cfg.seed)
    block_size = model.config.block_size
    loader = TokenLoader(shards.open_split(SHARDS, "train"), cfg.micro_batch, block_size, cfg.total_batch_tokens,
                         env.rank, env.world_size, shuffle=cfg.shuffle, seed=cfg.seed, vocab_size=data["vocab_size"])
    val_tokens = evaluation.val_stream(SHARDS, cfg.val_tokens, data["vocab_size"])
    dtype = resolve_dtype(cfg.dtype, env.device)
    evaluators = [evaluation.ValLoss(val_tokens, block_size, cfg.val_batch, env.device,
                                     dtype, env.rank, env.world_size, env.is_main)]
    if cfg.hellaswag:
        path = hellaswag.fetch_hellaswag("data/hellaswag", path=cfg.hellaswag_path, progress=env.is_main)
        examples = hellaswag.load_hellaswag(path, tok, limit=cfg.hellaswag_examples)
        evaluators.append(evaluation.ChoiceTask("hellaswag", examples, cfg.val_batch, env.device, dtype, env.is_main))
    (LIVE_DIR / "samples").mkdir(parents=True, exist_ok=True)  # a declared out, even when no samples are asked for
    if cfg.samples > 0:
        evaluators.append(TrainingSamples(tok, LIVE_DIR / "samples", cfg.sample_prompt, cfg.samples, cfg.sample_tokens,
                                          cfg.seed, env.device, env.is_main, dtype))

    run_params = run_fingerprint_params(model_params, cfg, data)
    resume_path, why = checkpoint.find_resume(CKPT_DIR, run_params)
    if env.is_main:
        print(f"[train] {why}", flush=True)
        if resume_path is None:
            checkpoint.remove_checkpoints(CKPT_DIR)
    distributed.barrier()
    resume = checkpoint.load_checkpoint(resume_path) if resume_path else None
    logger = StepLogger(LIVE_DIR, enabled=env.is_main, resume_step=resume["step"] if resume else None)
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
            best = checkpoint.load_best(CKPT_DIR, trainer.best_step, trainer.fingerprint)
            model.load_state_dict(best["model"])
            step = trainer.best_step
            export.update(best_step=trainer.best_step, best_val_loss=trainer.best_val_loss, trained_steps=trainer.step)
        checkpoint.save_final(model, MODEL_DIR, {"data": data, "step": step, "final": final, **export},
                              hf_vocab_size=data["vocab_size"])
        # The model folder carries its tokenizer, so sampling and evaluation need nothing else.
        save_beside_shards(tok, MODEL_DIR)
        # where it trained: the compare stage turns training hours into GPU-hours with it
        write_json(MODEL_DIR / "manifest.json", {"tokenizer": data, "step": step, **export,
                                                 "hardware": {"device": env.device.type, "processes": env.world_size}})
        if cfg.export == "best":
            print(f"[train] model/: the best weights, step {step} of {trainer.step} (val_loss "
                  f"{trainer.best_val_loss:.4f})", flush=True)
    distributed.teardown()


if __name__ == "__main__":
    # dies with its parent (dvc, or torchrun for a worker); Ctrl-C / SIGTERM: one line from rank 0, none from others
    with stage_lifetime("train", quiet=os.environ.get("RANK", "0") != "0"):
        main()
