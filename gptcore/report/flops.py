"""FLOPs: what a model's size costs per token, and the share of a GPU's peak a run reaches (MFU)."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch

from gptcore.model.gpt import GPT

if TYPE_CHECKING:
    pass


def flops_per_token(model: GPT) -> int:
    """Training FLOPs per token (forward + backward) at context block_size: 6N + 12*L*H*Q*T, with N the
    non-embedding parameter count (PaLM, Chowdhery et al. 2022, appendix B)."""
    cfg = model.config
    N = model.get_num_params(non_embedding=True)
    L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
    return 6 * N + 12 * L * H * Q * T


def model_sizes(model: GPT) -> dict[str, int]:
    """What makes runs of different shapes comparable: "params" (all, the tied matrix once), "params_non_embedding"
    (GPT.get_num_params: lookup tables left out) and "flops_per_token" (training, at block_size)."""
    return {"params": model.get_num_params(non_embedding=False),
            "params_non_embedding": model.get_num_params(non_embedding=True),
            "flops_per_token": flops_per_token(model)}


def estimate_mfu(model: GPT, tokens_per_sec: float, device: torch.device | str) -> float | None:
    """Model FLOPs utilisation of ONE device's `tokens_per_sec` (a fraction of its peak); None if unknown, e.g. CPU."""
    peak_flops = device_peak_flops(device)
    return None if peak_flops is None else flops_per_token(model) * tokens_per_sec / peak_flops


# Peak dense (no 2:4 sparsity) tensor-core FLOP/s in bf16 (fp16 where there is no bf16) from NVIDIA's datasheets (the
# sources: docs/benchmarks.md), keyed on whole words of torch.cuda.get_device_name(): specific names first.
_PEAK_FLOPS: tuple[tuple[str, float], ...] = (  # one GPU family a line
    ("GB200", 2.5e15), ("B200", 2.25e15),
    ("GH200", 989e12), ("H200 NVL", 835e12), ("H200", 989e12),
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12),  # "NVIDIA H100 80GB HBM3" is the SXM part
    ("A100", 312e12), ("A10G", 70e12), ("A10", 125e12), ("A40", 149.7e12),
    ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12),
    ("RTX 4090", 165.2e12), ("RTX 3090 Ti", 80e12), ("RTX 3090", 71e12),
    ("V100S", 130e12), ("V100-PCIE", 112e12), ("V100", 125e12), ("T4", 65e12),
)


def peak_flops_for_name(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s for a CUDA device name as torch reports it; None if unknown or a MIG slice (a part)."""
    if "MIG" in device_name:
        return None
    for key, flops in _PEAK_FLOPS:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name, flags=re.IGNORECASE):
            return flops
    return None


def device_peak_flops(device: torch.device | str) -> float | None:
    """Peak dense bf16 FLOP/s of `device`; None off CUDA or if unknown."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_flops_for_name(torch.cuda.get_device_name(device))
