"""FLOP accounting: training FLOPs per token, the peak FLOP/s of known GPUs, and MFU from a measured rate."""
from __future__ import annotations

import re

import torch

from gptcore.model.gpt import GPT



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


def estimate_mfu(
    model: GPT,
    tokens_per_sec: float,
    device: torch.device | str | None = None,
    peak_flops: float | None = None,
) -> float | None:
    """Model FLOPs utilisation, a fraction of peak dense bf16 FLOP/s, for `tokens_per_sec` processed by
    ONE device (divide a global rate by the world size). The peak is `peak_flops` if given, else looked
    up for `device` (default: where the model's parameters are); None when it is unknown, e.g. on CPU."""
    if peak_flops is None:
        if device is None:
            device = next(model.parameters()).device
        peak_flops = device_peak_flops(device)
        if peak_flops is None:
            return None
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be > 0, got {peak_flops}")
    return flops_per_token(model) * tokens_per_sec / peak_flops



# Peak dense (no 2:4 sparsity) tensor-core FLOP/s in bf16, or fp16 where the GPU has no bf16 (V100, T4),
# keyed on substrings of torch.cuda.get_device_name(). Checked in order, so specific names come first;
# a key matches only as a whole word ("A10" does not match "A100" or "A10G"). Sources: NVIDIA datasheets,
# halving the "with sparsity" figures they print:
#   H100 SXM / PCIe / NVL: H100 Tensor Core GPU datasheet (1,979 / 1,513 / 1,671 TFLOPS sparse BF16)
#   H200 SXM / NVL and GH200: H200 datasheet (1,979 / 1,671 sparse), GH200 datasheet (same die as H100 SXM)
#   B200 / GB200: HGX B200 and GB200 NVL72 specifications (4.5 / 5 PFLOPS sparse BF16 per GPU)
#   A100 (SXM and PCIe): A100 datasheet, 312 TFLOPS BF16 dense
#   A10: A10 datasheet, 125 dense; A10G (AWS g5): 70, per Baseten "NVIDIA A10 vs A10G for ML model inference"
#   A40: A40 datasheet, 149.7 dense; L40S: L40S datasheet, 362.05 dense; L40: 181.05 dense; L4: 242 sparse
#   RTX 4090: Ada (AD102) whitepaper, 165.2 FP16/BF16 with FP32 accumulate; RTX 3090 / 3090 Ti: Ampere
#   GA102 whitepaper, 71 / 80 with FP32 accumulate (training accumulates in fp32)
#   V100 SXM2 / PCIe / V100S: V100 datasheet, 125 / 112 / 130 fp16; T4: T4 datasheet, 65 fp16
_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("GH200", 989e12),
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # "NVIDIA H100 80GB HBM3" is the SXM part
    ("A100", 312e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("A40", 149.7e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("RTX 4090", 165.2e12),
    ("RTX 3090 Ti", 80e12),
    ("RTX 3090", 71e12),
    ("V100S", 130e12),
    ("V100-PCIE", 112e12),
    ("V100", 125e12),
    ("T4", 65e12),
)


def peak_flops_for_name(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s for a CUDA device name as torch reports it; None if not in the table or a
    MIG slice (which gets only part of the chip)."""
    if "MIG" in device_name:
        return None
    for key, flops in _PEAK_FLOPS:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name, flags=re.IGNORECASE):
            return flops
    return None


def device_peak_flops(device: torch.device | str | None = None) -> float | None:
    """Peak dense bf16 FLOP/s of `device` (default: the current CUDA device); None on CPU/MPS, without
    CUDA, or for a GPU not in the table, so that callers never report a made-up MFU."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_flops_for_name(torch.cuda.get_device_name(device))
