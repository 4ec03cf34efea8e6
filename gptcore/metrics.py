"""Metrics files: step-wise training metrics through dvclive (rank 0 only), and atomic JSON summaries."""
from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping


def write_json(path: str | Path, data: Any) -> None:
    """Write JSON atomically (temp name, fsync, rename) so a kill never leaves half a metrics file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        tmp = tsv.with_suffix(".tsv.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            csv.writer(f, delimiter="\t", lineterminator="\n").writerows([header, *kept])
        os.replace(tmp, tsv)


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
        # dvcyaml=None: dvc.yaml is ours and already declares the plots; never let dvclive rewrite it.
        self.live = Live(str(live_dir), resume=resume, save_dvc_exp=False, dvcyaml=None, report=None)

    def log(self, step: int, metrics: Mapping[str, float | int | None]) -> None:
        if self.live is None:
            return
        self.live.step = step
        for name, value in metrics.items():
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                continue
            self.live.log_metric(name, value)
        self.live.make_summary()

    def close(self) -> None:
        if self.live is not None:
            self.live.end()
