"""README's two-node torchrun recipe, run as two nodes on one machine: \
the same weights as one node with two processes."""
import re
import shlex
import socket
import subprocess
import sys

import pytest
import torch
from stagekit import ROOT, env, make_project, run_stage, write_gpt2_shards

from gptcore.train import checkpoints


def readme_node_commands() -> list[list[str]]:
    """The README's `torchrun --nnodes=2 ...` lines, one per node, split as a shell would."""
    lines = [ln for ln in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
             if ln.startswith("torchrun --nnodes=2")]
    assert len(lines) == 2, f"README should show one torchrun line per node, found {lines}"
    return [shlex.split(ln) for ln in lines]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_local_node(cmd: list[str], port: int) -> list[str]:
    """One README line for this machine: one process per node, the rendezvous on localhost; nothing else changes."""
    out = [sys.executable, "-m", "torch.distributed.run"]
    for arg in cmd[1:]:
        arg = re.sub(r"^--nproc_per_node=\d+$", "--nproc_per_node=1", arg)
        arg = re.sub(r"^--rdzv_endpoint=host0:\d+$", f"--rdzv_endpoint=127.0.0.1:{port}", arg)
        out.append(arg)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_readme_two_node_recipe_equals_one_node_with_two_processes(tmp_path_factory, parallel):
    """With train.parallel fsdp too. Every rank writes its part of a checkpoint (torch.distributed.checkpoint, in
    either mode), so checkpoints/ must be on storage both nodes see at the same path (README): both nodes run in one
    folder."""
    commands = readme_node_commands()
    for cmd in commands:  # what the recipe relies on: a c10d rendezvous, no --standalone
        assert "--rdzv_backend=c10d" in cmd and "--standalone" not in cmd and cmd[-2:] == ["-m", "stages.train"]
    shards = write_gpt2_shards(tmp_path_factory.mktemp("shards"))
    root = tmp_path_factory.mktemp("multinode")
    shared = make_project(root / "shared", shards, nproc=1, parallel=parallel)
    nodes = [shared, shared]  # each node's command runs in the one folder both see
    port = free_port()
    procs = [subprocess.Popen(as_local_node(cmd, port), cwd=node, env=env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for cmd, node in zip(commands, nodes)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    newest = checkpoints.latest_checkpoint(shared / "checkpoints")  # a shard from each node's rank
    assert {"__0_0.distcp", "__1_0.distcp"} <= {p.name for p in newest.iterdir()}
    assert checkpoints.read(newest)["world_size"] == 2
    assert "2 x cpu" in "".join(outs)
    one_node = make_project(root / "one_node", shards, nproc=2, parallel=parallel)
    run_stage(one_node, "train", 2)
    a = checkpoints.load_checkpoint(shared / "model" / "model.pt")["model"]
    b = checkpoints.load_checkpoint(one_node / "model" / "model.pt")["model"]
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
