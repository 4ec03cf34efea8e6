"""Will a training run fit in the device's memory? A lower bound of what training needs, checked before anything
is allocated, so that `model.n_layer: 1000000` is refused in a second instead of being OOM-killed minutes later.

The bound counts only what training certainly holds: every weight matrix (12 n_embd^2 per block, the embedding and
an untied head; biases, norms and the position table left out) in fp32 with its gradient and optimizer state
(AdamW: 16 bytes a weight; Muon's momentum: 12), and the inputs each block's linear layers keep for the backward
pass (about 7 n_embd values per token per block in the autocast precision). The logits are left out (the head may
be computed in chunks). Real use is higher, so a run this refuses cannot work; one it lets through may still not.
"""
from __future__ import annotations

from typing import Any

import torch

from gptcore.errors import UserError

GIB = 1 << 30


def matrix_params(model: dict[str, Any], vocab_size: int) -> int:
    """Weights in the matrices of a scratch model of this `model:` section (vocab_size already padded)."""
    c = model["n_embd"]
    per_block = 12 * c * c  # attention 4 c^2; MLP 8 c^2 (GELU/ReLU^2) or 3 c * 8/3 c (SwiGLU)
    heads = 1 if model.get("tie_embeddings", True) else 2
    return model["n_layer"] * per_block + heads * vocab_size * c


def train_bytes(model: dict[str, Any], train: dict[str, Any], vocab_size: int) -> int:
    """A lower bound of the memory one training process needs, in bytes."""
    n = matrix_params(model, vocab_size)
    state = 16 if train.get("optimizer", "adamw") == "adamw" else 12
    act_bytes = 4 if train.get("dtype") == "float32" else 2
    activations = train["micro_batch"] * model["block_size"] * model["n_layer"] * 7 * model["n_embd"] * act_bytes
    return n * state + activations


def available_bytes(device: torch.device) -> int | None:
    """Memory free for this process on `device` (CUDA: the GPU's free memory; CPU: the system's available RAM);
    None where it cannot be told (MPS)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        import psutil

        return psutil.virtual_memory().available
    return None


def check_fits(model: dict[str, Any], train: dict[str, Any], vocab_size: int, device: torch.device,
               processes: int = 1) -> None:
    """A UserError naming the params when training `model` cannot fit in `device`'s free memory (a scratch model
    only: a loaded one's weights are already known to fit). CPU processes share the machine's RAM."""
    if model.get("init_from", "scratch") != "scratch":
        return
    free = available_bytes(device)
    if free is None:
        return
    sharing = processes if device.type == "cpu" else 1
    need = train_bytes(model, train, vocab_size) * sharing
    if need <= free:
        return
    n = matrix_params(model, vocab_size)
    on = f"{processes} processes on the cpu" if sharing > 1 else str(device)
    raise UserError(
        f"params.yaml model.n_layer={model['n_layer']}, model.n_embd={model['n_embd']}, "
        f"train.micro_batch={train['micro_batch']}, model.block_size={model['block_size']}: training needs at least "
        f"{need / GIB:,.1f} GiB ({n / 1e6:,.0f}M weights with their gradients and optimizer state, and the "
        f"activations of one micro-batch) and {on} has {free / GIB:,.1f} GiB free: make the model smaller or "
        f"lower train.micro_batch")
