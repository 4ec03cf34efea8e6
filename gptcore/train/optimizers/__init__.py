"""The optimizers a run can use (`train.optimizer`): the table below, each kind a module of this package with the
parameter groups it makes. A new one is a module here that makes an `OptimizerKind` (optimizers/base.py), a row
below, and its keys as fields of `TrainConfig` (docs/architecture.md)."""
from __future__ import annotations

from gptcore.model.gpt import GPT
from gptcore.params import choose
from gptcore.train.config import TrainConfig
from gptcore.train.optimizers import adamw, muon
from gptcore.train.optimizers.base import OptimizerKind, Optimizers

OPTIMIZERS: dict[str, OptimizerKind] = {
    "adamw": adamw.KIND,  # AdamW everywhere, GPT-2's groups
    "muon": muon.KIND,  # Muon for the blocks' hidden matrices, AdamW for the rest (modded-nanogpt)
}


def optimizer_kind(cfg: TrainConfig) -> OptimizerKind:
    """The kind train.optimizer names (a ParamError naming it and the kinds there are)."""
    return choose(OPTIMIZERS, "train.optimizer", cfg.optimizer)


def build_optimizers(model: GPT, cfg: TrainConfig, device_type: str) -> Optimizers:
    """The optimizers `cfg.optimizer` names, over every trainable weight of `model`."""
    return optimizer_kind(cfg).build(model, cfg, device_type)
