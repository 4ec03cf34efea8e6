"""A run watched from a second terminal while it trains (README's `dvc metrics show && dvc plots show` line): its views
show its own step figures as they come, and nothing of the run before it, whose results are kept aside."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import clone_env as env

STEPS = 100_000  # far more than the views need: the run is interrupted once they are read
LATER_RESULTS = ("metrics/eval.json", "metrics/summary.json", "metrics/plots/baselines.tsv",
                 "metrics/plots/final_acc_norm.tsv")


def dvc_json(repo: Path, *args: str) -> dict | None:
    """`dvc <args> --json` read from a second process; None where it failed or took over 60 s."""
    try:
        proc = subprocess.run(["dvc", *args, "--json"], cwd=repo, env=env(repo), capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        return None
    return json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else None


def rows_of(plots: dict, plot_id: str) -> list[dict]:
    """The data rows of one of `dvc plots show --json`'s plots (every revision's)."""
    return [row for r in plots["data"].get(plot_id, []) for row in r["content"]["data"]["values"]]


def shown(repo: Path) -> dict | None:
    """What a user watching sees, read once: `dvc metrics show` and the top-level plots' data."""
    metrics, plots = dvc_json(repo, "metrics", "show"), dvc_json(repo, "plots", "show")
    if metrics is None or plots is None:
        return None
    files = metrics[""]["data"]
    live = (files.get("metrics/train/metrics.json") or {}).get("data") or {}
    loss = rows_of(plots, "loss")
    return {"step": live.get("step"), "metrics": files,
            "train_steps": sorted(int(r["step"]) for r in loss if r["field"] == "train_loss"),
            "loss_files": {r["filename"] for r in loss},
            "acc_files": {r["filename"] for r in rows_of(plots, "acc_norm")}}


@pytest.mark.slow
def test_a_running_train_shows_its_own_figures_and_none_of_the_run_before(micro_repro, tmp_path):
    """`dvc exp run` of a longer micro run in a copy of the micro run's workspace, watched from a second process: while
    train runs, `dvc metrics show` has its step and no eval or compare figure (the micro run's are kept in
    checkpoints/previous/), and the headline plots draw its steps, beyond the micro run's 6, without the micro run's
    reference or final-score rows. Before this, they drew compare's curves of the run before and set its eval val loss
    beside the running train loss."""
    repo = tmp_path / "repo"
    shutil.copytree(micro_repro.path, repo, symlinks=True)
    before = {name: (repo / name).read_bytes() for name in LATER_RESULTS}
    earlier = set((repo / "checkpoints" / "previous").glob("*"))  # the fresh clone's: git's run, moved by the micro run
    previous = shown(repo)
    assert previous["step"] == 6 and max(previous["train_steps"]) == 5  # the micro run, finished
    cmd = ["dvc", "exp", "run", "-S", "preset=micro", "-S", f"train.max_steps={STEPS}", "-S", "train.eval_every=500"]
    proc = subprocess.Popen(cmd, cwd=repo, env=env(repo), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    views, kept = [], []
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None and not kept:  # until train starts the run
            kept = sorted(set((repo / "checkpoints" / "previous").glob("*")) - earlier)
            time.sleep(0.2)
        while time.monotonic() < deadline and proc.poll() is None:
            view = shown(repo)
            if view is not None and proc.poll() is None:
                views.append(view)  # read while train runs (it runs far longer than this loop)
                if len(views) >= 3 and (view["step"] or 0) > 6 and max(view["train_steps"], default=0) > 6:
                    break
            time.sleep(1)
        running = proc.poll() is None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: dvc and the stage end, finished work kept
        out, _ = proc.communicate(timeout=120)
    assert running and len(views) >= 3, f"too few views read while train ran:\n{out[-3000:]}"
    for view in views:
        # dvc metrics show: the running run's step figures alone (or none while dvclive rewrites its file), the later
        # stages' files missing (shown as "-")
        for name in ("metrics/eval.json", "metrics/summary.json"):
            assert "data" not in view["metrics"][name], (name, view["metrics"][name])
        # the plots: this run's steps so far, written as it logs; no reference or final score of the run before
        assert view["train_steps"] == list(range(len(view["train_steps"]))), view["train_steps"][:10]
        assert not any(f.endswith(("baselines.tsv", "final_acc_norm.tsv")) for f in view["loss_files"] |
                       view["acc_files"]), view
    assert views[-1]["step"] > 6 and max(views[-1]["train_steps"]) > 6  # beyond anything of the micro run
    steps = [v["step"] for v in views if v["step"] is not None]
    assert steps == sorted(steps) and len(set(steps)) > 1, steps  # and it moves
    # the micro run's results are kept, byte for byte, beside its step metrics
    assert len(kept) == 1 and (kept[0] / "metrics" / "train" / "metrics.json").is_file()
    assert {name: (kept[0] / name).read_bytes() for name in LATER_RESULTS} == before
