"""The one stage boundary (stages/boundary.py): the locks each stage declares, never opened through a symlink; the
params it read still being params.yaml's when it ends; and a launcher that does no rank's work."""
from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gptcore.locks import FolderLock, NotALockFile, holder_pid

ROOT = Path(__file__).resolve().parents[1]

# every lock a stage takes, as the stage declares it (readers of a folder that does not exist take nothing)
LOCKS = [("fetch", "data/raw"), ("tokenize", "data/raw"), ("tokenize", "data/shards"), ("train", "data/shards"),
         ("train", "checkpoints"), ("evaluate", "data/shards"), ("evaluate", "checkpoints"), ("evaluate", "metrics"),
         ("compare", "checkpoints"), ("compare", "metrics")]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """An empty project folder as the working directory; SIGTERM's handler (the boundary sets it) put back after."""
    handler = signal.getsignal(signal.SIGTERM)
    (tmp_path / "p").mkdir()
    monkeypatch.chdir(tmp_path / "p")
    yield tmp_path / "p"
    signal.signal(signal.SIGTERM, handler)


def run_main(stage: str, capsys) -> tuple[int, list[str]]:
    """`python -m stages.<stage>` in this process: its exit status and the lines on stderr."""
    with pytest.raises(SystemExit) as e:
        importlib.import_module(f"stages.{stage}").main()
    return e.value.code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("stage, folder", LOCKS, ids=[f"{s}-{f}" for s, f in LOCKS])
def test_a_symlink_at_a_lock_path_is_refused_in_one_line_and_its_target_untouched(project, capsys, stage, folder):
    victim = project.parent / "victim.txt"
    victim.write_text("someone's file\n")
    for name in ("data/raw", "data/shards", "checkpoints", "metrics"):
        (project / name).mkdir(parents=True)
    (project / folder / ".lock").symlink_to(victim)
    status, lines = run_main(stage, capsys)
    assert status == 1 and lines == [f"[{stage}] {folder}/.lock is a symbolic link, not a lock file: a run never "
                                     f"opens its lock through it (it could overwrite what it points at); move it "
                                     f"away and run again"]
    assert victim.read_text() == "someone's file\n" and (project / folder / ".lock").is_symlink()


def test_a_fifo_or_a_folder_at_a_lock_path_is_refused(tmp_path):
    os.mkfifo(tmp_path / ".lock")
    with pytest.raises(NotALockFile, match=r"\.lock is not a file, not a lock file"):
        FolderLock(tmp_path, "train").acquire()
    (tmp_path / ".lock").unlink()
    (tmp_path / ".lock").mkdir()
    with pytest.raises(NotALockFile, match=r"\.lock is a folder, not a lock file"):
        FolderLock(tmp_path, "train", shared=True).acquire()


def test_params_changed_while_a_stage_ran_fail_it_naming_the_keys_and_keep_its_outputs(project, capsys):
    from gptcore.report.speedrun import CompareConfig
    from stages.boundary import stage

    params = {"compare": {"target_val_loss": 3.3}, "train": {"max_lr": 0.002}}
    Path("params.yaml").write_text(yaml.safe_dump(params))
    with stage("compare") as s:  # unchanged: the stage ends normally
        assert s.config(CompareConfig).target_val_loss == 3.3
    with pytest.raises(SystemExit) as e:
        with stage("compare", writes=["metrics"]) as s:
            s.config(CompareConfig)
            Path("metrics/summary.json").write_text("{}")
            # another run (a refused `dvc exp run -S ...`) rewrites params.yaml meanwhile; a section not read is no
            # concern of this stage's
            Path("params.yaml").write_text(yaml.safe_dump({"compare": {"target_val_loss": 3.0, "extra": 1},
                                                           "train": {"max_lr": 0.001}}))
    assert e.value.code == 1 and Path("metrics/summary.json").read_text() == "{}"
    assert capsys.readouterr().err.strip().splitlines() == [
        "[compare] params.yaml changed while compare ran (compare.extra: None -> 1, compare.target_val_loss: 3.3 -> "
        "3.0): its outputs, kept, were made with the old values, and failing keeps DVC from recording the new ones; "
        "rerun the stage. One run per project at a time: queue experiments (dvc exp run --queue) or use a second clone"]


