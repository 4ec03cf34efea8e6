import datetime
import errno
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

from gptcore.errors import UserError
from gptcore.model.checkpoint_file import CHECKPOINT_FORMAT, FORMAT_KEY, CheckpointRefused, CorruptCheckpoint
from gptcore.model.config import ModelConfig
from gptcore.model.export import export_model
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.model.load import init_model, load_model
from gptcore.train import checkpoints, run_folder

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
        from gptcore.train import checkpoints, run_folder
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
    state = {"params": params, "fingerprint": run_folder.run_fingerprint(params), "w": torch.arange(8.0)}
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
        run_folder.prepare_resume(tmp_path, params, is_main=True)
    assert tree(tmp_path) == before
    monkeypatch.setattr(torch, "load", real_load)
    resume, notes = run_folder.prepare_resume(tmp_path, params, is_main=True)
    assert resume["step"] == 9 and notes == [f"resuming from {tmp_path / 'ckpt_0000009.pt'} (step 9)"]


def test_a_bug_while_loading_keeps_its_traceback_and_the_files(tmp_path, monkeypatch):
    params, before = three_checkpoints(tmp_path)
    monkeypatch.setattr(torch, "load", lambda *a, **k: {}["missing"])
    with pytest.raises(KeyError):
        run_folder.prepare_resume(tmp_path, params, is_main=True)
    assert tree(tmp_path) == before


def test_a_global_the_weights_only_loader_refuses_stops_the_run_and_keeps_the_file(tmp_path):
    """As after a torch upgrade whose loader no longer allows a global the file holds: readable, not damaged."""
    params, _ = three_checkpoints(tmp_path)
    newest = tmp_path / "ckpt_0000009.pt"
    newest.write_bytes(torch_zip(tmp_path, {"step": 9, "params": params, "when": datetime.date(2026, 1, 1)}))
    before = tree(tmp_path)
    with pytest.raises(CheckpointRefused, match=r"ckpt_0000009.pt: not loadable as plain tensors by torch .* "
                                                r"\(Unsupported global: GLOBAL datetime.date\); the file is kept"):
        run_folder.find_resume(tmp_path, params)
    assert tree(tmp_path) == before


def test_a_checkpoint_of_another_format_version_is_refused_not_guessed_at(tmp_path):
    params, _ = three_checkpoints(tmp_path)
    assert checkpoints.load_checkpoint(tmp_path / "ckpt_0000003.pt")[FORMAT_KEY] == CHECKPOINT_FORMAT
    newest = tmp_path / "ckpt_0000009.pt"
    newest.write_bytes(torch_zip(tmp_path, {**checkpoints.load_checkpoint(newest), FORMAT_KEY: CHECKPOINT_FORMAT + 1}))
    before = tree(tmp_path)
    with pytest.raises(CheckpointRefused, match=f"ckpt_0000009.pt: checkpoint format {CHECKPOINT_FORMAT + 1}, but "
                                                f"this gptcore reads format {CHECKPOINT_FORMAT}; the file is kept"):
        run_folder.prepare_resume(tmp_path, params, is_main=True)
    assert tree(tmp_path) == before


def test_fingerprint_and_diff():
    a = {"train": {"max_lr": 6e-4, "seed": 1}, "model": {"n_layer": 2}}
    b = {"train": {"max_lr": 1e-3, "seed": 1}, "model": {"n_layer": 2}}
    assert run_folder.run_fingerprint(a) == run_folder.run_fingerprint(
        {"model": {"n_layer": 2}, "train": {"seed": 1, "max_lr": 6e-4}})
    assert run_folder.run_fingerprint(a) != run_folder.run_fingerprint(b)
    assert run_folder.param_diff(a, b) == ["train.max_lr: 0.0006 -> 0.001"]


