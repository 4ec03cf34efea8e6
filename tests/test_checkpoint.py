"""Training checkpoints (gptcore/train/checkpoints.py) and the run folder's lifecycle (run_folder.py), at the level
of the library: the format, its checks against every kind of damaged, mixed, truncated, foreign, future-format and
other-run file, faults that are no damage, the checkpoints of the gptcore before this format, and what a fresh run,
a resumed one and an earlier one brought back do with the folder. The same cases through the train stage, in both
parallel modes, and the stop signals: tests/test_resume.py."""
import datetime
import errno
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gptcore.digests import json_sha256
from gptcore.errors import UserError
from gptcore.model.checkpoint_file import CheckpointRefused, CorruptCheckpoint
from gptcore.model.config import ModelConfig
from gptcore.model.export import export_model
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.model.load import init_model, load_model
from gptcore.train import checkpoints, run_folder

TINY = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64)
PARAMS = {"model": {"init_from": "scratch"}, "train": {"max_lr": 6e-4}}


def toy(ckpt_dir: Path, step: int, params: dict = PARAMS, keep: int = 10, **record) -> Path:
    """A checkpoint of a run of `params` at `step`: one tensor (what the run folder's logic reads is the record)."""
    path = checkpoints.write(ckpt_dir, step, {"w": torch.arange(8.0) + step},
                             {"params": params, "fingerprint": run_folder.run_fingerprint(params), **record})
    checkpoints.remove_old(ckpt_dir, keep)
    return path


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def reseal(folder: Path, **changes) -> None:
    """digests.json rewritten with `changes` and each file's digest taken again, its own sha256 right: what a
    checkpoint with these files would hold, so that the checks behind the digests are reached."""
    seal = json.loads((folder / checkpoints.DIGESTS).read_text())
    seal.pop("sha256")
    for name in seal["files"]:
        data = (folder / name).read_bytes()
        seal["files"][name] = {"bytes": len(data), "sha256": __import__("hashlib").sha256(data).hexdigest()}
    seal.update(changes)
    (folder / checkpoints.DIGESTS).write_text(json.dumps({**seal, "sha256": json_sha256(seal)}))


def flip(path: Path, at: int = -100, n: int = 16) -> None:
    """n bytes of `path` inverted in place at `at` (negative: from the end), as bit rot or a bad copy leaves them."""
    data = bytearray(path.read_bytes())
    start = at % len(data)
    data[start:start + n] = bytes(b ^ 0xFF for b in data[start:start + n])
    path.write_bytes(bytes(data))


def test_a_checkpoint_is_a_folder_its_digests_the_files_sha256_and_keep_last_k(tmp_path):
    for step in (10, 20, 30, 40):
        toy(tmp_path, step, keep=2)
    (tmp_path / ".ckpt_0000050.tmp").mkdir()  # a killed save's temp folder never counts
    assert [p.name for p in checkpoints.list_checkpoints(tmp_path)] == ["ckpt_0000030", "ckpt_0000040"]
    newest = checkpoints.latest_checkpoint(tmp_path)
    assert sorted(p.name for p in newest.iterdir()) == [".metadata", "__0_0.distcp", "digests.json", "record.pt"]
    seal = json.loads((newest / "digests.json").read_text())
    import hashlib
    assert seal["step"] == 40 and seal["format"] == checkpoints.FORMAT
    assert seal["files"] == {n: {"bytes": (newest / n).stat().st_size,
                                 "sha256": hashlib.sha256((newest / n).read_bytes()).hexdigest()}
                             for n in (".metadata", "__0_0.distcp", "record.pt")}  # taken while written: the same
    record = checkpoints.read(newest)
    assert record["step"] == 40 and record["save_id"] == seal["save_id"] and record["folder"] == str(newest)
    assert checkpoints.read_index(newest / ".metadata").storage_meta.save_id == seal["save_id"]


