"""Step-wise training metrics through dvclive (rank 0 only), kept consistent across a kill and resume, and its step
TSVs read and written (the compare stage's plots and speedrun read them); with train.wandb_log (nanoGPT's), rank 0
also sends them to Weights & Biases (dvclive stays the source)."""
from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Iterable

from gptcore.atomic import atomic_write, write_json
from gptcore.errors import UserError
from gptcore.folders import check_writable


def _rows(tsv: Path) -> list[list[str]]:
    with open(tsv, newline="", encoding="utf-8") as f:
        return list(csv.reader(f, delimiter="\t"))


def read_step_tsv(path: str | Path) -> list[tuple[int, float]]:
    """A dvclive step-metric TSV (header `step<TAB>name`) -> [(step, value)], in file order."""
    path = Path(path)
    rows = _rows(path)
    if not rows:
        raise UserError(f"{path}: empty file, expected a header `step<TAB>{path.stem}`")
    header, name = rows[0], path.stem
    if "step" not in header or name not in header:
        raise UserError(f"{path}: header {header} lacks 'step' or {name!r}")
    i, j = header.index("step"), header.index(name)
    out = []
    for lineno, row in enumerate(rows[1:], 2):
        try:
            out.append((int(row[i]), float(row[j])))
        except (ValueError, IndexError):
            raise UserError(f"{path}: line {lineno}: expected an integer step and a number, got {row}") from None
    return out


def write_tsv(path: Path, header: list[str], rows: Iterable[Iterable[Any]]) -> None:
    """Replace `path` with a TSV of `header` and `rows` atomically."""
    buf = io.StringIO()
    csv.writer(buf, delimiter="\t", lineterminator="\n").writerows([header, *rows])
    with atomic_write(path, "wb") as f:  # bytes: the same "\n" line ends on every OS
        f.write(buf.getvalue().encode("utf-8"))


def truncate_step_metrics(live_dir: str | Path, from_step: int) -> None:
    """Drop rows with step >= from_step from dvclive's TSVs, so a resumed run neither loses nor repeats steps."""
    for tsv in (Path(live_dir) / "plots" / "metrics").rglob("*.tsv"):  # none when the folder is missing
        rows = _rows(tsv)
        if not rows:
            continue
        header, body = rows[0], rows[1:]
        step_col = header.index("step")
        kept = [r for r in body if int(r[step_col]) < from_step]
        if len(kept) != len(body):
            write_tsv(tsv, header, kept)


def repair_summary(live_dir: str | Path) -> None:
    """Rebuild a metrics.json a kill cut short (dvclive rewrites it in place, then cannot resume) from the step TSVs."""
    path = Path(live_dir) / "metrics.json"
    try:
        json.loads(path.read_text(encoding="utf-8"))
        return
    except FileNotFoundError:
        return
    except ValueError:
        pass
    summary: dict[str, float | int | None] = {}
    for tsv in sorted((Path(live_dir) / "plots" / "metrics").rglob("*.tsv")):
        rows = _rows(tsv)
        if len(rows) > 1:
            last = dict(zip(rows[0], rows[-1]))
            value = float(last[tsv.stem])
            summary[tsv.stem] = value if math.isfinite(value) else None  # JSON has no NaN
            summary["step"] = max(int(summary.get("step", 0)), int(last["step"]))
    write_json(path, summary, indent=4)


class StepLogger:
    """dvclive on rank 0, nothing elsewhere. `resume_step` keeps the curves written before that step; `also`: further
    sinks with log(step, metrics), log_constants(metrics) and close() (WandbLog)."""

    def __init__(self, live_dir: str | Path, enabled: bool = True, resume_step: int | None = None,
                 also: Sequence[Any] = ()) -> None:
        self.live, self.also = None, list(also) if enabled else []
        if not enabled:
            return
        from dvclive import Live

        check_writable(live_dir, "train")  # dvclive writes the folder directly, not through the atomic writer
        resume = bool(resume_step)
        if resume:
            truncate_step_metrics(live_dir, resume_step)
            repair_summary(live_dir)
        # dvcyaml=None: dvc.yaml is ours and already declares the plots; never let dvclive rewrite it.
        self.live = Live(str(live_dir), resume=resume, save_dvc_exp=False, dvcyaml=None, report=None)

    def log(self, step: int, metrics: Mapping[str, float | int | None]) -> None:
        """Log `metrics` at `step` (rank 0); None and non-finite values are left out."""
        if self.live is None:
            return
        self.live.step = step
        kept = {name: value for name, value in metrics.items()
                if value is not None and not (isinstance(value, float) and not math.isfinite(value))}
        for name, value in kept.items():
            self.live.log_metric(name, value)
        self.live.make_summary()
        for sink in self.also:
            sink.log(step, kept)

    def log_constants(self, metrics: Mapping[str, float | int]) -> None:
        """Figures of the whole run's config (its parameter count, ...) to the `also` sinks' summaries, never to
        dvclive: in DVC they are no metric, and gptcore-exp-table computes them from each experiment's params."""
        for sink in self.also:
            sink.log_constants(metrics)

    def close(self) -> None:
        """Finish dvclive's run (writes its summary)."""
        if self.live is not None:
            self.live.end()
        for sink in self.also:
            sink.close()


class WandbLog:
    """One W&B run getting what StepLogger gives dvclive, on dvclive's `step` axis (a resumed run continues its curves),
    named after the DVC experiment (DVC_EXP_NAME); WANDB_MODE=offline needs no account (`wandb sync` uploads later)."""

    def __init__(self, project: str, config: Mapping[str, Any], name: str | None = None) -> None:
        import wandb

        try:
            self.run = wandb.init(project=project, name=name or os.environ.get("DVC_EXP_NAME"), config=dict(config))
        except wandb.Error as e:  # no account or no network in online mode
            raise UserError(f"train.wandb_log: W&B could not start a run ({str(e).strip().splitlines()[0]}): run "
                            f"`wandb login`, or set WANDB_MODE=offline (then `wandb sync` uploads it later)") from None
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, step: int, metrics: Mapping[str, float | int]) -> None:
        """Send `metrics` at dvclive's `step`."""
        self.run.log({**metrics, "step": step})

    def log_constants(self, metrics: Mapping[str, float | int]) -> None:
        """Figures of the whole run (parameter count, ...) into the run's summary, as dvclive's metrics.json."""
        self.run.summary.update(dict(metrics))

    def close(self) -> None:
        """Finish the run (offline: its files are complete on disk)."""
        self.run.finish()


def wandb_sinks(train: Any, config: Mapping[str, Any], is_main: bool) -> list[WandbLog]:
    """[a WandbLog] on rank 0 when `train.wandb_log` is on, else []: StepLogger's `also`."""
    return [WandbLog(train.wandb_project, config)] if train.wandb_log and is_main else []