def test_find_resume_refuses_other_params(tmp_path):
    params = {"train": {"max_lr": 6e-4}}
    checkpoints.save_checkpoint(tmp_path, 5,
                                {"step": 5, "params": params, "fingerprint": run_folder.run_fingerprint(params)}, 2)
    path, ckpt, why = run_folder.find_resume(tmp_path, params)
    assert path is not None and ckpt["step"] == 5 and "resuming" in why
    path, ckpt, why = run_folder.find_resume(tmp_path, {"train": {"max_lr": 1e-3}})
    assert path is None and ckpt is None and "train.max_lr: 0.0006 -> 0.001" in why


def test_unreadable_newest_checkpoint_is_set_aside_and_the_older_one_resumes(tmp_path):
    params = {"train": {"max_lr": 6e-4}}
    state = {"params": params, "fingerprint": run_folder.run_fingerprint(params)}
    checkpoints.save_checkpoint(tmp_path, 3, {**state, "step": 3}, 2)
    newest = checkpoints.save_checkpoint(tmp_path, 6, {**state, "step": 6}, 2)
    newest.write_bytes(newest.read_bytes()[:100])  # truncated, as a full disk or a kill during a copy leaves it
    path, ckpt, why = run_folder.find_resume(tmp_path, params)
    assert path == tmp_path / "ckpt_0000003.pt" and ckpt["step"] == 3
    assert "ckpt_0000006.pt: cannot read checkpoint: a zip archive cut short" in why and "resuming from" in why
    assert not newest.exists() and (tmp_path / "ckpt_0000006.pt.corrupt").stat().st_size == 100


def test_move_aside_keeps_the_previous_run(tmp_path):
    ckpts, live = tmp_path / "checkpoints", tmp_path / "metrics" / "train"
    a = checkpoints.save_checkpoint(ckpts, 3, {"step": 3}, 2)
    (live / "plots").mkdir(parents=True)
    (live / "plots" / "loss.tsv").write_text("step\tloss\n0\t1.0\n")
    content = a.read_bytes()
    dest = run_folder.move_aside(ckpts, also=[live])
    assert dest.parent == ckpts / run_folder.PREVIOUS
    assert checkpoints.list_checkpoints(ckpts) == [] and not live.exists()
    assert (dest / a.name).read_bytes() == content
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


def tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


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
    checkpoints.save_checkpoint(tmp_path, 4, {"step": 4}, keep=2)
    (tmp_path / ".ckpt_0000006.pt.123.abcd.tmp").write_bytes(b"x" * 1000)
    (tmp_path / ".best_0000005.pt.9f2e.tmp").write_bytes(b"x" * 10)
    (tmp_path / "notes.tmp").write_bytes(b"not ours")
    resume, notes = run_folder.prepare_resume(tmp_path, {"model": {"init_from": "scratch"}}, is_main=True)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["notes.tmp"]
    assert resume is None and "removed 2 temp file(s) of interrupted saves" in notes[0]


def test_a_start_from_a_file_the_run_would_move_aside_is_refused(tmp_path, monkeypatch):
    from gptcore.params import ParamError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints" / "previous" / "old").mkdir(parents=True)
    for spec in ("checkpoints/ckpt_0000030.pt", "./checkpoints/best_0000020.pt", str(tmp_path / "checkpoints/x.pt")):
        with pytest.raises(ParamError, match="model.init_from=.*copy it out first"):
            run_folder.check_init_from(spec, tmp_path / "checkpoints")
    for spec in ("scratch", "gpt2", "model", "init.pt", "checkpoints/previous/old/ckpt_0000030.pt"):
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
            checkpoints.save_checkpoint(ckpts, step, {"step": step, "params": params, "tag": tag,
                                                     "fingerprint": run_folder.run_fingerprint(params)}, keep=2)
        live.mkdir(parents=True, exist_ok=True)
        (live / "train_loss.tsv").write_text(f"run {tag}\n")
        return resume, notes

    assert run(a, "A")[0] is None
    assert run(b, "B")[0] is None
    resume, notes = run_folder.prepare_resume(ckpts, a, is_main=True, also=[live])
    assert resume["tag"] == "A" and resume["step"] == 6
    assert "holds a run with these params (step 6): bringing it back" in notes[0]
    assert notes[-1] == f"resuming from {ckpts / 'ckpt_0000006.pt'} (step 6)"
    assert [checkpoints.load_checkpoint(p)["tag"] for p in checkpoints.list_checkpoints(ckpts)] == ["A", "A"]
    assert (live / "train_loss.tsv").read_text() == "run A\n"
    kept = sorted((ckpts / run_folder.PREVIOUS).iterdir())  # nothing lost: B waits there as A did
    assert len(kept) == 1 and (kept[0] / "train" / "train_loss.tsv").read_text() == "run B\n"
    assert [checkpoints.load_checkpoint(p)["tag"] for p in checkpoints.list_checkpoints(kept[0])] == ["B", "B"]
    assert run_folder.prepare_resume(ckpts, a, is_main=True, also=[live])[0]["tag"] == "A"  # and stays resumed


