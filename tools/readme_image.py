"""README's top image, docs/loss_vs_tokens.png, drawn from committed runs: the `loss_vs_tokens` plot of `dvc plots
diff` over the git revisions that hold them, each named, rendered by gptcore-render-plots' renderer. The plot's
template draws a reference line only for a run its compare stage called comparable with it (the revision's
metrics/plots/baselines.tsv), so a Shakespeare run gets no FineWeb-Edu line.

    python -m tools.readme_image                                  # the committed quick start (HEAD)
    python -m tools.readme_image quickstart=HEAD modern=<rev>     # runs committed at other revisions beside it
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gptcore.errors import UserError, one_line_errors
from gptcore.report.curves import CURVES
from gptcore.report.plots import render_plots

PLOT = "loss_vs_tokens"
OUT_DIR = Path("docs")  # the image: docs/loss_vs_tokens.png (.svg)
RUNS = ("quickstart=HEAD",)


def parse_runs(runs: list[str]) -> dict[str, str]:
    """["NAME=REV", ...] -> {rev: name}, in order; a UserError for a malformed or repeated one."""
    named: dict[str, str] = {}
    for run in runs:
        name, sep, rev = run.partition("=")
        if not (sep and name and rev):
            raise UserError(f"{run!r}: give a run as NAME=REV (a git commit, tag or branch holding its metrics/)")
        if rev in named or name in named.values():
            raise UserError(f"{run!r}: each revision and each name once")
        named[rev] = name
    return named


def the_plot(plots: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """`dvc plots diff --json` output cut to PLOT with the data of `names`' revisions alone, each named; a UserError
    where a revision has none (DVC's error for it, if it gave one)."""
    renderers = [r for r in plots.get("data", {}).get(PLOT, []) if r.get("type") == "vega"]
    if not renderers:
        raise UserError(f"dvc plots diff gave no {PLOT} plot: run this in the gptcore checkout")
    spec = dict(renderers[0]["content"])
    rows = [dict(row, rev=names[row["rev"]]) for row in spec["data"]["values"] if row.get("rev") in names]
    for rev, name in names.items():  # a revision of an older layout has its reference rows alone: no curve to draw
        if not any(row["rev"] == name and row.get("field") in CURVES for row in rows):
            why = [f"{e.get('source')}: {e.get('type')}" for e in plots.get("errors", []) if e.get("rev") == rev]
            raise UserError(f"{name}={rev}: that revision holds no loss curve where dvc.yaml's plots read them"
                            f"{' (' + '; '.join(why) + ')' if why else ''}: name a commit of a run's metrics/")
    spec["data"] = {"values": rows}
    return {"errors": [], "data": {PLOT: [{"type": "vega", "revisions": list(names.values()), "content": spec}]}}


def main(argv: list[str] | None = None) -> None:
    """Render the image from the runs named (default: the committed quick start) and print its path."""
    ap = argparse.ArgumentParser(prog="python -m tools.readme_image", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", default=list(RUNS), help=f"NAME=REV, each a committed run (default: {RUNS[0]})")
    ap.add_argument("--out-dir", default=str(OUT_DIR), help=f"where {PLOT}.png goes (default: {OUT_DIR})")
    ap.add_argument("--format", choices=("png", "svg"), default="png")
    args = ap.parse_args(argv)
    with one_line_errors("readme_image"):
        names = parse_runs(args.runs)
        proc = subprocess.run(["dvc", "plots", "diff", *names, "--json"], capture_output=True, text=True)
        if proc.returncode:
            raise UserError(f"dvc plots diff {' '.join(names)} failed: {(proc.stderr.strip() or '?').splitlines()[-1]}")
        drawn = render_plots(the_plot(json.loads(proc.stdout), names), args.out_dir, args.format, scale=1.0,
                             log=lambda m: print(m, file=sys.stderr))
    print(drawn[0])


if __name__ == "__main__":
    main()