def test_kill_during_save_leaves_previous_checkpoint_intact(tmp_path):
    toy(tmp_path, 1)
    before = tree(tmp_path)
    # a child process starts a save and is SIGKILLed half way through writing its shard
    code = textwrap.dedent(f"""
        import os, signal, torch
        from gptcore import digests
        from gptcore.train import checkpoints
        def dying_write(self, data):
            self._f.write(b"x" * 1000); self._f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        digests.HashingWriter.write = dying_write
        checkpoints.write({str(tmp_path)!r}, 2, {{"w": torch.zeros(8)}}, {{}})
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=os.getcwd())
    assert proc.returncode == -signal.SIGKILL
    assert [p.name for p in checkpoints.list_checkpoints(tmp_path)] == ["ckpt_0000001"]
    assert {k: v for k, v in tree(tmp_path).items() if k.startswith("ckpt_")} == before
    assert checkpoints.read(tmp_path / "ckpt_0000001")["step"] == 1
    assert checkpoints.remove_temp_files(tmp_path)[0].startswith("removed 1 temp file(s) of interrupted saves")
    assert tree(tmp_path) == before


def torch_zip(tmp_path, obj) -> bytes:
    torch.save(obj, tmp_path / "whole.pt")
    return (tmp_path / "whole.pt").read_bytes()


@pytest.mark.parametrize("damage,named", [
    (lambda b: b[:100], "a zip archive cut short"),
    (lambda b: b[:len(b) // 2], "a zip archive cut short"),
    (lambda b: b[:-30], "a zip archive cut short"),  # torch itself says OSError EINVAL here: not an I/O error
    (lambda b: b"", "an empty file"),
    (lambda b: b"step: 3\n" * 20, "not a torch.save file"),
])
def test_damage_is_recognised_by_the_file_s_own_bytes(tmp_path, damage, named):
    """One torch.save file (a record.pt, a best file, model/model.pt): what its own bytes show."""
    path = tmp_path / "best_0000001.pt"
    path.write_bytes(damage(torch_zip(tmp_path, {"w": torch.ones(1000)})))
    with pytest.raises(CorruptCheckpoint, match=f"best_0000001.pt: cannot read checkpoint: {named}"):
        checkpoints.load_checkpoint(path)


def test_a_legacy_format_file_cut_short_is_named_and_a_whole_one_loads(tmp_path):
    torch.save({"step": 3}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    assert checkpoints.load_checkpoint(tmp_path / "old.pt")["step"] == 3
    (tmp_path / "cut.pt").write_bytes((tmp_path / "old.pt").read_bytes()[:40])
    with pytest.raises(CorruptCheckpoint, match="cut.pt: cannot read checkpoint: torch's legacy format, cut short"):
        checkpoints.load_checkpoint(tmp_path / "cut.pt")


def test_a_zip_that_torch_did_not_write_is_foreign(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "best_0000001.pt", "w") as z:
        z.writestr("notes.txt", "hello")
    with pytest.raises(CorruptCheckpoint, match="a zip archive but not a torch.save file"):
        checkpoints.load_checkpoint(tmp_path / "best_0000001.pt")


def three_checkpoints(ckpt_dir):
    for step in (3, 6, 9):
        toy(ckpt_dir, step)
    return PARAMS, tree(ckpt_dir)


# -- what a check finds: each damaged, mixed, truncated, foreign or other-run file is named, its checkpoint set aside
# (nothing deleted) and the previous one resumes

def other_run(tmp_path) -> Path:
    """Step 9 of a run with other params, in a folder of its own."""
    return toy(tmp_path / "other", 9, params={**PARAMS, "train": {"max_lr": 1e-3}})


DAMAGE = {
    "bytes flipped in the shard": (lambda c, t: flip(c / "__0_0.distcp"),
                                   r"__0_0.distcp is not the file it was saved with \(its sha256 differs from the one "
                                   r"digests.json records: damaged, or a file of another save\)"),
    "the shard cut short": (lambda c, t: (c / "__0_0.distcp").write_bytes((c / "__0_0.distcp").read_bytes()[:100]),
                            r"__0_0.distcp is 100 bytes, but it was saved with [\d,]+ \(cut short, or a file of "
                            r"another save\)"),
    "the shard missing": (lambda c, t: (c / "__0_0.distcp").unlink(),
                          r"__0_0.distcp is missing \(one of the 3 files it was saved with\)"),
    "step 6's shard mixed in": (lambda c, t: shutil.copy(c.parent / "ckpt_0000006" / "__0_0.distcp", c),
                                r"__0_0.distcp is not the file it was saved with"),
    "step 6's record mixed in": (lambda c, t: shutil.copy(c.parent / "ckpt_0000006" / "record.pt", c),
                                 r"record.pt is (not the file it was saved with|[\d,]+ bytes, but)"),
    "another run's record": (lambda c, t: shutil.copy(other_run(t) / "record.pt", c),
                             r"record.pt is (not the file it was saved with|[\d,]+ bytes, but)"),
    "step 6's index mixed in": (lambda c, t: shutil.copy(c.parent / "ckpt_0000006" / ".metadata", c),
                                r"\.metadata is (not the file it was saved with|[\d,]+ bytes, but)"),
    "step 6's digests mixed in": (lambda c, t: shutil.copy(c.parent / "ckpt_0000006" / "digests.json", c),
                                  r"its digests.json is of step 6, not of step 9 as the folder is named"),
    "digests.json missing": (lambda c, t: (c / "digests.json").unlink(),
                             r"its digests.json is missing \(a checkpoint is published whole, with it"),
    "digests.json cut short": (lambda c, t: (c / "digests.json").write_bytes((c / "digests.json").read_bytes()[:50]),
                               r"its digests.json is damaged \(JSONDecodeError"),
    "a digest in digests.json changed": (lambda c, t: (c / "digests.json").write_text(
        (c / "digests.json").read_text().replace('"sha256": "', '"sha256": "0', 1)),
        r"its digests.json is damaged \(its own sha256 does not match it\)"),
    "a foreign folder of the name": (lambda c, t: [shutil.rmtree(c), c.mkdir(), (c / "notes.txt").write_text("x")],
                                     r"its digests.json is missing"),
    "the index of another save, digests taken again": (
        lambda c, t: [shutil.copy(c.parent / "ckpt_0000006" / ".metadata", c), reseal(c)],
        r"its \.metadata is of another save \(save id '[0-9a-f]+', not '[0-9a-f]+'\)"),
    "the record of another save, digests taken again": (
        lambda c, t: [shutil.copy(other_run(t) / "record.pt", c), reseal(c)],
        r"its record.pt gives save_id '[0-9a-f]+', its digests.json '[0-9a-f]+' \(files of two saves\)"),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_damage_or_a_mix_is_named_set_aside_and_the_previous_checkpoint_resumes(tmp_path, case):
    damage, said = DAMAGE[case]
    params, _ = three_checkpoints(tmp_path / "ckpts")
    newest = tmp_path / "ckpts" / "ckpt_0000009"
    damage(newest, tmp_path)
    damaged = tree(newest)
    resume, notes = run_folder.prepare_resume(tmp_path / "ckpts", params, is_main=True)
    assert resume["step"] == 6 and resume["folder"] == str(newest.parent / "ckpt_0000006")
    assert re.search(f"^{re.escape(str(newest))}: {said}[^;]*; set aside as {re.escape(str(newest))}.corrupt; resuming "
                     f"from {re.escape(str(newest.parent / 'ckpt_0000006'))} \\(step 6\\)$", notes[0]), notes
    assert not newest.exists() and tree(newest.with_name("ckpt_0000009.corrupt")) == damaged  # nothing deleted


def test_a_folder_renamed_to_another_step_is_named(tmp_path):
    params, _ = three_checkpoints(tmp_path)
    os.replace(tmp_path / "ckpt_0000006", tmp_path / "ckpt_0000012")
    path, ckpt, why = run_folder.find_resume(tmp_path, params)
    assert path.name == "ckpt_0000009" and ckpt["step"] == 9
    assert "ckpt_0000012: its digests.json is of step 6, not of step 12 as the folder is named" in why


def test_when_every_checkpoint_is_damaged_the_run_starts_fresh_saying_so_and_keeps_them(tmp_path):
    params, _ = three_checkpoints(tmp_path)
    for step in (3, 6, 9):
        flip(tmp_path / f"ckpt_{step:07d}" / "__0_0.distcp")
    resume, notes = run_folder.prepare_resume(tmp_path, params, is_main=True)
    assert resume is None and len(re.findall("set aside as", notes[0])) == 3
    assert notes[0].endswith(f"no readable checkpoint in {tmp_path}: starting from step 0")
    (kept,) = (tmp_path / run_folder.PREVIOUS).iterdir()  # with the fresh start, in previous/: nothing deleted
    assert sorted(p.name for p in kept.iterdir()) == [f"ckpt_{s:07d}.corrupt" for s in (3, 6, 9)]


@pytest.mark.parametrize("fault,line", [
    (lambda: OSError(errno.EIO, "Input/output error"), r"cannot read it \(EIO: Input/output error\); the file is kept"),
    (lambda: OSError(errno.EACCES, "Permission denied"), r"cannot read it \(EACCES: Permission denied\)"),
    (lambda: MemoryError(), r"out of memory while loading it \(MemoryError\); the file is kept"),
    (lambda: RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you "
                          "tried to allocate 1024 bytes."), "out of memory while loading it"),
])
def test_a_fault_while_reading_good_checkpoints_stops_with_every_file_in_place(tmp_path, monkeypatch, fault, line):
    """An I/O error reading three good checkpoints once set all three aside and started from step 0. Now the first
    one read stops the run in one line and nothing moves; without the fault it resumes."""
    params, before = three_checkpoints(tmp_path)
    real_load = torch.load

    def failing_load(f, *args, **kwargs):
        raise fault()

    monkeypatch.setattr(torch, "load", failing_load)
    with pytest.raises(CheckpointRefused, match="ckpt_0000009/record.pt: " + line):
        run_folder.prepare_resume(tmp_path, params, is_main=True)
    assert tree(tmp_path) == before
    monkeypatch.setattr(torch, "load", real_load)
    resume, notes = run_folder.prepare_resume(tmp_path, params, is_main=True)
    assert resume["step"] == 9 and notes == [f"resuming from {tmp_path / 'ckpt_0000009'} (step 9)"]


@pytest.mark.parametrize("where", ["__0_0.distcp", ".metadata", "record.pt", "digests.json"])
def test_an_io_error_reading_any_file_of_a_checkpoint_stops_in_one_line_with_every_file_in_place(tmp_path,
                                                                                                  monkeypatch, where):
    """EIO where the check reads (the digests, each file's bytes for its sha256, the record, the index): nothing is
    set aside; rerun once the disk is fixed."""
    params, before = three_checkpoints(tmp_path)
    target = tmp_path / "ckpt_0000009" / where
    real_open = open

    def failing_open(f, *a, **k):
        if Path(f) == target:
            raise OSError(errno.EIO, "Input/output error", str(f))
        return real_open(f, *a, **k)

    monkeypatch.setattr("builtins.open", failing_open)
    monkeypatch.setattr(Path, "read_bytes", lambda p: failing_open(p, "rb").read())
    with pytest.raises(CheckpointRefused, match=re.escape(f"{target}: cannot read it (EIO: Input/output error); the "
                                                          f"file is kept as it is")):
        run_folder.prepare_resume(tmp_path, params, is_main=True)
    monkeypatch.undo()
    assert tree(tmp_path) == before
    assert run_folder.prepare_resume(tmp_path, params, is_main=True)[0]["step"] == 9


def test_a_bug_while_loading_keeps_its_traceback_and_the_files(tmp_path, monkeypatch):
    params, before = three_checkpoints(tmp_path)
    monkeypatch.setattr(torch, "load", lambda *a, **k: {}["missing"])
    with pytest.raises(KeyError):
        run_folder.prepare_resume(tmp_path, params, is_main=True)
    assert tree(tmp_path) == before


def test_a_global_the_weights_only_loader_refuses_stops_the_run_and_keeps_the_file(tmp_path):
    """As after a torch upgrade whose loader no longer allows a global the record holds: readable, not damaged."""
    three_checkpoints(tmp_path)
    shutil.rmtree(tmp_path / "ckpt_0000009")
    toy(tmp_path, 9, when=datetime.date(2026, 1, 1))
    before = tree(tmp_path)
    with pytest.raises(CheckpointRefused, match=r"ckpt_0000009/record.pt: not loadable as plain tensors by torch .* "
                                                r"\(Unsupported global: GLOBAL datetime.date\); the file is kept"):
        run_folder.find_resume(tmp_path, PARAMS)
    assert tree(tmp_path) == before


def test_a_checkpoint_of_a_future_format_is_refused_not_guessed_at(tmp_path):
    params, _ = three_checkpoints(tmp_path)
    reseal(tmp_path / "ckpt_0000009", format=checkpoints.FORMAT + 1)
    before = tree(tmp_path)
    with pytest.raises(CheckpointRefused, match=f"ckpt_0000009: checkpoint format {checkpoints.FORMAT + 1}, but "
                                                f"this gptcore reads format {checkpoints.FORMAT}; the folder is kept"):
        run_folder.prepare_resume(tmp_path, params, is_main=True)
    assert tree(tmp_path) == before


def test_an_index_that_names_code_or_a_pickled_object_is_refused_and_nothing_runs(tmp_path):
    """.metadata is a pickle: only torch's index classes are unpickled, and an index that says a key is a pickled
    object (torch would unpickle it with weights_only=False) is refused, though its digests match."""
    params, _ = three_checkpoints(tmp_path)
    planted = tmp_path / "planted"

    class Plant:
        def __reduce__(self):
            return (os.mkdir, (str(planted),))

    newest = tmp_path / "ckpt_0000009"
    (newest / ".metadata").write_bytes(pickle.dumps(Plant()))
    reseal(newest)
    with pytest.raises(CheckpointRefused, match=r"\.metadata: not read \(a global posix.mkdir that a checkpoint's "
                                                r"\.metadata never holds\); the folder is kept"):
        run_folder.find_resume(tmp_path, params)
    assert not planted.exists()
    shutil.rmtree(newest)
    import io

    import torch.distributed.checkpoint as dcp
    dcp.save({"w": torch.zeros(2), "note": io.BytesIO(b"runs code when read")},
             storage_writer=dcp.FileSystemWriter(tmp_path / "bytes"), no_dist=True)
    shutil.copy(tmp_path / "bytes" / ".metadata", tmp_path / "ckpt_0000006")
    folder = tmp_path / "ckpt_0000006"
    index = checkpoints.read_index(folder / ".metadata")
    seal = json.loads((folder / "digests.json").read_text())
    index.storage_meta.save_id = seal["save_id"]  # of this save: only the kind of what it indexes is wrong
    index.storage_data = {k: type(v)("__0_0.distcp", v.offset, v.length) for k, v in index.storage_data.items()}
    (folder / ".metadata").write_bytes(pickle.dumps(index))
    reseal(folder)
    with pytest.raises(CheckpointRefused, match="ckpt_0000006: its .metadata says note is a pickled object, where "
                                                "this gptcore saves tensors only; not read"):
        checkpoints.read(folder)


def test_checkpoints_of_the_gptcore_before_this_format_are_refused_in_one_line_and_kept(tmp_path):
    """ckpt_*.pt files and ckpt_*.dcp folders carry no digests: nothing could tell a damaged one from a whole one,
    so they are never read; the run stops naming the newest, and every file stays where it is."""
    toy(tmp_path, 3)
    (tmp_path / "ckpt_0000008.pt").write_bytes(torch_zip(tmp_path, {"step": 8, "params": PARAMS}))
    (tmp_path / "ckpt_0000012.dcp").mkdir()
    (tmp_path / "ckpt_0000012.dcp" / "record.pt").write_bytes(b"x")
    before = tree(tmp_path)
    with pytest.raises(CheckpointRefused) as refused:
        run_folder.prepare_resume(tmp_path, PARAMS, is_main=True)
    assert str(refused.value) == (
        f"{tmp_path / 'ckpt_0000012.dcp'} (and 1 more): a checkpoint of an older gptcore, without the digests this "
        f"one checks before resuming, so it is not read; every file is kept: finish that run with the gptcore that "
        f"wrote it, or move the old ckpt_*.pt / ckpt_*.dcp out of {tmp_path} to start this run fresh")
    assert tree(tmp_path) == before
    # moved into an archive (previous/), an old run is never brought back, and the line says so
    archive = tmp_path / run_folder.PREVIOUS / "20250101T000000Z"
    archive.mkdir(parents=True)
    for name in ("ckpt_0000008.pt", "ckpt_0000012.dcp"):
        os.replace(tmp_path / name, archive / name)
    resume, notes = run_folder.prepare_resume(tmp_path, {**PARAMS, "train": {"max_lr": 1}}, is_main=True)
    assert resume is None and f"{archive} holds checkpoints of an older gptcore, which this one does not resume" in \
        notes[0]


def test_fingerprint_and_diff():
    a = {"train": {"max_lr": 6e-4, "seed": 1}, "model": {"n_layer": 2}}
    b = {"train": {"max_lr": 1e-3, "seed": 1}, "model": {"n_layer": 2}}
    assert run_folder.run_fingerprint(a) == run_folder.run_fingerprint(
        {"model": {"n_layer": 2}, "train": {"seed": 1, "max_lr": 6e-4}})
    assert run_folder.run_fingerprint(a) != run_folder.run_fingerprint(b)
    assert run_folder.param_diff(a, b) == ["train.max_lr: 0.0006 -> 0.001"]


def test_find_resume_refuses_other_params_without_reading_the_shards(tmp_path, monkeypatch):
    toy(tmp_path, 5)
    path, ckpt, why = run_folder.find_resume(tmp_path, PARAMS)
    assert path is not None and ckpt["step"] == 5 and "resuming" in why
    flip(tmp_path / "ckpt_0000005" / "__0_0.distcp")  # another run's shards are not read at all
    path, ckpt, why = run_folder.find_resume(tmp_path, {**PARAMS, "train": {"max_lr": 1e-3}})
    assert path is None and ckpt is None and "train.max_lr: 0.0006 -> 0.001" in why
    assert (tmp_path / "ckpt_0000005").is_dir()


def test_move_aside_keeps_the_previous_run(tmp_path):
    ckpts, live = tmp_path / "checkpoints", tmp_path / "metrics" / "train"
    a = toy(ckpts, 3)
    (live / "plots").mkdir(parents=True)
    (live / "plots" / "loss.tsv").write_text("step\tloss\n0\t1.0\n")
    content = tree(a)
    dest = run_folder.move_aside(ckpts, also=[live])
    assert dest.parent == ckpts / run_folder.PREVIOUS
    assert checkpoints.list_checkpoints(ckpts) == [] and not live.exists()
    assert tree(dest / a.name) == content
    assert (dest / "train" / "plots" / "loss.tsv").read_text().startswith("step")
    assert run_folder.move_aside(ckpts, also=[live]) is None  # nothing left to move
def test_init_model_pads_vocab_and_checks_it():
    m = init_model(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size="auto"), data_vocab_size=65)
    assert m.config.vocab_size == 128
    with pytest.raises(UserError, match="smaller than the data's tokenizer vocabulary"):
        init_model(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64), data_vocab_size=65)
    with pytest.raises(UserError, match="model.init_from='nope': model 'nope': no such file"):
        init_model(ModelConfig(init_from="nope", n_layer=1), data_vocab_size=65)


def test_final_model_exports_to_hugging_face(tmp_path):
    model = GPT(TINY)
    export_model(tmp_path, model, None, {"step": 3}, hf_vocab_size=60)
    assert (tmp_path / "model.pt").is_file() and (tmp_path / "hf" / "config.json").is_file()
    back = load_model(tmp_path / "model.pt")
    assert torch.equal(back.transformer.wte.weight, model.transformer.wte.weight)


def test_a_kill_during_the_export_leaves_the_previous_model_whole(tmp_path):
    """model/ is one run's: a kill after model.pt but before hf/ is written leaves the previous export as it was,
    and the next export clears what the killed one left."""
    from gptcore.data.tokenizers.char import CharTokenizer

    tok = CharTokenizer("abcdefgh ")
    torch.manual_seed(1)
    export_model(tmp_path / "model", GPT(TINY), tok, {"step": 3})
    before = tree(tmp_path / "model")
    assert {"model.pt", "manifest.json", "hf/config.json"} <= set(before)
    code = textwrap.dedent(f"""
        import os, signal, torch
        import gptcore.model.export as export
        from gptcore.data.tokenizers import CharTokenizer
        from gptcore.model.gpt import GPT, GPTConfig
        def dying_export(*args, **kwargs):  # model.pt of the new run is written by now
            os.kill(os.getpid(), signal.SIGKILL)
        export.export_hf = dying_export
        torch.manual_seed(2)
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64))
        export.export_model({str(tmp_path / "model")!r}, model, CharTokenizer("abcdefgh "), {{"step": 9}})
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=os.getcwd())
    assert proc.returncode == -signal.SIGKILL
    assert tree(tmp_path / "model") == before
    torch.manual_seed(3)
    new = GPT(TINY)
    export_model(tmp_path / "model", new, tok, {"step": 12})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing of the killed export is left
    assert torch.equal(load_model(tmp_path / "model").transformer.wte.weight, new.transformer.wte.weight)
    hf = load_model(tmp_path / "model" / "hf")  # the export keeps the tokenizer's rows of the padded 64
    assert torch.equal(hf.transformer.wte.weight, new.transformer.wte.weight[:tok.vocab_size])