@pytest.mark.parametrize("init_from", ["scratch", "gpt2"])
def test_the_launcher_holds_the_locks_and_builds_no_model(project, monkeypatch, init_from):
    """train.nproc 2: this process checks params and data, then starts torchrun holding checkpoints/'s lock; it builds
    no model and reads no weights (for init_from: gpt2 that would be a download of OpenAI's): only the ranks do."""
    import stagekit
    import torch

    import gptcore.lifetime
    import gptcore.model.load
    import stages.train
    from gptcore.model.gpt import GPT

    stagekit.make_project(project, stagekit.write_gpt2_shards(project.parent / "shards"), {"init_from": init_from},
                          nproc=2)
    started = []

    def fake_torchrun(argv, env=None):
        started.append((argv, holder_pid("checkpoints"), holder_pid("data/shards")))
        return 0

    def rank_work(*args, **kwargs):
        raise AssertionError("the launcher did a rank's work")

    monkeypatch.setattr(gptcore.lifetime, "run_child", fake_torchrun)
    for owner, name in ((GPT, "__init__"), (torch, "load"), (gptcore.model.load, "load_hf_gpt2")):
        monkeypatch.setattr(owner, name, rank_work)
    stages.train.main()
    [(argv, writer, reader)] = started
    assert "--nproc_per_node=2" in argv and argv[-2:] == ["-m", "stages.train"]
    assert writer == reader == os.getpid()  # the ranks find the launcher's locks: theirs
    assert not (project / "model").exists() and not list((project / "checkpoints").glob("*.pt"))


def test_the_atomic_writer_never_writes_through_a_symlink(tmp_path, monkeypatch):
    """A link planted at the final name is replaced by the rename; one swapped in for the temp file (a folder others
    can write) is refused: neither target changes."""
    import gptcore.atomic as atomic

    victim = tmp_path / "victim.txt"
    victim.write_text("someone's file\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "eval.json").symlink_to(victim)
    atomic.write_text(tmp_path / "out" / "eval.json", "ours\n")
    assert ((tmp_path / "out" / "eval.json").read_text() == "ours\n"
            and not (tmp_path / "out" / "eval.json").is_symlink())
    made = atomic.temp_beside

    def swapped_for_a_link(path):
        tmp = made(path)
        tmp.unlink()
        tmp.symlink_to(victim)
        return tmp

    monkeypatch.setattr(atomic, "temp_beside", swapped_for_a_link)
    with pytest.raises(OSError):
        atomic.write_text(tmp_path / "out" / "summary.json", "ours\n")
    assert victim.read_text() == "someone's file\n" and not (tmp_path / "out" / "summary.json").exists()


def test_a_failing_rank_other_than_0_leaves_the_line_to_rank_0_and_says_its_own_mistake(project, capsys, monkeypatch):
    """Both ranks meet a bad param; rank 1, a moment sooner, must not exit first (torchrun would SIGTERM rank 0, whose
    one line would then be "interrupted"): it waits for rank 0 to say it. A mistake rank 0 never meets is said by
    rank 1 after that wait, naming the rank."""
    from stages import boundary

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(boundary, "QUIET_RANK_GRACE_S", 0.3)
    (project / "params.yaml").write_text("train: {}\n", encoding="utf-8")
    started = time.monotonic()
    status, lines = run_main("train", capsys)
    assert time.monotonic() - started >= 0.3 and status == 1
    assert lines == ["[train rank 1] params.yaml model=None: missing section (found: train)"]


def test_a_rank_other_than_0_ended_by_torchrun_while_it_waits_says_nothing(project):
    # rank 1 of two, as torchrun starts it; it says when it begins the wait
    code = ("import time; real = time.sleep\n"
            "def sleep(s): print('waiting', s, flush=True); real(s)\n"
            "time.sleep = sleep\nfrom stages import train; train.main()")
    env = {**os.environ, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "PYTHONPATH": str(ROOT)}
    (project / "params.yaml").write_text("train: {}\n", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=project, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    from stages.boundary import QUIET_RANK_GRACE_S

    waiting = f"waiting {QUIET_RANK_GRACE_S}\n"
    while (line := proc.stdout.readline()) and line != waiting:
        pass
    assert line == waiting, proc.stderr.read()
    proc.send_signal(signal.SIGTERM)  # what torchrun sends this rank once rank 0 has failed
    assert proc.wait(timeout=30) == -signal.SIGTERM and proc.stderr.read() == ""
