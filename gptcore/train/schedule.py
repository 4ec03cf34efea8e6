"""The learning-rate schedules (`train.schedule`): linear warmup, then one of the decays in the table below, a pure
function of the step, so a resumed run gets the same rates. A new one is a function here and a row in SCHEDULES."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from gptcore.params import choose

# (step after warmup, max_lr, min_lr, warmup_steps, max_steps, decay_frac) -> the rate, for warmup <= step < max_steps
Decay = Callable[[int, float, float, int, int, float], float]


def cosine(step: int, max_lr: float, min_lr: float, warmup_steps: int, max_steps: int, decay_frac: float) -> float:
    """Cosine from max_lr down to min_lr at max_steps (build-nanogpt)."""
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def wsd(step: int, max_lr: float, min_lr: float, warmup_steps: int, max_steps: int, decay_frac: float) -> float:
    """max_lr held, then a straight line to min_lr over the last decay_frac of max_steps (modded-nanogpt, nanochat)."""
    decay = wsd_decay_steps(max_steps, decay_frac)
    left = max_steps - step
    return max_lr if left >= decay else min_lr + (max_lr - min_lr) * left / decay


SCHEDULES: dict[str, Decay] = {
    "cosine": cosine,
    "wsd": wsd,
}


def lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, max_steps: int, kind: str = "cosine",
          decay_frac: float = 0.2) -> float:
    """The rate at 0-based `step`: (step+1)/warmup of max_lr while warming up, then the `kind` of decay, min_lr from
    max_steps on."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    return SCHEDULES[kind](step, max_lr, min_lr, warmup_steps, max_steps, decay_frac)


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
        # TrainConfig checked the steps (gptcore/train/config.py); the name is checked here, against the table
        assert 0 <= self.warmup_steps <= self.max_steps, (self.warmup_steps, self.max_steps)
        choose(SCHEDULES, "train.schedule", self.kind)

    def __call__(self, step: int) -> float:
        return lr_at(step, self.max_lr, self.min_lr, self.warmup_steps, self.max_steps, self.kind, self.decay_frac)
