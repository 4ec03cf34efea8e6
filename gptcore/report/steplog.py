"""Step-wise training metrics through dvclive (rank 0 only), kept consistent across a kill and resume."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Mapping

from gptcore.atomic import atomic_write


def truncate_step_metrics(live_dir: str | Path, from_step: int) -> None:
    """Drop rows with step >= from_step from dvclive's TSVs, so a resumed run neither loses nor repeats steps."""
    plots = Path(live_dir) / "plots" / "metrics"
    if not plots.is_dir():
        return
    for tsv in plots.rglob("*.tsv"):
        with open(tsv, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter="\t"))
        if not rows:
            continue
        header, body = rows[0], rows[1:]
        step_col = header.index("step")
        kept = [r for r in body if int(r[step_col]) < from_step]
        if len(kept) == len(body):
            continue
        with atomic_write(tsv) as f:
            csv.writer(f, delimiter="\t", lineterminator="\n").writerows([header, *kept])


class StepLogger:
    """dvclive on rank 0, nothing elsewhere. `resume_step` keeps the curves written before that step."""

    def __init__(self, live_dir: str | Path, enabled: bool = True, resume_step: int | None = None) -> None:
        self.live = None
        if not enabled:
            return
        from dvclive import Live

        resume = bool(resume_step)
        if resume:
            truncate_step_metrics(live_dir, resume_step)
            # dvclive rewrites its summary in place after every log; a kill mid-write leaves it empty or cut, and
            # dvclive's resume would fail to parse it. It holds only the latest values: the next log rewrites it.
            summary = Path(live_dir) / "metrics.json"
            try:
                json.loads(summary.read_text(encoding="utf-8"))
            except FileNotFoundError:
                pass
            except ValueError:
                summary.unlink()
        # dvcyaml=None: dvc.yaml is ours and already declares the plots; never let dvclive rewrite it.
        self.live = Live(str(live_dir), resume=resume, save_dvc_exp=False, dvcyaml=None, report=None)

    def log(self, step: int, metrics: Mapping[str, float | int | None]) -> None:
        """Log `metrics` at `step` (rank 0); None and non-finite values are left out."""
        if self.live is None:
            return
        self.live.step = step
        for name, value in metrics.items():
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                continue
            self.live.log_metric(name, value)
        self.live.make_summary()

    def close(self) -> None:
        """Finish dvclive's run (writes its summary)."""
        if self.live is not None:
            self.live.end()