def test_earlier_runs_of_other_params_stay_where_they_are_and_an_unreadable_one_stops_nothing(tmp_path):
    a, b, c = ({"model": {"init_from": "scratch"}, "train": {"max_lr": lr}} for lr in (1e-4, 2e-4, 3e-4))
    for params in (a, b):
        run_folder.prepare_resume(tmp_path, params, is_main=True)
        checkpoints.save_checkpoint(tmp_path, 3, {"step": 3, "params": params,
                                                 "fingerprint": run_folder.run_fingerprint(params)}, keep=2)
    kept = next((tmp_path / run_folder.PREVIOUS).iterdir()) / "ckpt_0000003.pt"  # a's run
    resume, notes = run_folder.prepare_resume(tmp_path, c, is_main=True)
    assert resume is None and notes[0].endswith("starting fresh (train.max_lr: 0.0002 -> 0.0003)")
    assert len(list((tmp_path / run_folder.PREVIOUS).iterdir())) == 2 and kept.is_file()
    kept.write_bytes(torch_zip(tmp_path, {**checkpoints.load_checkpoint(kept), FORMAT_KEY: CHECKPOINT_FORMAT + 1}))
    resume, notes = run_folder.prepare_resume(tmp_path, a, is_main=True)  # an archive never stops a run
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
    assert run_folder.prepare_resume(ckpts, b, is_main=True, also=[live])[0] is None
    checkpoints.save_checkpoint(ckpts, 6, {"step": 6, "params": b, "fingerprint": run_folder.run_fingerprint(b)},
                                keep=2)
    assert (live / run_folder.CURVES_STAMP).read_text().strip() == run_folder.run_fingerprint(b)
    assert run_folder.prepare_resume(ckpts, b, is_main=True, also=[live])[0]["step"] == 6  # its own curves: resumed
    (live / run_folder.CURVES_STAMP).write_text(run_folder.run_fingerprint(a) + "\n")  # what exp apply A leaves
    (live / "train_loss.tsv").write_text("run A\n")

    resume, notes = run_folder.prepare_resume(ckpts, b, is_main=True, also=[live])
    assert resume is None
    assert f"{live}/ holds another run's step metrics" in notes[0] and notes[0].endswith("starting from step 0")
    kept = next((ckpts / run_folder.PREVIOUS).iterdir())  # nothing lost: B's weights and A's curves, side by side
    assert (kept / "ckpt_0000006.pt").is_file() and (kept / "train" / "train_loss.tsv").read_text() == "run A\n"
    assert not (live / "train_loss.tsv").exists()
    assert (live / run_folder.CURVES_STAMP).read_text().strip() == run_folder.run_fingerprint(b)
    resume, notes = run_folder.prepare_resume(ckpts, b, is_main=True, also=[live])  # nor is that pair brought back
    assert resume is None and (kept / "ckpt_0000006.pt").is_file()


