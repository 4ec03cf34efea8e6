"""Stage `compare`: the run beside OpenAI GPT-2 124M -> metrics/summary.json (its deltas and speedrun figures: metrics)
and metrics/comparison.json (the baselines and why each delta is or is not given: no `dvc exp show` columns), plus
the data behind the plots' lines."""
from __future__ import annotations

import json
from pathlib import Path

from gptcore.atomic import write_json
from gptcore.report.baselines import read_baselines
from gptcore.report.compare import (
    comparable_figures,
    describe,
    final_acc_norm,
    measured_line,
    own_text,
    split_outputs,
    summarize,
)
from gptcore.report.config import CompareConfig
from gptcore.report.plots import write_offline_page, write_plot_data
from gptcore.report.speedrun import describe_speedrun, speedrun_summary
from stages.boundary import stage

EVAL = Path("metrics/eval.json")
MEASURED = Path("metrics/measured_on.json")
BASELINES = Path("conf/baselines.yaml")
LIVE_DIR = Path("metrics/train")
OUT, COMPARISON = Path("metrics/summary.json"), Path("metrics/comparison.json")
PLOT_DATA = Path("metrics/plots")
MODEL_MANIFEST = Path("model/manifest.json")
# model/ and metrics/train/ are train's outputs, under its lock on checkpoints/; metrics/'s covers evaluate's files too
TRAINED, METRICS = Path("checkpoints"), Path("metrics")


def main() -> None:
    """eval.json and the baselines -> summary.json (deltas where comparable), comparison.json and the plots' data."""
    with stage("compare", reads=[TRAINED], writes=[METRICS]) as s:
        target = s.config(CompareConfig).target_val_loss
        run = json.loads(EVAL.read_text(encoding="utf-8"))
        baselines = read_baselines(BASELINES)
        # what the run was evaluated on (evaluate's record): a delta needs what the baseline was measured on
        measured = json.loads(MEASURED.read_text(encoding="utf-8")) if MEASURED.is_file() else None
        summary = summarize(run, baselines, measured)
        model = json.loads(MODEL_MANIFEST.read_text(encoding="utf-8")) if MODEL_MANIFEST.is_file() else {}
        summary["speedrun"] = speedrun_summary(LIVE_DIR, target, model.get("hardware"))
        metrics, comparison = split_outputs(summary)  # what the run measured; what it was set beside
        write_json(OUT, metrics)
        write_json(COMPARISON, comparison)
        # the final multiple-choice scores go on the acc_norm plot (cloze has no curve); references where comparable
        write_plot_data(LIVE_DIR, baselines, PLOT_DATA, final_acc_norm(run), comparable_figures(summary["comparable"]))
        write_offline_page()  # plots/offline.html: .dvc/config has `dvc plots show` fill it, drawn offline
        own = own_text(summary, measured)  # neither a published val loss nor the committed run is on this text
        said = [] if own and not summary["delta"] else [*describe(summary, baselines),
                                                         f"speedrun: {describe_speedrun(summary['speedrun'])}"]
        s.say(*said, measured_line(run, summary["speedrun"], own=own))  # own text, nothing compared: one line


if __name__ == "__main__":
    main()
