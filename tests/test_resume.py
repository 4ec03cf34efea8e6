"""Checkpoints and stop signals through the train stage (`python -m stages.train` in a temp project), in both parallel
modes. A damaged, mixed or other-run checkpoint is named, set aside (nothing deleted), and the run resumes from the one
before, ending bit-identical to an uninterrupted run; a finished run's re-export checks the same; a checkpoint of the
gptcore before this format, or of a future one, is one line with every file kept. SIGINT, SIGTERM and the warning
signal (SIGUSR1) finish the step in flight, save it and exit 128 + n, with a line saying what was kept; a rerun (a
requeue) ends bit-identical to an uninterrupted run. A second signal during that save ends at once, the checkpoint
before it whole. A full disk during a two-rank save is one line. The library-level cases: tests/test_checkpoint.py."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from stagekit import env, make_project, run_stage, stage_cmd, tsv, write_gpt2_shards

from gptcore.digests import json_sha256
from gptcore.train import checkpoints

pytestmark = pytest.mark.slow  # training runs through the stage, in subprocesses
RUN = dict(max_steps=12, ckpt_every=3, keep_checkpoints=10, eval_every=6)
MODES = ("ddp", "fsdp")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_gpt2_shards(tmp_path_factory.mktemp("shards"))


@pytest.fixture(scope="module")
def straight(shards, tmp_path_factory):
    """Uninterrupted runs of RUN on one process, ddp and fsdp, and a run of other params (another seed)."""
    root = tmp_path_factory.mktemp("straight")
    runs = {m: make_project(root / m, shards, parallel=m, **RUN) for m in MODES}
    runs["other"] = make_project(root / "other", shards, seed=7, **RUN)
    for project in runs.values():
        run_stage(project, "train")
    return runs


def model_tree(project: Path) -> dict[str, bytes]:
    folder = project / "model"
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and p.name != ".lock"}


def copied(source: Path, target: Path, shards: Path, up_to: int) -> Path:
    """A project of `source`'s params holding its checkpoints up to step `up_to` (what a kill after it leaves)."""
    params = yaml.safe_load((source / "params.yaml").read_text(encoding="utf-8"))
    project = make_project(target, shards, model=params["model"], **params["train"])
    shutil.copytree(source / "checkpoints", project / "checkpoints",
                    ignore=lambda folder, names: [n for n in names if re.fullmatch(r"ckpt_\d{7}", n) and
                                                  int(n[5:]) > up_to])
    return project


def flip(path: Path, n: int = 64) -> None:
    """n bytes in the middle of `path` inverted in place, as bit rot or a bad copy leaves them: size unchanged."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + n] = bytes(b ^ 0xFF for b in data[mid:mid + n])
    path.write_bytes(bytes(data))


DAMAGE = {  # what is done to step 9's checkpoint, and how its line names it
    "bytes flipped in a shard": (lambda c, other: flip(c / "__0_0.distcp"), "__0_0.distcp is not the file"),
    "step 6's shard mixed in": (lambda c, other: shutil.copy(c.parent / "ckpt_0000006" / "__0_0.distcp", c),
                                "__0_0.distcp is not the file"),
    "step 6's record mixed in": (lambda c, other: shutil.copy(c.parent / "ckpt_0000006" / "record.pt", c),
                                 "record.pt is "),
    "another run's record": (lambda c, other: shutil.copy(other / "checkpoints" / "ckpt_0000009" / "record.pt", c),
                             "record.pt is "),
}


@pytest.mark.parametrize("case", DAMAGE)
@pytest.mark.parametrize("mode", MODES)
def test_a_damaged_or_mixed_checkpoint_is_set_aside_and_the_run_resumes_bit_identically(tmp_path, shards, straight,
                                                                                      mode, case):
    """Each of these once resumed or exported without a word (issue 42): now the check names the checkpoint and the
    file, sets it aside, and nothing trains from it: the run ends on the uninterrupted run's model/, byte for byte."""
    project = copied(straight[mode], tmp_path / "p", shards, up_to=9)
    damage, named = DAMAGE[case]
    newest = project / "checkpoints" / "ckpt_0000009"
    damage(newest, straight["other"])
    damaged = tree(newest)
    out = run_stage(project, "train").stdout
    said = next(line for line in out.splitlines() if "set aside as" in line)
    assert said.startswith(f"[train] checkpoints/ckpt_0000009: {named}") and said.endswith(
        "; set aside as checkpoints/ckpt_0000009.corrupt; resuming from checkpoints/ckpt_0000006 (step 6)"), said
    assert tree(project / "checkpoints" / "ckpt_0000009.corrupt") == damaged  # kept, nothing deleted
    assert model_tree(project) == model_tree(straight[mode])
    assert tsv(project, "train_loss") == tsv(straight[mode], "train_loss")[6:]  # steps 6-11, trained again


