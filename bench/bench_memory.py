"""Memory, measured: what the model keeps for backward, train's estimate beside measured peaks, and the per-GPU tables
of README and docs/reproducing-gpt2.md, all from gptcore/train/memory.py.

1. Saved for backward: every tensor autograd keeps, counted once per storage (torch.autograd.graph.saved_tensors_hooks;
   the weights themselves left out, autocast's cast copies of them kept), for one and two blocks at two batch sizes,
   so that the difference is one block's bytes per token. A row per recipe (GPT-2; the modern switches of
   conf/preset/modern_quickstart.yaml; modern_124m's, ReLU^2), precision (fp32; bf16 autocast) and torch.compile off
   or on, beside memory.saved_per_token_block, the formula train's estimate uses. Compile rows take a minute each on
   the CPU (--compile).
2. The estimate beside measured peaks: bench/bench_parallel.py's launch (2 gloo ranks on the CPU, the Trainer's own
   path, the runtime warmed first) at three shapes, ddp and fsdp, the worse rank of each; the former estimate (16
   bytes a weight and 10 n_embd values a token a block, before issue 44) beside it.
3. The per-GPU tables: train's estimate for each GPT-2 preset on 8 GPUs at the micro batches the docs list.

    python bench/bench_memory.py                    # all three, eager, a few minutes on 2 cores
    python bench/bench_memory.py --compile          # the saved-for-backward rows with torch.compile too
    python bench/bench_memory.py --tables           # the per-GPU tables alone (no measurement), seconds
    python bench/bench_memory.py --tiny             # small shapes: checks the script runs (CI)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import bench_parallel  # noqa: E402
from gptcore.device import autocast_context  # noqa: E402
from gptcore.model.gpt import GPT, GPTConfig  # noqa: E402
from gptcore.presets import composed  # noqa: E402
from gptcore.train import memory  # noqa: E402
from gptcore.train.config import TrainConfig  # noqa: E402
from gptcore.train.parallel import MODES  # noqa: E402

GIB = 1 << 30
# the recipes' switches: GPT-2's defaults; conf/preset/modern_quickstart.yaml's; conf/preset/modern_124m.yaml's
RECIPES = {
    "gpt2": {},
    "modern_quickstart": dict(bias=False, pos_encoding="rotary", norm="rmsnorm", qk_norm=True, mlp="gelu",
                              tie_embeddings=False, zero_init_head=True, zero_init_proj=True, logit_softcap=30.0),
    "modern_124m": dict(bias=False, pos_encoding="rotary", norm="rmsnorm", qk_norm=True, mlp="relu2",
                        tie_embeddings=False, zero_init_head=True, zero_init_proj=True, logit_softcap=30.0),
}
# (n_layer, n_embd, n_head, block_size, micro_batch, vocab, dtype): weights first; activations first; a larger head
# under bf16 autocast (the blocks' cast copies, the loss's chunk)
PEAK_SHAPES = [(8, 640, 10, 64, 1, 512, "float32"), (4, 256, 4, 256, 8, 512, "float32"),
               (6, 384, 6, 128, 4, 4096, "bfloat16")]
TINY_SHAPES = [(2, 64, 2, 64, 2, 512, "float32"), (2, 64, 2, 64, 4, 512, "bfloat16")]
# the docs' per-GPU tables: preset, micro batches; 8 GPUs
TABLES = [("gpt2_124m", (64, 32, 16)), ("gpt2_350m", (64, 32, 16)), ("gpt2_774m", (32, 16, 8)),
          ("gpt2_1558m", (16, 8, 4))]


def saved_bytes(config: GPTConfig, batch: int, dtype: torch.dtype, compile: bool = False) -> int:
    """Bytes autograd keeps for one forward of a GPT of `config` on `batch` random sequences of block_size tokens
    (with their loss) under autocast at `dtype` (fp32: none), each storage once, the weights left out."""
    torch.manual_seed(0)
    model = GPT(config)
    model.loss_chunk_rows = 256  # a fixed chunking; the loss keeps the same whatever its chunks
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    if compile:
        torch._dynamo.reset()
    run = torch.compile(model) if compile else model
    x, y = (torch.randint(0, config.vocab_size, (batch, config.block_size)) for _ in range(2))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast_context(torch.device("cpu"), dtype):
            run(x, y)
    return sum(kept.values())


def per_token_block(switches: dict, n_embd: int, n_head: int, dtype: torch.dtype, compile: bool = False,
                    block_size: int = 64) -> float:
    """One block's saved bytes per token: saved_bytes at one and two blocks, two batch sizes, differenced."""
    at = {(layers, batch): saved_bytes(GPTConfig(n_layer=layers, n_embd=n_embd, n_head=n_head, block_size=block_size,
                                                 vocab_size=512, **switches), batch, dtype, compile)
          for layers in (1, 2) for batch in (2, 4)}
    return ((at[2, 4] - at[1, 4]) - (at[2, 2] - at[1, 2])) / (2 * block_size)