def test_a_new_run_removes_the_temp_files_of_killed_saves(tmp_path):
    toy(tmp_path, 4)
    half = tmp_path / ".ckpt_0000006.tmp"
    half.mkdir()
    (half / "__0_0.distcp").write_bytes(b"x" * 1000)
    (tmp_path / ".best_0000005.pt.9f2e.tmp").write_bytes(b"x" * 10)
    (tmp_path / "notes.tmp").write_bytes(b"not ours")
    resume, notes = run_folder.prepare_resume(tmp_path, {"model": {"init_from": "scratch"}}, is_main=True)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(("ckpt", "previous"))) == ["notes.tmp"]
    assert resume is None and "removed 2 temp file(s) of interrupted saves (0.0 MB)" in notes[0]


def test_a_start_from_a_file_the_run_would_move_aside_is_refused(tmp_path, monkeypatch):
    from gptcore.params import ParamError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints" / "previous" / "old").mkdir(parents=True)
    for spec in ("checkpoints/best_0000030.pt", "./checkpoints/best_0000020.pt", str(tmp_path / "checkpoints/x.pt")):
        with pytest.raises(ParamError, match="model.init_from=.*copy it out first"):
            run_folder.check_init_from(spec, tmp_path / "checkpoints")
    for spec in ("scratch", "gpt2", "model", "init.pt", "checkpoints/previous/old/best_0000030.pt"):
        run_folder.check_init_from(spec, tmp_path / "checkpoints")


