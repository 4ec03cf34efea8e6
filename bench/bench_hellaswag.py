"""HellaSwag scoring speed, every figure a median over rounds: gptcore's fast row picker against one padded 4-row
forward per example, and gptcore's lm-eval adapter against lm-eval's own `hf` model, the peer a user would run.

Same model, same examples; the variants take turns round by round (bench/rounds.py: one untimed warm-up round,
then --rounds timed ones, each variant scoring every example once a round, its model and requests built before):
- the per-example reference (tests/reference_scorer.py, the tests' oracle) and gptcore.eval.score's packed
  scorer, in each of --dtypes: examples/s, the speed-up (the median of per-round ratios, with their range), the
  predictions that agree and the largest loss difference, what the full 10,042 examples would take;
- lm-eval 0.4's `hf` model (lm_eval.models.huggingface.HFLM, float32) on the Hugging Face export of the same
  weights (written as the train stage writes model/hf: gptcore.model.load.export_hf and the tokenizer's save_hf)
  beside gptcore's adapter (gptcore.eval.harness.make_lm, float32), both answering the very same lm-eval requests
  of a local HellaSwag task (lm-eval's hellaswag prompt over ../shared/ref-data's preprocessed copy), the same
  batch size; the clock covers lm.loglikelihood(requests) (tokenizing and scoring; building the requests is
  lm-eval's own and the same for both); the picks (argmax log-likelihood per example) are compared, with the largest
  log-likelihood difference.
Beside the fast path's speed-up, the FLOP ceiling: the reference's forward FLOPs over the fast path's for these
examples (trunk over 4 padded context+ending rows and the head at every position, against the trunk over one packed
context+endings sequence and the head at ending positions only). A speed-up near it means the fast path is bound by
the model's arithmetic, not by overhead; bf16 on hardware with native bf16 can go past it.

    python bench/bench_hellaswag.py                      # the quick-start shape (4L 128d, block 128), 200 examples
    python bench/bench_hellaswag.py --shape 124m         # the 124M shape at block 1024
    python bench/bench_hellaswag.py --model model        # a trained model: the quick-start's model/ folder
    python bench/bench_hellaswag.py --tiny               # a seconds-long smoke run (CI); synthetic examples if no file
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # gptcore, bench, and the tests' oracle (reference_scorer)

import random  # noqa: E402

from reference_scorer import score_examples_reference  # noqa: E402

from bench.rounds import DEFAULT_ROUNDS, Timed, fmt, ratios, time_rounds  # noqa: E402
from gptcore.data.tokenizers import get_tokenizer  # noqa: E402
from gptcore.device import DTYPES  # noqa: E402
from gptcore.eval.scorer import ChoiceResult, Example, fit_example, score_examples
from gptcore.eval.tasks.hellaswag import HELLASWAG_VAL_EXAMPLES, load_hellaswag
from gptcore.model.gpt import GPT, GPTConfig  # noqa: E402
from gptcore.model.load import load_model  # noqa: E402

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


SHAPES = {"quickstart": dict(n_layer=4, n_head=4, n_embd=128, block_size=128),  # params.yaml's model
          "124m": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024)}
TINY = dict(n_layer=2, n_head=2, n_embd=64, block_size=128)
HELLASWAG_YAML = """\
output_type: multiple_choice
doc_to_text: '{{activity_label}}: {{ctx}}'
doc_to_choice: '{{endings}}'
doc_to_target: '{{label}}'
target_delimiter: ' '
metric_list:
  - metric: acc
