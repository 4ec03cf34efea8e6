import datetime
import errno
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from gptcore.errors import UserError
from gptcore.model.checkpoint_file import CHECKPOINT_FORMAT, FORMAT_KEY, CheckpointRefused, CorruptCheckpoint
from gptcore.model.export import export_model
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.model.load import ModelConfig, init_model, load_model
from gptcore.train import checkpoints

TINY = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64)


def test_save_keeps_last_k_and_ignores_temp_files(tmp_path):
    for step in (10, 20, 30, 40):
        checkpoints.save_checkpoint(tmp_path, step, {"step": step}, keep=2)
    (tmp_path / ".ckpt_0000050.pt.abc.tmp").write_bytes(b"half a file")
    names = [p.name for p in checkpoints.list_checkpoints(tmp_path)]
    assert names == ["ckpt_0000030.pt", "ckpt_0000040.pt"]
    assert checkpoints.load_checkpoint(checkpoints.latest_checkpoint(tmp_path))["step"] == 40


def test_kill_during_save_leaves_previous_checkpoint_intact(tmp_path):
    checkpoints.save_checkpoint(tmp_path, 1, {"w": torch.ones(4)}, keep=3)
    # A child process starts a big save and is SIGKILLed half way.
    code = textwrap.dedent(f"""
        import os, signal, torch
        from gptcore.train import checkpoints
        real_save = torch.save
        def dying_save(obj, f):
            f.write(b"x" * 1000); f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        torch.save = dying_save
        checkpoints.save_checkpoint({str(tmp_path)!r}, 2, {{"w": torch.zeros(4)}}, keep=3)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=os.getcwd())
    assert proc.returncode == -signal.SIGKILL
    assert [p.name for p in checkpoints.list_checkpoints(tmp_path)] == ["ckpt_0000001.pt"]
    assert torch.equal(checkpoints.load_checkpoint(checkpoints.latest_checkpoint(tmp_path))["w"], torch.ones(4))


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
    path = tmp_path / "ckpt_0000001.pt"
    path.write_bytes(damage(torch_zip(tmp_path, {"w": torch.ones(1000)})))
    with pytest.raises(CorruptCheckpoint, match=f"ckpt_0000001.pt: cannot read checkpoint: {named}"):
        checkpoints.load_checkpoint(path)


def test_a_legacy_format_file_cut_short_is_named_and_a_whole_one_loads(tmp_path):
    torch.save({"step": 3}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    assert checkpoints.load_checkpoint(tmp_path / "old.pt")["step"] == 3
    (tmp_path / "cut.pt").write_bytes((tmp_path / "old.pt").read_bytes()[:40])
    with pytest.raises(CorruptCheckpoint, match="cut.pt: cannot read checkpoint: torch's legacy format, cut short"):
        checkpoints.load_checkpoint(tmp_path / "cut.pt")


def test_a_zip_that_torch_did_not_write_is_foreign(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "ckpt_0000001.pt", "w") as z:
        z.writestr("notes.txt", "hello")
    with pytest.raises(CorruptCheckpoint, match="a zip archive but not a torch.save file"):
        checkpoints.load_checkpoint(tmp_path / "ckpt_0000001.pt")


def three_checkpoints(ckpt_dir):
    params = {"model": {"init_from": "scratch"}, "train": {"max_lr": 6e-4}}
    state = {"params": params, "fingerprint": checkpoints.run_fingerprint(params), "w": torch.arange(8.0)}
    for step in (3, 6, 9):
        checkpoints.save_checkpoint(ckpt_dir, step, {**state, "step": step}, keep=3)
    return params, tree(ckpt_dir)


@pytest.mark.parametrize("fault,line", [
    (lambda: OSError(errno.EIO, "Input/output error"), r"cannot read it \(EIO: Input/output error\); the file is kept"),
    (lambda: OSError(errno.EACCES, "Permission denied"), r"cannot read it \(EACCES: Permission denied\)"),
    (lambda: MemoryError(), r"out of memory while loading it \(MemoryError\); the file is kept"),
    (lambda: RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you "
                          "tried to allocate 1024 bytes."), "out of memory while loading it"),
])
def test_a_fault_while_reading_good_checkpoints_stops_with_every_file_in_place(tmp_path, monkeypatch, fault, line):
    """The issue's reproduction: an I/O error reading three good checkpoints set all three aside and started from
    step 0. Now the first one read stops the run in one line and nothing moves; without the fault it resumes."""
    params, before = three_checkpoints(tmp_path)
    real_load = torch.load

    def failing_load(f, *args, **kwargs):
        raise fault()

    monkeypatch.setattr(torch, "load", failing_load)
    with pytest.raises(CheckpointRefused, match="ckpt_0000009.pt: " + line):
        checkpoints.prepare_resume(tmp_path, params, is_main=True)
    assert tree(tmp_path) == before
    monkeypatch.setattr(torch, "load", real_load)
    resume, notes = checkpoints.prepare_resume(tmp_path, params, is_main=True)
    assert resume["step"] == 9 and notes == [f"resuming from {tmp_path / 'ckpt_0000009.pt'} (step 9)"]


def test_a_bug_while_loading_keeps_its_traceback_and_the_files(tmp_path, monkeypatch):
    params, before = three_checkpoints(tmp_path)
    monkeypatch.setattr(torch, "load", lambda *a, **k: {}["missing"])
    with pytest.raises(KeyError):
        checkpoints.prepare_resume(tmp_path, params, is_main=True)
    assert tree(tmp_path) == before


def test_a_global_the_weights_only_loader_refuses_stops_the_run_and_keeps_the_file(tmp_path):
    """As after a torch upgrade whose loader no longer allows a global the file holds: readable, not damaged."""
    params, _ = three_checkpoints(tmp_path)
    newest = tmp_path / "ckpt_0000009.pt"
    newest.write_bytes(torch_zip(tmp_path, {"step": 9, "params": params, "when": datetime.date(2026, 1, 1)}))
    before = tree(tmp_path)
    with pytest.raises(CheckpointRefused, match=r"ckpt_0000009.pt: not loadable as plain tensors by torch .* "
                                                r"\(Unsupported global: GLOBAL datetime.date\); the file is kept"):
        checkpoints.find_resume(tmp_path, params)
    assert tree(tmp_path) == before


def test_a_checkpoint_of_another_format_version_is_refused_not_guessed_at(tmp_path):
    params, _ = three_checkpoints(tmp_path)
    assert checkpoints.load_checkpoint(tmp_path / "ckpt_0000003.pt")[FORMAT_KEY] == CHECKPOINT_FORMAT
    newest = tmp_path / "ckpt_0000009.pt"
    newest.write_bytes(torch_zip(tmp_path, {**checkpoints.load_checkpoint(newest), FORMAT_KEY: CHECKPOINT_FORMAT + 1}))
    before = tree(tmp_path)
    with pytest.raises(CheckpointRefused, match=f"ckpt_0000009.pt: checkpoint format {CHECKPOINT_FORMAT + 1}, but "
                                                f"this gptcore reads format {CHECKPOINT_FORMAT}; the file is kept"):
        checkpoints.prepare_resume(tmp_path, params, is_main=True)
    assert tree(tmp_path) == before


def test_fingerprint_and_diff():
    a = {"train": {"max_lr": 6e-4, "seed": 1}, "model": {"n_layer": 2}}
    b = {"train": {"max_lr": 1e-3, "seed": 1}, "model": {"n_layer": 2}}
    assert checkpoints.run_fingerprint(a) == checkpoints.run_fingerprint(
        {"model": {"n_layer": 2}, "train": {"seed": 1, "max_lr": 6e-4}})
    assert checkpoints.run_fingerprint(a) != checkpoints.run_fingerprint(b)
    assert checkpoints.param_diff(a, b) == ["train.max_lr: 0.0006 -> 0.001"]


def test_find_resume_refuses_other_params(tmp_path):
    params = {"train": {"max_lr": 6e-4}}
    checkpoints.save_checkpoint(tmp_path, 5,
                                {"step": 5, "params": params, "fingerprint": checkpoints.run_fingerprint(params)}, 2)
    path, ckpt, why = checkpoints.find_resume(tmp_path, params)
    assert path is not None and ckpt["step"] == 5 and "resuming" in why
    path, ckpt, why = checkpoints.find_resume(tmp_path, {"train": {"max_lr": 1e-3}})
    assert path is None and ckpt is None and "train.max_lr: 0.0006 -> 0.001" in why


def test_unreadable_newest_checkpoint_is_set_aside_and_the_older_one_resumes(tmp_path):
    params = {"train": {"max_lr": 6e-4}}
    state = {"params": params, "fingerprint": checkpoints.run_fingerprint(params)}
    checkpoints.save_checkpoint(tmp_path, 3, {**state, "step": 3}, 2)
    newest = checkpoints.save_checkpoint(tmp_path, 6, {**state, "step": 6}, 2)
    newest.write_bytes(newest.read_bytes()[:100])  # truncated, as a full disk or a kill during a copy leaves it
    path, ckpt, why = checkpoints.find_resume(tmp_path, params)
    assert path == tmp_path / "ckpt_0000003.pt" and ckpt["step"] == 3
    assert "ckpt_0000006.pt: cannot read checkpoint: a zip archive cut short" in why and "resuming from" in why
    assert not newest.exists() and (tmp_path / "ckpt_0000006.pt.corrupt").stat().st_size == 100


def test_move_aside_keeps_the_previous_run(tmp_path):
    ckpts, live = tmp_path / "checkpoints", tmp_path / "metrics" / "train"
    a = checkpoints.save_checkpoint(ckpts, 3, {"step": 3}, 2)
    (live / "plots").mkdir(parents=True)
    (live / "plots" / "loss.tsv").write_text("step\tloss\n0\t1.0\n")
    content = a.read_bytes()
    dest = checkpoints.move_aside(ckpts, also=[live])
    assert dest.parent == ckpts / checkpoints.PREVIOUS
    assert checkpoints.list_checkpoints(ckpts) == [] and not live.exists()
    assert (dest / a.name).read_bytes() == content
    assert (dest / "train" / "plots" / "loss.tsv").read_text().startswith("step")
    assert checkpoints.move_aside(ckpts, also=[live]) is None  # nothing left to move


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


def tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_kill_during_the_export_leaves_the_previous_model_whole(tmp_path):
    """model/ is one run's: a kill after model.pt but before hf/ is written leaves the previous export as it was,
    and the next export clears what the killed one left."""
    from gptcore.data.tokenizers import CharTokenizer

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
    checkpoints.save_checkpoint(tmp_path, 4, {"step": 4}, keep=2)
    (tmp_path / ".ckpt_0000006.pt.123.abcd.tmp").write_bytes(b"x" * 1000)
    (tmp_path / ".best_0000005.pt.9f2e.tmp").write_bytes(b"x" * 10)
    (tmp_path / "notes.tmp").write_bytes(b"not ours")
    resume, notes = checkpoints.prepare_resume(tmp_path, {"model": {"init_from": "scratch"}}, is_main=True)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["notes.tmp"]
    assert resume is None and "removed 2 temp file(s) of interrupted saves" in notes[0]


def test_a_start_from_a_file_the_run_would_move_aside_is_refused(tmp_path, monkeypatch):
    from gptcore.params import ParamError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints" / "previous" / "old").mkdir(parents=True)
    for spec in ("checkpoints/ckpt_0000030.pt", "./checkpoints/best_0000020.pt", str(tmp_path / "checkpoints/x.pt")):
        with pytest.raises(ParamError, match="model.init_from=.*copy it out first"):
            checkpoints.check_init_from(spec, tmp_path / "checkpoints")
    for spec in ("scratch", "gpt2", "model", "init.pt", "checkpoints/previous/old/ckpt_0000030.pt"):
        checkpoints.check_init_from(spec, tmp_path / "checkpoints")


def test_an_earlier_run_with_the_same_params_is_brought_back_not_retrained(tmp_path):
    """`dvc exp apply` of an earlier experiment, then `dvc repro`: params A, then B (A moved aside), then A again.
    The third run resumes A's checkpoints from checkpoints/previous/ and its step metrics; B's move aside."""
    ckpts, live = tmp_path / "checkpoints", tmp_path / "metrics" / "train"
    a = {"model": {"init_from": "scratch"}, "train": {"max_lr": 6e-4}}
    b = {"model": {"init_from": "scratch"}, "train": {"max_lr": 1e-3}}

    def run(params, tag):  # what a finished train leaves: its checkpoints and its step metrics
        resume, notes = checkpoints.prepare_resume(ckpts, params, is_main=True, also=[live])
        for step in (3, 6):
            checkpoints.save_checkpoint(ckpts, step, {"step": step, "params": params, "tag": tag,
                                                     "fingerprint": checkpoints.run_fingerprint(params)}, keep=2)
        live.mkdir(parents=True, exist_ok=True)
        (live / "train_loss.tsv").write_text(f"run {tag}\n")
        return resume, notes

    assert run(a, "A")[0] is None
    assert run(b, "B")[0] is None
    resume, notes = checkpoints.prepare_resume(ckpts, a, is_main=True, also=[live])
    assert resume["tag"] == "A" and resume["step"] == 6
    assert "holds a run with these params (step 6): bringing it back" in notes[0]
    assert notes[-1] == f"resuming from {ckpts / 'ckpt_0000006.pt'} (step 6)"
    assert [checkpoints.load_checkpoint(p)["tag"] for p in checkpoints.list_checkpoints(ckpts)] == ["A", "A"]
    assert (live / "train_loss.tsv").read_text() == "run A\n"
    kept = sorted((ckpts / checkpoints.PREVIOUS).iterdir())  # nothing lost: B waits there as A did
    assert len(kept) == 1 and (kept[0] / "train" / "train_loss.tsv").read_text() == "run B\n"
    assert [checkpoints.load_checkpoint(p)["tag"] for p in checkpoints.list_checkpoints(kept[0])] == ["B", "B"]
    assert checkpoints.prepare_resume(ckpts, a, is_main=True, also=[live])[0]["tag"] == "A"  # and stays resumed


def test_earlier_runs_of_other_params_stay_where_they_are_and_an_unreadable_one_stops_nothing(tmp_path):
    a, b, c = ({"model": {"init_from": "scratch"}, "train": {"max_lr": lr}} for lr in (1e-4, 2e-4, 3e-4))
    for params in (a, b):
        checkpoints.prepare_resume(tmp_path, params, is_main=True)
        checkpoints.save_checkpoint(tmp_path, 3, {"step": 3, "params": params,
                                                 "fingerprint": checkpoints.run_fingerprint(params)}, keep=2)
    kept = next((tmp_path / checkpoints.PREVIOUS).iterdir()) / "ckpt_0000003.pt"  # a's run
    resume, notes = checkpoints.prepare_resume(tmp_path, c, is_main=True)
    assert resume is None and notes[0].endswith("starting fresh (train.max_lr: 0.0002 -> 0.0003)")
    assert len(list((tmp_path / checkpoints.PREVIOUS).iterdir())) == 2 and kept.is_file()
    kept.write_bytes(torch_zip(tmp_path, {**checkpoints.load_checkpoint(kept), FORMAT_KEY: CHECKPOINT_FORMAT + 1}))
    resume, notes = checkpoints.prepare_resume(tmp_path, a, is_main=True)  # an archive never stops a run
    assert resume is None and f"checkpoint format {CHECKPOINT_FORMAT + 1}" in notes[0]
    assert f"(so the run in {kept.parent} was not considered for resuming)" in notes[0]
    assert kept.is_file() and notes[0].endswith("starting from step 0")


def test_a_run_is_never_resumed_onto_another_run_s_curves(tmp_path):
    """`dvc exp apply A` restores A's metrics/train (a DVC out) but not checkpoints/; a `dvc exp run` with B's params
    then found B's finished checkpoints and resumed them over A's curves: A's train loss beside B's val loss, silently.
    Now the curves carry their run's fingerprint, and a mismatch starts fresh with everything kept."""
    ckpts, live = tmp_path / "checkpoints", tmp_path / "metrics" / "train"
    a = {"model": {"init_from": "scratch"}, "train": {"max_lr": 6e-4}}
    b = {"model": {"init_from": "scratch"}, "train": {"max_lr": 1e-3}}
    assert checkpoints.prepare_resume(ckpts, b, is_main=True, also=[live])[0] is None
    checkpoints.save_checkpoint(ckpts, 6, {"step": 6, "params": b, "fingerprint": checkpoints.run_fingerprint(b)},
                                keep=2)
    assert (live / checkpoints.CURVES_STAMP).read_text().strip() == checkpoints.run_fingerprint(b)
    assert checkpoints.prepare_resume(ckpts, b, is_main=True, also=[live])[0]["step"] == 6  # its own curves: resumed
    (live / checkpoints.CURVES_STAMP).write_text(checkpoints.run_fingerprint(a) + "\n")  # what exp apply A leaves
    (live / "train_loss.tsv").write_text("run A\n")

    resume, notes = checkpoints.prepare_resume(ckpts, b, is_main=True, also=[live])
    assert resume is None
    assert f"{live}/ holds another run's step metrics" in notes[0] and notes[0].endswith("starting from step 0")
    kept = next((ckpts / checkpoints.PREVIOUS).iterdir())  # nothing lost: B's weights and A's curves, side by side
    assert (kept / "ckpt_0000006.pt").is_file() and (kept / "train" / "train_loss.tsv").read_text() == "run A\n"
    assert not (live / "train_loss.tsv").exists()
    assert (live / checkpoints.CURVES_STAMP).read_text().strip() == checkpoints.run_fingerprint(b)
    resume, notes = checkpoints.prepare_resume(ckpts, b, is_main=True, also=[live])  # nor is that pair brought back
    assert resume is None and (kept / "ckpt_0000006.pt").is_file()
