"""train.parallel hsdp through the train stage on the CPU (gloo): 4 ranks as 2 nodes of 2 (two torchrun agents meeting
at a c10d rendezvous on this machine, as two nodes would; torchrun gives each rank LOCAL_WORLD_SIZE 2), the same
training as ddp and fsdp on 4 ranks; the weights really cut in 2 (not 4) shards; on one node the same run as fsdp; its
sharded checkpoint resumed under another mode and number of processes.

Tolerances, measured here (2-layer 32-wide GPT-2, fp32, 12 steps of 2 micro steps; one thread a rank): hsdp against
ddp, every step's train loss 1.9e-6, the final weights 8.5e-7; against fsdp 9.5e-7 and 7.8e-7; resumed under fsdp on
2 from step 6, 6.4e-8. The three sum gradients in other orders (each micro step reduce-scattered inside a node, the
step's sum all-reduced across nodes once; one all-reduce; a reduce-scatter a micro step), nothing else. Asserted:
2e-5, as tests/test_fsdp.py asserts fsdp against ddp.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from stagekit import env, make_project, run_stage, tsv, write_gpt2_shards
from test_fsdp import TOL, largest_difference, resumed, same_weights
from torch.distributed.checkpoint import FileSystemReader

from gptcore.train import checkpoints

pytestmark = pytest.mark.slow  # training runs through the stage, in subprocesses
# 512 tokens a step: 4 ranks x 2 micro steps of micro batch 2 x 32
RUN = dict(micro_batch=2, total_batch_tokens=512, max_steps=12, ckpt_every=6, keep_checkpoints=10)
WEIGHT = "model.transformer.h.0.attn.c_attn.weight"  # a block's matrix, as the sharded checkpoint names it


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_gpt2_shards(tmp_path_factory.mktemp("shards"))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_as_nodes(project: Path, *ranks: int, ok: bool = True) -> str:
    """The train stage on a torchrun agent a node, of `ranks[i]` ranks on node i, meeting at a c10d rendezvous here
    (what slurm/train.sbatch starts on each node); their output (`ok`: every agent must succeed)."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(ranks)}",
                               f"--nproc_per_node={n}", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                               "--rdzv_id=hsdp-test", "-m", "stages.train"],
                              cwd=project, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for n in ranks]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outs):
        assert (p.returncode == 0) == ok, out[-3000:]
    return "".join(outs)


def chunks(project: Path, step: int, name: str = WEIGHT) -> int:
    """Into how many pieces the sharded checkpoint of `step` cut weight `name` (one a shard: replicas write once)."""
    folder = project / "checkpoints" / f"ckpt_{step:07d}"
    return len(FileSystemReader(folder).read_metadata().state_dict_metadata[name].chunks)


@pytest.fixture(scope="module")
def runs(shards, tmp_path_factory):
    """hsdp on 2 nodes of 2 ranks; ddp and fsdp on one node of 4 ranks (the stage launches them)."""
    root = tmp_path_factory.mktemp("runs")
    hsdp = make_project(root / "hsdp", shards, parallel="hsdp", nproc=2, **RUN)
    out = train_as_nodes(hsdp, 2, 2)
    assert "4 x cpu (hsdp" in out
    others = {m: make_project(root / m, shards, parallel=m, nproc=4, **RUN) for m in ("ddp", "fsdp")}
    for project in others.values():
        run_stage(project, "train", 1)
    return {"hsdp": hsdp, **others}


def test_hsdp_on_two_nodes_of_two_trains_as_ddp_and_fsdp_on_four(runs):
    losses = {m: [v for _, v in tsv(p, "train_loss")] for m, p in runs.items()}
    assert len(losses["hsdp"]) == 12
    for other in ("ddp", "fsdp"):
        loss_gap = float(np.abs(np.array(losses["hsdp"]) - np.array(losses[other])).max())
        worst = largest_difference(runs["hsdp"], runs[other])
        print(f"hsdp 2 x 2 against {other} on 4: largest train loss difference {loss_gap:.2e}, weights {worst:.2e}")
        assert loss_gap < TOL and worst < TOL


def test_hsdp_shards_inside_a_node_and_replicates_across(runs):
    """A node's 2 ranks hold a weight's 2 shards (fsdp's 4 ranks: 4), and the other node the same 2 again: the
    checkpoint, which writes a replicated piece once, has 2 pieces of each weight under hsdp and 4 under fsdp."""
    assert chunks(runs["hsdp"], 12) == 2 and chunks(runs["fsdp"], 12) == 4
    moments = f"optimizer.adamw.{WEIGHT.removeprefix('model.')}.exp_avg"  # keyed by the weight's name
    assert chunks(runs["hsdp"], 12, moments) == 2  # Adam's moments are sharded alike


def test_hsdp_on_one_node_is_fsdp(tmp_path, shards):
    """On one node (LOCAL_WORLD_SIZE = every process) the mesh is one row of 2: fsdp's run, bit for bit."""
    projects = {m: make_project(tmp_path / m, shards, parallel=m, nproc=2, **{**RUN, "total_batch_tokens": 256})
                for m in ("hsdp", "fsdp")}
    outs = {m: run_stage(p, "train", 1).stdout for m, p in projects.items()}
    assert "2 x cpu (hsdp" in outs["hsdp"]
    assert same_weights(projects["hsdp"], projects["fsdp"])
    assert tsv(projects["hsdp"], "train_loss") == tsv(projects["fsdp"], "train_loss")


def test_an_hsdp_checkpoint_resumes_under_fsdp_on_one_node_of_two(tmp_path, shards, runs):
    """torch.distributed.checkpoint reads the 2 pieces of each weight into fsdp's 2 ranks: step 6 continues as the
    uninterrupted hsdp run, to float tolerance."""
    project, out = resumed(runs["hsdp"], tmp_path / "resumed", shards, 6, parallel="fsdp", nproc=2)
    assert "resuming from checkpoints/ckpt_0000006 (step 6)" in out and "2 x cpu (fsdp" in out
    worst = largest_difference(project, runs["hsdp"])
    print(f"hsdp 2 x 2 -> fsdp on 2 at step 6 of 12: largest weight difference {worst:.2e}")
    assert worst < TOL
    assert checkpoints.latest_checkpoint(project / "checkpoints").name == "ckpt_0000012"


def test_nodes_of_different_sizes_are_refused_in_one_line(tmp_path, shards):
    """A node of 2 ranks and a node of 1: no mesh row would be one node, so every rank stops naming train.parallel,
    before any step."""
    project = make_project(tmp_path / "uneven", shards, parallel="hsdp", nproc=2, **{**RUN, "total_batch_tokens": 192})
    out = train_as_nodes(project, 2, 1, ok=False)
    line = ("train.parallel='hsdp': needs as many processes on every node, found 1, 2 on the 3 processes' nodes: "
            "start the same number on each, or set train.parallel: fsdp")
    assert line in out and "gptcore/train/parallel.py" not in out, out[-3000:]  # the line, not a traceback
    assert not (project / "checkpoints").exists() or not any((project / "checkpoints").glob("ckpt_*"))