"""


def lm_eval_requests(folder: Path, ref: Path, examples: int) -> list:
    """The lm-eval requests (Instances) of a HellaSwag task over the first `examples` rows of the preprocessed copy."""
    from gptcore.eval import harness

    rows = [json.loads(line) for line, _ in zip(ref.open(encoding="utf-8"), range(examples))]
    data = folder / "hellaswag_local.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (folder / "hellaswag_local.yaml").write_text(
        f"task: hellaswag_local\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"  cache_dir: {folder / 'cache'}\ntest_split: test\n{HELLASWAG_YAML}", encoding="utf-8")
    task = harness.load_tasks(["hellaswag_local"], include=folder).items[0]
    task.build_all_requests(limit=examples)
    return task.instances


def lm_eval_peers(model: GPT, folder: Path, requests: list, batch_size: int, device: str) -> dict[str, Callable]:
    """gptcore's adapter and lm-eval's `hf` model on the export of `model`, each a callable scoring `requests`."""
    from lm_eval.models.huggingface import HFLM

    from gptcore.data.tokenizers.gpt2 import GPT2Tokenizer
    from gptcore.eval import harness
    from gptcore.model.hf import export_hf

    tok = GPT2Tokenizer()
    export = folder / "hf"
    export_hf(model, export, vocab_size=tok.vocab_size, eot=tok.eot)
    tok.save_hf(export, max_length=model.config.block_size)
    ours = harness.make_lm(model, tok, device=torch.device(device), batch_size=batch_size, progress=False)
    theirs = HFLM(pretrained=str(export), batch_size=batch_size, device=device, dtype="float32")
    return {HF: lambda: theirs.loglikelihood(requests, disable_tqdm=True),
            OURS: lambda: ours.loglikelihood(requests, disable_tqdm=True)}


HF, OURS = "lm-eval hf (HFLM)", "lm-eval gptcore adapter"


def compare_peers(requests: list, ours: list, theirs: list, tie: float = 1e-4) -> tuple[int, int, int, float]:
    """(examples, identical picks, near-ties, max |log-likelihood difference|) between the two peers' answers to
    `requests`; a near-tie is an example whose best two choices are within `tie` in hf's scores (float rounding may
    pick either), counted apart."""
    docs: dict[int, list[tuple[int, float, float]]] = {}
    for req, a, b in zip(requests, ours, theirs):
        docs.setdefault(req.doc_id, []).append((req.idx, a[0], b[0]))
    same = ties = 0
    for choices in docs.values():
        top = sorted((c[2] for c in choices), reverse=True)
        if len(top) > 1 and top[0] - top[1] < tie:
            ties += 1
        else:
            same += max(choices, key=lambda c: c[1])[0] == max(choices, key=lambda c: c[2])[0]
    diff = max(abs(a[0] - b[0]) for a, b in zip(ours, theirs))
    return len(docs), same, ties, diff


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", default=None, help="HellaSwag jsonl (default: data/hellaswag's official copy, "
                                                 "else ../shared/ref-data's preprocessed copy)")
    ap.add_argument("--ref", type=Path, default=REF, help="the preprocessed HellaSwag copy the lm-eval task reads "
                                                          f"(default {REF})")
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="quickstart", help="the random model's shape")
    ap.add_argument("--model", default=None, help="trained weights instead of a random model (a model/ folder, a "
                                                  "checkpoint, a Hugging Face GPT-2 folder or name)")
    ap.add_argument("--vocab-size", type=int, default=50304)
    ap.add_argument("--batch-size", type=int, default=32, help="examples per forward on the fast path; requests per "
                                                               "batch of both lm-eval models")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="timed rounds after one warm-up round")
    ap.add_argument("--no-lm-eval", action="store_true", help="leave out lm-eval's hf model and gptcore's adapter")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer 64-wide model, 8 examples, 2 rounds: checks the "
                                                        "script runs")
    args = ap.parse_args(argv)
    args.weights, args.model = args.model, TINY if args.tiny else SHAPES[args.shape]
    if args.tiny:
        args.examples, args.rounds = 8, 2
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    path = Path(args.path) if args.path else (OFFICIAL if OFFICIAL.is_file() else REF)
    vocab = get_tokenizer("gpt2").vocab_size  # the examples' ids: log-probabilities are over these, not the padding
    if path.is_file():
        examples = load_hellaswag(path, get_tokenizer("gpt2"), limit=args.examples)
    elif args.tiny:
        examples, path = synthetic_examples(args.examples, vocab, args.seed), Path("synthetic")
    else:
        sys.exit(f"{path}: no HellaSwag file; pass --path or run the evaluate stage's download first")
    torch.manual_seed(args.seed)
    model = load_model(args.weights) if args.weights else GPT(GPTConfig(vocab_size=args.vocab_size, **args.model))
    model = model.to(args.device).eval()
    config = model.config
    print(f"model: {config.n_layer}L {config.n_embd}d {config.n_head}h vocab {config.vocab_size} block "
          f"{config.block_size} ({model.get_num_params() / 1e6:.1f}M params) on {args.device}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}; figures: median (min-max) over "
          f"{args.rounds} rounds after a warm-up")
    print(f"data:  {len(examples)} examples of {path.name}; fast path batch_size {args.batch_size}")
    trunk = 2 * sum(p.numel() for p in model.transformer.h.parameters() if p.dim() == 2)
    ceiling = flop_ceiling(examples, config, trunk)
    print(f"FLOP ceiling of the speed-up (reference forward FLOPs / fast path's, these examples): {ceiling:.2f}x")
    variants: dict[str, Callable] = {}
    for name in args.dtypes:
        dtype = DTYPES[name]  # as asked, no fallback: the point is to time this precision
        variants[f"reference {name}"] = lambda dtype=dtype: score_examples_reference(
            model, examples, vocab, device=args.device, dtype=dtype)
        variants[f"fast {name}"] = lambda dtype=dtype: score_examples(
            model, examples, vocab, device=args.device, dtype=dtype, batch_size=args.batch_size, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        requests = []
        if args.no_lm_eval or not args.ref.is_file():
            print("lm-eval peers: left out" + ("" if args.no_lm_eval else f" (no preprocessed HellaSwag copy: "
                                                                         f"{args.ref})"))
        else:
            requests = lm_eval_requests(Path(tmp), args.ref, args.examples)
            variants.update(lm_eval_peers(model, Path(tmp), requests, args.batch_size, args.device))
        sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
        timed = time_rounds(variants, args.rounds, sync=sync, progress=not args.tiny)
    report(timed, args.dtypes, len(examples), ceiling)
    if requests:
        report_peers(timed, requests)


def report(timed: Timed, dtypes: list[str], n: int, ceiling: float) -> None:
    """The fast path against the reference, one row per dtype."""
    print(f"{'dtype':9} {'reference ex/s':>20} {'fast ex/s':>20} {'speed-up':>20} {'of ceiling':>10} "
          f"{'pred agree':>11} {'norm agree':>11} {'max |dloss|':>11} {'acc_norm':>8} {'10,042 ex: ref / fast':>21}")
    for name in dtypes:
        ref, fast = timed.last[f"reference {name}"], timed.last[f"fast {name}"]
        t_ref, t_fast = timed.seconds[f"reference {name}"], timed.seconds[f"fast {name}"]
        speed = ratios(t_ref, t_fast)
        agree, agree_norm, diff = compare(ref, fast)
        full_ref, full_fast = (HELLASWAG_VAL_EXAMPLES * statistics.median(t) / n / 60 for t in (t_ref, t_fast))
        print(f"{name:9} {fmt(timed.rate(f'reference {name}', n)):>20} {fmt(timed.rate(f'fast {name}', n)):>20} "
              f"{fmt(speed, '.2f', unit='x'):>20} {100 * statistics.median(speed) / ceiling:9.0f}% {agree:>5}/{n:<5} "
              f"{agree_norm:>5}/{n:<5} {diff:11.2e} {fast.acc_norm:8.4f} {full_ref:11.1f} / {full_fast:5.1f} min")


def report_peers(timed: Timed, requests: list) -> None:
    """lm-eval's hf model against gptcore's adapter on the same requests, and whether they pick alike."""
    n, same, ties, diff = compare_peers(requests, timed.last[OURS], timed.last[HF])
    print(f"lm-eval, {n} HellaSwag examples ({len(requests)} requests), float32:")
    for name in (HF, OURS):
        print(f"  {name:26} {fmt(timed.rate(name, n)):>20} ex/s")
    speed = ratios(timed.seconds[HF], timed.seconds[OURS])
    print(f"  gptcore adapter / hf: {fmt(speed, '.2f', unit='x')}; identical picks {same}/{n - ties} ({ties} near-ties "
          f"left aside); max |log-likelihood difference| {diff:.2e}")


if __name__ == "__main__":
    main()
