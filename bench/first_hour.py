"""The first GPU hour, checked: a run of conf/preset/gpt2_124m_first_hour.yaml set beside published figures of the
same recipe (GPT-2 124M, 524,288 tokens a step, the 715-step warmup to 6e-4), each figure pass or fail.

The published figures, and how close a run must come:
- the train loss at step 0, 10.99: the loss of GPT-2's initialisation over 50,304 ids, whatever the text (nanoGPT
  pull request #225, a GPT-2 124M run from scratch: "step 0: train loss 10.9895"). Within 0.1;
- the val loss at step 250, 6.1631 (train loss 6.1283, HellaSwag 0.2434): build-nanogpt pull request #30, its
  train_gpt2.py on 8 x A100 40GB, micro batch 16 with 4 micro steps, the run its author shows as the loss expected
  of the recipe (the same recipe with DDP's gradient sync broken gave 6.4300). Within 0.15, on FineWeb-Edu only;
- the speed: build-nanogpt's 1.5M tokens a second on 8 x A100 80GB (its video and README), about 187,500 a GPU, a
  share of the A100's 312 TFLOP/s bf16 peak (MFU). A GPU passes at half that MFU or more, on its own peak.

Two ways to run it:
- `--check metrics/train` after `dvc exp run -S preset=gpt2_124m_first_hour` (one GPU, a few minutes on an H100):
  every figure, from the run's own metrics (the speed needs `--gpu` or a visible GPU for the peak);
- `--run` (bench/device_check.sh): the preset's model and steps through the Trainer for --steps steps, on
  data/shards/train_000000.npy where it exists, else on .whl/fineweb_edu_sample.npy (bench/device_wheels.sh makes
  it: the 150 FineWeb-Edu reference documents, repeated to one step). It checks the step-0 loss and the speed; the
  step-250 loss needs the full run on FineWeb-Edu, and says so.

    python bench/first_hour.py --check metrics/train
    python bench/first_hour.py --run --steps 12
    python bench/first_hour.py --run --tiny      # a 2-layer model on the CPU: checks the script runs (CI)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gptcore import distributed  # noqa: E402
from gptcore.data.loader import TokenLoader  # noqa: E402
from gptcore.model.gpt import GPT, GPTConfig  # noqa: E402
from gptcore.presets import composed  # noqa: E402
from gptcore.report.flops import device_peak_flops, flops_per_token, peak_flops_for_name  # noqa: E402
from gptcore.report.steplog import read_step_tsv  # noqa: E402
from gptcore.train.config import TrainConfig  # noqa: E402
from gptcore.train.trainer import Trainer  # noqa: E402

PRESET = "gpt2_124m_first_hour"
STEP0_LOSS, STEP0_TOLERANCE = 10.9895, 0.1  # nanoGPT #225
STEP250_VAL, STEP250_TRAIN, STEP250_TOLERANCE = 6.1631, 6.1283, 0.15  # build-nanogpt #30
A100_PEAK, PER_A100 = 312e12, 1.5e6 / 8  # build-nanogpt: 1.5M tokens/s on 8 x A100
SPEED_SHARE = 0.5  # of build-nanogpt's MFU
SAMPLE = ROOT / ".whl" / "fineweb_edu_sample.npy"
FIRST_SHARD = ROOT / "data" / "shards" / "train_000000.npy"


class Figure(NamedTuple):
    """One line of the comparison: what, the published value, this run's, pass (None: not compared) and a note."""
    name: str
    published: str
    here: str
    ok: bool | None
    note: str = ""


def preset_model(tiny: bool = False) -> tuple[GPTConfig, TrainConfig]:
    """The preset's model shape and train section (`tiny`: 2 layers of 64, 4,096 tokens a step, eager)."""
    values = composed(PRESET)
    model, train = dict(values["model"]), dict(values["train"])
    if tiny:
        model.update(n_layer=2, n_head=2, n_embd=64, block_size=64)
        train.update(micro_batch=4, total_batch_tokens=4 * 64 * 2, compile=False)
    return (GPTConfig.read({k: v for k, v in model.items() if k in GPTConfig.params()}),
            TrainConfig.read({k: v for k, v in train.items() if k in TrainConfig.params()}))


def recipe_flops() -> int:
    """Training FLOPs a token of the preset's model (built on the meta device: no memory)."""
    with torch.device("meta"):
        return flops_per_token(GPT(preset_model()[0]))


