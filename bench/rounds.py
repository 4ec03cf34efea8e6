"""Round-robin timing for the benches: the variants take turns (A B C A B C ...), so a drift of the machine's speed
lands on every variant alike instead of on whichever ran last, and each figure comes with its spread over rounds.

A variant is a callable that does a fixed amount of work per call (its set-up done before, outside the clock) and
may keep state between calls (a trainer steps on). `time_rounds` runs one untimed warm-up round, then `rounds`
timed ones; a figure is reported as the median of its per-round values with their range, and a ratio between two
variants as the median of the per-round ratios (both measured in the same round) with their range.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ROUNDS = 5


@dataclass
class Timed:
    """Per-round seconds of each variant, in the order given, what each of its timed calls returned, and the seconds
    of its first (warm-up) call."""
    seconds: dict[str, list[float]]
    returns: dict[str, list[Any]]
    warmup: dict[str, float] = field(default_factory=dict)

    @property
    def last(self) -> dict[str, Any]:
        """What each variant's last call returned."""
        return {name: values[-1] for name, values in self.returns.items()}

    def rate(self, name: str, work: float) -> list[float]:
        """Per-round `work` per second of variant `name` (work: tokens, FLOPs, examples per call)."""
        return [work / s for s in self.seconds[name]]


def time_rounds(variants: dict[str, Callable[[], Any]], rounds: int = DEFAULT_ROUNDS, warmup: int = 1,
                sync: Callable[[], None] = lambda: None, progress: bool = False,
                after: Callable[[], None] = lambda: None) -> Timed:
    """Run every variant once per round, in turn, `warmup` untimed rounds and then `rounds` timed ones.

    `sync` waits for the device (torch.cuda.synchronize) before and after each call, so a call's time is its own;
    `after` runs after each call, off the clock (a bench's cleanup: the files a call wrote)."""
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds must be >= 1 and warmup >= 0, got {rounds}, {warmup}")
    out = Timed({name: [] for name in variants}, {name: [] for name in variants})
    for r in range(warmup + rounds):
        for name, fn in variants.items():
            sync()
            t0 = time.perf_counter()
            value = fn()
            sync()
            dt = time.perf_counter() - t0
            after()
            if r >= warmup:
                out.seconds[name].append(dt)
                out.returns[name].append(value)
            else:
                out.warmup.setdefault(name, dt)
        if progress:
            print(f"[rounds] {'warm-up' if r < warmup else 'round'} {r + 1 - warmup if r >= warmup else r + 1} done",
                  flush=True)
    return out


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-round a / b (both lists in round order, as time_rounds gives them)."""
    if len(a) != len(b):
        raise ValueError(f"ratios need one value per round on both sides, got {len(a)} and {len(b)}")
    return [x / y for x, y in zip(a, b)]


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of per-round values."""
    return statistics.median(values), min(values), max(values)


def fmt(values: Sequence[float], spec: str = ".1f", scale: float = 1.0, unit: str = "") -> str:
    """'median (min-max)unit' of per-round values times `scale`, each number formatted by `spec`."""
    med, lo, hi = (v * scale for v in spread(values))
    return f"{med:{spec}} ({lo:{spec}}-{hi:{spec}}){unit}"


def beats(ratio: Sequence[float]) -> bool:
    """Whether per-round ratios (candidate's speed over the baseline's) show the candidate faster by more than the
    spread: even its slowest round is ahead."""
    return min(ratio) > 1.0
