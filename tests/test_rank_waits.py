"""Every wait for another rank has a bound and a name (gptcore/launch.py's watch, gptcore/distributed.py's timeouts),
each case through `python -m stages.train` with train.nproc 2 in a temp project, as users run it: a stopped rank, a
SIGTERM while a rank is stopped and another blocked in a collective, a rank that ends early with status 0, a SIGTERM to
one rank, a SIGINT while the ranks start, and torchrun's variables left in the environment without torchrun."""
from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from stagekit import env, make_project, stage_cmd, write_gpt2_shards
from test_lifetime import as_foreground_job, seconds_until_gone, tree, wait_for

# long enough to be caught mid-training; every checkpoint kept, so that the test sees none is lost
LONG = dict(max_steps=400, eval_every=0, ckpt_every=2, keep_checkpoints=1000, samples=0)
KEPT = "finished checkpoints are kept"


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_gpt2_shards(tmp_path_factory.mktemp("shards"))


def start(project: Path, **inject: str) -> subprocess.Popen:
    """The train stage as a terminal's foreground job of its own (its process group is the job)."""
    return subprocess.Popen(stage_cmd("train"), cwd=project, env=env(**inject), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=as_foreground_job)


def ranks(stage: subprocess.Popen) -> dict[int, psutil.Process]:
    """The stage's ranks by RANK (the children torchrun's agent started in it)."""
    out = {}
    for child in psutil.Process(stage.pid).children():
        try:
            rank = child.environ().get("RANK")
        except psutil.Error:
            continue
        if rank is not None:
            out[int(rank)] = child
    return out


def steps_logged(project: Path) -> int:
    path = project / "metrics/train/plots/metrics/train_loss.tsv"
    return max(len(path.read_text().splitlines()) - 1, 0) if path.exists() else 0


def training(project: Path, stage: subprocess.Popen, steps: int = 4) -> dict[int, psutil.Process]:
    """Wait until the run has logged `steps` steps; its ranks."""
    wait_for(lambda: steps_logged(project) >= steps, stage, timeout=300)
    found = ranks(stage)
    assert sorted(found) == [0, 1], found
    return found


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every finished file under `folder` (hidden temp names and the lock left out)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)}


def said(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("[train")]


@pytest.mark.slow
def test_a_stopped_rank_is_named_after_train_dist_timeout_and_the_others_are_ended(tmp_path, shards):
    """SIGSTOP of one rank mid-training (a stuck network file system read, swap): rank 0 then waits in a collective.
    After train.dist_timeout without a heartbeat the stage names the stopped rank, ends both and keeps every
    checkpoint."""
    project = make_project(tmp_path / "p", shards, nproc=2, dist_timeout=3, **LONG)
    stage = start(project)
    rank = training(project, stage)[1]
    procs = tree(stage.pid)
    before = snapshot(project / "checkpoints")
    rank.send_signal(signal.SIGSTOP)
    out, err = stage.communicate(timeout=300)
    seconds_until_gone(procs)
    assert stage.returncode == 1 and "Traceback" not in err, err[-3000:]
    [line] = said(err)
    assert re.fullmatch(rf"\[train\] rank 1 \(pid {rank.pid}\) made no progress for 3 s in step \d+ \((training|saving)"
                        rf"\): it was stopped \(SIGSTOP, or a debugger holds it\); the other ranks were ended and "
                        rf"{KEPT}: rerun to resume", line), line
    after = snapshot(project / "checkpoints")
    assert before and before.items() <= after.items()


@pytest.mark.slow
def test_sigterm_ends_the_run_within_train_stop_timeout_with_one_rank_stopped_and_one_blocked_in_c(tmp_path, shards):
    """The ranks take SIGTERM in Python (as one that finishes its step first does), so neither ends on it: rank 1 is
    stopped, rank 0 waits for it inside gloo's collective, where no Python handler runs. The stage waits
    train.stop_timeout for them to finish their step, kills them and says so. (A save in flight has its heartbeat's
    bound, train.dist_timeout, as it has without a signal: here no step saves.)"""
    project = make_project(tmp_path / "p", shards, nproc=2, stop_timeout=3,  # dist_timeout: 600 s
                           **{**LONG, "ckpt_every": 1000})
    stage = start(project, GPTCORE_TEST_SIGTERM_HANDLED="1")
    found = training(project, stage)
    procs = tree(stage.pid)
    found[1].send_signal(signal.SIGSTOP)
    time.sleep(1)  # rank 0 reaches its next collective and waits there
    sent = time.monotonic()
    stage.send_signal(signal.SIGTERM)
    out, err = stage.communicate(timeout=300)
    took = time.monotonic() - sent
    seconds_until_gone(procs)
    assert stage.returncode == 143 and "Traceback" not in err, err[-3000:]
    assert said(err) == [f"[train] interrupted (SIGTERM); ranks 0 and 1 (pids {found[0].pid}, {found[1].pid}) had "
                         f"not stopped 3 s later (train.stop_timeout) and were killed; {KEPT}, rerun to resume"]
    assert 3 <= took < 60, took


