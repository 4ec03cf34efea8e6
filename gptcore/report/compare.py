"""Set a run's evaluation metrics beside published reference figures: baseline values and run - baseline deltas."""
from __future__ import annotations

from typing import Any


def compare(run: dict[str, Any], baselines: dict[str, Any], comparable: bool = True) -> dict[str, Any]:
    """`run` is evaluate's eval.json ({"eval": {"val_loss"}, "hellaswag": {"acc_norm"}, ...}).

    Returns {"baseline": {...}, "delta": {...}} with keys named after what they compare; a figure the run lacks
    (say, HellaSwag on the quick-start, which evaluates the cloze task) gets a baseline but no delta, and so does
    every figure when the run is not `comparable` (another tokenizer: its loss is in other units).
    """
    gpt2, gpt3 = baselines["gpt2_124m"], baselines.get("gpt3_124m", {})
    ours = {
        "val_loss": run.get("eval", {}).get("val_loss"),
        "hellaswag_acc_norm": run.get("hellaswag", {}).get("acc_norm"),
    }
    baseline = {"gpt2_val_loss": gpt2["val_loss"], "gpt2_hellaswag_acc_norm": gpt2["hellaswag_acc_norm"]}
    if "hellaswag_acc_norm" in gpt3:
        baseline["gpt3_hellaswag_acc_norm"] = gpt3["hellaswag_acc_norm"]
    delta: dict[str, float] = {}
    if not comparable:
        return {"baseline": baseline, "delta": delta}
    if ours["val_loss"] is not None:
        delta["val_loss_vs_gpt2"] = ours["val_loss"] - gpt2["val_loss"]
    if ours["hellaswag_acc_norm"] is not None:
        delta["hellaswag_acc_norm_vs_gpt2"] = ours["hellaswag_acc_norm"] - gpt2["hellaswag_acc_norm"]
        if "gpt3_hellaswag_acc_norm" in baseline:
            delta["hellaswag_acc_norm_vs_gpt3"] = ours["hellaswag_acc_norm"] - baseline["gpt3_hellaswag_acc_norm"]
    return {"baseline": baseline, "delta": delta}
