"""The learning-rate schedules: warmup then cosine decay (build-nanogpt), or warmup, a held peak and a linear
decay (WSD: modded-nanogpt, nanochat); a pure function of the step, so a resumed run gets the same rates."""
from __future__ import annotations

import math
from dataclasses import dataclass

# torch.optim.Muon's private Newton-Schulz iteration and shape scaling: a matrix Muon updates whole gets torch's update


SCHEDULES = ("cosine", "wsd")


def lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, max_steps: int, kind: str = "cosine",
          decay_frac: float = 0.2) -> float:
    """The rate at 0-based `step`: (step+1)/warmup of max_lr while warming up, then cosine to min_lr at max_steps
    (build-nanogpt) or, for wsd, max_lr held until a straight line over the last decay_frac (modded-nanogpt)."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    if kind == "wsd":
        decay = wsd_decay_steps(max_steps, decay_frac)
        left = max_steps - step
        return max_lr if left >= decay else min_lr + (max_lr - min_lr) * left / decay
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def wsd_decay_steps(max_steps: int, decay_frac: float) -> int:
    """The steps of the WSD schedule's final decay: decay_frac of max_steps, rounded."""
    return round(decay_frac * max_steps)


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate at each step (`lr_at`), a pure function of the step: a resumed run gets the same rates."""

    max_lr: float
    min_lr: float
    warmup_steps: int
    max_steps: int
    kind: str = "cosine"
    decay_frac: float = 0.2

    def __post_init__(self) -> None:
        # TrainConfig checked these (gptcore/train/config.py)
        assert 0 <= self.warmup_steps <= self.max_steps, (self.warmup_steps, self.max_steps)
        assert self.kind in SCHEDULES, self.kind

    def __call__(self, step: int) -> float:
        return lr_at(step, self.max_lr, self.min_lr, self.warmup_steps, self.max_steps, self.kind, self.decay_frac)