@pytest.mark.slow
@pytest.mark.parametrize("where, rank, at", [("start", 1, "at start-up"), ("3", 0, r"in step 3 \(training\)")],
                         ids=["at-start-up", "mid-training"])
def test_a_rank_that_ends_with_status_0_is_named_and_the_others_are_ended(tmp_path, shards, where, rank, at):
    """Today's cases: rank 1 exiting 0 at start-up left rank 0 waiting in the rendezvous, silent; rank 0 exiting 0
    mid-training ended the run with status 1 and no line. The stage sees the rank end without finishing and ends the
    others at once, well within train.init_timeout."""
    project = make_project(tmp_path / "p", shards, nproc=2, max_steps=8, eval_every=0, ckpt_every=2)
    stage = start(project, GPTCORE_TEST_EXIT=f"{rank}:{where}:0")
    wait_for(lambda: len(ranks(stage)) == 2, stage, timeout=300)
    procs = tree(stage.pid)
    out, err = stage.communicate(timeout=300)
    seconds_until_gone(procs)
    assert stage.returncode == 1 and "Traceback" not in err, err[-3000:]
    [line] = said(err)
    assert re.fullmatch(rf"\[train\] rank {rank} \(pid \d+\) ended with exit status 0 {at}, before the run was done \("
                        rf"its output above may say why\); the other ranks were stopped and {KEPT}: rerun to resume",
                        line), line


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_every_rank_with_a_save_in_one_line(tmp_path, shards):
    """Once the stage ended with no line; then it named the rank. Now the rank finishes its step, the others agree
    to stop after the same one, they save it together and the stage says what was kept."""
    project = make_project(tmp_path / "p", shards, nproc=2, **LONG)
    stage = start(project)
    rank = training(project, stage)[1]
    procs = tree(stage.pid)
    rank.send_signal(signal.SIGTERM)
    out, err = stage.communicate(timeout=300)
    seconds_until_gone(procs)
    assert stage.returncode == 143 and "Traceback" not in err, err[-3000:]
    [line] = said(err)
    kept = re.fullmatch(r"\[train\] interrupted \(SIGTERM\); saved step (\d+): a rerun resumes there", line)
    assert kept, line
    assert (project / "checkpoints" / f"ckpt_{int(kept.group(1)):07d}").is_dir()


@pytest.mark.slow
def test_ctrl_c_while_the_ranks_start_is_one_line(tmp_path, shards):
    """Ctrl-C as soon as the ranks exist, while they still import torch: the stage passes it on as SIGTERM, which ends
    a starting rank quietly (a SIGINT there was a KeyboardInterrupt traceback from each rank)."""
    project = make_project(tmp_path / "p", shards, nproc=2, max_steps=8)
    stage = start(project)
    wait_for(lambda: len(ranks(stage)) == 2, stage, timeout=300)
    procs = tree(stage.pid)
    os.killpg(stage.pid, signal.SIGINT)  # what Ctrl-C does: SIGINT to the terminal's foreground job
    out, err = stage.communicate(timeout=120)
    seconds_until_gone(procs)
    assert stage.returncode == 130, err[-3000:]
    assert err.strip().splitlines() == ["[train] interrupted (SIGINT); finished work is kept, rerun to resume"]


LEFT_OVER = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"}


@pytest.mark.parametrize("left", [LEFT_OVER, {k: v for k, v in LEFT_OVER.items() if not k.startswith("MASTER")}],
                         ids=["with-master", "without-master"])
def test_torchrun_variables_without_torchrun_are_one_line_before_anything_waits(tmp_path, shards, left):
    """A batch job or a container that carries torchrun's variables: the stage once waited for a rank nobody started
    (SIGTERM ignored), or, without MASTER_ADDR, raised a ValueError. torchrun sets TORCHELASTIC_RUN_ID in every rank
    it starts; without it the variables are refused by name."""
    project = make_project(tmp_path / "p", shards, max_steps=2)
    e = {k: v for k, v in env().items() if not k.startswith(("TORCHELASTIC_", "PET_"))}
    run = subprocess.run(stage_cmd("train"), cwd=project, env={**e, **left}, capture_output=True, text=True,
                         timeout=120)
    found = " ".join(f"{k}={v}" for k, v in left.items())
    assert run.returncode == 1 and run.stderr.strip().splitlines() == [
        f"[train] the environment says this is one of several torchrun processes ({found}) but torchrun did not start "
        f"it (TORCHELASTIC_RUN_ID is unset): a batch job or a container left them. Unset them (unset "
        f"{' '.join(left)}) and run again; train.nproc starts the ranks of one machine, and README's torchrun recipe "
        f"those of several"], run.stderr[-3000:]
    assert not (project / "checkpoints").exists()


@pytest.mark.slow
def test_torchrun_variables_of_one_process_are_ignored(tmp_path, shards):
    """WORLD_SIZE 1 asks for nothing to wait for: the stage runs alone, as train.nproc says."""
    project = make_project(tmp_path / "p", shards, max_steps=2, eval_every=0)
    left = {**LEFT_OVER, "WORLD_SIZE": "1"}
    run = subprocess.run(stage_cmd("train"), cwd=project, env={**env(), **left}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "1 x cpu" in run.stdout and (project / "model" / "model.pt").is_file()
