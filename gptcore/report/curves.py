"""A run's headline curves: its step log (dvclive's TSVs) with the tokens seen at each step beside it and the train
loss's centred moving average, in the files dvc.yaml's top-level plots read (metrics/plots/train_loss.tsv, val_loss.tsv,
acc_norm.tsv). The train stage keeps them in step as it logs (`LiveCurves`, a StepLogger sink), so the plots show a run
while it trains, never the run before; they are derived from the step log alone, so a run moved aside or brought back
takes only its step log along. compare reads a run's span from the same step log."""
from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from pathlib import Path

from gptcore.report.steplog import read_step_tsv, write_tsv

# dvclive step metrics drawn against tokens seen, and the suffix of a task's accuracy logged in training (train.tasks:
# `<task>_acc_norm`), which goes on the accuracy plot
CURVES = ("train_loss", "val_loss")
ACC_NORM = "_acc_norm"
# the score of a guess, the accuracy plot's chance line: every task of the table (gptcore/eval/tasks/) picks one of 4
# endings (HellaSwag's are 4 by its format, the cloze task cuts 4)
CHANCE = 0.25
ACC_FILE = "acc_norm.tsv"


def step_metrics(live_dir: str | Path) -> Path:
    """dvclive's folder of step TSVs in `live_dir`."""
    return Path(live_dir) / "plots" / "metrics"


def tokens_per_step(live_dir: str | Path) -> float:
    """Tokens per optimizer step, from dvclive's tokens_seen.tsv (tokens seen after step s = (s + 1) x this); 0 when
    the run took no step (train.max_steps 0): everything it logged is at zero tokens."""
    path = step_metrics(live_dir) / "tokens_seen.tsv"
    rows = read_step_tsv(path) if path.is_file() else []
    if not rows:
        return 0.0
    step, tokens = rows[-1]
    return tokens / (step + 1)


def smooth_half_width(n: int) -> int:
    """Points on each side of the train loss's moving average for a curve of n points: 0.5% of the run, at least 3
    (a 7-point window on the 200-step quick start, 191 points on a 19,000-step run: 1% of the plot's width). Wider
    windows smooth more but cut the corner where the loss stops falling fast."""
    return max(3, n // 200)


def smooth(values: list[float], half: int | None = None) -> list[float]:
    """Centred moving average: point i is the mean of points i - h .. i + h, h = `half` (default smooth_half_width)
    shrunk near either end to keep the window symmetric: the curve starts and ends at the data and a straight stretch
    stays put (a trailing average, debiased or not, lags a falling loss and starts above it)."""
    n = len(values)
    h = smooth_half_width(n) if half is None else half
    if h < 0:
        raise ValueError(f"half={h}: must be >= 0")
    prefix = [0.0, *itertools.accumulate(values)]
    halves = (min(h, i, n - 1 - i) for i in range(n))  # the window's half-width at point i
    return [(prefix[i + k + 1] - prefix[i - k]) / (2 * k + 1) for i, k in enumerate(halves)]


def read_curves(live_dir: str | Path) -> dict[str, list[tuple[int, int, float]]]:
    """{name: [(step, tokens_seen, value)]} of each of CURVES and each task's `<task>_acc_norm` the run logged. An
    evaluation at step s has seen s steps of tokens; a training step s, s + 1 (its loss is logged after its update)."""
    metrics = step_metrics(live_dir)
    per_step = tokens_per_step(live_dir)
    tasks = sorted(p.stem for p in metrics.glob(f"*{ACC_NORM}.tsv"))
    out = {}
    for name in (*CURVES, *tasks):
        src = metrics / f"{name}.tsv"
        if src.is_file():
            done = 1 if name == "train_loss" else 0
            out[name] = [(s, round((s + done) * per_step), v) for s, v in read_step_tsv(src)]
    return out


def run_span(live_dir: str | Path) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The (step, tokens_seen) of the first and the last point the run logged on its curves; None before any."""
    points = [(s, t) for rows in read_curves(live_dir).values() for s, t, _ in rows]
    return (min(points), max(points)) if points else None  # tokens_seen grows with the step


def write_curves(live_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Write the curves of the step log in `live_dir` to `out_dir`; returns the files. train_loss.tsv: step,
    tokens_seen, train_loss, train_loss_smooth (`smooth`); val_loss.tsv: step, tokens_seen, val_loss; acc_norm.tsv:
    step, tokens_seen, task, acc_norm, chance (CHANCE) for each task's curve logged in training. Each is written whole
    every time, a header alone where the run logged no such curve (DVC reads an empty curve; a missing file it
    reports)."""
    out_dir = Path(out_dir)
    curves = read_curves(live_dir)
    train = curves.get("train_loss", [])
    smoothed = smooth([v for _, _, v in train])
    write_tsv(out_dir / "train_loss.tsv", ["step", "tokens_seen", "train_loss", "train_loss_smooth"],
              ((s, t, v, round(m, 6)) for (s, t, v), m in zip(train, smoothed)))
    write_tsv(out_dir / "val_loss.tsv", ["step", "tokens_seen", "val_loss"], curves.get("val_loss", []))
    write_tsv(out_dir / ACC_FILE, ["step", "tokens_seen", "task", "acc_norm", "chance"],
              ((s, t, name.removesuffix(ACC_NORM), v, CHANCE) for name, rows in curves.items()
               if name.endswith(ACC_NORM) for s, t, v in rows))
    return [out_dir / "train_loss.tsv", out_dir / "val_loss.tsv", out_dir / ACC_FILE]


class LiveCurves:
    """write_curves as a run logs, a StepLogger sink (its `also`): at once when the run starts (`update(force=True)`:
    a fresh run's headers, a resumed run's curves up to its checkpoint) and on the first log, then at each evaluation
    and at most every `every_s` seconds, or less often where a write takes over 1% of that (a long run's files grow);
    and at the end. It reads dvclive's files, which StepLogger has written by then."""

    def __init__(self, live_dir: str | Path, out_dir: str | Path, every_s: float = 10.0) -> None:
        self.live_dir, self.out_dir, self.every_s = Path(live_dir), Path(out_dir), every_s
        self.next_at, self.logged = float("-inf"), False

    def update(self, force: bool = False) -> None:
        """Rewrite the curves if `force` or if they are due."""
        start = time.monotonic()
        if not force and start < self.next_at:
            return
        write_curves(self.live_dir, self.out_dir)
        took = time.monotonic() - start
        self.next_at = start + max(self.every_s, 100 * took)

    def log(self, step: int, metrics: Mapping[str, float | int]) -> None:
        """After StepLogger logged `metrics` at `step`: the first log's and an evaluation's points go out at once,
        others when due."""
        first, self.logged = not self.logged, True
        self.update(force=first or any(name == "val_loss" or name.endswith(ACC_NORM) for name in metrics))

    def log_constants(self, metrics: Mapping[str, float | int]) -> None:
        """Nothing: the curves are step metrics only."""

    def close(self) -> None:
        """The run's last points."""
        self.update(force=True)
