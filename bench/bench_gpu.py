"""GPU check: the 124M recipe and the modern one for a few dozen steps on one device, from synthetic shards.

For each preset (conf/preset/gpt2_124m.yaml and modern_124m.yaml, their model and train sections as the train stage
reads them, on one process with no gradient accumulation): compile time (the first steps), tokens/s and MFU
(the median of the timed steps), peak memory, val-loss speed (tokens/s) and multiple-choice scoring speed
(HellaSwag-like synthetic examples/s), printed beside what published figures lead one to expect:
build-nanogpt about 1.5M tokens/s on 8 x A100 (about 190k per A100 at the 124M shape, bf16 + compile + flash
attention) and llm.c about 60% MFU on an A100. Runs on the CPU too (no MFU there: no known peak).

--parallel ddp fsdp gives each preset a row per mode (train.parallel); --rows names each row as PRESET:MODE, with
:eager or :compile to override the preset's train.compile. On one device ddp is the unwrapped model and fsdp a group
of one: the rows show what FSDP's hooks, gathers and bf16 copies cost, and whether train's memory estimate
(memory.train_bytes, the "est GiB" column) holds against CUDA's peak; what sharding saves needs two or more devices.
It imports only what bench/preflight.py lists (bench/device_check.sh runs it on a machine where nothing installs).

    python bench/bench_gpu.py                       # one CUDA device: both presets, 30 steps each, a few minutes
    python bench/bench_gpu.py --presets gpt2_124m gpt2_350m --parallel ddp fsdp --train-only --no-compile
    python bench/bench_gpu.py --rows gpt2_124m:ddp gpt2_350m:fsdp:eager --train-only
    python bench/bench_gpu.py --tiny                # a seconds-long CPU smoke run (CI), compile off
"""
from __future__ import annotations

import argparse
import copy
import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gptcore import distributed  # noqa: E402
from gptcore.data.loader import TokenLoader  # noqa: E402
from gptcore.eval.scorer import Example, score_examples  # noqa: E402
from gptcore.eval.val_loss import val_loss  # noqa: E402
from gptcore.model.config import ModelConfig  # noqa: E402
from gptcore.model.gpt import GPT, GPTConfig  # noqa: E402
from gptcore.presets import composed  # noqa: E402
from gptcore.report.flops import device_peak_flops, flops_per_token  # noqa: E402
from gptcore.train import memory  # noqa: E402
from gptcore.train.config import TrainConfig  # noqa: E402
from gptcore.train.parallel import MODES, evaluating  # noqa: E402
from gptcore.train.trainer import Trainer  # noqa: E402

A100_PEAK = 312e12  # dense bf16
BUILD_NANOGPT_PER_A100 = 1.5e6 / 8  # tokens/s per GPU, 124M, the reproduction's reported throughput
LLMC_MFU = 0.60


def build(name: str, args: argparse.Namespace, parallel: str = "ddp",
          compile: bool | None = None) -> tuple[GPT, TrainConfig, ModelConfig]:
    """A row's model, train section and model section: the preset's, on one process, at --micro-batch with no
    accumulation; `compile` (None: the preset's train.compile, off with --no-compile) as the row says."""
    sections = composed(name)
    model_p, train_p = dict(sections["model"]), dict(sections["train"])
    if args.tiny:
        model_p.update(n_layer=2, n_head=2, n_embd=64, block_size=64)
    shape = GPTConfig.read({k: v for k, v in model_p.items() if k in GPTConfig.params() and k != "vocab_size"})
    torch.manual_seed(1337)
    model = GPT(shape)
    T = model.config.block_size
    train_p.update(nproc=1, parallel=parallel, device=args.device, micro_batch=args.micro_batch,
                   total_batch_tokens=args.micro_batch * T,
                   max_steps=max(args.steps, 1), warmup_steps=min(int(train_p.get("warmup_steps", 0)), args.steps),
                   eval_every=0, ckpt_every=args.steps, val_tokens=T + 1, eval_batch=args.micro_batch)
    if args.no_compile:
        train_p["compile"] = False
    if compile is not None:
        train_p["compile"] = compile
    cfg = TrainConfig.read({k: v for k, v in train_p.items() if k in TrainConfig.params()})
    model_cfg = ModelConfig.read({k: v for k, v in model_p.items() if k in ModelConfig.params() and k != "vocab_size"})
    return model, cfg, model_cfg


