"""Stage `compare`: the run beside OpenAI GPT-2 124M -> metrics/summary.json, plus the data behind the plots' lines."""
from __future__ import annotations

import json
from pathlib import Path

from gptcore.atomic import write_json
from gptcore.process import stage_lifetime
from gptcore.report.baselines import read_baselines
from gptcore.report.compare import describe, summarize
from gptcore.report.params import COMPARE
from gptcore.report.plots import write_plot_data
from gptcore.report.speedrun import describe_speedrun, speedrun_summary
from stages.common import load_params, user_errors

EVAL = Path("metrics/eval.json")
MEASURED = Path("metrics/measured_on.json")
BASELINES = Path("conf/baselines.yaml")
LIVE_DIR = Path("metrics/train")
OUT = Path("metrics/summary.json")
PLOT_DATA = Path("metrics/plots")
MODEL_MANIFEST = Path("model/manifest.json")


def main() -> None:
    """eval.json and the baselines -> summary.json (deltas where comparable) and the plots' data files."""
    with user_errors("compare"):
        target = load_params(COMPARE)["target_val_loss"]
    run = json.loads(EVAL.read_text(encoding="utf-8"))
    baselines = read_baselines(BASELINES)
    # what the run was evaluated on (evaluate's record): a delta needs what the baseline was measured on
    summary = summarize(run, baselines, json.loads(MEASURED.read_text(encoding="utf-8")) if MEASURED.is_file() else None)
    hardware = json.loads(MODEL_MANIFEST.read_text(encoding="utf-8")).get("hardware") if MODEL_MANIFEST.is_file() else None
    summary["speedrun"] = speedrun_summary(LIVE_DIR, target, hardware)
    write_json(OUT, summary)
    # the evaluate stage's final multiple-choice score, for the acc_norm plot (cloze runs have no curve)
    final = {task: run[task]["acc_norm"] for task in ("hellaswag", "cloze")
             if isinstance(run.get(task), dict) and run[task].get("acc_norm") is not None}
    write_plot_data(LIVE_DIR, baselines, PLOT_DATA, final)
    for line in describe(summary, baselines):
        print(f"[compare] {line}")
    print(f"[compare] speedrun: {describe_speedrun(summary['speedrun'])}")


if __name__ == "__main__":
    with stage_lifetime("compare"):  # dies with dvc; Ctrl-C / SIGTERM: one line
        main()
