"""HellaSwag scoring speed: the fast row picker vs one padded 4-row forward per example.

Same model, same examples, same run, in float32 and bfloat16; prints examples/s of each, the speed-up,
how many predictions agree and the largest loss difference, and what the full 10,042 examples would take.
Beside the speed-up, the FLOP ceiling: the reference's forward FLOPs over the fast path's for these examples
(trunk over 4 padded context+ending rows and the head at every position, against the trunk over one packed
context+endings sequence and the head at ending positions only). A speed-up near it means the fast path is bound
by the model's arithmetic, not by overhead; bf16 on hardware with native bf16 can go past it.

    python bench/bench_hellaswag.py                      # 6-layer 384-wide GPT, 500 real examples
    python bench/bench_hellaswag.py --n-layer 12 --n-embd 768 --n-head 12 --examples 200   # the 124M shape
    python bench/bench_hellaswag.py --tiny               # a seconds-long smoke run (CI); synthetic examples if no file
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import random  # noqa: E402

from gptcore.data.tokenizers import get_tokenizer  # noqa: E402
from gptcore.eval.hellaswag import HELLASWAG_VAL_EXAMPLES, load_hellaswag  # noqa: E402
from gptcore.eval.multichoice import ChoiceResult, Example, fit_example, score_examples, score_examples_reference  # noqa: E402
from gptcore.model.gpt import GPT, GPTConfig  # noqa: E402
from gptcore.precision import DTYPES  # noqa: E402

REF = ROOT / ".." / "shared" / "ref-data" / "hellaswag_val_preprocessed.jsonl"
OFFICIAL = ROOT / "data" / "hellaswag" / "hellaswag_val.jsonl"


def compare(ref: ChoiceResult, fast: ChoiceResult) -> tuple[int, int, float]:
    """(pred agreements, pred_norm agreements, max |mean-loss difference|)."""
    agree = sum(p["pred"] == q["pred"] for p, q in zip(ref.predictions, fast.predictions))
    agree_norm = sum(p["pred_norm"] == q["pred_norm"] for p, q in zip(ref.predictions, fast.predictions))
    diff = max(abs(a - b) for p, q in zip(ref.predictions, fast.predictions)
               for a, b in zip(p["mean_losses"], q["mean_losses"]))
    return agree, agree_norm, diff


def flop_ceiling(examples: list[Example], config: GPTConfig, trunk_per_token: int) -> float:
    """Forward FLOPs of the reference over the fast path's for `examples` (matmuls only: 2 x weights per token)."""
    head = 2 * config.n_embd * config.vocab_size
    ref = fast = 0
    for ex in examples:
        context, endings = fit_example(ex, config.block_size)
        T = len(context) + max(len(e) for e in endings)
        ref += len(endings) * T * (trunk_per_token + head)
        # an ending's last token is only a target: the trunk never sees it
        fast += (len(context) + sum(len(e) - 1 for e in endings)) * trunk_per_token + sum(map(len, endings)) * head
    return ref / fast


def synthetic_examples(n: int, vocab: int, seed: int) -> list[Example]:
    """HellaSwag-like lengths (contexts ~25 tokens, 4 endings ~14), random ids: for --tiny where no file is."""
    rng = random.Random(seed)
    return [Example([rng.randrange(vocab) for _ in range(rng.randint(10, 40))],
                    [[rng.randrange(vocab) for _ in range(rng.randint(5, 25))] for _ in range(4)], rng.randrange(4), i)
            for i in range(n)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", default=None, help="HellaSwag jsonl (default: data/hellaswag's official copy, "
                                                 "else ../shared/ref-data's preprocessed copy)")
    ap.add_argument("--examples", type=int, default=500)
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--vocab-size", type=int, default=50304)
    ap.add_argument("--block-size", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=32, help="examples per forward on the fast path")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer 64-wide model, 8 examples: checks the script runs")
    args = ap.parse_args(argv)
    if args.tiny:
        args.n_layer, args.n_head, args.n_embd, args.block_size, args.examples = 2, 2, 64, 128, 8

    path = Path(args.path) if args.path else (OFFICIAL if OFFICIAL.is_file() else REF)
    if path.is_file():
        examples = load_hellaswag(path, get_tokenizer("gpt2"), limit=args.examples)
    elif args.tiny:
        examples, path = synthetic_examples(args.examples, 50257, args.seed), Path("synthetic")
    else:
        sys.exit(f"{path}: no HellaSwag file; pass --path or run the evaluate stage's download first")
    torch.manual_seed(args.seed)
    config = GPTConfig(block_size=args.block_size, vocab_size=args.vocab_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd)
    model = GPT(config).to(args.device).eval()
    print(f"model: {args.n_layer}L {args.n_embd}d {args.n_head}h vocab {args.vocab_size} block {args.block_size} "
          f"({model.get_num_params() / 1e6:.1f}M params) on {args.device}, {torch.get_num_threads()} threads")
    print(f"data:  {len(examples)} examples of {path.name}; fast path batch_size {args.batch_size}")
    trunk = 2 * sum(p.numel() for p in model.transformer.h.parameters() if p.dim() == 2)
    ceiling = flop_ceiling(examples, config, trunk)
    print(f"FLOP ceiling of the speed-up (reference forward FLOPs / fast path's, these examples): {ceiling:.2f}x")

    header = f"{'dtype':9} {'reference ex/s':>14} {'fast ex/s':>10} {'speed-up':>8} {'of ceiling':>10} {'pred agree':>11} " \
             f"{'norm agree':>11} {'max |dloss|':>11} {'acc_norm':>8} {'10,042 ex: reference / fast':>27}"
    rows = []
    for name in args.dtypes:
        dtype = DTYPES[name]  # as asked, no fallback: the point is to time this precision
        t0 = time.perf_counter()
        ref = score_examples_reference(model, examples, device=args.device, dtype=dtype, progress=True)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t_ref = time.perf_counter() - t0
        t0 = time.perf_counter()
        fast = score_examples(model, examples, device=args.device, dtype=dtype, batch_size=args.batch_size,
                              progress=True)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t_fast = time.perf_counter() - t0
        agree, agree_norm, diff = compare(ref, fast)
        n = len(examples)
        full_ref, full_fast = (HELLASWAG_VAL_EXAMPLES * t / n / 60 for t in (t_ref, t_fast))
        rows.append(f"{name:9} {n / t_ref:14.1f} {n / t_fast:10.1f} {t_ref / t_fast:7.2f}x {100 * t_ref / t_fast / ceiling:9.0f}% {agree:>5}/{n:<5} "
                    f"{agree_norm:>5}/{n:<5} {diff:11.2e} {fast.acc_norm:8.4f} {full_ref:13.1f} / {full_fast:5.1f} min")
    print(header)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