def synthetic_examples(n: int, seed: int = 0) -> list[Example]:
    rng = np.random.default_rng(seed)
    return [Example(rng.integers(0, 50257, int(rng.integers(10, 40))).tolist(),
                    [rng.integers(0, 50257, int(rng.integers(5, 25))).tolist() for _ in range(4)],
                    int(rng.integers(4)), i)
            for i in range(n)]


class Quiet:
    """A step logger that keeps nothing: the bench prints its own figures."""

    def log(self, step: int, metrics: dict) -> None: ...
    def log_constants(self, metrics: dict) -> None: ...


def run(name: str, args: argparse.Namespace, shard: Path, parallel: str = "ddp", compile: bool | None = None) -> dict:
    """One row: build, step, time, measure."""
    model, cfg, model_cfg = build(name, args, parallel, compile)
    env = distributed.setup(args.device)
    dev = env.device
    loader = TokenLoader([shard], args.micro_batch, model.config.block_size, cfg.total_batch_tokens)
    gc.collect()  # the last row's trainer, gone before this one's peak is measured
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    with tempfile.TemporaryDirectory() as ckpt:
        trainer = Trainer(copy.deepcopy(model), loader, cfg, env, Path(ckpt), Quiet(), {})
        t_start = time.perf_counter()
        for i in range(args.steps):
            t0 = time.perf_counter()
            loss = float(trainer.train_step()["train_loss"])  # a host sync: the step has finished on the device
            trainer.step += 1
            if i == args.warmup - 1:
                first = time.perf_counter() - t_start
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        dt = float(np.median(times))
        tps = cfg.total_batch_tokens / dt
        peak_mem = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan")
        estimate = memory.train_bytes(model_cfg, cfg, model.config.vocab_size, env.world_size,
                                      trainer.mode, dev.type) / 2**30
        val_tps = ex_s = float("nan")
        if not args.train_only:  # evaluation speed on the raw (uncompiled) model, as the loop's evaluators run it
            tokens = np.load(shard, mmap_mode="r")[: args.val_tokens + 1]
            t0 = time.perf_counter()
            with evaluating(trainer.raw_model):
                val_loss(trainer.raw_model, tokens, model.config.block_size, args.micro_batch, dev, trainer.dtype)
                val_tps = args.val_tokens / (time.perf_counter() - t0)
                examples = synthetic_examples(args.examples)
                t0 = time.perf_counter()
                score_examples(trainer.raw_model, examples, 50257, device=dev, dtype=trainer.dtype,  # GPT-2 BPE ids
                               batch_size=args.micro_batch, progress=False)
                ex_s = len(examples) / (time.perf_counter() - t0)
    peak = device_peak_flops(dev)
    fpt = flops_per_token(trainer.raw_model)
    return {"name": name, "parallel": parallel, "dtype": str(trainer.dtype).replace("torch.", ""),
            "compile": cfg.compile, "first": first, "tps": tps, "step_ms": dt * 1e3,
            "mfu": fpt * tps / peak if peak else None, "mem": peak_mem, "est": estimate, "val_tps": val_tps,
            "ex_s": ex_s, "loss": loss, "fpt": fpt, "peak": peak}


