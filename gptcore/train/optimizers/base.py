"""What every optimizer kind shares: `OptimizerKind` (how it builds a model's optimizers, what a weight costs), and
`Optimizers`, a run's torch optimizers stepped and saved as one; `set_lr`, the schedule's rate into each group."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn

from gptcore.model.gpt import GPT
from gptcore.train.config import TrainConfig


class Optimizers:
    """{name: torch optimizer} on disjoint parameters, stepped and saved as one; `clip_params`: what the clip covers."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer], clip_params: list[nn.Parameter] | None = None):
        self.optimizers, self.clip_params = dict(optimizers), clip_params
        for opt in self:
            for group in opt.param_groups:
                group.setdefault("peak_lr", group["lr"])  # what the schedule scales; saved with the optimizer state

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.optimizers.values())

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every optimizer's groups, in order (each has "name" and "peak_lr")."""
        return [g for opt in self for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Every optimizer's zero_grad (None frees the gradients' memory until the next backward)."""
        for opt in self:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """One step of every optimizer, each with its own groups' learning rates."""
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


@dataclass(frozen=True)
class OptimizerKind:
    """One choice of `train.optimizer`: how it builds a model's optimizers, and the bytes a matrix weight costs while
    training (the weight, its gradient and the optimizer's state, fp32) for the memory estimate."""

    build: Callable[[GPT, TrainConfig, str], Optimizers]  # (model, train: section, device type)
    bytes_per_weight: int


def set_lr(optimizer: Optimizers | torch.optim.Optimizer, lr: float, max_lr: float) -> None:
    """Set each group's rate to lr scaled by its own peak, peak_lr * lr / max_lr (at max_lr: lr itself, bit for bit)."""
    for group in optimizer.param_groups:
        peak = group.get("peak_lr", max_lr)
        group["lr"] = lr if peak == max_lr else peak * (lr / max_lr)
