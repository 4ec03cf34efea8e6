"""Stage `compare`: the run beside OpenAI GPT-2 124M -> metrics/summary.json, plus the data behind the plots' lines."""
from __future__ import annotations

import json
from pathlib import Path

from gptcore.atomic import write_json
from gptcore.data.shards import read_manifest
from gptcore.report.plots import write_plot_data
from gptcore.report.baselines import read_baselines
from gptcore.report.compare import describe, summarize

EVAL = Path("metrics/eval.json")
BASELINES = Path("conf/baselines.yaml")
SHARDS = Path("data/shards")
LIVE_DIR = Path("metrics/train")
OUT = Path("metrics/summary.json")
PLOT_DATA = Path("metrics/plots")


def main() -> None:
    """eval.json and the baselines -> summary.json (deltas where comparable) and the plots' data files."""
    run = json.loads(EVAL.read_text(encoding="utf-8"))
    baselines = read_baselines(BASELINES)
    # what the run was evaluated on: a delta needs the baseline's data and tokenizer
    manifest = read_manifest(SHARDS)
    data = {"tokenizer": manifest["tokenizer"]["name"], "dataset": (manifest.get("source") or {}).get("name")}
    summary = summarize(run, baselines, data)
    write_json(OUT, summary)
    write_plot_data(LIVE_DIR, baselines, PLOT_DATA)
    for line in describe(summary, baselines):
        print(f"[compare] {line}")


if __name__ == "__main__":
    main()
