"""Stage `compare`: the run beside OpenAI GPT-2 124M -> metrics/summary.json, plus the data behind the plots' lines."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from gptcore.atomic import write_json
from gptcore.report.plots import write_plot_data
from gptcore.report.compare import compare
from gptcore.data.tokenizers import load_tokenizer

EVAL = Path("metrics/eval.json")
BASELINES = Path("conf/baselines.yaml")
SHARDS = Path("data/shards")
LIVE_DIR = Path("metrics/train")
OUT = Path("metrics/summary.json")
PLOT_DATA = Path("metrics/plots")


def main() -> None:
    run = json.loads(EVAL.read_text(encoding="utf-8"))
    baselines = yaml.safe_load(BASELINES.read_text(encoding="utf-8"))
    # GPT-2's figures are comparable only with runs on GPT-2 BPE tokens (a char-level loss is another unit).
    same_tokenizer = load_tokenizer(SHARDS).name == "gpt2"
    summary = compare(run, baselines, comparable=same_tokenizer)
    write_json(OUT, summary)
    write_plot_data(LIVE_DIR, baselines, PLOT_DATA)
    for key, value in summary["delta"].items():
        print(f"[compare] {key}: run - GPT-2 124M = {value:+.4f}")


if __name__ == "__main__":
    main()