# -- sharded checkpoints (train.parallel fsdp) ---------------------------------------------------------------------
# saves of a sharded model, by the trainer's own save, on 2 ranks (torchrun) or 1 process: each step given
SHARDED_SAVE = r"""
import sys
from pathlib import Path

import torch

from gptcore import distributed
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.train import checkpoints, sharded_checkpoints, run_folder
from gptcore.train.config import TrainConfig
from gptcore.train.optimizers import build_optimizers
from gptcore.train.parallel import MODES, init_optimizer_state

folder, steps = Path(sys.argv[1]), [int(s) for s in sys.argv[2:]]
env = distributed.setup("cpu")
torch.manual_seed(0)
model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64))
MODES["fsdp"].prepare(model, env, torch.float32, compile=False)
cfg = TrainConfig.read({"parallel": "fsdp", "micro_batch": 1, "total_batch_tokens": 16, "max_steps": 9,
                        "warmup_steps": 0, "max_lr": 6e-4, "eval_every": 0, "val_tokens": 16, "ckpt_every": 3})
optimizers = build_optimizers(model, cfg, "cpu")
init_optimizer_state(optimizers)
params = {"model": {"init_from": "scratch"}, "train": {"max_lr": 6e-4}}
for step in steps:
    record = {"step": step, "params": params, "fingerprint": run_folder.run_fingerprint(params)}
    sharded_checkpoints.save(folder, step, model, optimizers, record, env.is_main)
distributed.teardown()
"""
SHARDED_PARAMS = {"model": {"init_from": "scratch"}, "train": {"max_lr": 6e-4}}


