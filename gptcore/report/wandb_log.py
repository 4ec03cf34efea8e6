"""Weights & Biases as an opt-in second home for the train step metrics (nanoGPT's `wandb_log`), beside dvclive, which
stays the source of metrics/train/ (docs/reproducing-gpt2.md)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gptcore.errors import UserError


class WandbLog:
    """One W&B run; `log` takes the metrics StepLogger gives dvclive (None and non-finite values already left out)."""

    def __init__(self, project: str, config: Mapping[str, Any], name: str | None = None) -> None:
        import wandb

        try:
            self.run = wandb.init(project=project, name=name or os.environ.get("DVC_EXP_NAME"), config=dict(config))
        except wandb.Error as e:  # no account or no network in online mode
            raise UserError(f"train.wandb_log: W&B could not start a run ({str(e).strip().splitlines()[0]}): run "
                            f"`wandb login`, or set WANDB_MODE=offline (then `wandb sync` uploads it later)") from None
        self.run.define_metric("step")  # dvclive's step, not W&B's counter: a resumed run continues its curves
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


def wandb_sinks(train: Mapping[str, Any], config: Mapping[str, Any], is_main: bool) -> list[WandbLog]:
    """[a WandbLog] on rank 0 when `train.wandb_log` is on, else []: StepLogger's `also`."""
    return [WandbLog(train["wandb_project"], config)] if train["wandb_log"] and is_main else []
