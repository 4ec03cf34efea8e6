"""The one stage boundary (stages/boundary.py): the locks each stage declares, never opened through a symlink; the
params it read still being params.yaml's when it ends; and a launcher that does no rank's work."""
from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
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
    from gptcore.report.config import CompareConfig
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

    import gptcore.model.load
    import stages.boundary
    import stages.train
    from gptcore.launch import RanksEnded
    from gptcore.model.gpt import GPT

    stagekit.make_project(project, stagekit.write_gpt2_shards(project.parent / "shards"), {"init_from": init_from},
                          nproc=2)
    started = []

    def fake_torchrun(module, nproc, bounds):
        started.append((module, nproc, holder_pid("checkpoints"), holder_pid("data/shards"), bounds.stop_timeout))
        return RanksEnded(0)

    def rank_work(*args, **kwargs):
        raise AssertionError("the launcher did a rank's work")

    monkeypatch.setattr(stages.train, "run_ranks", fake_torchrun)
    for owner, name in ((GPT, "__init__"), (torch, "load"), (gptcore.model.load, "load_hf_gpt2")):
        monkeypatch.setattr(owner, name, rank_work)
    stages.train.main()
    [(module, nproc, writer, reader, stop)] = started
    assert (module, nproc, stop) == ("stages.train", 2, 10.0)  # the ranks watched within train's bounds
    assert writer == reader == os.getpid()  # the launcher holds the locks for its ranks
    assert not (project / "model").exists() and not list((project / "checkpoints").glob("ckpt_*"))


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


def ended(ends: dict, lines: dict, tmp_path, beats: dict | None = None, killed=frozenset()) -> tuple:
    """launch._ended over how ranks ended {rank: (status, when)} (status: exit status, or minus the signal), the lines
    they left and their last beats {rank: how they said they ended, None: not at all} (all in step 7's training)."""
    import json

    from gptcore.launch import End, _ended

    tmp_path.mkdir()
    for rank, line in lines.items():
        (tmp_path / f"rank{rank}").write_text(line)
    for rank, how in (beats or {}).items():
        record = {"step": 7, "doing": "training", **({} if how is None else {"ended": how})}
        (tmp_path / f"beat{rank}").write_text(json.dumps(record))
    out = _ended({r: End(at, status, 100 + r) for r, (status, at) in ends.items()}, tmp_path, set(killed))
    return out.status, out.rank, out.line


def test_the_launcher_says_the_cause_of_a_failed_run_once(tmp_path):
    """The cause is the first rank to end that the watch did not kill and that did not finish or lose a peer: a rank
    killed by a signal (the OOM killer), a user's mistake it left (rank 0's when it has one too), a bug (its traceback
    is above), a rank that ended with status 0 before the run was done."""
    oom = ended({0: (-9, 5), 1: (1, 6)}, {}, tmp_path / "a", {1: "lost a peer"})  # rank 1's collective lost its peer
    assert oom[:2] == (137, 0) and oom[2].startswith("rank 0 (pid 100) was killed by SIGKILL (out of memory")
    assert ended({1: (1, 5), 0: (-15, 6)}, {1: "params.yaml x=1: no"}, tmp_path / "b") == (1, 1, "params.yaml x=1: no")
    assert ended({0: (1, 5), 1: (1, 5)}, {0: "mine", 1: "theirs"}, tmp_path / "c") == (1, 0, "mine")
    # a SIGTERM from outside to rank 1, then the agent's to rank 0: the first end is the cause
    status, _, line = ended({1: (-15, 5.1), 0: (-15, 5.2)}, {}, tmp_path / "d", {0: None, 1: None})
    assert status == 143 and line.startswith("rank 1 (pid 101) was killed by SIGTERM in step 7 (training);")
    status, rank, line = ended({1: (1, 5), 0: (-15, 6)}, {}, tmp_path / "e", {1: "traceback"})
    assert (status, rank) == (1, 0)
    assert line.startswith("rank 1 (pid 101) failed in step 7 (training): its traceback is above; the other ranks")
    # rank 0 left by sys.exit(0); rank 1's collective then lost its peer
    status, _, line = ended({0: (0, 5), 1: (1, 6)}, {}, tmp_path / "f", {0: 0, 1: "lost a peer"})
    assert status == 1 and line.startswith("rank 0 (pid 100) ended with exit status 0 in step 7 (training), before "
                                           "the run was done")
    # rank 1 exited 0 at start-up; the watch killed rank 0, which waited for it: no cause
    status, _, line = ended({1: (0, 5), 0: (-9, 6)}, {}, tmp_path / "g", killed={100})
    assert status == 1 and line.startswith("rank 1 (pid 101) ended with exit status 0 at start-up")
    assert ended({0: (0, 5), 1: (0, 6)}, {}, tmp_path / "h", {0: "finished", 1: "finished"}) == (0, 0, None)


def test_a_collective_that_timed_out_is_one_line_naming_its_bound():
    """What a rank under a torchrun you start yourself says when a collective waits longer than the bound (the stage
    watching its own ranks speaks first): gloo's words, named with the param that set the bound."""
    from gptcore import distributed
    from gptcore.errors import ending

    gloo = RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to "
                        "complete")
    distributed.setup("cpu", timeouts=distributed.Timeouts(900.0, 5.0, "train.init_timeout", "train.dist_timeout"))
    try:
        status, line = ending(gloo, in_rank=True)
        assert status == 1 and line.startswith("a wait for the other ranks timed out (RuntimeError: [../gloo/")
        assert "took longer than train.init_timeout=900 s;" in line  # no step done yet: the start-up's bound
        distributed.progress(3, "training")
        distributed.progress(4, "training")  # a step done: the steady bound
        assert "took longer than train.dist_timeout=5 s;" in ending(gloo, in_rank=True)[1]
        assert ending(gloo) is None  # outside a rank: a bug's traceback
    finally:
        distributed.setup("cpu")  # no bounds for the tests after


@pytest.mark.slow
def test_a_mistake_every_rank_meets_is_said_once_by_the_stage(project):
    """nproc 2 through the launcher: a mistake the launcher's own checks cannot see (a model file they find, which
    every rank fails to read) is said once, by the stage, labelled with the rank that said it when that is not 0."""
    import stagekit

    stagekit.make_project(project, stagekit.write_gpt2_shards(project.parent / "shards"), nproc=2, max_steps=2)
    (project / "bad.pt").write_bytes(b"not a checkpoint")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["model"]["init_from"] = "bad.pt"
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    run = subprocess.run([sys.executable, "-m", "stages.train"], cwd=project, env=stagekit.env(), capture_output=True,
                         text=True, timeout=300)
    lines = [x for x in run.stderr.splitlines() if x.startswith("[train")]
    assert run.returncode == 1 and len(lines) == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert re.fullmatch(r"\[train( rank 1)?\] model.init_from='bad.pt': bad.pt: cannot read checkpoint: .*", lines[0])
