"""An interrupt or a fault at any step of tokenize leaves a state one rerun resumes to the very bytes of an
uninterrupted run: an interrupt at each step of a shard's publish (later shards already assembled), a real SIGTERM
mid-run, an I/O error while reading the manifest or a staged shard, a worker killed in a staged run; and a
symbolic link at data/shards is refused, never written through or replaced."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_tokenize import make_raw, synthetic_docs, tokenize

from gptcore import atomic, folders
from gptcore.data import shard_writer, verify
from gptcore.data import shards as S
from gptcore.data import tokenize as E
from gptcore.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
# about 25 shards of a 100 KB corpus: one task on one worker closes them all before the first is published
CFG = {"tokenizer": "char", "shard_tokens": 4000, "val_tokens": 6000, "workers": 1}


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every shard and of the vocabulary, by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.suffix == ".npy" or p.name == "vocab.json"}


def files(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file in `folder` but the run lock: (inode, bytes) by name."""
    return {p.name: (p.stat().st_ino, p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()
            and p.name != ".lock"}


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """A corpus and the digests of its uninterrupted run (names in order, from its manifest)."""
    tmp = tmp_path_factory.mktemp("ref")
    raw = make_raw(tmp, synthetic_docs(300, seed=5))
    m = tokenize(raw, tmp / "shards", CFG, progress=False)
    assert len(m["shards"]) >= 20
    return raw, digests(tmp / "shards"), [s["name"] for s in m["shards"]]


def assert_one_rerun_finishes(raw: Path, shard_dir: Path, want: dict[str, str], cfg: dict = CFG) -> None:
    m = tokenize(raw, shard_dir, cfg, progress=False)
    assert m["complete"] and digests(shard_dir) == want
    assert verify.verify(shard_dir) == [] and not list(shard_dir.glob(".*tmp"))


def interrupt_at(monkeypatch, step: str, name: str, assembled_after: str | None) -> list[str]:
    """Raise KeyboardInterrupt at `step` of the publish of shard `name`; returns a list that the hook fills with the
    step once it fires. `assembled_after`: a later shard that must already be assembled (its temp file there)."""
    fired: list[str] = []
    real_publish, real_write_json = shard_writer.publish, shard_writer.write_json

    def check_and_stop(folder: Path) -> None:
        if assembled_after is not None:
            assert list(folder.glob(f".{assembled_after}.*{atomic.TMP_SUFFIX}")), "later shards not yet assembled"
        fired.append(step)
        raise KeyboardInterrupt(step)

    def publish(tmp, path, synced=False):
        mine = Path(path).name == name and not fired
        if mine and step == "before the rename":
            check_and_stop(Path(path).parent)
        real_publish(tmp, path, synced)
        if mine and step == "after the rename":
            check_and_stop(Path(path).parent)

    def write_json(path, data, indent=2):
        listed = [s["name"] for s in data.get("shards", [])] if isinstance(data, dict) else []
        if step == "before the final manifest":
            mine = bool(data.get("complete")) and not fired
        else:
            mine = bool(listed) and listed[-1] == name and not fired and not data.get("complete")
        if mine and step in ("before the manifest write", "before the final manifest"):
            check_and_stop(Path(path).parent)
        real_write_json(path, data, indent)
        if mine and step == "after the manifest write":
            check_and_stop(Path(path).parent)

    monkeypatch.setattr(shard_writer, "publish", publish)
    monkeypatch.setattr(shard_writer, "write_json", write_json)
    return fired


STEPS = ("before the rename", "after the rename", "before the manifest write", "after the manifest write")


# the first shard, a middle one and the last (closed by finish) on one worker; a middle one on two
CASES = [(step, which, 1) for step in STEPS for which in (0, 3, -1)] + [(step, 3, 2) for step in STEPS]


@pytest.mark.parametrize(("step", "which", "workers"), CASES)
def test_an_interrupt_at_each_step_of_a_publish_resumes_byte_identical(tmp_path, monkeypatch, ref, step, which,
                                                                      workers):
    raw, want, names = ref
    name = names[which]
    # one worker assembles every shard of the one task before the first is published; two do it as they go
    later = names[which + 1] if workers == 1 and which != -1 else None
    fired = interrupt_at(monkeypatch, step, name, later)
    cfg = {**CFG, "workers": workers}
    with pytest.raises(KeyboardInterrupt):
        tokenize(raw, tmp_path / "shards", cfg, progress=False)
    assert fired == [step]
    monkeypatch.undo()
    listed = [s["name"] for s in S.read_manifest(tmp_path / "shards")["shards"]]
    assert listed == names[:len(listed)]  # the manifest lists a prefix of the run: no gap
    assert_one_rerun_finishes(raw, tmp_path / "shards", want, cfg)


def test_an_interrupt_that_also_stops_the_clean_up_resumes(tmp_path, monkeypatch, ref):
    """A second SIGTERM while the first unwinds: the abort never runs, temp files and pieces stay behind."""
    raw, want, names = ref
    interrupt_at(monkeypatch, "after the rename", names[2], names[3])

    def no_abort(self):
        raise KeyboardInterrupt("second SIGTERM")

    monkeypatch.setattr(shard_writer.ShardWriter, "abort", no_abort)
    with pytest.raises(KeyboardInterrupt):
        tokenize(raw, tmp_path / "shards", CFG, progress=False)
    monkeypatch.undo()
    assert list((tmp_path / "shards").glob(".*tmp"))  # what the clean-up would have removed
    assert_one_rerun_finishes(raw, tmp_path / "shards", want)


def test_an_interrupt_before_the_final_manifest_resumes(tmp_path, monkeypatch, ref):
    raw, want, names = ref
    interrupt_at(monkeypatch, "before the final manifest", names[-1], None)
    with pytest.raises(KeyboardInterrupt):
        tokenize(raw, tmp_path / "shards", CFG, progress=False)
    monkeypatch.undo()
    m = S.read_manifest(tmp_path / "shards")
    assert not m["complete"] and [s["name"] for s in m["shards"]] == names
    assert_one_rerun_finishes(raw, tmp_path / "shards", want)


def test_a_manifest_with_a_gap_left_by_an_older_gptcore_resumes(tmp_path, ref):
    """The state the old abort path left: shard k neither listed nor on disk, the later ones listed after it."""
    raw, want, names = ref
    tokenize(raw, tmp_path / "shards", CFG, progress=False)
    m = S.read_manifest(tmp_path / "shards")
    gap = 4
    (tmp_path / "shards" / names[gap]).unlink()
    atomic.write_json(tmp_path / "shards" / S.MANIFEST, dict(m, complete=False, shards=m["shards"][:gap] +
                                                         m["shards"][gap + 1:]), indent=1)
    kept = {n: (tmp_path / "shards" / n).stat().st_ino for n in names if n != names[gap]}
    assert_one_rerun_finishes(raw, tmp_path / "shards", want)
    assert {n: (tmp_path / "shards" / n).stat().st_ino for n in kept} == kept  # recognised, not rewritten


@pytest.mark.parametrize("at", ["before the swap", "after the swap"])
def test_an_interrupt_while_a_staged_run_replaces_the_old_one_resumes(tmp_path, monkeypatch, ref, at):
    raw, want, _ = ref
    tokenize(raw, tmp_path / "shards", {**CFG, "shard_tokens": 9000}, progress=False)
    real_swap, real_fsync = atomic.swap_dir, atomic.fsync_dir

    def swap(staged, final):
        if at == "before the swap":
            raise KeyboardInterrupt(at)
        real_swap(staged, final)

    def fsync_dir(path):  # swap_dir's fsync of the parent comes after its rename(s), before the old folder goes
        if Path(path) == tmp_path:
            raise KeyboardInterrupt(at)
        real_fsync(path)

    monkeypatch.setattr(E, "swap_dir", swap)
    monkeypatch.setattr(atomic, "fsync_dir", fsync_dir)
    with pytest.raises(KeyboardInterrupt):
        tokenize(raw, tmp_path / "shards", CFG, progress=False)
    monkeypatch.undo()
    assert_one_rerun_finishes(raw, tmp_path / "shards", want)
    assert not E.staged_dir(tmp_path / "shards").exists()


SLOW_RENAMES = """
import sys, time
sys.path.insert(0, {root!r})
from gptcore.data import shard_writer
from gptcore.data.tokenize import TokenizeConfig, tokenize
from stages.boundary import stage
real = shard_writer.publish
def slow(tmp, path, synced=False):  # a slow file system: the signal mostly comes while a shard is being renamed
    real(tmp, path, synced)
    time.sleep(0.03)
shard_writer.publish = slow
with stage("tokenize"):
    tokenize({raw!r}, {out!r}, TokenizeConfig.read({cfg!r}), progress=False)
"""


@pytest.mark.slow
def test_a_real_sigterm_at_several_moments_then_one_rerun_is_byte_identical(tmp_path):
    """The stage's own signal path (stage_lifetime: SIGTERM raises KeyboardInterrupt) at moments the test does not
    choose, most of them inside some shard's publish with later shards assembled; each interrupted run after the
    first is itself a resumed one."""
    raw = make_raw(tmp_path, synthetic_docs(6000, seed=9, max_words=200))
    cfg = {"tokenizer": "gpt2", "encoder": "tiktoken", "shard_tokens": 15_000, "val_tokens": 45_000, "workers": 2}
    tokenize(raw, tmp_path / "ref", cfg, progress=False)
    want = digests(tmp_path / "ref")
    assert len(want) > 50
    code = SLOW_RENAMES.format(root=str(ROOT), raw=str(raw), out=str(tmp_path / "shards"),
                              cfg=cfg)
    manifest = tmp_path / "shards" / "manifest.json"
    for more in (2, 5, 9, 14):  # shards more than the run resumed from when the signal comes
        start = len(json.loads(manifest.read_text())["shards"]) if manifest.exists() else 0
        proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            try:
                if len(json.loads(manifest.read_text())["shards"]) >= start + more:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
        assert proc.returncode == 143 and "interrupted (SIGTERM)" in err, (proc.returncode, err)
    assert not json.loads(manifest.read_text())["complete"]
    assert_one_rerun_finishes(raw, tmp_path / "shards", want, cfg)


# ---------------------------------------------------------------------------------------------
# faults are not corruption: an I/O error leaves every file in place and the rerun resumes

def eio(path):
    return OSError(errno.EIO, os.strerror(errno.EIO), str(path))


def stopped_run(raw: Path, shard_dir: Path, monkeypatch, cfg: dict = CFG, after: int = 5) -> None:
    """An unfinished run in shard_dir: stopped after `after` shards were published."""
    real, n = shard_writer.ShardWriter._publish, []

    def publish_then_stop(self, *a):
        real(self, *a)
        n.append(1)
        if len(n) == after:
            raise KeyboardInterrupt

    monkeypatch.setattr(shard_writer.ShardWriter, "_publish", publish_then_stop)
    with pytest.raises(KeyboardInterrupt):
        tokenize(raw, shard_dir, cfg, progress=False)
    monkeypatch.undo()


@pytest.mark.parametrize("staged", [False, True])
def test_an_io_error_reading_the_manifest_touches_nothing(tmp_path, monkeypatch, ref, staged):
    raw, want, _ = ref
    if staged:  # a finished run of other params, and this run's unfinished one beside it
        tokenize(raw, tmp_path / "shards", {**CFG, "shard_tokens": 9000}, progress=False)
    stopped_run(raw, tmp_path / "shards", monkeypatch)
    where = E.staged_dir(tmp_path / "shards") if staged else tmp_path / "shards"
    before = {d: files(d) for d in (tmp_path / "shards", where)}
    real = Path.read_text

    def read_text(self, *a, **k):
        if self == where / S.MANIFEST:
            raise eio(self)
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    with pytest.raises(OSError) as e:
        tokenize(raw, tmp_path / "shards", CFG, progress=False)
    assert e.value.errno == errno.EIO
    monkeypatch.undo()
    assert {d: files(d) for d in before} == before
    assert_one_rerun_finishes(raw, tmp_path / "shards", want)


@pytest.mark.parametrize("staged", [False, True])
def test_an_io_error_reading_a_finished_shard_touches_nothing(tmp_path, monkeypatch, ref, staged):
    """The final reread of the shards meets EIO on one of them: not "delete the damaged file", and no staged run
    thrown away (the old code set aside every staged shard for it)."""
    raw, want, names = ref
    if staged:
        tokenize(raw, tmp_path / "shards", {**CFG, "shard_tokens": 9000}, progress=False)
    stopped_run(raw, tmp_path / "shards", monkeypatch)
    where = E.staged_dir(tmp_path / "shards") if staged else tmp_path / "shards"
    bad = where / names[1]  # finished by the stopped run, so the rerun rereads it in its final check
    before = {d: files(d) for d in (tmp_path / "shards", where)}
    real_open = open

    def failing_open(path, *a, **k):
        if Path(path) == bad:
            raise eio(path)
        return real_open(path, *a, **k)

    monkeypatch.setattr(S, "open", failing_open, raising=False)  # the shard reader's open, nothing else
    with pytest.raises(OSError) as e:
        tokenize(raw, tmp_path / "shards", CFG, progress=False)
    assert e.value.errno == errno.EIO and e.value.filename == str(bad)
    monkeypatch.undo()
    after = files(where)
    assert {n: after.get(n) for n in before[where] if n != S.MANIFEST} == {
        n: v for n, v in before[where].items() if n != S.MANIFEST}  # every file kept, untouched
    listed = S.read_manifest(where)["shards"]
    assert listed[:5] == json.loads(before[where][S.MANIFEST][1])["shards"] and len(listed) == len(names)
    assert_one_rerun_finishes(raw, tmp_path / "shards", want)


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace for a real I/O error")
@pytest.mark.parametrize("target", ["manifest", "staged shard"])
def test_a_real_eio_stops_the_stage_with_every_file_in_place(tmp_path, monkeypatch, ref, target):
    """A real EIO (strace injects it into every read of one file) in the stage: the manifest of an unfinished run,
    or a finished shard of a staged run when the final check rereads it (the old code called that shard damaged
    and deleted the whole staged run)."""
    raw, want, names = ref
    if target == "staged shard":
        tokenize(raw, tmp_path / "shards", {**CFG, "shard_tokens": 9000}, progress=False)
    stopped_run(raw, tmp_path / "shards", monkeypatch)
    where = E.staged_dir(tmp_path / "shards") if target == "staged shard" else tmp_path / "shards"
    bad = where / (S.MANIFEST if target == "manifest" else names[1])
    before = files(where)
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from stages.boundary import stage; "
            f"from gptcore.data.tokenize import TokenizeConfig, tokenize\nwith stage('tokenize'): "
            f"tokenize({str(raw)!r}, {str(tmp_path / 'shards')!r}, TokenizeConfig.read({CFG!r}), progress=False)")
    r = subprocess.run(["strace", "-f", "-o", "/dev/null", "-e", "inject=read:error=EIO", "-P", str(bad),
                        sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if "ptrace" in r.stderr and "Input/output error" not in r.stderr:
        pytest.skip(f"strace cannot trace here: {r.stderr.strip()[:200]}")
    # one line or a traceback (EIO is no mistake of the user's), naming the file either way
    assert r.returncode == 1 and "Input/output error" in r.stderr and str(bad) in r.stderr, r.stderr[-2000:]
    after = files(where)
    assert {n: after.get(n) for n in before if n != S.MANIFEST} == {n: v for n, v in before.items()
                                                                     if n != S.MANIFEST}
    if target == "manifest":
        assert after == before
    assert_one_rerun_finishes(raw, tmp_path / "shards", want)


def _dies(task, *a, **k):
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would kill a worker


def test_a_worker_killed_in_a_staged_run_keeps_the_staged_work(tmp_path, monkeypatch, ref):
    """The pool's BrokenProcessPool is one line, and the staged run stays for the rerun (the old code's `except
    ValueError` caught that UserError and deleted the staged folder)."""
    raw, want, _ = ref
    tokenize(raw, tmp_path / "shards", {**CFG, "shard_tokens": 9000}, progress=False)
    stopped_run(raw, tmp_path / "shards", monkeypatch)
    staged = E.staged_dir(tmp_path / "shards")
    kept = {s["name"]: (staged / s["name"]).stat().st_ino for s in S.read_manifest(staged)["shards"]}
    assert len(kept) >= 5
    monkeypatch.setattr(E, "_encode_task", _dies)  # forked after this: the workers run it
    with pytest.raises(UserError, match="a tokenize worker process died"):
        tokenize(raw, tmp_path / "shards", {**CFG, "workers": 2}, progress=False)
    monkeypatch.undo()
    assert {n: (staged / n).stat().st_ino for n in kept} == kept
    assert_one_rerun_finishes(raw, tmp_path / "shards", want)
    assert {n: (tmp_path / "shards" / n).stat().st_ino for n in kept} == kept


def test_a_corrupt_staged_manifest_is_set_aside_and_the_run_rewritten(tmp_path, monkeypatch, ref):
    raw, want, _ = ref
    tokenize(raw, tmp_path / "shards", {**CFG, "shard_tokens": 9000}, progress=False)
    stopped_run(raw, tmp_path / "shards", monkeypatch)
    staged = E.staged_dir(tmp_path / "shards")
    (staged / S.MANIFEST).write_text((staged / S.MANIFEST).read_text()[:100])  # cut by a crash of the disk
    with pytest.raises(S.CorruptManifest, match="not valid JSON"):
        S.read_manifest(staged)
    assert_one_rerun_finishes(raw, tmp_path / "shards", want)


# ---------------------------------------------------------------------------------------------
# a symbolic link at data/shards: refused whenever tokenize would write, read when it would not

def test_a_linked_shard_folder_is_refused_for_other_params_and_left_as_it_is(tmp_path, monkeypatch, ref):
    raw, want, _ = ref
    shared = tmp_path / "shared" / "shards"
    tokenize(raw, shared, CFG, progress=False)
    (tmp_path / "data").mkdir()
    link = tmp_path / "data" / "shards"
    link.symlink_to(shared)
    before = files(shared)
    assert tokenize(raw, link, CFG, progress=False)["complete"]  # the same params: nothing to write, allowed
    for cfg in ({**CFG, "shard_tokens": 9000}, {**CFG, "val_tokens": 5000}):
        with pytest.raises(folders.LinkedFolder, match=f"{link} is a symbolic link .*rm {link}"):
            tokenize(raw, link, cfg, progress=False)
        assert link.is_symlink() and files(shared) == before
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["shards"]
    # an unfinished run behind the link is not cleared through it either
    stopped_run(raw, tmp_path / "shared" / "other", monkeypatch, {**CFG, "shard_tokens": 9000})
    link.unlink()
    link.symlink_to(tmp_path / "shared" / "other")
    before = files(tmp_path / "shared" / "other")
    with pytest.raises(folders.LinkedFolder):
        tokenize(raw, link, CFG, progress=False)
    assert files(tmp_path / "shared" / "other") == before


def test_swap_dir_and_staged_dir_refuse_links(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "model.pt").write_text("shared")
    final = tmp_path / "model"
    final.symlink_to(target)
    with pytest.raises(folders.LinkedFolder, match=f"{final} is a symbolic link"):
        folders.staged_dir(final)  # refused before anything is built
    staged = folders.next_path(final)
    staged.mkdir()
    (staged / "model.pt").write_text("new")
    with pytest.raises(folders.LinkedFolder, match=f"{final} is a symbolic link"):
        atomic.swap_dir(staged, final)
    assert final.is_symlink() and (target / "model.pt").read_text() == "shared" and staged.is_dir()
    # the link an older swap_dir moved to the staged name is named, not deleted nor followed
    (staged / "model.pt").unlink()
    staged.rmdir()
    final.unlink()
    staged.symlink_to(target)
    with pytest.raises(folders.LinkedFolder, match=f"{staged} is a symbolic link .*rm {staged}"):
        folders.staged_dir(final)
    assert staged.is_symlink() and (target / "model.pt").read_text() == "shared"
