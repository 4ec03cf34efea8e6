"""Where a run computes: one process, or one per device under torchrun (NCCL on CUDA, gloo on CPU); its device and
the precision it actually runs in (the one place `dtype: bfloat16` becomes a torch dtype)."""
from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import ContextManager

import torch
import torch.distributed as dist

from gptcore.params import ParamError


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits: its global and local rank, the world size and its device."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs, writes metrics and saves."""
        return self.rank == 0

    @property
    def ddp(self) -> bool:
        """More than one process: the model is wrapped in DistributedDataParallel."""
        return self.world_size > 1


DEVICES = r"auto|cpu|mps|cuda(:\d+)?"  # the device params pick_device takes (a Param pattern)


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def pick_device(device: str = "auto", local_rank: int = 0, key: str = "device") -> torch.device:
    """`auto` prefers CUDA, then Apple's MPS, then the CPU; `cuda` takes the local rank's GPU. A missing device is a
    ParamError naming `key`, the param it came from (`train.device`)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            build = "a CPU build of torch" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
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


def setup(device: str = "auto", key: str = "device") -> DistEnv:
    """Join the process group when launched by torchrun (RANK/WORLD_SIZE set), else run single-process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local_rank, key)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, device_id=dev if dev.type == "cuda" else None)
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=dev)


def teardown() -> None:
    """Wait for every rank, then leave the process group (no-op in a single process)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def active() -> bool:
    """True inside a process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks in place (no-op in a single process)."""
    if active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    """Average a tensor over ranks in place (no-op in a single process)."""
    if active():
        all_reduce_sum(t).div_(dist.get_world_size())
    return t


def all_gather_objects(obj: object) -> list[object]:
    """Every rank's `obj`, in rank order (a one-element list in a single process)."""
    if not active():
        return [obj]
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    if active():
        dist.barrier()