def test_a_finished_run_s_re_export_checks_its_checkpoint_too(tmp_path, shards, straight):
    """A rerun of a finished run only exports again, from its last checkpoint: damaged, it is set aside and the
    steps after the one before are trained again, to the same model/."""
    project = copied(straight["ddp"], tmp_path / "p", shards, up_to=12)
    shutil.copytree(straight["ddp"] / "metrics", project / "metrics")
    flip(project / "checkpoints" / "ckpt_0000012" / "__0_0.distcp")
    out = run_stage(project, "train").stdout
    assert "checkpoints/ckpt_0000012: __0_0.distcp is not the file it was saved with" in out
    assert "resuming from checkpoints/ckpt_0000009 (step 9)" in out
    assert model_tree(project) == model_tree(straight["ddp"])


def reseal(folder: Path, **changes) -> None:
    seal = json.loads((folder / "digests.json").read_text())
    seal.pop("sha256")
    seal.update(changes)
    (folder / "digests.json").write_text(json.dumps({**seal, "sha256": json_sha256(seal)}))


def old_file(project: Path) -> str:
    (project / "checkpoints" / "ckpt_0000015.pt").write_bytes(b"PK\x03\x04 an older gptcore's checkpoint")
    return ("[train] checkpoints/ckpt_0000015.pt: a checkpoint of an older gptcore, without the digests this one "
            "checks before resuming, so it is not read; every file is kept: finish that run with the gptcore that "
            "wrote it, or move the old ckpt_*.pt / ckpt_*.dcp out of checkpoints to start this run fresh")


def old_folder(project: Path) -> str:
    (project / "checkpoints" / "ckpt_0000015.dcp").mkdir()
    (project / "checkpoints" / "ckpt_0000015.dcp" / "record.pt").write_bytes(b"PK\x03\x04")
    return "[train] checkpoints/ckpt_0000015.dcp: a checkpoint of an older gptcore, without the digests"


def future(project: Path) -> str:
    reseal(project / "checkpoints" / "ckpt_0000009", format=checkpoints.FORMAT + 1)
    return (f"[train] checkpoints/ckpt_0000009: checkpoint format {checkpoints.FORMAT + 1}, but this gptcore reads "
            f"format {checkpoints.FORMAT}; the folder is kept: use the gptcore that wrote it, or move it away to go "
            f"on without it")


