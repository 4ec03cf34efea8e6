"""Stage `compare`: this run's evaluation beside the published OpenAI GPT-2 124M figures -> metrics/summary.json."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from gptcore.atomic import write_json
from gptcore.report import compare

EVAL = Path("metrics/eval.json")
BASELINES = Path("conf/baselines.yaml")
OUT = Path("metrics/summary.json")


def main() -> None:
    run = json.loads(EVAL.read_text(encoding="utf-8"))
    baselines = yaml.safe_load(BASELINES.read_text(encoding="utf-8"))
    summary = compare(run, baselines)
    write_json(OUT, summary)
    for key, value in summary["delta"].items():
        print(f"[compare] {key}: run - GPT-2 124M = {value:+.4f}")


if __name__ == "__main__":
    main()