def saved_table(args: argparse.Namespace) -> None:
    """Part 1: measured against the formula, per recipe, precision and compile."""
    n_embd, n_head = (64, 2) if args.tiny else (256, 4)
    print(f"1. saved for backward, bytes a token a block, measured with saved-tensor hooks at n_embd {n_embd}, "
          f"n_head {n_head} (CPU) beside memory.saved_per_token_block")
    print(f"{'recipe':18} {'precision':9} {'compile':7} {'measured':>9} {'= x n_embd':>10} {'formula':>8}")
    for name, switches in RECIPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            formula = memory.saved_per_token_block(GPTConfig(n_embd=n_embd, n_head=n_head, **switches),
                                                   4 if dtype == torch.float32 else 2)
            for compile in (False, True) if args.compile else (False,):
                got = per_token_block(switches, n_embd, n_head, dtype, compile)
                print(f"{name:18} {str(dtype).replace('torch.', ''):9} {str(compile):7} {got:9.0f} "
                      f"{got / n_embd:10.2f} {formula:8d}", flush=True)


def former_estimate(model: GPTConfig, train: TrainConfig, vocab: int, processes: int, mode: str) -> int:
    """The estimate before issue 44, for comparison: the mode's state and 10 n_embd values a token a block."""
    act = memory.act_bytes(train)
    weights = memory.matrix_params(model, vocab)
    root = weights - model.n_layer * memory.block_params(model)
    state = MODES[mode].state_bytes(weights, root, memory.block_params(model), 16, processes, act)
    return state + train.micro_batch * model.block_size * model.n_layer * 10 * model.n_embd * act


def peaks_table(args: argparse.Namespace) -> None:
    """Part 2: train's estimate beside the measured peak at 2 gloo ranks."""
    print("\n2. a rank's peak (2 gloo ranks on the CPU, the worse rank), MiB: measured (what training adds to the "
          "warmed process), train's estimate, the former one")
    print(f"{'shape':40} {'mode':5} {'peak':>8} {'estimate':>9} {'est/peak':>8} {'former':>8} {'former/peak':>11}")
    for n_layer, n_embd, n_head, block, micro, vocab, dtype in TINY_SHAPES if args.tiny else PEAK_SHAPES:
        launch = bench_parallel.main_args(
            ["--n-layer", str(n_layer), "--n-embd", str(n_embd), "--n-head", str(n_head), "--block-size", str(block),
             "--micro-batch", str(micro), "--vocab", str(vocab), "--dtype", dtype, "--steps", "2", "--warmup", "2"])
        model = GPTConfig(n_layer=n_layer, n_embd=n_embd, n_head=n_head, block_size=block, vocab_size=vocab)
        train = TrainConfig.read(dict(micro_batch=micro, total_batch_tokens=micro * block * 2, dtype=dtype,
                                      max_steps=4, warmup_steps=0, max_lr=1e-3, eval_every=0, val_tokens=block,
                                      ckpt_every=10**6))
        shape = f"{n_layer} x {n_embd}, block {block}, micro {micro}, vocab {vocab}, {dtype}"
        for mode in bench_parallel.MODES:
            worst = max(bench_parallel.launch(launch, mode), key=lambda r: r["peak"])
            former = former_estimate(model, train, vocab, 2, mode)
            print(f"{shape:40} {mode:5} {worst['peak'] / 2**20:8.1f} {worst['estimate'] / 2**20:9.1f} "
                  f"{worst['estimate'] / worst['peak']:8.2f} {former / 2**20:8.1f} {former / worst['peak']:11.2f}",
                  flush=True)


def gpu_tables() -> None:
    """Part 3: GiB a GPU on 8 GPUs (bf16, the preset's train section but its micro batch), ddp and fsdp."""
    print("\n3. train's estimate, GiB a GPU on 8 GPUs (bf16; CUDA's loss chunks), and the former estimate")
    print(f"{'preset':12} {'micro batch':>11} {'ddp':>6} {'fsdp':>6} {'former ddp':>10} {'former fsdp':>11}")
    for name, micros in TABLES:
        values = composed(name)
        model = GPTConfig.read({k: v for k, v in values["model"].items() if k in GPTConfig.params()})
        vocab = model.vocab_size
        for micro in micros:
            train = TrainConfig.read({**values["train"], "micro_batch": micro})
            est = {m: memory.train_bytes(model, train, vocab, 8, MODES[m], "cuda") / GIB for m in ("ddp", "fsdp")}
            old = {m: former_estimate(model, train, vocab, 8, m) / GIB for m in ("ddp", "fsdp")}
            print(f"{name:12} {micro:11d} {est['ddp']:6.1f} {est['fsdp']:6.1f} {old['ddp']:10.1f} {old['fsdp']:11.1f}")


def main(argv: list[str] | None = None) -> None:
    """Print the parts the options ask for (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile", action="store_true", help="also measure the saved tensors under torch.compile")
    ap.add_argument("--tables", action="store_true", help="the per-GPU tables alone")
    ap.add_argument("--tiny", action="store_true", help="small shapes, no compile: checks the script runs")
    args = ap.parse_args(argv)
    if not args.tables:
        saved_table(args)
        peaks_table(args)
    gpu_tables()


if __name__ == "__main__":
    main()
