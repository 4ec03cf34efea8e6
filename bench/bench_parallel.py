"""ddp, fsdp and hsdp at 4 gloo ranks on the CPU, as 2 nodes of 2: each rank's peak memory and the step time, and the
estimate gptcore/train/memory.py makes before allocating, against the measured peak.

A launch starts one torchrun agent a node (`--nodes`, each of `--nproc / --nodes` ranks) meeting at a c10d rendezvous
on this machine, as two nodes would; torchrun gives each rank its node's size (LOCAL_WORLD_SIZE), so hsdp shards over
a node's 2 ranks and replicates across the 2 nodes, where fsdp shards over all 4. A round launches once per mode, the
modes taking turns (ddp, fsdp, hsdp, ddp, ...), so a drift of the machine lands on all alike. In a launch each rank
builds the same GPT (the trainer's own path: Trainer with train.parallel ddp, fsdp or hsdp, AdamW, fp32 or --dtype
bfloat16), steps it --warmup untimed steps then --steps timed ones on random tokens, and reports:
- peak: the most its resident memory reached during the steps (Linux's high-water mark, reset once the model and
  trainer are built), less what the process held before the model existed: what training adds. Two steps of a
  one-block model in the same mode come first, so that what any first step loads (modules imported on first use,
  kernels, the collectives' own buffers) is in that base, not in the peak. glibc returns freed blocks over 128 KiB
  at once (MALLOC_MMAP_THRESHOLD_ fixed), so a freed gathered block leaves the resident set and is not counted as
  held;
- the step time, the median of its timed steps;
- memory.train_bytes' estimate for that rank, made from the params alone.
A round's figure of a mode is the worse of its ranks. Each figure printed is the median over rounds with the range
(min-max), and the ratios to ddp the medians of the per-round ratios. Not controlled: other work on the machine (the
ranks share its cores with it), the allocator's own rounding, the kernel's page accounting. The "nodes" share one
machine: the step times say nothing of a network between nodes.

    python bench/bench_parallel.py                  # 16 blocks of 512 wide, 4 ranks as 2 nodes, 5 rounds a mode
    python bench/bench_parallel.py --nproc 2 --nodes 1 --modes ddp fsdp   # the earlier figures: one node of 2
    python bench/bench_parallel.py --tiny           # 8 blocks of 64 wide, 2 rounds: checks the script runs (CI)
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rounds import fmt, ratios  # noqa: E402

GIB = 1 << 30
MODES = ("ddp", "fsdp", "hsdp")  # the rows, as gptcore.train.parallel.MODES names them (imported only in a worker)


def worker(args: argparse.Namespace) -> None:
    """One rank of one launch (under torchrun): build, step, measure; rank 0 prints every rank's figures as JSON."""
    import torch

    from gptcore import distributed
    from gptcore.model.config import ModelConfig
    from gptcore.model.gpt import GPT, GPTConfig
    from gptcore.train import memory
    from gptcore.train.config import TrainConfig
    from gptcore.train.trainer import Trainer

    torch.set_num_threads(1)
    env = distributed.setup("cpu")
    cpu = torch.device("cpu")
    shape = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size)
    model_cfg = ModelConfig.read({**shape, "vocab_size": args.vocab})
    tokens = args.micro_batch * args.block_size * env.world_size
    cfg = TrainConfig.read(dict(parallel=args.parallel, micro_batch=args.micro_batch, total_batch_tokens=tokens,
                                max_steps=args.warmup + args.steps, warmup_steps=0, max_lr=1e-3, dtype=args.dtype,
                                eval_every=0, val_tokens=args.block_size, ckpt_every=10**6))

    class Batches:
        grad_accum = 1
        gen = torch.Generator().manual_seed(env.rank)

        def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
            b = torch.randint(0, args.vocab, (args.micro_batch, args.block_size + 1), generator=self.gen)
            return b[:, :-1], b[:, 1:]

        def state_dict(self) -> dict:
            return {}

    class Quiet:
        def log(self, step: int, metrics: dict) -> None: ...
        def log_constants(self, metrics: dict) -> None: ...
        def close(self) -> None: ...

    def step(trainer: Trainer) -> None:
        float(trainer.train_step()["train_loss"])
        trainer.step += 1

    with tempfile.TemporaryDirectory() as ckpt:
        # the runtime warmed first, by two steps of a one-block model in the same mode: what the first step of any
        # run loads (modules imported on first use, kernels, the collectives' buffers) is not training's memory
        warm = Trainer(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=args.block_size,
                                     vocab_size=args.vocab)), Batches(), cfg, env, Path(ckpt), Quiet(), {})
        step(warm)
        step(warm)
        del warm
        gc.collect()
        base = memory.held_bytes(cpu)  # the warmed process before any weight of the measured model
        torch.manual_seed(0)
        trainer = Trainer(GPT(GPTConfig(**shape, vocab_size=args.vocab)), Batches(), cfg, env, Path(ckpt), Quiet(),
                          {})
        memory.reset_peak(cpu)  # from here: the steps, with the weights (and gradients, state) they hold
        times = []
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            step(trainer)
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        mine = {"rank": env.rank, "peak": memory.peak_bytes(cpu) - base, "base": base,
                "step_s": statistics.median(times),
                "estimate": memory.train_bytes(model_cfg, cfg, args.vocab, env.world_size, trainer.mode, "cpu")}
        every = distributed.all_gather_objects(mine)
    if env.is_main:
        print("RESULT " + json.dumps(every), flush=True)
    distributed.teardown()