def test_an_earlier_run_with_the_same_params_is_brought_back_not_retrained(tmp_path):
    """`dvc exp apply` of an earlier experiment, then `dvc repro`: params A, then B (A moved aside), then A again.
    The third run resumes A's checkpoints from checkpoints/previous/ and its step metrics; B's move aside."""
    ckpts, live = tmp_path / "checkpoints", tmp_path / "metrics" / "train"
    a = {"model": {"init_from": "scratch"}, "train": {"max_lr": 6e-4}}
    b = {"model": {"init_from": "scratch"}, "train": {"max_lr": 1e-3}}

    def run(params, tag):  # what a finished train leaves: its checkpoints and its step metrics
        resume, notes = run_folder.prepare_resume(ckpts, params, is_main=True, also=[live])
        for step in (3, 6):
            toy(ckpts, step, params, keep=2, tag=tag)
        live.mkdir(parents=True, exist_ok=True)
        (live / "train_loss.tsv").write_text(f"run {tag}\n")
        return resume, notes

    assert run(a, "A")[0] is None
    assert run(b, "B")[0] is None
    resume, notes = run_folder.prepare_resume(ckpts, a, is_main=True, also=[live])
    assert resume["tag"] == "A" and resume["step"] == 6
    assert "holds a run with these params (step 6): bringing it back" in notes[0]
    assert notes[-1] == f"resuming from {ckpts / 'ckpt_0000006'} (step 6)"
    assert [checkpoints.read(p)["tag"] for p in checkpoints.list_checkpoints(ckpts)] == ["A", "A"]
    assert (live / "train_loss.tsv").read_text() == "run A\n"
    kept = sorted((ckpts / run_folder.PREVIOUS).iterdir())  # nothing lost: B waits there as A did
    assert len(kept) == 1 and (kept[0] / "train" / "train_loss.tsv").read_text() == "run B\n"
    assert [checkpoints.read(p)["tag"] for p in checkpoints.list_checkpoints(kept[0])] == ["B", "B"]
    assert run_folder.prepare_resume(ckpts, a, is_main=True, also=[live])[0]["tag"] == "A"  # and stays resumed


