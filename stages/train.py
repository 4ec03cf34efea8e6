"""Stage `train`: params -> a Trainer (model, loader, evaluators) -> checkpoints/, model/, metrics/train/ (dvclive),
and the curves the plots read (metrics/plots/, in step as it logs).
With train.nproc > 1 this process checks params and data, then runs itself under torchrun and does no rank's work."""
from __future__ import annotations

from pathlib import Path

from gptcore.data.shard_set import ShardSet
from gptcore.eval.config import EvalConfig
from gptcore.launch import run_ranks
from gptcore.model.config import ModelConfig
from gptcore.presets import preset_table
from gptcore.train.config import TrainConfig
from gptcore.train.run_folder import Presets
from gptcore.train.trainer import Trainer, preflight
from stages.boundary import later_results, stage

SHARDS, CKPT_DIR, MODEL_DIR, LIVE_DIR = Path("data/shards"), Path("checkpoints"), Path("model"), Path("metrics/train")
PLOT_DATA = Path("metrics/plots")  # the headline plots' curves; compare writes its reference lines beside them


def main() -> None:
    """Check params and data, start torchrun or build the run, resume if it is the same, train, export model/."""
    # its lock covers model/, metrics/train/ and its curves too, and the later stages' results it moves aside with
    # the previous run: evaluate and compare read checkpoints/
    with stage("train", reads=[SHARDS], writes=[CKPT_DIR]) as s:
        model_cfg, cfg = s.config(ModelConfig), s.config(TrainConfig)
        data = ShardSet.open(SHARDS)
        preflight(model_cfg, cfg, data, MODEL_DIR, s.config(EvalConfig))  # eval's too: checked before training
        if s.launch(cfg.nproc, run_ranks, cfg):  # the ranks, watched within cfg's bounds
            return
        trainer, notes = Trainer.build(model_cfg, cfg, data, CKPT_DIR, LIVE_DIR, Presets(s.preset(), preset_table()),
                                       results=later_results("train"), curves=PLOT_DATA)
        s.say(*notes, trainer.describe())
        final = trainer.fit()
        s.say(*trainer.export(MODEL_DIR, data, final))


if __name__ == "__main__":
    main()
