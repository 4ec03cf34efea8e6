"""Stage `train`: params -> model + loader + evaluators -> checkpoints/, model/, metrics/train/ (dvclive). With
train.nproc > 1 this process checks the params and data, then runs itself under torchrun (an argument list: no shell
sees a param) and does no rank's work; under torchrun (also README's multi-node commands) each process trains."""
from __future__ import annotations

import os
from pathlib import Path

from tqdm import tqdm

from gptcore import distributed
from gptcore.data import shards, tokenizers
from gptcore.data.loader import TokenLoader
from gptcore.eval.hooks import training_evaluators
from gptcore.model.load import init_model, model_vocab
from gptcore.model.params import MODEL
from gptcore.precision import resolve_dtype
from gptcore.process import under_torchrun
from gptcore.report import steplog, wandb_log
from gptcore.train import checkpoint, export, memory
from gptcore.train.loop import TrainConfig, Trainer
from gptcore.train.params import TRAIN, check_run, fingerprint_params
from stages.common import stage

# checkpoints/'s lock covers the run's other outputs, model/ and metrics/train/
SHARDS, CKPT_DIR, MODEL_DIR, LIVE_DIR = Path("data/shards"), Path("checkpoints"), Path("model"), Path("metrics/train")


def main() -> None:
    """Validate, start torchrun or build, resume if the run is the same, train, export model/."""
    with stage("train", reads=[SHARDS], writes=[CKPT_DIR]) as s:
        model_params, train = s.params(MODEL), s.params(TRAIN)
        world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else train["nproc"]
        check_run(model_params, train, world, shards.split_tokens(SHARDS, "val"))
        device = distributed.pick_device(train["device"], int(os.environ.get("LOCAL_RANK", "0")), key="train.device")
        if device.type != "cuda" or world == 1 or under_torchrun():  # a launcher keeps off the GPUs
            vocab = model_vocab(model_params["vocab_size"], shards.read_manifest(SHARDS)["vocab_size"])
            memory.check_fits(model_params, train, vocab, device, world)
        tok = tokenizers.load_tokenizer(SHARDS)
        data = {**tok.record(), "shards": shards.identity(SHARDS)}  # a checkpoint resumes only on the same data
        if s.launch(train["nproc"]):
            return
        model = init_model(model_params, data["vocab_size"], seed=train["seed"])
        env = distributed.setup(train["device"], key="train.device")
        loader = TokenLoader(shards.open_split(SHARDS, "train"), train["micro_batch"], model.config.block_size,
                             train["total_batch_tokens"], env.rank, env.world_size, shuffle=train["shuffle"],
                             seed=train["seed"], vocab_size=data["vocab_size"])
        evaluators = training_evaluators(train, tok, SHARDS, LIVE_DIR / "samples", model.config.block_size, env.device,
                                         resolve_dtype(train["dtype"], env.device), env.rank, env.world_size,
                                         echo=tqdm.write)
        run_params = fingerprint_params(model_params, train, data)
        resume, notes = checkpoint.prepare_resume(CKPT_DIR, run_params, env.is_main, also=[LIVE_DIR])
        (LIVE_DIR / "samples").mkdir(parents=True, exist_ok=True)  # a declared out, even when no samples are asked for
        if env.is_main and not train["samples"]:  # and never empty: DVC would warn of it after every train
            (LIVE_DIR / "samples" / "README.txt").write_text("train.samples is 0: no samples\n", encoding="utf-8")
        logger = steplog.StepLogger(LIVE_DIR, enabled=env.is_main, resume_step=resume["step"] if resume else None,
                                    also=wandb_log.wandb_sinks(train, {"model": model_params, "train": train},
                                                               env.is_main))
        trainer = Trainer(model, loader, TrainConfig.from_params(train), env, CKPT_DIR, logger, run_params, evaluators,
                          resume_from=resume)
        s.say(*notes, trainer.describe())
        final = trainer.fit()
        logger.close()
        if env.is_main:
            weights, record = trainer.export_weights()
            record.update(final=final, shards_digest=data["shards"])  # the shards it trained on
            s.say(*export.export_model(MODEL_DIR, weights, tok, record, {"device": env.device.type,
                                                                        "processes": env.world_size}))


if __name__ == "__main__":
    main()