def test_an_earlier_run_brought_back_is_checked_in_full_and_its_damage_set_aside(tmp_path):
    """An earlier run's record is read where it waits; its shards are checked once it is back, as any resume's."""
    a, b = PARAMS, {**PARAMS, "train": {"max_lr": 1e-3}}
    for params in (a, b):
        run_folder.prepare_resume(tmp_path, params, is_main=True)
        for step in (3, 6):
            toy(tmp_path, step, params, keep=2)
    (kept,) = (tmp_path / run_folder.PREVIOUS).iterdir()  # a's run
    flip(kept / "ckpt_0000006" / "__0_0.distcp")
    resume, notes = run_folder.prepare_resume(tmp_path, a, is_main=True)
    assert resume["step"] == 3 and "bringing it back" in notes[0]
    assert f"{tmp_path / 'ckpt_0000006'}: __0_0.distcp is not the file it was saved with" in notes[-1]
    assert notes[-1].endswith(f"resuming from {tmp_path / 'ckpt_0000003'} (step 3)")
    assert (tmp_path / "ckpt_0000006.corrupt").is_dir()


def test_earlier_runs_of_other_params_stay_where_they_are_and_an_unreadable_one_stops_nothing(tmp_path):
    a, b, c = ({"model": {"init_from": "scratch"}, "train": {"max_lr": lr}} for lr in (1e-4, 2e-4, 3e-4))
    for params in (a, b):
        run_folder.prepare_resume(tmp_path, params, is_main=True)
        toy(tmp_path, 3, params, keep=2)
    kept = next((tmp_path / run_folder.PREVIOUS).iterdir()) / "ckpt_0000003"  # a's run
    resume, notes = run_folder.prepare_resume(tmp_path, c, is_main=True)
    assert resume is None and notes[0].endswith("starting fresh (train.max_lr: 0.0002 -> 0.0003)")
    assert len(list((tmp_path / run_folder.PREVIOUS).iterdir())) == 2 and kept.is_dir()
    reseal(kept, format=checkpoints.FORMAT + 1)
    resume, notes = run_folder.prepare_resume(tmp_path, a, is_main=True)  # an archive never stops a run
    assert resume is None and f"checkpoint format {checkpoints.FORMAT + 1}" in notes[0]
    assert f"(so the run in {kept.parent} was not considered for resuming)" in notes[0]
    assert kept.is_dir() and notes[0].endswith("starting from step 0")