def speed_figure(tokens_per_sec: float, fpt: int, peak: float | None) -> Figure:
    """The run's MFU (`fpt`: its model's FLOPs a token) against half of build-nanogpt's on an A100."""
    published = PER_A100 * recipe_flops() / A100_PEAK
    if peak is None:
        return Figure("tokens/s (MFU)", f"{PER_A100:,.0f} a GPU on A100 ({100 * published:.0f}% MFU)",
                      f"{tokens_per_sec:,.0f}", None, "no known peak for this device: not compared")
    mfu = tokens_per_sec * fpt / peak
    return Figure("tokens/s (MFU)", f"{PER_A100:,.0f} a GPU on A100 ({100 * published:.0f}% MFU)",
                  f"{tokens_per_sec:,.0f} ({100 * mfu:.0f}% MFU)", mfu >= SPEED_SHARE * published,
                  f"pass at {100 * SPEED_SHARE * published:.0f}% MFU or more, "
                  f"{SPEED_SHARE * published * peak / fpt:,.0f} tokens/s on this GPU")


def loss_figure(name: str, published: float, tolerance: float, here: float | None, note: str = "") -> Figure:
    """A loss within `tolerance` of the published one (None: not measured, `note` says why)."""
    if here is None:
        return Figure(name, f"{published:.4f}", "-", None, note)
    return Figure(name, f"{published:.4f}", f"{here:.4f}", abs(here - published) <= tolerance,
                  f"pass within {tolerance}" + (f"; {note}" if note else ""))


def report(figures: list[Figure]) -> bool:
    """Print the comparison; whether every compared figure passed (true where none could be compared)."""
    print(f"{'figure':22} {'published':32} {'this run':22} {'':5} note")
    for f in figures:
        verdict = "n/a" if f.ok is None else "PASS" if f.ok else "FAIL"
        print(f"{f.name:22} {f.published:32} {f.here:22} {verdict:5} {f.note}")
    compared = [f.ok for f in figures if f.ok is not None]
    if not compared:
        print("first hour: nothing compared here")
        return True
    passed = all(compared)
    print(f"first hour: {'pass' if passed else 'FAIL'} ({sum(compared)} of {len(compared)} compared figures pass)")
    return passed


def check_metrics(folder: Path, gpu: str | None) -> bool:
    """The figures of a finished run of the preset, from its step metrics (dvclive's TSVs under `folder`)."""
    tsv = folder / "plots" / "metrics"
    train = dict(read_step_tsv(tsv / "train_loss.tsv"))
    val = dict(read_step_tsv(tsv / "val_loss.tsv"))
    speed = [v for s, v in read_step_tsv(tsv / "tokens_per_sec.tsv") if s >= 10]  # past the compile
    fpt = recipe_flops()
    peak = peak_flops_for_name(gpu) if gpu else device_peak_flops("cuda")
    return report([
        loss_figure("train loss, step 0", STEP0_LOSS, STEP0_TOLERANCE, train.get(0)),
        loss_figure("val loss, step 250", STEP250_VAL, STEP250_TOLERANCE, val.get(250),
                    "" if 250 in val else "no val loss at step 250 in this run"),
        Figure("train loss, step 249", f"{STEP250_TRAIN:.4f} (at 250)",
               f"{train[249]:.4f}" if 249 in train else "-", None, "one batch: not compared"),
        speed_figure(statistics.median(speed), fpt, peak) if speed else
        Figure("tokens/s (MFU)", "", "-", None, "no tokens_per_sec past step 10"),
    ])