def row_specs(args: argparse.Namespace) -> list[tuple[str, str, bool | None]]:
    """(preset, mode, compile: None for the preset's) of each row: --rows, else every preset in every mode."""
    if not args.rows:
        return [(p, m, None) for p in args.presets for m in args.parallel]
    out = []
    for spec in args.rows:
        parts = spec.split(":")
        preset, mode, how = parts[0], parts[1] if len(parts) > 1 else "", parts[2:]
        if mode not in MODES or how not in ([], ["eager"], ["compile"]):
            raise SystemExit(f"--rows {spec}: expected PRESET:MODE[:eager|:compile], MODE one of {', '.join(MODES)}")
        out.append((preset, mode, None if not how else how[0] == "compile"))
    return out


def main(argv: list[str] | None = None) -> None:
    """Measure every row and print the table, then what the published figures lead one to expect."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["gpt2_124m", "modern_124m"])
    ap.add_argument("--micro-batch", type=int, default=16, help="sequences per step (one micro batch, no accumulation)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="untimed first steps: compilation and allocator warm-up")
    ap.add_argument("--val-tokens", type=int, default=262144, help="val-loss tokens timed")
    ap.add_argument("--examples", type=int, default=256, help="synthetic multiple-choice examples timed")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-compile", action="store_true", help="eager even where the preset compiles")
    ap.add_argument("--parallel", nargs="+", choices=tuple(MODES), default=["ddp"],
                    help="a row per preset and mode (train.parallel; one device: fsdp is a group of one)")
    ap.add_argument("--rows", nargs="+", metavar="PRESET:MODE[:eager|:compile]",
                    help="the rows, in order (instead of --presets x --parallel)")
    ap.add_argument("--train-only", action="store_true", help="time the steps only, not val loss or scoring")
    ap.add_argument("--tiny", action="store_true",
                    help="2-layer 64-wide models, 3 steps, eager: checks the script runs")
    args = ap.parse_args(argv)
    if args.tiny:
        args.micro_batch, args.steps, args.warmup, args.val_tokens, args.examples = 2, 3, 1, 256, 4
        args.no_compile = True
    if not 0 < args.warmup < args.steps:
        ap.error("--warmup must be at least 1 and below --steps")

    dev = distributed.setup(args.device).device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, micro batch {args.micro_batch}, {args.steps} steps "
          f"({args.warmup} untimed)")
    with tempfile.TemporaryDirectory() as d:
        shard = Path(d) / "train_000000.npy"
        need = (args.steps + 2) * args.micro_batch * 1024 + args.val_tokens + 1
        np.save(shard, np.random.default_rng(0).integers(0, 50257, need, dtype=np.uint16))
        rows = [run(preset, args, shard, mode, compile) for preset, mode, compile in row_specs(args)]
    print(f"{'preset':12} {'parallel':8} {'dtype':9} {'compile':7} {'warm-up s':>9} {'tok/s':>9} {'ms/step':>8} "
          f"{'MFU':>6} {'peak GiB':>8} {'est GiB':>7} {'val tok/s':>10} {'choice ex/s':>11} {'loss':>7}")
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"{r['name']:12} {r['parallel']:8} {r['dtype']:9} {str(r['compile']):7} {r['first']:9.1f} "
              f"{r['tps']:9.0f} {r['step_ms']:8.1f} {mfu:>6} {r['mem']:8.1f} {r['est']:7.1f} {r['val_tps']:10.0f} "
              f"{r['ex_s']:11.1f} {r['loss']:7.3f}")
    print("expected from published figures:")
    shown = set()
    for r in rows:
        if r["name"] in shown:
            continue  # one line a preset
        shown.add(r["name"])
        if r["peak"]:
            scale = r["peak"] / A100_PEAK
            print(f"  {r['name']}: build-nanogpt's ~{BUILD_NANOGPT_PER_A100 * scale:,.0f} tokens/s (1.5M/8 per A100, "
                  f"scaled by this device's bf16 peak, x{scale:.2f}); llm.c's {100 * LLMC_MFU:.0f}% MFU would be "
                  f"{LLMC_MFU * r['peak'] / r['fpt']:,.0f} tokens/s here")
        else:
            print(f"  {r['name']}: no known peak for this device; the published figures are for A100s")


if __name__ == "__main__":
    main()