@pytest.mark.parametrize("mode,case", [("ddp", old_file), ("fsdp", old_folder), ("ddp", future), ("fsdp", future)])
def test_an_old_or_future_checkpoint_stops_the_stage_in_one_line_with_every_file_kept(tmp_path, shards, straight,
                                                                                     mode, case):
    project = copied(straight[mode], tmp_path / "p", shards, up_to=9)
    line = case(project)
    before = tree(project / "checkpoints")
    proc = subprocess.run(stage_cmd("train"), cwd=project, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.strip().startswith(line), proc.stderr
    assert tree(project / "checkpoints") == before


# -- stop signals ------------------------------------------------------------------------------------------------
LONG = dict(max_steps=40, eval_every=20, ckpt_every=1000, keep_checkpoints=10)  # no periodic checkpoint but the last


def start(project: Path, **inject: str) -> subprocess.Popen:
    """The train stage as a terminal's foreground job of its own (its process group is the job)."""
    return subprocess.Popen(stage_cmd("train"), cwd=project, env=env(**inject), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal's job


def after_step(project: Path, proc: subprocess.Popen, step: int) -> None:
    """Wait until the stage has logged step `step`."""
    rows = project / "metrics/train/plots/metrics/train_loss.tsv"
    deadline = time.monotonic() + 300
    while not (rows.exists() and len(rows.read_text().splitlines()) > step + 1):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def saved(err: str, name: str) -> int:
    """The step the stage's last line says the signal's save kept."""
    said = re.fullmatch(rf"\[train\] interrupted \({name}\); saved step (\d+): a rerun resumes there",
                        err.strip().splitlines()[-1])
    assert said, err[-3000:]
    return int(said.group(1))


@pytest.fixture(scope="module")
def long_runs(shards, tmp_path_factory):
    """Uninterrupted runs of LONG: one process (ddp), and two ranks under ddp and under fsdp."""
    root = tmp_path_factory.mktemp("long")
    runs = {("ddp", 1): make_project(root / "ddp1", shards, **LONG)}
    runs.update({(m, 2): make_project(root / f"{m}2", shards, parallel=m, nproc=2, **LONG) for m in MODES})
    for project in runs.values():
        run_stage(project, "train")
    return runs


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_an_interrupt_before_the_first_periodic_checkpoint_saves_the_step_and_the_rerun_is_bit_identical(
        tmp_path, shards, long_runs, name):
    """Ctrl-C (SIGINT to the job) or SIGTERM at step 5 of 40, checkpoints every 1000: the step in flight finishes and
    is saved (once nothing was: 20 minutes of modern_quickstart lost, issue 42), and the rerun resumes there."""
    project = make_project(tmp_path / "p", shards, **LONG)
    proc = start(project)
    after_step(project, proc, 5)
    os.killpg(proc.pid, getattr(signal, name))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + getattr(signal, name), err[-2000:]
    step = saved(err, name)
    assert "Traceback" not in err and 5 < step < 40
    assert [p.name for p in checkpoints.list_checkpoints(project / "checkpoints")] == [f"ckpt_{step:07d}"]
    assert f"resuming from checkpoints/ckpt_{step:07d} (step {step})" in run_stage(project, "train").stdout
    assert model_tree(project) == model_tree(long_runs[("ddp", 1)])
    assert tsv(project, "train_loss") == tsv(long_runs[("ddp", 1)], "train_loss")


@pytest.mark.parametrize("mode", MODES)
def test_the_warning_signal_on_two_ranks_saves_and_a_requeue_resumes_bit_identically(tmp_path, shards, long_runs,
                                                                                    mode):
    """SLURM's --signal=USR1@90 as the stage gets it: both ranks finish the same step, save it together, and the stage
    exits 138 (what a batch script takes as "requeue me"); the requeued run resumes and ends on the uninterrupted
    run's model/, byte for byte."""
    project = make_project(tmp_path / "p", shards, parallel=mode, nproc=2, **LONG)
    proc = start(project)
    after_step(project, proc, 5)
    os.kill(proc.pid, signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 138, err[-2000:]
    step = saved(err, "SIGUSR1")
    assert [ln for ln in err.splitlines() if ln.startswith("[train")] == [err.strip().splitlines()[-1]]
    newest = project / "checkpoints" / f"ckpt_{step:07d}"
    assert {p.name for p in newest.iterdir()} >= {"__0_0.distcp", "__1_0.distcp"}  # both ranks saved it
    assert checkpoints.read(newest)["world_size"] == 2
    out = run_stage(project, "train").stdout
    assert f"resuming from checkpoints/ckpt_{step:07d} (step {step})" in out
    assert model_tree(project) == model_tree(long_runs[(mode, 2)])


def test_the_same_signal_to_every_process_at_once_saves_once(tmp_path, shards, long_runs):
    """As SLURM signals every process of a job step while the stage passes the signal on to its ranks too: each rank
    gets it twice at once, which counts once (a second signal, a second or more later, would end it at once)."""
    import psutil

    project = make_project(tmp_path / "p", shards, nproc=2, **LONG)
    proc = start(project)
    after_step(project, proc, 5)
    for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
        p.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    step = saved(err, "SIGTERM")
    assert f"resuming from checkpoints/ckpt_{step:07d}" in run_stage(project, "train").stdout
    assert model_tree(project) == model_tree(long_runs[("ddp", 2)])


def test_a_second_signal_during_the_save_ends_at_once_and_the_checkpoint_before_stays_whole(tmp_path, shards,
                                                                                           long_runs):
    """Every save here waits 60 s before its rename (tests/inject): SIGTERM at step 5, then SIGTERM again while that
    save waits. The run ends at once, saying what a rerun starts from, and the half-made save is dropped."""
    project = make_project(tmp_path / "p", shards, **LONG)
    proc = start(project, GPTCORE_TEST_SLOW_SAVE="60")
    after_step(project, proc, 5)
    first = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    while not list((project / "checkpoints").glob(".ckpt_*.tmp/digests.json")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    time.sleep(max(0.0, first + 1.5 - time.monotonic()))  # the same signal within a second counts once
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)  # not the 60 s the save waits
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1] == ("[train] interrupted (SIGTERM); asked twice: stopped at once; nothing "
                                            "was saved: a rerun starts from step 0")
    assert [p.name for p in (project / "checkpoints").iterdir() if p.name != ".lock"] == []
    run_stage(project, "train")
    assert model_tree(project) == model_tree(long_runs[("ddp", 1)])


def test_a_full_disk_during_a_two_rank_save_is_one_line_and_the_checkpoint_before_stays_whole(tmp_path, shards):
    """checkpoints/ on a file system with room for one checkpoint (a tmpfs; root only): the second save fills it.
    Once 28 tracebacks from the ranks; now the one "no space" line, and step 3's checkpoint is whole."""
    project = make_project(tmp_path / "p", shards, parallel="fsdp", nproc=2, **RUN)
    ckpts = project / "checkpoints"
    ckpts.mkdir()
    size = 1.5 * 21e6  # a checkpoint of this model is about 20 MB: one fits, not two
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size)}", "tmpfs", str(ckpts)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        proc = subprocess.run(stage_cmd("train"), cwd=project, env=env(), capture_output=True, text=True,
                              timeout=600)
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[train")]
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert len(lines) == 1 and re.fullmatch(
            rf"\[train( rank 1)?\] checkpoints/ckpt_0000006: no space left on {re.escape(str(ckpts))}( \(.*\))?: "
            rf"free some space there \(or point the folder at a larger disk\) and run again", lines[0]), lines
        assert [p.name for p in ckpts.iterdir() if p.name != ".lock"] == ["ckpt_0000003"]  # no temp folder left
        assert checkpoints.read(ckpts / "ckpt_0000003")["step"] == 3
    finally:
        subprocess.run(["umount", str(ckpts)], check=True)
