"""Precision: dtype names, the bf16 fallback on hardware without it, and the autocast context for a forward.

The one place train, evaluate and sampling turn `dtype: bfloat16` into what actually runs.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The precision actually used: bf16 falls back to fp32 on CPUs without native bf16 (it would only be slower)
    and to fp16 on GPUs without bf16."""
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}: expected one of {sorted(DTYPES)}")
    dtype = DTYPES[name]
    if dtype == torch.bfloat16 and device.type == "cpu":
        fast = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)() or getattr(
            torch.cpu, "_is_amx_tile_supported", lambda: False)()
        if not fast:
            return torch.float32
    if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return dtype


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> ContextManager:
    """Mixed precision for a forward pass in `dtype` (nothing for fp32); losses stay float32."""
    if dtype is None or dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
