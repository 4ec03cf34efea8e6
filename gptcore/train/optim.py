"""The learning-rate schedule: linear warmup, then cosine decay to min_lr, then flat (GPT-3 paper, build-nanogpt)."""
from __future__ import annotations

import math
from dataclasses import dataclass


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


def set_lr(optimizer, lr: float) -> None:  # type: ignore[no-untyped-def]
    """Set every parameter group's learning rate to `lr`."""
    for group in optimizer.param_groups:
        group["lr"] = lr
