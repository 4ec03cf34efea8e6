"""Stage `train`: params -> model + loader + evaluators -> checkpoints/, model/, metrics/train/ (dvclive). With
train.nproc > 1 this process checks params and data, then runs itself under torchrun and does no rank's work."""
from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from gptcore import device, distributed
from gptcore.data import shards, tokenizers
from gptcore.data.loader import TokenLoader
from gptcore.model.export import export_model
from gptcore.model.gpt import MODEL
from gptcore.model.load import init_model
from gptcore.report import steplog
from gptcore.train import checkpoints, config, evaluators
from gptcore.train.config import TRAIN, TrainConfig, preflight
from gptcore.train.trainer import Trainer
from stages.boundary import stage

SHARDS, CKPT_DIR, MODEL_DIR, LIVE_DIR = Path("data/shards"), Path("checkpoints"), Path("model"), Path("metrics/train")


def main() -> None:
    """Validate, start torchrun or build, resume if the run is the same, train, export model/."""
    with stage("train", reads=[SHARDS], writes=[CKPT_DIR]) as s:  # its lock covers model/ and metrics/train/ too
        model_params, train = s.params(MODEL), s.params(TRAIN)
        preflight(model_params, train, SHARDS)
        tok = tokenizers.load_tokenizer(SHARDS)
        data = {**tok.record(), "shards": shards.identity(SHARDS)}  # a checkpoint resumes only on the same data
        if s.launch(train["nproc"]):
            return
        cfg = TrainConfig(**train)
        model = init_model(model_params, data["vocab_size"], seed=cfg.seed)
        env = distributed.setup(cfg.device, key="train.device")
        loader = TokenLoader(shards.open_split(SHARDS, "train"), cfg.micro_batch, model.config.block_size,
                             cfg.total_batch_tokens, env.rank, env.world_size, shuffle=cfg.shuffle, seed=cfg.seed,
                             vocab_size=data["vocab_size"])
        evals = evaluators.training_evaluators(train, tok, SHARDS, LIVE_DIR / "samples", model.config.block_size, env.device,
                                         device.resolve_dtype(cfg.dtype, env.device), env.rank, env.world_size,
                                         echo=tqdm.write)
        run_params = config.fingerprint_params(model_params, train, data)
        resume, notes = checkpoints.prepare_resume(CKPT_DIR, run_params, env.is_main, also=[LIVE_DIR])
        evaluators.samples_folder(LIVE_DIR / "samples", train["samples"], env.is_main)
        sinks = steplog.wandb_sinks(train, {"model": model_params, "train": train}, env.is_main)
        logger = steplog.StepLogger(LIVE_DIR, enabled=env.is_main, resume_step=resume["step"] if resume else None,
                                    also=sinks)
        trainer = Trainer(model, loader, cfg, env, CKPT_DIR, logger, run_params, evals, resume_from=resume)
        s.say(*notes, trainer.describe())
        final = trainer.fit()
        logger.close()
        if env.is_main:
            weights, record = trainer.export_weights()
            record.update(final=final, shards_digest=data["shards"])  # the shards it trained on
            s.say(*export_model(MODEL_DIR, weights, tok, record,
                                {"device": env.device.type, "processes": env.world_size}))


if __name__ == "__main__":
    main()