@pytest.fixture(scope="module")
def sharded_saves(tmp_path_factory):
    """Two checkpoint folders, each with ckpt_0000003.dcp and ckpt_0000006.dcp: of 2 ranks, and of 1 process."""
    root = tmp_path_factory.mktemp("sharded")
    script = root / "save.py"
    script.write_text(SHARDED_SAVE, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    launch = {2: [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"],
              1: [sys.executable]}
    for nproc, cmd in launch.items():
        proc = subprocess.run([*cmd, str(script), str(root / f"ranks{nproc}"), "3", "6"], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return root


def sharded_copy(sharded_saves, tmp_path, nproc: int = 2):
    """A fresh copy of the saves of `nproc` processes, and its tree of files."""
    folder = tmp_path / "checkpoints"
    shutil.copytree(sharded_saves / f"ranks{nproc}", folder)
    return folder, sharded_tree(folder)


def sharded_tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_sharded_checkpoint_is_its_record_and_one_shard_a_rank(sharded_saves, tmp_path):
    folder, _ = sharded_copy(sharded_saves, tmp_path)
    newest = folder / "ckpt_0000006.dcp"
    assert sorted(p.name for p in newest.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "record.pt"]
    resume, notes = run_folder.prepare_resume(folder, SHARDED_PARAMS, is_main=True)
    assert resume["step"] == 6 and resume["world_size"] == 2 and resume["sharded"] == str(newest)
    assert notes == [f"resuming from {newest} (step 6)"]
    assert set(resume["files"]) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    checkpoints.remove_old(folder, keep=1)  # a folder goes by a hidden rename first: never half deleted in place
    assert [p.name for p in folder.iterdir()] == ["ckpt_0000006.dcp"]


def cut_shard(c):
    (c / "__1_0.distcp").write_bytes((c / "__1_0.distcp").read_bytes()[:100])


@pytest.mark.slow
@pytest.mark.parametrize("damage,line", [
    (cut_shard, r"__1_0.distcp is 100 bytes, but it was saved with [\d,]+ \(cut short or replaced\)"),
    (lambda c: (c / "__0_0.distcp").unlink(), r"__0_0.distcp is missing \(one of the 3 files it was saved with\)"),
    (lambda c: (c / "record.pt").unlink(), r"a sharded checkpoint without its record.pt"),
    (lambda c: (c / "record.pt").write_bytes(b""), r"record.pt: cannot read checkpoint: an empty file"),
    (lambda c: (c / ".metadata").write_bytes((c / ".metadata").read_bytes()[:50]),
     r"its .metadata is damaged or cut short"),
])
def test_a_damaged_sharded_checkpoint_is_named_set_aside_and_the_older_one_resumes(sharded_saves, tmp_path, damage,
                                                                                   line):
    folder, _ = sharded_copy(sharded_saves, tmp_path)
    damage(folder / "ckpt_0000006.dcp")
    path, ckpt, why = run_folder.find_resume(folder, SHARDED_PARAMS)
    assert path == folder / "ckpt_0000003.dcp" and ckpt["step"] == 3
    assert re.search(line, why), why
    assert f"set aside as {folder / 'ckpt_0000006.dcp.corrupt'}" in why
    assert not (folder / "ckpt_0000006.dcp").exists() and (folder / "ckpt_0000006.dcp.corrupt").is_dir()


@pytest.mark.slow
def test_the_index_of_a_save_of_another_number_of_processes_is_named(sharded_saves, tmp_path):
    """The 2 ranks' .metadata put into the one process's checkpoint of the same step: it names a shard that save
    never wrote. (A whole checkpoint of 2 ranks resumes on 1 or 3: tests/test_fsdp.py.)"""
    folder, _ = sharded_copy(sharded_saves, tmp_path, nproc=1)
    shutil.copy(sharded_saves / "ranks2" / "ckpt_0000006.dcp" / ".metadata", folder / "ckpt_0000006.dcp")
    path, ckpt, why = run_folder.find_resume(folder, SHARDED_PARAMS)
    assert path.name == "ckpt_0000003.dcp"
    assert ("its .metadata names __1_0.distcp, which this save did not write (.metadata of another save, say of "
            "another number of processes); set aside as") in why


@pytest.mark.slow
@pytest.mark.parametrize("where", ["__1_0.distcp", ".metadata", "record.pt"])
def test_an_io_error_reading_a_sharded_checkpoint_stops_in_one_line_with_every_file_in_place(
        sharded_saves, tmp_path, monkeypatch, where):
    """EIO where the check reads: a shard's size, the index, the record. Nothing is set aside: rerun once fixed."""
    folder, before = sharded_copy(sharded_saves, tmp_path)
    target = folder / "ckpt_0000006.dcp" / where
    eio = OSError(errno.EIO, "Input/output error")
    if where == "__1_0.distcp":
        real_stat = Path.stat
        monkeypatch.setattr(Path, "stat", lambda p, **k: (_ for _ in ()).throw(eio) if p == target
                            else real_stat(p, **k))
    else:
        real_open = open
        monkeypatch.setattr("builtins.open", lambda f, *a, **k: (_ for _ in ()).throw(eio) if Path(f) == target
                            else real_open(f, *a, **k))
    with pytest.raises(CheckpointRefused, match=re.escape(f"{target}: cannot read it (EIO: Input/output error); "
                                                          f"the file is kept as it is")):
        run_folder.prepare_resume(folder, SHARDED_PARAMS, is_main=True)
    monkeypatch.undo()
    assert sharded_tree(folder) == before
    resume, _ = run_folder.prepare_resume(folder, SHARDED_PARAMS, is_main=True)
    assert resume["step"] == 6


@pytest.mark.slow
def test_a_sharded_checkpoint_of_another_format_or_with_code_in_its_index_is_refused_and_kept(sharded_saves,
                                                                                          tmp_path):
    folder, _ = sharded_copy(sharded_saves, tmp_path)
    newest = folder / "ckpt_0000006.dcp"
    record = checkpoints.load_checkpoint(newest / "record.pt")
    (newest / "record.pt").write_bytes(torch_zip(tmp_path, {**record, "sharded_format": 2}))
    before = sharded_tree(folder)
    with pytest.raises(CheckpointRefused, match="ckpt_0000006.dcp: sharded checkpoint format 2, but this gptcore "
                                                "reads format 1; the folder is kept"):
        run_folder.find_resume(folder, SHARDED_PARAMS)
    assert sharded_tree(folder) == before
    older = folder / "ckpt_0000003.dcp"
    planted = tmp_path / "planted"

    class Plant:
        def __reduce__(self):
            return (os.mkdir, (str(planted),))

    (older / ".metadata").write_bytes(pickle.dumps(Plant()))
    shutil.rmtree(newest)
    with pytest.raises(CheckpointRefused, match=r"\.metadata: not read \(a global posix.mkdir that a checkpoint's "
                                                r"\.metadata never holds\); the folder is kept"):
        run_folder.find_resume(folder, SHARDED_PARAMS)
    assert not planted.exists()


@pytest.mark.slow
def test_a_sharded_save_s_temp_folder_is_removed_by_the_next_run(sharded_saves, tmp_path):
    folder, _ = sharded_copy(sharded_saves, tmp_path)
    half = folder / ".ckpt_0000009.dcp.tmp"
    half.mkdir()
    (half / "__0_0.distcp").write_bytes(b"x" * 4096)
    assert checkpoints.remove_temp_files(folder) == [
        f"removed 1 temp file(s) of interrupted saves (0.0 MB) from {folder}"]
    assert not half.exists() and len(checkpoints.list_checkpoints(folder)) == 2


@pytest.mark.slow
def test_two_ranks_shards_load_whole_into_one_process_exactly_as_torch_reads_them(sharded_saves, tmp_path):
    """The 2 ranks' shards read by one process into a whole model and optimizer (a resume on 1 process, or under
    ddp) against torch.distributed.checkpoint's own conversion of the folder to one torch.save file: equal."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from gptcore.train import sharded_checkpoints
    from gptcore.train.config import TrainConfig
    from gptcore.train.optimizers import build_optimizers

    folder = sharded_saves / "ranks2" / "ckpt_0000006.dcp"
    dcp_to_torch_save(folder, tmp_path / "whole.pt")
    reference = torch.load(tmp_path / "whole.pt", weights_only=False)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64))
    cfg = TrainConfig.read({"micro_batch": 1, "total_batch_tokens": 16, "max_steps": 9, "warmup_steps": 0,
                            "max_lr": 6e-4, "eval_every": 0, "val_tokens": 16, "ckpt_every": 3})
    optimizers = build_optimizers(model, cfg, "cpu")
    sharded_checkpoints.load(checkpoints.read_run_checkpoint(folder), model, optimizers, collective=False)
    for name, t in model.state_dict().items():
        assert torch.equal(t, reference["model"][name]), name
    state = optimizers.state_dict()["adamw"]["state"]
    saved = reference["optimizer"]["adamw"]  # torch's conversion names the weights' numbers as strings
    assert sorted(map(str, state)) == sorted(saved)
    for i, s in state.items():
        for key, t in s.items():
            assert torch.equal(t, saved[str(i)][key]), (i, key)


@pytest.mark.slow
def test_sharded_checkpoints_move_aside_whole_and_come_back(sharded_saves, tmp_path):
    """A fresh start with other params moves the sharded run's folders to previous/, each whole; the same params
    again bring them back and resume from the newest."""
    folder, before = sharded_copy(sharded_saves, tmp_path)
    other = {"model": {"init_from": "scratch"}, "train": {"max_lr": 1e-3}}
    resume, notes = run_folder.prepare_resume(folder, other, is_main=True)
    assert resume is None and "train.max_lr: 0.0006 -> 0.001" in notes[0]
    (kept,) = (folder / run_folder.PREVIOUS).iterdir()
    assert sorted(p.name for p in kept.iterdir()) == ["ckpt_0000003.dcp", "ckpt_0000006.dcp"]
    assert checkpoints.list_checkpoints(folder) == []
    resume, notes = run_folder.prepare_resume(folder, SHARDED_PARAMS, is_main=True)
    assert resume["step"] == 6 and resume["sharded"] == str(folder / "ckpt_0000006.dcp")
    assert {k: v for k, v in sharded_tree(folder).items() if k.startswith("ckpt_")} == before


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
            checkpoints.save_checkpoint(ckpts, step, {"step": step, "params": params, "tag": tag,
                                                     "fingerprint": run_folder.run_fingerprint(params)}, keep=2)
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