def launch(args: argparse.Namespace, mode: str) -> list[dict[str, Any]]:
    """One launch of `--nproc` ranks in `mode`, as `--nodes` nodes (one torchrun agent each); every rank's figures."""
    if args.nproc % args.nodes:
        raise SystemExit(f"--nproc {args.nproc} does not split into --nodes {args.nodes} nodes of as many ranks")
    where = ["--standalone"] if args.nodes == 1 else [
        f"--nnodes={args.nodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}",
        f"--rdzv_id=bench-{mode}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc_per_node={args.nproc // args.nodes}",
           str(Path(__file__).resolve()), "--worker", "--parallel", mode, *shape_args(args)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    agents = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(args.nodes)]
    try:
        outs = [a.communicate(timeout=1200) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    lines = [ln for out, _ in outs for ln in out.splitlines() if ln.startswith("RESULT ")]
    if any(a.returncode for a in agents) or not lines:
        said = "".join(out[-3000:] + err[-3000:] for out, err in outs)
        raise SystemExit(f"the {mode} launch failed (exits {[a.returncode for a in agents]}):\n{said}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def free_port() -> int:
    """A TCP port free on this machine now, for the rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shape_args(args: argparse.Namespace) -> list[str]:
    return [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
            ("n_layer", "n_head", "n_embd", "block_size", "vocab", "micro_batch", "steps", "warmup", "dtype")]


def measure(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """--rounds rounds, the modes taking turns; per mode, per round: the worse rank's peak, step time, estimate."""
    out = {m: {"peak": [], "step_s": [], "estimate": []} for m in args.modes}
    for r in range(args.rounds):
        for mode in args.modes:
            ranks = launch(args, mode)
            worst = max(ranks, key=lambda x: x["peak"])
            for key in out[mode]:
                out[mode][key].append(max(x[key] for x in ranks) if key != "estimate" else worst[key])
        print(f"[rounds] round {r + 1} of {args.rounds} done", flush=True)
    return out


def report(args: argparse.Namespace, figures: dict[str, dict[str, list[float]]]) -> None:
    """The table: each mode's peak, estimate and step time (medians with ranges), then each mode against ddp."""
    params = 12 * args.n_embd ** 2 * args.n_layer + args.vocab * args.n_embd
    nodes = f" as {args.nodes} nodes of {args.nproc // args.nodes}" if args.nodes > 1 else ""
    print(f"{args.nproc} gloo ranks on the CPU{nodes}, 1 thread each; {args.n_layer} blocks x {args.n_embd} wide "
          f"({params / 1e6:.1f}M matrix weights), block {args.block_size}, micro batch {args.micro_batch}, "
          f"{args.dtype}, AdamW; {args.steps} timed steps a launch after {args.warmup}; {args.rounds} rounds")
    print(f"{'mode':5} {'peak MiB (training adds)':>26} {'estimate MiB':>14} {'estimate / peak':>17} "
          f"{'step ms':>22}")
    for mode, f in figures.items():
        share, estimate = ratios(f["estimate"], f["peak"]), statistics.median(f["estimate"]) / (1 << 20)
        print(f"{mode:5} {fmt(f['peak'], '.0f', 1 / (1 << 20)):>26} {estimate:14.0f} {fmt(share, '.2f'):>17} "
              f"{fmt(f['step_s'], '.0f', 1e3):>22}")
    for mode in (m for m in figures if m != "ddp" and "ddp" in figures):
        print(f"{mode} / ddp: peak {fmt(ratios(figures[mode]['peak'], figures['ddp']['peak']), '.2f')}, step time "
              f"{fmt(ratios(figures[mode]['step_s'], figures['ddp']['step_s']), '.2f')}")


def main_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options (a test launches with them too)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-layer", type=int, default=16)
    ap.add_argument("--n-head", type=int, default=8)
    ap.add_argument("--n-embd", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=512, help="a small vocabulary: the blocks' weights dominate")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="train.dtype (bfloat16: CPU "
                    "autocast)")
    ap.add_argument("--steps", type=int, default=4, help="timed steps a launch")
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps (the optimizer state appears)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=4, help="ranks in all")
    ap.add_argument("--nodes", type=int, default=2, help="torchrun agents (nodes) the ranks are split over")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="the rows, in this order")
    ap.add_argument("--tiny", action="store_true", help="8 blocks of 64 wide, 2 rounds: checks the script runs")
    ap.add_argument("--json", action="store_true", help="print the per-round figures as JSON too")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--parallel", choices=MODES, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Measure and print (see the module docstring); under torchrun with --worker, one rank of one launch."""
    args = main_args(argv)
    if args.worker:
        worker(args)
        return
    if args.tiny:
        args.n_layer, args.n_head, args.n_embd, args.rounds, args.steps, args.warmup = 8, 2, 64, 2, 2, 1
    figures = measure(args)
    report(args, figures)
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
