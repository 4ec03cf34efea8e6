"""The speedrun metric, as the NanoGPT speedrun (KellerJordan/modded-nanogpt) ranks recipes: the tokens seen (and the
time) up to the first eval whose val loss is at or below a target, e.g. GPT-2 124M's. Training time is the sum of
step_ms (evals, checkpoints and startup left out); GPU-hours are that x processes, for runs on GPUs."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from gptcore.report.curves import tokens_per_step
from gptcore.report.steplog import read_step_tsv


def speedrun_summary(live_dir: str | Path, target: float | None, hardware: Mapping[str, Any] | None = None
                     ) -> dict[str, Any]:
    """{"target_val_loss", "reached", "tokens_to_target", "steps_to_target", "train_hours", "hours_to_target",
    "gpu_hours", "gpu_hours_to_target"} from dvclive's val_loss/step_ms curves in live_dir. Figures a run cannot
    give are None: the target-dependent ones when target is None or was never reached, the GPU ones unless
    `hardware` ({"device": "cuda"|..., "processes": N}, the train stage's model/manifest.json) says GPUs."""
    metrics = Path(live_dir) / "plots" / "metrics"
    val = read_step_tsv(metrics / "val_loss.tsv") if (metrics / "val_loss.tsv").is_file() else []
    step_ms = dict(read_step_tsv(metrics / "step_ms.tsv")) if (metrics / "step_ms.tsv").is_file() else {}
    per_step = tokens_per_step(live_dir)
    hit = next((s for s, loss in val if target is not None and loss <= target), None)
    hours = sum(step_ms.values()) / 3.6e6 if step_ms else None
    # an eval at step s follows s updates: steps 0..s-1
    hours_to = sum(ms for s, ms in step_ms.items() if s < hit) / 3.6e6 if step_ms and hit is not None else None
    gpus = int(hardware["processes"]) if hardware and hardware.get("device") == "cuda" else None
    return {"target_val_loss": target, "reached": hit is not None,
            "tokens_to_target": round(hit * per_step) if hit is not None else None, "steps_to_target": hit,
            "train_hours": hours, "hours_to_target": hours_to,
            "gpu_hours": hours * gpus if gpus and hours is not None else None,
            "gpu_hours_to_target": hours_to * gpus if gpus and hours_to is not None else None}


def describe_speedrun(s: Mapping[str, Any]) -> str:
    """One line: where the run reached the target, or that it did not."""
    if s["target_val_loss"] is None:
        return "no target val loss (compare.target_val_loss: null)"
    if not s["reached"]:
        return f"val loss never reached the target {s['target_val_loss']}"
    line = (f"val loss reached {s['target_val_loss']} after {s['tokens_to_target']:,} tokens "
            f"(step {s['steps_to_target']})")
    if s["hours_to_target"] is not None:
        line += f", {s['hours_to_target'] * 3600:.1f} s of training"
    if s["gpu_hours_to_target"] is not None:
        line += f", {s['gpu_hours_to_target']:.3f} GPU-hours"
    return line