def test_a_run_is_never_resumed_onto_another_run_s_curves(tmp_path):
    """`dvc exp apply A` restores A's metrics/train (a DVC out) but not checkpoints/; a `dvc exp run` with B's params
    then found B's finished checkpoints and resumed them over A's curves: A's train loss beside B's val loss, silently.
    Now the curves carry their run's fingerprint, and a mismatch starts fresh with everything kept."""
    ckpts, live = tmp_path / "checkpoints", tmp_path / "metrics" / "train"
    a = {"model": {"init_from": "scratch"}, "train": {"max_lr": 6e-4}}
    b = {"model": {"init_from": "scratch"}, "train": {"max_lr": 1e-3}}
    assert run_folder.prepare_resume(ckpts, b, is_main=True, also=[live])[0] is None
    toy(ckpts, 6, b, keep=2)
    assert (live / run_folder.CURVES_STAMP).read_text().strip() == run_folder.run_fingerprint(b)
    assert run_folder.prepare_resume(ckpts, b, is_main=True, also=[live])[0]["step"] == 6  # its own curves: resumed
    (live / run_folder.CURVES_STAMP).write_text(run_folder.run_fingerprint(a) + "\n")  # what exp apply A leaves
    (live / "train_loss.tsv").write_text("run A\n")

    resume, notes = run_folder.prepare_resume(ckpts, b, is_main=True, also=[live])
    assert resume is None
    assert f"{live}/ holds another run's step metrics" in notes[0] and notes[0].endswith("starting from step 0")
    kept = next((ckpts / run_folder.PREVIOUS).iterdir())  # nothing lost: B's weights and A's curves, side by side
    assert (kept / "ckpt_0000006").is_dir() and (kept / "train" / "train_loss.tsv").read_text() == "run A\n"
    assert not (live / "train_loss.tsv").exists()
    assert (live / run_folder.CURVES_STAMP).read_text().strip() == run_folder.run_fingerprint(b)
    resume, notes = run_folder.prepare_resume(ckpts, b, is_main=True, also=[live])  # nor is that pair brought back
    assert resume is None and (kept / "ckpt_0000006").is_dir()


