"""Optimizers and the learning-rate schedule.

The schedule: linear warmup, then cosine decay to min_lr, then flat (GPT-3 paper, build-nanogpt). The optimizer:
AdamW over every parameter (GPT-2), or Muon (torch.optim.Muon, Jordan et al. 2024) for the hidden matrices with
AdamW for the rest, as the NanoGPT speedrun (KellerJordan/modded-nanogpt) does. Either way the trainer sees one
`Optimizers` object; the schedule scales every group by the same factor, each from its own peak rate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from gptcore.model.gpt import GPT

OPTIMIZERS = ("adamw", "muon")


@dataclass(frozen=True)
class CosineSchedule:
    """The learning rate at each step: linear warmup, cosine decay to min_lr, then flat."""

    max_lr: float
    min_lr: float
    warmup_steps: int
    max_steps: int

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.max_steps < 0:
            raise ValueError(f"train.warmup_steps={self.warmup_steps} and train.max_steps={self.max_steps} must be >= 0")
        if self.warmup_steps > self.max_steps:
            raise ValueError(f"train.warmup_steps={self.warmup_steps} exceeds train.max_steps={self.max_steps}")

    def __call__(self, step: int) -> float:
        return lr_at(step, self.max_lr, self.min_lr, self.warmup_steps, self.max_steps)


def lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """LR for 0-based `step`: (step+1)/warmup of max_lr while warming up, cosine to min_lr at max_steps, min_lr after."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


class Optimizers:
    """Several torch optimizers over disjoint parameters, stepped as one: {name: optimizer}, e.g. {"adamw": ...}
    or {"adamw": ..., "muon": ...}. The state_dict is keyed by the same names, so a checkpoint holds each one's."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer]):
        self.optimizers = dict(optimizers)

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.optimizers.values())

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every optimizer's groups, in order (each has "name" and "peak_lr")."""
        return [g for opt in self for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every optimizer's gradients."""
        for opt in self:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """One update of every optimizer."""
        for opt in self:
            opt.step()

    def state_dict(self) -> dict[str, Any]:
        """{name: that optimizer's state_dict}."""
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned; the names must be this run's optimizers."""
        if set(state) != set(self.optimizers):
            raise ValueError(f"optimizer state holds {sorted(state)}, this run uses {sorted(self.optimizers)}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])


def build_optimizers(model: GPT, optimizer: str, max_lr: float, weight_decay: float, betas: tuple[float, float],
                     eps: float, device_type: str, muon_lr: float = 0.02, muon_momentum: float = 0.95) -> Optimizers:
    """`optimizer` adamw: GPT.configure_optimizers (AdamW at max_lr everywhere). muon: torch.optim.Muon at muon_lr
    (Nesterov momentum muon_momentum, the speedrun's shape-based lr adjustment) for GPT.hidden_matrices, AdamW at
    max_lr for embeddings, lm_head, gains and biases; weight decay (decoupled, scaled by lr) for both."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"train.optimizer={optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
    if optimizer == "adamw":
        adamw = model.configure_optimizers(weight_decay, max_lr, betas, eps, device_type)
        opts = {"adamw": adamw}
    else:
        if muon_lr <= 0:
            raise ValueError(f"train.muon_lr must be > 0, got {muon_lr}")
        if not 0 <= muon_momentum < 1:
            raise ValueError(f"train.muon_momentum must be in [0, 1), got {muon_momentum}")
        hidden = model.hidden_matrices()
        adamw = model.configure_optimizers(weight_decay, max_lr, betas, eps, device_type, exclude=hidden)
        muon = torch.optim.Muon([{"name": "muon", "params": hidden}], lr=muon_lr, momentum=muon_momentum,
                                weight_decay=weight_decay, nesterov=True)
        opts = {"adamw": adamw, "muon": muon}
    for opt in opts.values():
        for group in opt.param_groups:
            group["peak_lr"] = group["lr"]  # what the schedule scales; saved with the optimizer state
    return Optimizers(opts)


def set_lr(optimizer: Optimizers | torch.optim.Optimizer, lr: float, max_lr: float) -> None:
    """Set each group's rate to lr scaled by its own peak: peak_lr * lr / max_lr (AdamW's groups get lr itself)."""
    for group in optimizer.param_groups:
        peak = group.get("peak_lr", max_lr)
        group["lr"] = lr if peak == max_lr else peak * (lr / max_lr)
