"""Where and in what precision a process computes: the device a param names, and the one place `dtype: bfloat16`
becomes a torch dtype (with its CPU and GPU fallbacks) and an autocast context."""
from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager

import torch

from gptcore.params import ParamError

DEVICES = r"auto|cpu|mps|cuda(:\d+)?"  # the device params pick_device takes (a Param pattern)
# the rules of every device and dtype param (train.device, eval.device, gptcore-sample's --device; ... dtype), one
# definition for all of them: `param(**DEVICE_RULES)`, `Param(str, **DTYPE_RULES)`
DEVICE_RULES = dict(default="auto", doc="auto (cuda, else mps, else cpu) | cpu | cuda | cuda:N | mps", pattern=DEVICES,
                    what="auto, cpu, cuda, cuda:N or mps")


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def pick_device(device: str = "auto", local_rank: int = 0, key: str = "device") -> torch.device:
    """`auto` prefers CUDA, then Apple's MPS, then the CPU; `cuda` takes the local rank's GPU. A missing device is a
    ParamError naming `key`, the param it came from (`train.device`)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            build = f"torch built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build of torch"
            raise ParamError(key, device, f"no CUDA GPU is visible ({build}): set auto or cpu, or run where a GPU is")
        index = local_rank if device == "cuda" else int(device.split(":")[1])
        if index >= torch.cuda.device_count():
            raise ParamError(key, device, f"GPU {index} does not exist here ({torch.cuda.device_count()} visible): "
                                          f"set cuda or a smaller index")
        return torch.device("cuda", index)
    if device == "mps" and not _mps_available():
        raise ParamError(key, device, "Apple's MPS is not available here: set auto or cpu")
    return torch.device(device)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_RULES = dict(default="bfloat16", doc="autocast precision (float32 turns it off; bfloat16 falls back to "
                                           "float32 on a CPU without native bf16, to float16 on a GPU without bf16)",
                   choices=tuple(sorted(DTYPES)))


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The precision actually used: bf16 falls back to fp32 on CPUs without native bf16 (it would only be slower)
    and to fp16 on GPUs without bf16."""
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