# -- a model's checkpoint: weights and optimizer state by name, on any number of processes, in either mode ----------

def tiny_run(optimizer: str = "adamw", reorder: bool = False):
    """A tiny GPT and its optimizers (the trainer's); `reorder`: each of AdamW's groups lists its weights in reverse
    order (what a code change that reorders parameters does to their positions)."""
    from stagekit import train_config

    from gptcore.train.optimizers import build_optimizers

    torch.manual_seed(0)
    model = GPT(TINY)
    opts = build_optimizers(model, train_config(optimizer=optimizer, warmup_steps=2), "cpu")
    if reorder:
        for group in opts.optimizers["adamw"].param_groups:
            group["params"].reverse()
    return model, opts


def step(model, opts, n: int = 2) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        x = torch.randint(0, 64, (2, 16), generator=g)
        _, loss = model(x, x)
        loss.backward()
        opts.step()
        opts.zero_grad()


def test_weights_and_optimizer_state_are_saved_by_name_the_tied_embedding_once(tmp_path):
    model, opts = tiny_run("muon")
    step(model, opts)
    path = checkpoints.save(tmp_path, 2, model, opts, {"note": 1}, keep=2)
    index = checkpoints.read_index(path / ".metadata").state_dict_metadata
    weights = [k.removeprefix("model.") for k in index if k.startswith("model.")]
    assert "transformer.wte.weight" in weights and "lm_head.weight" not in weights  # tied: stored once
    assert sorted(weights) == sorted(set(model.state_dict()) - {"lm_head.weight"})
    assert "optimizer.adamw.transformer.wte.weight.exp_avg" in index
    assert "optimizer.muon.transformer.h.0.attn.c_attn.weight.momentum_buffer" in index
    record = checkpoints.read(path)
    assert record["note"] == 1 and set(record["optimizer"]) == {"adamw", "muon"}
    assert record["optimizer"]["muon"][0]["params"][0].startswith("transformer.h.0.")  # groups name their weights
    again, fresh = tiny_run("muon")
    checkpoints.load(record, again, fresh)
    for k, v in model.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k
    assert again.lm_head.weight is again.transformer.wte.weight
    for name in ("adamw", "muon"):
        a, b = opts.optimizers[name].state_dict(), fresh.optimizers[name].state_dict()
        assert a["param_groups"] == b["param_groups"]
        assert all(torch.equal(a["state"][i][k], b["state"][i][k]) for i in a["state"] for k in a["state"][i])


def test_optimizer_state_follows_its_weight_by_name_whatever_the_order_of_the_parameters(tmp_path):
    """Keyed by position, a checkpoint loaded into optimizers that list the parameters in another order would put
    Adam's moments on another weight of the same shape without a word; by name each lands on its own weight."""
    model, opts = tiny_run()
    step(model, opts)
    checkpoints.save(tmp_path, 2, model, opts, {}, keep=2)
    scalars = [g for g in opts.optimizers["adamw"].param_groups if g["name"] == "scalars"][0]["params"]
    assert len(scalars) > len({p.shape for p in scalars})  # weights of one shape: by position, a reorder goes unseen
    again, reordered = tiny_run(reorder=True)
    checkpoints.load(checkpoints.read(tmp_path / "ckpt_0000002"), again, reordered)
    saved = {n: opts.optimizers["adamw"].state[p] for n, p in model.named_parameters()}
    loaded = {n: reordered.optimizers["adamw"].state[p] for n, p in again.named_parameters()}
    for name, s in saved.items():
        assert torch.equal(s["exp_avg"], loaded[name]["exp_avg"]) and torch.equal(s["exp_avg_sq"],
                                                                                    loaded[name]["exp_avg_sq"]), name


def test_the_digests_cost_no_second_read_they_are_taken_as_each_file_is_written(tmp_path, monkeypatch):
    """Every file of a save goes through the hashing stream; nothing reads a file back to hash it."""
    import gptcore.digests

    model, opts = tiny_run()
    reads = []
    real = gptcore.digests.file_sha256
    monkeypatch.setattr(gptcore.digests, "file_sha256", lambda p: reads.append(p) or real(p))
    path = checkpoints.save(tmp_path, 1, model, opts, {}, keep=2)
    assert reads == []
    checkpoints.read(path)  # reading back is where files are hashed: each once
    assert sorted(Path(p).name for p in reads) == [".metadata", "__0_0.distcp", "record.pt"]


# -- on two processes: each rank's shard, read back whole on one ---------------------------------------------------
SAVE = r"""
import sys
from pathlib import Path

import torch

from gptcore import distributed
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.train import checkpoints
from gptcore.train.config import TrainConfig
from gptcore.train.optimizers import build_optimizers
from gptcore.train.parallel import MODES

folder, mode = Path(sys.argv[1]), sys.argv[2]
env = distributed.setup("cpu")
torch.manual_seed(0)
model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64))
MODES[mode].prepare(model, env, torch.float32, compile=False)
cfg = TrainConfig.read({"parallel": mode, "micro_batch": 1, "total_batch_tokens": 16, "max_steps": 9,
                        "warmup_steps": 0, "max_lr": 6e-4, "eval_every": 0, "val_tokens": 16, "ckpt_every": 3})
optimizers = build_optimizers(model, cfg, "cpu")
g = torch.Generator().manual_seed(env.rank)
for _ in range(2):  # each rank its own tokens: the moments differ from zero, and from rank to rank before averaging
    x = torch.randint(0, 64, (2, 16), generator=g)
    model(x, x)[1].backward()
    for p in model.parameters():  # ddp's all-reduce, by hand (fsdp reduce-scatters itself)
        if mode == "ddp":
            torch.distributed.all_reduce(p.grad, op=torch.distributed.ReduceOp.AVG)
    optimizers.step()
    optimizers.zero_grad()
checkpoints.save(folder, 6, model, optimizers, {"mode": mode}, keep=2)
distributed.teardown()
"""


