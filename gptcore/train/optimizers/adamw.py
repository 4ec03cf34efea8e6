"""AdamW everywhere, as GPT-2 (build-nanogpt's groups: decay on the 2-D weights, none on gains and biases), with
optional own peak rates for the embedding tables, the head and the scalars (modded-nanogpt's record 2024-11-03)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gptcore.model.gpt import GPT
from gptcore.train.config import TrainConfig
from gptcore.train.optimizers.base import OptimizerKind, Optimizers


def adamw_groups(model: GPT, weight_decay: float, max_lr: float, embed_lr: float | None = None,
                 head_lr: float | None = None, scalar_lr: float | None = None,
                 exclude: list[nn.Parameter] | None = None) -> list[dict[str, Any]]:
    """AdamW's non-empty groups, each with "name", "lr" (None: max_lr) and "weight_decay": embed (token and position
    tables), head (lm_head), matrices (the blocks', unless `exclude`d), scalars (gains and biases: no decay, GPT-2)."""
    skip = {id(p) for p in exclude or []}
    head = model.lm_head.weight  # tied: also transformer.wte.weight, and parameters() yields it once
    tables = {id(m.weight) for name, m in model.transformer.items() if name in ("wte", "wpe")} - {id(head)}
    groups: dict[str, dict[str, Any]] = {
        "embed": {"lr": embed_lr or max_lr, "weight_decay": weight_decay, "params": []},
        "head": {"lr": head_lr or max_lr, "weight_decay": weight_decay, "params": []},
        "matrices": {"lr": max_lr, "weight_decay": weight_decay, "params": []},
        "scalars": {"lr": scalar_lr or max_lr, "weight_decay": 0.0, "params": []},
    }
    for p in model.parameters():
        if not p.requires_grad or id(p) in skip:
            continue
        kind = ("head" if p is head else "embed" if id(p) in tables else "matrices" if p.dim() >= 2 else "scalars")
        groups[kind]["params"].append(p)
    return [{"name": name, **g} for name, g in groups.items() if g["params"]]


def make_adamw(model: GPT, cfg: TrainConfig, device_type: str,
               exclude: list[nn.Parameter] | None = None) -> torch.optim.AdamW:
    """torch's AdamW over `adamw_groups` (all but `exclude`), fused on CUDA and on the CPU, where it is faster than
    foreach too (docs/benchmarks.md); elsewhere torch's choice."""
    groups = adamw_groups(model, cfg.weight_decay, cfg.max_lr, cfg.embed_lr, cfg.head_lr, cfg.scalar_lr, exclude)
    fused = True if device_type in ("cuda", "cpu") else None
    return torch.optim.AdamW(groups, lr=cfg.max_lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused)


def build(model: GPT, cfg: TrainConfig, device_type: str) -> Optimizers:
    """AdamW over every weight."""
    return Optimizers({"adamw": make_adamw(model, cfg, device_type)})


# fp32 weight, gradient and AdamW's two moments
KIND = OptimizerKind(build, bytes_per_weight=16)
