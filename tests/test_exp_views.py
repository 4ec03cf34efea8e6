"""Experiment views through a real DVC queue (README's `dvc exp show` line and gptcore-exp-table): a file of its own, so
that pytest-xdist runs it beside test_dvc_experience.py's long sequence."""
from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import clone_env as env
from conftest import micro_base, run_in

ROOT = Path(__file__).resolve().parents[1]
run = functools.partial(run_in, timeout=600)


@pytest.fixture(scope="module")
def micro_run(micro_repro) -> Path:
    """The micro run's workspace (conftest.micro_base)."""
    return micro_base(micro_repro.path)


def readme_line(start: str) -> list[str]:
    """README's command that starts with `start`, split as a shell would, its trailing comment left out."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(ln for ln in text.splitlines() if ln.startswith(start))
    return shlex.split(line, comments=True)


def wait_until(check, timeout: float = 300, every: float = 0.5, why=lambda: ""):
    """Poll `check()` until it returns something true; that value (a failure after `timeout` seconds, saying
    `why()`)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if got := check():
            return got
        time.sleep(every)
    pytest.fail(f"still waiting after {timeout} s: {why()}")


def exp_states(repo: Path) -> dict[str, tuple[str | None, dict]]:
    """`dvc exp show --json` -> {experiment name: (DVC's state of it, its metrics files)}; {} where DVC failed, as it
    may while a queued run moves between states (a task's files come and go), or where it hung: pygit2 was seen to
    wait forever in a blob read of a running task's branch, so each call is given 60 s and then asked again."""
    try:
        proc = subprocess.run(["dvc", "exp", "show", "--json"], cwd=repo, env=env(repo), capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return {}
    if proc.returncode:
        return {}
    out = {}
    for commit in json.loads(proc.stdout):
        for exp in commit.get("experiments") or []:
            for rev in exp["revs"]:
                metrics = {k: v.get("data") for k, v in ((rev.get("data") or {}).get("metrics") or {}).items()}
                out[rev["name"]] = ((exp.get("executor") or {}).get("state"), metrics)
    return out


@pytest.mark.slow
def test_after_readme_s_sweep_its_views_keep_the_changed_param_and_no_run_shows_another_s_results(micro_run, tmp_path):
    """README's flow on the micro budget through a real DVC queue: a workspace experiment (its results stay in the
    workspace), then a queued run read while it runs, and README's sweep. A running row shows only figures its own run
    wrote, and gptcore-exp-table lists it under the table, never in it; afterwards README's `dvc exp show` line fits
    200 columns with no `…` and shows train.max_lr for every run. Then a smoke, a modern_quickstart and an fsdp run
    (micro budgets): README's table still fits 200 columns and shows each one's preset and what its -S changed."""
    repo = tmp_path / "repo"
    shutil.copytree(micro_run, repo, symlinks=True, ignore=shutil.ignore_patterns("checkpoints"))
    run(repo, "git", "add", "-A")  # HEAD holds a run, as a fresh clone's holds the quick start
    run(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the micro run")
    micro = ("-S", "preset=micro")
    run(repo, "dvc", "exp", "run", "-n", "qs-lr", *micro, "-S", "train.max_lr=3e-3")  # its results: the workspace's
    stale = json.loads((repo / "metrics/eval.json").read_text(encoding="utf-8"))
    run(repo, "dvc", "exp", "run", "--queue", "-n", "long", *micro, "-S", "train.max_steps=500",
        "-S", "train.eval_every=0", "-S", "train.ckpt_every=500")  # trains long enough to be read while running
    for lr in ("6e-4", "2e-3"):
        run(repo, "dvc", "exp", "run", "--queue", "-n", f"lr{lr}", *micro, "-S", f"train.max_lr={lr}")
    workers = [subprocess.Popen(["dvc", "queue", "start", "-j", "1"], cwd=repo, env=env(repo),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        # `long` trains: its row may show its own live train figures, never qs-lr's evaluation
        log = lambda: subprocess.run(["dvc", "queue", "logs", "long"], cwd=repo, env=env(repo),  # noqa: E731
                                     capture_output=True, text=True).stdout
        # the stage's own first line: its boundary has removed the copied results by then (DVC's checks of the
        # unchanged stages and the stage's start, a few seconds, still show them: docs/experiments.md says so)
        # every poll here and below is a dvc process (seconds of a core): polled gently, so as not to slow the runs
        # it waits for on 2 cores
        wait_until(lambda: "[train]" in log(), every=2)
        for _ in range(3):
            state, metrics = wait_until(lambda: exp_states(repo))["long"]
            assert state == "running" and "metrics/eval.json" not in {k for k, v in metrics.items() if v}, metrics
            assert stale not in metrics.values()
            time.sleep(2)
        doc = run(repo, "dvc", "exp", "show", "--json")
        (tmp_path / "running.json").write_text(doc, encoding="utf-8")
        table = run(repo, "sh", "-c", f"gptcore-exp-table {tmp_path / 'running.json'} --names --changed")
        assert "not finished, no figures: " in table and "long (running)" in table
        assert not [ln for ln in table.splitlines() if ln.startswith("|") and "long" in ln]
        queue = lambda: subprocess.run(["dvc", "queue", "status"], cwd=repo, env=env(repo),  # noqa: E731
                                       capture_output=True, text=True).stdout

        def swept() -> bool:
            states = exp_states(repo)
            if any(s == "queued" for s, _ in states.values()) and "0 active, 0 idle" in queue():
                # DVC's queue worker was seen to exit on loaded cores with runs still queued: start one again
                workers.append(subprocess.Popen(["dvc", "queue", "start", "-j", "1"], cwd=repo, env=env(repo),
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            return bool(states) and {"lr6e-4", "lr2e-3"} <= set(states) and all(
                s in ("success", None, "failed") for s, _ in states.values())
        wait_until(swept, timeout=900, every=10,
                   why=lambda: f"{ {k: v[0] for k, v in exp_states(repo).items()} }\n{queue()}")
    finally:
        for w in workers:
            w.kill()
            w.wait()
        stop_queue_workers(repo)
    view = readme_line("dvc exp show --only-changed")
    e = {**env(repo), "COLUMNS": "200"}
    shown = subprocess.run(view + ["--no-pager"], cwd=repo, env=e, capture_output=True, text=True, timeout=600)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "…" not in shown.stdout and max(len(ln) for ln in lines) <= 200, shown.stdout
    assert "train.max_lr" in lines[1].split(), lines[1]
    for name, lr in (("qs-lr", "0.003"), ("lr6e-4", "0.0006"), ("lr2e-3", "0.002"), ("long", "0.001")):
        assert re.search(rf"\[{re.escape(name)}\].*\s{re.escape(lr)}(\s|$)", shown.stdout, re.M), (name, shown.stdout)
    assert not {"params", "params_non_embedding", "flops_per_token"} & set(lines[1].split())
    table = readme_view(repo)
    rows = table_rows(table)
    assert {r["train.max_lr"] for r in rows.values()} >= {"0.003", "0.0006", "0.002"}, table
    assert "not finished" not in table
    print(f"README's DVC line, one preset:\n{shown.stdout}\nREADME's table:\n{table}")

    # other presets beside README's sweep (`long`, this test's own, goes): README's table still fits 200 columns and
    # shows what each experiment changed
    run(repo, "dvc", "exp", "remove", "long")
    for name, *sets in (("smoke", "preset=smoke", *SMOKE_MICRO), ("modern", "preset=modern_quickstart", *MODERN_MICRO),
                        ("fsdp", "preset=micro", "train.parallel=fsdp", "train.nproc=2", "train.micro_batch=4")):
        run(repo, "dvc", "exp", "run", "-n", name, *(a for s in sets for a in ("-S", s)))
    table = readme_view(repo)
    assert max(len(ln) for ln in table.splitlines()) <= 200, table
    rows = table_rows(table)
    header = table.splitlines()[0].strip("| ").split(" | ")
    assert header[:6] == ["experiments", "preset", "train.max_lr", "train.micro_batch", "train.nproc",
                          "train.parallel"], header  # preset, then only keys that differ within a preset
    assert not [k for k in header if k.startswith(("model.", "tokenize.", "fetch."))], header
    assert {k: rows["fsdp"][k] for k in ("preset", "train.parallel", "train.nproc", "train.micro_batch")} == {
        "preset": "micro", "train.parallel": "fsdp", "train.nproc": "2", "train.micro_batch": "4"}, table
    assert (rows["qs-lr"]["preset"], rows["qs-lr"]["train.max_lr"]) == ("micro", "0.003")
    assert rows["smoke"]["preset"] == "smoke" and rows["modern"]["preset"] == "modern_quickstart", table
    mixed = subprocess.run(view + ["--no-pager"], cwd=repo, env=e, capture_output=True, text=True, timeout=600)
    print(f"README's DVC line, four presets:\n{mixed.stdout}\nREADME's table:\n{table}")


# the micro budget for presets other than micro, on micro's data (no fetch or tokenize again)
MICRO_DATA = ("fetch.max_docs=2", "tokenize.val_tokens=8192")
MICRO_BUDGET = ("train.max_steps=4", "train.warmup_steps=1", "train.eval_every=2", "train.val_tokens=1024",
                "train.eval_batch=8", "train.ckpt_every=100", "eval.val_tokens=2048", "eval.eval_batch=8",
                "eval.cloze_examples=20", "eval.cloze_context=16", "eval.cloze_ending=4", "eval.samples=1",
                "eval.sample_tokens=8")
SMOKE_MICRO = (*MICRO_DATA, *MICRO_BUDGET, "model.block_size=32", "train.micro_batch=8", "train.total_batch_tokens=256")
MODERN_MICRO = (*MICRO_DATA, *MICRO_BUDGET, "model.n_layer=1", "model.n_head=2", "model.n_embd=32",
                "model.block_size=32", "train.micro_batch=8", "train.total_batch_tokens=256")


def stop_queue_workers(repo: Path) -> None:
    """End the DVC queue workers `dvc queue start` left for `repo` (a celery worker that outlives the command, and so
    this test, unless stopped): `dvc queue stop --kill`, then any left, by pid, and wait until none is."""
    import psutil

    subprocess.run(["dvc", "queue", "stop", "--kill"], cwd=repo, env=env(repo), capture_output=True, timeout=120)

    def left() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["cmdline", "cwd"]):
            cmd, cwd = " ".join(p.info["cmdline"] or []), p.info["cwd"] or ""
            if "queue-worker" in cmd and (cwd == str(repo) or cwd.startswith(f"{repo}/")):
                found.append(p)
        return found

    procs = left()
    for p in procs:
        p.kill()
    psutil.wait_procs(procs, timeout=30)
    assert not left(), "a DVC queue worker outlived the test"


def readme_view(repo: Path) -> str:
    """README's table line (`dvc exp show --json | gptcore-exp-table ...`) run as a shell runs it, at COLUMNS=200."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(ln for ln in text.splitlines() if ln.startswith("dvc exp show --json | gptcore-exp-table --names "
                                                                "--changed"))
    command = line.split("   #")[0]
    proc = subprocess.run(["sh", "-c", command], cwd=repo, env={**env(repo), "COLUMNS": "200"}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def table_rows(table: str) -> dict[str, dict[str, str]]:
    """The Markdown table's rows by experiment name: {column: cell}."""
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]  # the header and the rows, not |---|
    head = lines[0].strip("| ").split(" | ")
    return {cells[0]: dict(zip(head, cells)) for cells in (ln.strip("| ").split(" | ") for ln in lines[1:])}
