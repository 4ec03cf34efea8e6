"""train.parallel fsdp through the train stage on the CPU (gloo): the same training as ddp and as one process,
checkpoints (the one format, a shard from each rank) that survive kill -9 (in training and in a save) and resume
bit-identically on the same number of processes, on another number (2 -> 1, 2 -> 3) and in the other mode within float
tolerance, faults refused, the same model/ bytes as ddp, and the memory it saves.

Tolerances, measured here (2-layer 32-wide GPT-2, fp32, 12 steps at max_lr 1e-3 unless said; one thread a rank):
- fsdp against ddp and one process, every step's train loss: 1.9e-6; final weights: 1.9e-6. The two sum in
  another order (each micro step's gradients reduce-scattered against all-reduced once; the clip's norm from the
  shards'), nothing else. Asserted: 2e-5 both.
- the modern recipe (Muon), with Newton-Schulz in fp32 in both (tests/inject: torch runs it in bf16, where a last
  bit rounded otherwise changes an update by up to 1e-3, as tests/test_loss_curve.py measured across kernels):
  losses 9.5e-7, weights 3.3e-6, but for 13 of the 1.6M elements of the token table (8.4e-4): their gradients are
  near Adam's eps after the zero-initialised head's first steps, where g / (|g| + eps) turns a last-bit difference
  into a visible one. Asserted: losses 1e-5; weights 2e-5, the token table's largest 2e-3 with at most 1e-4 of its
  elements over 2e-5.
- a resume on another number of processes or in the other mode, against the uninterrupted run: printed by each test
  (1.7e-6 to 1.8e-6 measured for 2 -> 1, fsdp -> ddp and ddp -> fsdp); asserted 2e-5.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from stagekit import REF_DATA, env, make_project, run_stage, stage_cmd, tsv, write_gpt2_shards
from test_training import (
    MODERN_MODEL,
    MODERN_TRAIN,
    best_opts,
    kill_after_checkpoint,
    model_tree,
    strace_works,
    write_tiny_shards,
)

from gptcore.train import checkpoints

pytestmark = pytest.mark.slow  # training runs through the stage, in subprocesses
# 384 tokens a step: 2 ranks x 3 micro steps, 3 ranks x 2, 1 rank x 6, all of micro batch 2 x 32
RUN = dict(nproc=2, micro_batch=2, total_batch_tokens=384, max_steps=12, ckpt_every=3, keep_checkpoints=10)
TOL = 2e-5


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_gpt2_shards(tmp_path_factory.mktemp("shards"))


def train(project: Path, **inject: str) -> str:
    """The train stage as dvc runs it (it launches train.nproc ranks itself); its stdout, then its stderr."""
    proc = run_stage(project, "train", 1, **inject)
    return proc.stdout + proc.stderr


def weights(project: Path) -> dict[str, torch.Tensor]:
    return checkpoints.load_checkpoint(project / "model" / "model.pt")["model"]


def largest_difference(a: Path, b: Path) -> float:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def straight(shards, tmp_path_factory):
    """The uninterrupted runs of RUN: fsdp and ddp on 2 processes, and 1 process (6 micro steps a step)."""
    root = tmp_path_factory.mktemp("straight")
    runs = {"fsdp": make_project(root / "fsdp", shards, parallel="fsdp", **RUN),
            "ddp": make_project(root / "ddp", shards, **RUN),
            "one": make_project(root / "one", shards, **{**RUN, "nproc": 1})}
    for project in runs.values():
        train(project)
    return runs


def resumed(source: Path, target: Path, shards: Path, at: int, **change) -> tuple[Path, str]:
    """`source`'s checkpoints up to step `at` (what a kill after that save leaves) in a new project of its params
    with `change`, trained to the end; the project and its stdout."""
    params = yaml.safe_load((source / "params.yaml").read_text(encoding="utf-8"))
    project = make_project(target, shards, model=params["model"], **{**params["train"], **change})
    shutil.copytree(source / "checkpoints", project / "checkpoints", symlinks=True,
                    ignore=lambda folder, names: [n for n in names if n.startswith("ckpt_") and n[5:12].isdigit() and
                                                  int(n[5:12]) > at])
    return project, train(project)


def test_fsdp_on_two_ranks_trains_as_ddp_and_one_process(straight):
    out = (straight["fsdp"] / "metrics" / "train" / "metrics.json").read_text(encoding="utf-8")
    assert json.loads(out)["step"] == 12
    losses = {name: tsv(p, "train_loss") for name, p in straight.items()}
    assert [s for s, _ in losses["fsdp"]] == list(range(12))
    for other in ("ddp", "one"):
        np.testing.assert_allclose([v for _, v in losses["fsdp"]], [v for _, v in losses[other]], atol=TOL, rtol=0)
        worst = largest_difference(straight["fsdp"], straight[other])
        print(f"fsdp against {other}: largest weight difference {worst:.2e}")
        assert worst < TOL
    ckpts = sorted(p.name for p in (straight["fsdp"] / "checkpoints").iterdir() if p.name.startswith("ckpt_"))
    assert ckpts == [f"ckpt_{s:07d}" for s in (3, 6, 9, 12)]
    files = sorted(p.name for p in (straight["fsdp"] / "checkpoints" / ckpts[-1]).iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "digests.json", "record.pt"]  # a shard a rank


def test_the_modern_recipe_with_muon_on_sharded_weights_trains_as_ddp_and_one_process(tmp_path, shards):
    """Muon orthogonalises each sharded matrix whole: the same updates as ddp's and one process's, to fp32
    precision (see above)."""
    opts = dict(model=MODERN_MODEL, **{**RUN, **MODERN_TRAIN})
    runs = {mode: make_project(tmp_path / mode, shards, parallel=mode, **opts) for mode in ("fsdp", "ddp")}
    runs["one"] = make_project(tmp_path / "one", shards, **{**opts, "nproc": 1})
    for project in runs.values():
        train(project, GPTCORE_TEST_NS_FP32="1")
    for other in ("ddp", "one"):
        a, b = (tsv(runs[m], "train_loss") for m in ("fsdp", other))
        np.testing.assert_allclose([v for _, v in a], [v for _, v in b], atol=1e-5, rtol=0)
        wa, wb = weights(runs["fsdp"]), weights(runs[other])
        for k in wa:
            diff = (wa[k] - wb[k]).abs()
            if k == "transformer.wte.weight":
                # a token seen too rarely to have a gradient above rounding gets an Adam step whose sign the
                # reduction order decides: such tokens are rare, and each differs by less than one step at embed_lr
                print(f"against {other}, token table: largest difference {float(diff.max()):.2e}, "
                      f"{int((diff > TOL).sum())} of {diff.numel():,} elements over {TOL}")
                assert float(diff.max()) < MODERN_TRAIN["embed_lr"] and int((diff > TOL).sum()) <= 1e-4 * diff.numel()
            else:
                assert float(diff.max()) < TOL, (other, k)


def test_kill_9_in_training_then_a_rerun_is_bit_identical(tmp_path, shards, straight):
    """With text samples at each eval: every rank draws them in lockstep (each token a gather of every block), rank 0
    writes them; their own generator leaves the training bit-identical to the run without them."""
    killed = make_project(tmp_path / "killed", shards, parallel="fsdp", samples=1, sample_tokens=4, **RUN)
    kill_after_checkpoint(killed, 1, ckpt_step=6)
    newest = sorted((killed / "checkpoints").glob("ckpt_*"))[-1]
    out = train(killed)
    assert f"resuming from checkpoints/{newest.name}" in out
    assert same_weights(killed, straight["fsdp"])
    assert tsv(killed, "train_loss") == tsv(straight["fsdp"], "train_loss")
    assert sorted(p.name for p in (killed / "metrics/train/samples").iterdir()) == [
        f"step_{s:07d}.txt" for s in (0, 5, 10, 12)]


@pytest.mark.parametrize("point,rank", [("shard", "1"), ("rename", "0")])
def test_kill_9_in_a_sharded_save_keeps_the_last_checkpoint_and_the_rerun_is_bit_identical(
        tmp_path, shards, straight, point, rank):
    """Rank 1 killed right after writing its shard of step 6's save (rank 0 still waiting for it), or rank 0 right
    before it renames the whole folder in: step 3's checkpoint is the newest, and the rerun resumes from it."""
    killed = make_project(tmp_path / "killed", shards, parallel="fsdp", **RUN)
    proc = subprocess.run(stage_cmd("train"), cwd=killed, env=env(GPTCORE_TEST_KILL_SAVE=f"6:{point}:{rank}"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 137, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"[train] rank {rank} (pid" in proc.stderr and "was killed by SIGKILL" in proc.stderr
    assert [p.name for p in checkpoints.list_checkpoints(killed / "checkpoints")] == ["ckpt_0000003"]
    left = sorted(p.name for p in (killed / "checkpoints").iterdir() if p.name.endswith(".tmp"))
    out = train(killed)
    if left:  # rank 0 died holding the temp folder: the rerun removes it and says so
        assert left == [".ckpt_0000006.tmp"] and "removed 1 temp file(s) of interrupted saves" in out
    assert "resuming from checkpoints/ckpt_0000003 (step 3)" in out
    assert same_weights(killed, straight["fsdp"])
    assert not any(p.name.endswith(".tmp") for p in (killed / "checkpoints").iterdir())


@pytest.mark.parametrize("nproc", [1, 3])
def test_a_sharded_checkpoint_resumes_on_another_number_of_processes(tmp_path, shards, straight, nproc):
    """torch.distributed.checkpoint reads the 2 ranks' shards into 1 or 3: exactly the saved state (the first
    step after it gives the uninterrupted run's loss), then float tolerance of summing in another order."""
    project, out = resumed(straight["fsdp"], tmp_path / "resumed", shards, 6, nproc=nproc)
    assert "resuming from checkpoints/ckpt_0000006 (step 6)" in out and f"{nproc} x cpu (fsdp" in out
    assert "torch.distributed is disabled" not in out
    worst = largest_difference(project, straight["fsdp"])
    print(f"fsdp 2 -> {nproc} processes at step 6 of 12: largest weight difference {worst:.2e}")
    assert worst < TOL
    after, before = tsv(project, "train_loss"), tsv(straight["fsdp"], "train_loss")[6:]
    assert [s for s, _ in after] == [s for s, _ in before] == list(range(6, 12))
    assert abs(after[0][1] - before[0][1]) < 1e-6  # step 6 from the loaded weights: only the sums' order differs
    np.testing.assert_allclose([v for _, v in after], [v for _, v in before], atol=TOL, rtol=0)


@pytest.mark.parametrize("source,mode", [("fsdp", "ddp"), ("ddp", "fsdp")])
def test_parallel_switched_on_resume_continues_within_tolerance(tmp_path, shards, straight, source, mode):
    """train.parallel may change on resume: one format for both, read by name, each rank reading what its mode
    holds (every weight whole under ddp, its shards under fsdp); the run continues as the other mode would from the
    same state."""
    project, out = resumed(straight[source], tmp_path / "resumed", shards, 6, parallel=mode)
    assert "resuming from checkpoints/ckpt_0000006 (step 6)" in out
    assert "torch.distributed is disabled" not in out  # the false warning an fsdp checkpoint gave each ddp rank
    worst = largest_difference(project, straight[source])
    print(f"{source} -> {mode} at step 6 of 12: largest weight difference {worst:.2e}")
    assert worst < TOL
    assert checkpoints.latest_checkpoint(project / "checkpoints").name == "ckpt_0000012"


def test_the_fsdp_export_is_the_ddp_export_byte_for_byte(tmp_path, shards, straight):
    """The ddp run's finished checkpoints resumed under fsdp: the weights are read into shards, gathered whole again
    on rank 0 and exported; model/ (model.pt, hf/, manifest, tokenizer) is the ddp run's, byte for byte."""
    project, out = resumed(straight["ddp"], tmp_path / "switched", shards, 12, parallel="fsdp")
    assert "resuming from checkpoints/ckpt_0000012 (step 12)" in out and "(fsdp" in out
    assert model_tree(project) == model_tree(straight["ddp"])


def test_bf16_under_fsdp_trains_close_to_ddp_and_resumes_bit_identically(tmp_path, shards):
    """bf16 blocks (FSDP's mixed precision) against ddp's bf16 autocast: the same losses to bf16 precision; killed
    after a checkpoint, the rerun ends on the uninterrupted run's weights, bit for bit."""
    opts = dict(RUN, dtype="bfloat16", max_steps=9)
    runs = {m: make_project(tmp_path / m, shards, parallel=m, **opts) for m in ("fsdp", "ddp")}
    for project in runs.values():
        train(project)
    a, b = (tsv(runs[m], "train_loss") for m in ("fsdp", "ddp"))
    np.testing.assert_allclose([v for _, v in a], [v for _, v in b], atol=1e-3, rtol=0)
    killed = make_project(tmp_path / "killed", shards, parallel="fsdp", **opts)
    kill_after_checkpoint(killed, 1, ckpt_step=3)
    assert "resuming from" in train(killed)
    assert same_weights(killed, runs["fsdp"])


@pytest.mark.skipif(not strace_works(), reason="needs a working strace (ptrace) for fault injection")
def test_an_io_error_reading_a_shard_in_the_ranks_stops_in_one_line_and_the_rerun_resumes(tmp_path, shards,
                                                                                          straight):
    """A real EIO (strace's fault injection) on every read of one rank's shard file: the check of its sha256, on rank
    0 before any rank loads, stops in one line, every file stays, and without the fault the run resumes."""
    project, _ = resumed(straight["fsdp"], tmp_path / "eio", shards, 6, max_steps=12)
    shutil.rmtree(project / "model")  # resumed() trained it already: start again from step 6's checkpoint
    for p in (project / "checkpoints").iterdir():
        if p.name.startswith("ckpt_") and int(p.name[5:12]) > 6:
            shutil.rmtree(p)
    shard = project / "checkpoints" / "ckpt_0000006" / "__1_0.distcp"
    before = {p: p.read_bytes() for p in shard.parent.iterdir()}
    cmd = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=read,pread64", "-e",
           "inject=read,pread64:error=EIO", "-P", str(shard), *stage_cmd("train")]
    proc = subprocess.run(cmd, cwd=project, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[train")]
    assert lines == ["[train] checkpoints/ckpt_0000006/__1_0.distcp: cannot read it (EIO: Input/output error); the "
                     "file is kept as it is: check the disk and this user's access to it, then run again"], \
        proc.stderr[-3000:]
    assert {p: p.read_bytes() for p in shard.parent.iterdir()} == before
    assert "resuming from checkpoints/ckpt_0000006 (step 6)" in train(project)
    assert same_weights(project, straight["fsdp"])


def test_export_best_under_fsdp_gathers_the_best_weights(tmp_path):
    """train.export best: each new lowest val loss's weights gathered whole to checkpoints/best_*.pt by rank 0;
    model/ gets them, as under ddp (the same best step; the weights within the tolerance above)."""
    tiny = write_tiny_shards(tmp_path / "tiny")
    opts = dict(best_opts(), nproc=2, max_steps=24, micro_batch=2)  # 128 tokens a step: 2 ranks x 2 x 32
    runs = {m: make_project(tmp_path / m, tiny, parallel=m, **opts) for m in ("fsdp", "ddp")}
    outs = {m: train(p) for m, p in runs.items()}
    best = {m: json.loads((p / "model" / "manifest.json").read_text())["best_step"] for m, p in runs.items()}
    assert best["fsdp"] == best["ddp"] < 24 and f"model/: the best weights, step {best['fsdp']} of 24" in outs["fsdp"]
    assert [p.name for p in checkpoints.list_checkpoints(runs["fsdp"] / "checkpoints", checkpoints.BEST_RE)] == [
        f"best_{best['fsdp']:07d}.pt"]
    kept = checkpoints.load_checkpoint(runs["fsdp"] / "checkpoints" / f"best_{best['fsdp']:07d}.pt")["model"]
    assert all(torch.equal(kept[k], v) for k, v in weights(runs["fsdp"]).items())
    assert largest_difference(runs["fsdp"], runs["ddp"]) < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fsdp_on_one_cuda_device_compiled_in_bf16_saves_and_resumes(tmp_path):
    """bench/device_check.sh runs this where a GPU is lent (in-process, random tokens: the device image has torch
    but not every package the stage uses): FSDP2 over NCCL (a group of one), its bf16 blocks and fp32 root,
    torch.compile, the rotary table moved to the GPU with the root, sharded checkpoints of CUDA tensors, and a
    resume from step 3 of 6 (the printed difference says whether CUDA's kernels kept it bit-identical)."""
    from gptcore import distributed
    from gptcore.data.loader import TokenLoader
    from gptcore.model.gpt import GPT, GPTConfig
    from gptcore.report.steplog import StepLogger
    from gptcore.train.config import TrainConfig
    from gptcore.train.parallel import whole_state
    from gptcore.train.trainer import Trainer

    shard = tmp_path / "train_000000.npy"
    np.save(shard, np.random.default_rng(0).integers(0, 50257, 200_000, dtype=np.uint16))
    cfg = TrainConfig.read({"parallel": "fsdp", "device": "cuda", "dtype": "bfloat16", "compile": True,
                            "micro_batch": 4, "total_batch_tokens": 512, "max_steps": 6, "warmup_steps": 1,
                            "max_lr": 1e-3, "eval_every": 0, "val_tokens": 64, "ckpt_every": 3,
                            "keep_checkpoints": 10, **MODERN_TRAIN})
    shape = {k: v for k, v in MODERN_MODEL.items()}
    env = distributed.setup("cuda")

    def trainer(ckpt_dir, resume_from=None):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=50304, **shape))
        loader = TokenLoader([shard], 4, 64, 512)
        return Trainer(model, loader, cfg, env, ckpt_dir, StepLogger(tmp_path, enabled=False), {},
                       resume_from=resume_from)

    straight = trainer(tmp_path / "a")
    assert "1 x cuda:0 (fsdp" in straight.describe()
    straight.fit()
    assert checkpoints.latest_checkpoint(tmp_path / "a").name == "ckpt_0000006"
    shutil.copytree(tmp_path / "a" / "ckpt_0000003", tmp_path / "b" / "ckpt_0000003")
    again = trainer(tmp_path / "b", checkpoints.read(tmp_path / "b" / "ckpt_0000003"))
    assert again.step == 3
    again.fit()
    wa, wb = whole_state(straight.raw_model), whole_state(again.raw_model)
    worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    print(f"cuda, fsdp, bf16, compiled: resumed at step 3 of 6, largest weight difference {worst:.2e}")
    assert all(torch.isfinite(v).all() for v in wa.values()) and worst < 1e-2


HELLASWAG = REF_DATA / "hellaswag_val_preprocessed.jsonl"


@pytest.mark.skipif(not HELLASWAG.is_file(), reason="needs ../shared/ref-data's HellaSwag sample")
def test_hellaswag_inside_fsdp_training_scores_in_lockstep_as_ddp(tmp_path, shards):
    """9 examples in batches of 4 over 2 ranks: rank 0 scores 5 in two batches, rank 1 4 in one, and repeats one so
    that both run the same gathers. The scores are ddp's."""
    opts = dict(nproc=2, micro_batch=2, total_batch_tokens=512, max_steps=4, eval_every=2, eval_batch=4,
                tasks=["hellaswag"], hellaswag_path=str(HELLASWAG), hellaswag_examples=9)
    runs = {m: make_project(tmp_path / m, shards, model={"block_size": 128}, parallel=m, **opts)
            for m in ("fsdp", "ddp")}
    for project in runs.values():
        train(project)
    curves = {m: tsv(p, "hellaswag_acc_norm") for m, p in runs.items()}
    assert [s for s, _ in curves["fsdp"]] == [0, 2, 4] and curves["fsdp"] == curves["ddp"]
