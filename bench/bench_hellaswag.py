"""HellaSwag scoring speed: the fast row picker vs one padded 4-row forward per example.

Same model, same examples, same run, in float32 and bfloat16; prints examples/s of each, the speed-up,
how many predictions agree and the largest loss difference, and what the full 10,042 examples would take.

    python bench/bench_hellaswag.py                      # 6-layer 384-wide GPT, 500 real examples
    python bench/bench_hellaswag.py --n-layer 12 --n-embd 768 --n-head 12 --examples 200 --device cuda
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gptcore.eval.hellaswag import HELLASWAG_VAL_EXAMPLES, load_hellaswag  # noqa: E402
from gptcore.model.gpt import GPT, GPTConfig  # noqa: E402
from gptcore.eval.multichoice import ChoiceResult, score_examples, score_examples_reference  # noqa: E402
from gptcore.data.tokenizers import get_tokenizer  # noqa: E402
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


def main() -> None:
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
    args = ap.parse_args()

    path = Path(args.path) if args.path else (OFFICIAL if OFFICIAL.is_file() else REF)
    if not path.is_file():
        sys.exit(f"{path}: no HellaSwag file; pass --path or run the evaluate stage's download first")
    examples = load_hellaswag(path, get_tokenizer("gpt2"), limit=args.examples)
    torch.manual_seed(args.seed)
    config = GPTConfig(block_size=args.block_size, vocab_size=args.vocab_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd)
    model = GPT(config).to(args.device).eval()
    print(f"model: {args.n_layer}L {args.n_embd}d {args.n_head}h vocab {args.vocab_size} block {args.block_size} "
          f"({model.get_num_params() / 1e6:.1f}M params) on {args.device}, {torch.get_num_threads()} threads")
    print(f"data:  {len(examples)} examples of {path.name}; fast path batch_size {args.batch_size}")

    header = f"{'dtype':9} {'reference ex/s':>14} {'fast ex/s':>10} {'speed-up':>8} {'pred agree':>11} " \
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
        rows.append(f"{name:9} {n / t_ref:14.1f} {n / t_fast:10.1f} {t_ref / t_fast:7.2f}x {agree:>5}/{n:<5} "
                    f"{agree_norm:>5}/{n:<5} {diff:11.2e} {fast.acc_norm:8.4f} {full_ref:13.1f} / {full_fast:5.1f} min")
    print(header)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