@pytest.fixture(scope="module")
def two_rank_saves(tmp_path_factory):
    """The checkpoint of step 6 saved by 2 ranks, under fsdp and under ddp."""
    root = tmp_path_factory.mktemp("two_ranks")
    script = root / "save.py"
    script.write_text(SAVE, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    for mode in ("fsdp", "ddp"):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               str(script), str(root / mode), mode], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "torch.distributed is disabled" not in proc.stderr
    return root


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_two_ranks_write_a_shard_each_and_one_process_reads_them_whole_as_torch_does(two_rank_saves, tmp_path,
                                                                                      mode):
    """fsdp: each rank its shard of every weight; ddp: every rank holds the whole, and DCP spreads the writing over
    them. Read by one process into a whole model and its optimizers (a resume on 1 process, or in the other mode),
    against torch.distributed.checkpoint's own conversion of the folder to one torch.save file: equal, by name."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder = two_rank_saves / mode / "ckpt_0000006"
    assert sorted(p.name for p in folder.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "digests.json",
                                                        "record.pt"]
    record = checkpoints.read(folder)
    assert record["world_size"] == 2 and record["mode"] == mode
    dcp_to_torch_save(folder, tmp_path / "whole.pt")
    reference = torch.load(tmp_path / "whole.pt", weights_only=False)
    model, opts = tiny_run()
    checkpoints.load(record, model, opts)
    for name, t in model.state_dict().items():
        assert torch.equal(t, reference["model"]["transformer.wte.weight" if name == "lm_head.weight" else name]), name
    adam = reference["optimizer"]["adamw"]
    for name, p in model.named_parameters():
        for key, t in opts.optimizers["adamw"].state[p].items():
            assert torch.equal(t, adam[name][key]), (name, key)


def test_the_later_stages_results_leave_with_the_run_before_and_come_back_with_it(tmp_path, monkeypatch):
    """The results of evaluate and compare in the workspace are the run's before a fresh one: they move aside with it
    (no view sets a running run beside them), a resumed run keeps them, and an earlier run comes back with its own."""
    monkeypatch.chdir(tmp_path)
    ckpts, live = Path("checkpoints"), Path("metrics/train")
    results = [Path("metrics/eval.json"), Path("metrics/plots/baselines.tsv"), Path("metrics/summary.json")]
    a = {"model": {"init_from": "scratch"}, "train": {"max_lr": 6e-4}}
    b = {"model": {"init_from": "scratch"}, "train": {"max_lr": 1e-3}}

    def finish(params, tag):  # a finished run, then its evaluate and compare
        for step in (3, 6):
            toy(ckpts, step, params, keep=2, tag=tag)
        (live / "train_loss.tsv").write_text(f"run {tag}\n")
        Path("metrics/plots").mkdir(exist_ok=True)
        Path("metrics/plots/baselines.tsv").write_text(f"baselines of {tag}\n")
        Path("metrics/eval.json").write_text(f'{{"run": "{tag}"}}\n')
        # summary.json: compare did not run (killed): what is there moves, what is not is no matter

    def workspace():
        return {str(p): p.read_text() for p in results if p.is_file()}

    # a fresh clone: git's results of the committed run, no checkpoints; a fresh run moves them aside too
    Path("metrics/plots").mkdir(parents=True)
    Path("metrics/eval.json").write_text('{"run": "git"}\n')
    resume, notes = run_folder.prepare_resume(ckpts, a, is_main=True, also=[live], results=results)
    assert resume is None and workspace() == {}
    kept = next((ckpts / run_folder.PREVIOUS).iterdir())
    assert (kept / "metrics" / "eval.json").read_text() == '{"run": "git"}\n'
    assert not [n for n in notes if "kept in" in n]  # git's files only, as on a fresh clone: nothing to say
    shutil.rmtree(kept)
    finish(a, "A")
    before = workspace()
    # the same run again (a code change reran train): resumed, its own results stay
    resume, notes = run_folder.prepare_resume(ckpts, a, is_main=True, also=[live], results=results)
    assert resume["tag"] == "A" and workspace() == before and not any((ckpts / run_folder.PREVIOUS).iterdir())
    # B: A and its results move aside together
    resume, notes = run_folder.prepare_resume(ckpts, b, is_main=True, also=[live], results=results)
    assert resume is None and workspace() == {}
    kept = next((ckpts / run_folder.PREVIOUS).iterdir())
    assert notes[-1] == (f"the previous run's checkpoints and metrics/train/ are kept in {kept}, with its 2 result "
                         f"files of later stages")
    finish(b, "B")
    # A again: B and its results aside, A and its results back
    resume, notes = run_folder.prepare_resume(ckpts, a, is_main=True, also=[live], results=results)
    assert resume["tag"] == "A" and workspace() == before
    assert (live / "train_loss.tsv").read_text() == "run A\n"
    kept = next((ckpts / run_folder.PREVIOUS).iterdir())
    assert (kept / "metrics" / "eval.json").read_text() == '{"run": "B"}\n'
    assert (kept / "metrics" / "plots" / "baselines.tsv").read_text() == "baselines of B\n"