def sample_or_shard(tiny: bool, step_tokens: int, sample: Path) -> tuple[Path, str]:
    """The tokens of the short run: the first FineWeb-Edu training shard where tokenized here, else the sample."""
    if FIRST_SHARD.is_file() and not tiny:
        return FIRST_SHARD, f"{FIRST_SHARD.relative_to(ROOT)}"
    if not sample.is_file():
        raise SystemExit(f"{sample} is missing: run bench/device_wheels.sh first (it tokenizes the FineWeb-Edu sample)")
    tokens = np.load(sample)
    reps = -(-(step_tokens + 1) // len(tokens))
    path = Path(tempfile.mkdtemp(prefix="first-hour-")) / "train_000000.npy"
    np.save(path, np.tile(tokens, reps))
    return path, f"the FineWeb-Edu sample ({len(tokens):,} tokens, repeated to one step)"


def short_run(args: argparse.Namespace) -> bool:
    """The preset's first --steps steps on one device; the step-0 loss and the speed against the published ones."""
    model_cfg, train = preset_model(args.tiny)
    train = TrainConfig.read({**{k: getattr(train, k) for k in TrainConfig.params()}, "nproc": 1,
                              "device": args.device, "max_steps": max(args.steps, train.max_steps),
                              "eval_every": 0, "ckpt_every": 10**6})
    env = distributed.setup(args.device)
    path, about = sample_or_shard(args.tiny, train.total_batch_tokens, args.sample)
    torch.manual_seed(train.seed)
    model = GPT(model_cfg)
    fpt = flops_per_token(model)
    loader = TokenLoader([path], train.micro_batch, model_cfg.block_size, train.total_batch_tokens)

    class Quiet:
        def log(self, step: int, metrics: dict) -> None: ...
        def log_constants(self, metrics: dict) -> None: ...

    print(f"{PRESET}: {args.steps} steps of {train.total_batch_tokens:,} tokens ({loader.grad_accum} micro batches of "
          f"{train.micro_batch}) on {env.device}, compile {train.compile}, from {about}", flush=True)
    with tempfile.TemporaryDirectory() as ckpt:
        trainer = Trainer(model, loader, train, env, Path(ckpt), Quiet(), {})
        losses, seconds = [], []
        for step in range(args.steps):
            t0 = time.perf_counter()
            losses.append(float(trainer.train_step()["train_loss"]))  # a host sync: the step has finished
            seconds.append(time.perf_counter() - t0)
            trainer.step += 1
            print(f"step {step}: train loss {losses[-1]:.4f}, {seconds[-1] * 1e3:,.0f} ms", flush=True)
    timed = seconds[args.untimed:] or seconds[-1:]
    tps = train.total_batch_tokens / statistics.median(timed)
    on_fineweb = path == FIRST_SHARD
    return report([
        loss_figure("train loss, step 0", STEP0_LOSS, STEP0_TOLERANCE, losses[0] if not args.tiny else None,
                    "" if not args.tiny else "a tiny model: not compared"),
        loss_figure("val loss, step 250", STEP250_VAL, STEP250_TOLERANCE, None,
                    f"needs the full preset run{'' if on_fineweb else ' on FineWeb-Edu'}: "
                    f"dvc exp run -S preset={PRESET}, then --check metrics/train"),
        speed_figure(tps, fpt, None if args.tiny else device_peak_flops(env.device)),
    ])


def make_sample(jsonl: Path, sample: Path = SAMPLE) -> None:
    """`sample`: the documents of a jsonl file ({"text": ...} a line) in GPT-2 ids, each after the end-of-text id, as
    build-nanogpt's fineweb.py shards them (uint16)."""
    import json

    from gptcore.data.tokenizers.gpt2 import gpt2_encoding

    enc, ids = gpt2_encoding(), []
    for line in jsonl.read_text(encoding="utf-8").splitlines():
        ids += [50256, *enc.encode_ordinary(json.loads(line)["text"])]
    sample.parent.mkdir(exist_ok=True)
    np.save(sample, np.asarray(ids, dtype=np.uint16))
    print(f"{sample}: {len(ids):,} GPT-2 tokens of {jsonl}")


def main(argv: list[str] | None = None) -> int:
    """Check a finished run's metrics, or make the short run; exit 1 when a compared figure fails."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", type=Path, metavar="METRICS_DIR", help="a finished run's metrics/train folder")
    mode.add_argument("--run", action="store_true", help="the short run (bench/device_check.sh)")
    mode.add_argument("--make-sample", type=Path, metavar="JSONL", help="tokenize the sample the short run reads")
    ap.add_argument("--gpu", help="--check: the GPU's name as torch reports it, for its peak (default: this one's)")
    ap.add_argument("--steps", type=int, default=12, help="--run: steps")
    ap.add_argument("--untimed", type=int, default=4, help="--run: first steps left out of the speed (compile)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--sample", type=Path, default=SAMPLE, help="the sample's tokens (--make-sample writes them)")
    ap.add_argument("--tiny", action="store_true", help="--run: 2 layers of 64 on 4,096-token steps, eager")
    args = ap.parse_args(argv)
    if args.run and args.tiny:
        args.steps, args.untimed = min(args.steps, 3), 1
    if args.make_sample:
        make_sample(args.make_sample, args.sample)
        return 0
    ok = check_metrics(args.check, args.gpu) if args.check else short_run(args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
