"""One process, or one per device under torchrun (NCCL on CUDA, gloo on CPU): joining and leaving the process
group, each wait on the other ranks bounded in time, the heartbeat a rank gives as it goes, and the reductions every
rank takes part in (no-ops in a single process)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from gptcore.device import pick_device
from gptcore.lifetime import beat, check_launcher_vars, rank_lines, under_torchrun

# under a stage's launch the stage watches every rank's heartbeat against the same bounds and names the rank that
# stalled (gptcore.launch); the collectives' own timeout waits this much longer, so that the stage speaks first
WATCHED_MARGIN = 30.0


@dataclass(frozen=True)
class Timeouts:
    """How long a rank waits for the others, in seconds, and the params that say so: `start` until its first step is
    done (joining the group, reading data and weights, the first step's compile), `steady` after (each collective,
    and the time from one heartbeat to the next)."""

    start: float
    steady: float
    start_key: str
    steady_key: str


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits: its global and local rank, the world size and its device."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs, writes metrics, model/ and a checkpoint's record (every rank writes its part of a
        checkpoint's shards)."""
        return self.rank == 0

    @property
    def ddp(self) -> bool:
        """More than one process (the Trainer wraps the model in DistributedDataParallel then, unless it shards it
        under train.parallel fsdp)."""
        return self.world_size > 1


class _Progress:
    """This rank's bounds, and the step its first heartbeat of training gave (None before)."""

    timeouts: Timeouts | None = None
    first_step: int | None = None
    steady = False


def setup(device: str = "auto", key: str = "device", timeouts: Timeouts | None = None) -> DistEnv:
    """Join the process group when torchrun started this process, else run single-process (torchrun's variables left
    in the environment without it are one line: `check_launcher_vars`). With `timeouts`, joining and every collective
    time out after `timeouts.start` seconds until `progress` sees a first step done, then after `timeouts.steady`
    (torch's own defaults otherwise: 10 minutes for NCCL, 30 for gloo)."""
    check_launcher_vars()
    launched = under_torchrun()
    world_size = int(os.environ["WORLD_SIZE"]) if launched else 1
    rank = int(os.environ["RANK"]) if launched else 0
    local_rank = int(os.environ["LOCAL_RANK"]) if launched else 0
    dev = pick_device(device, local_rank, key)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    _Progress.timeouts, _Progress.first_step, _Progress.steady = timeouts, None, False
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        wait = {} if timeouts is None else {"timeout": _collective_timeout(timeouts.start)}
        dist.init_process_group(backend=backend, device_id=dev if dev.type == "cuda" else None, **wait)
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=dev)


def _collective_timeout(seconds: float) -> timedelta:
    return timedelta(seconds=seconds + (WATCHED_MARGIN if rank_lines() is not None else 0.0))


def progress(step: int, doing: str) -> None:
    """This rank is `doing` (training, evaluating, saving, exporting) at `step`: its heartbeat for the stage that
    launched it (gptcore.launch; nothing elsewhere), and once a first step is done (a later step begins) the process
    group's timeout turns from the start-up's to the steady one. Cheap: call it as often as every step."""
    bounds = _Progress.timeouts
    if bounds is None:
        return
    if doing == "training" and _Progress.first_step is None:
        _Progress.first_step = step
    if not _Progress.steady and _Progress.first_step is not None and step > _Progress.first_step:
        _Progress.steady = True
        if active():
            dist.distributed_c10d._set_pg_timeout(_collective_timeout(bounds.steady))  # torchtitan does the same
    beat(step, doing, *current_bound())


def current_bound() -> tuple[float, str] | None:
    """(seconds, param) bounding this rank's waits for the others now, or None where `setup` was given no bounds."""
    bounds = _Progress.timeouts
    if bounds is None:
        return None
    return (bounds.steady, bounds.steady_key) if _Progress.steady else (bounds.start, bounds.start_key)


def teardown() -> None:
    """Wait for every rank, then leave the process group (no-op in a single process)."""
    if dist.is_initialized():
        dist.barrier()
        # gloo's worker thread frees each finished collective, and with it the last reference to its tensors, which
        # takes the GIL. The group's destructor joins that thread holding the GIL (at exit, when DDP's reducer lets go
        # of it): seen to hang a finished rank for good under load. Sleeping hands the thread the GIL to finish first.
        time.sleep(0.2)
        dist.destroy_process_group()
        _CPU_GROUP.clear()


def active() -> bool:
    """True inside a process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """The processes of the group (1 outside one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


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


_CPU_GROUP: list = []  # a gloo group beside NCCL's, made on first use, for what the host needs to agree on


def max_over_ranks(value: int) -> int:
    """The largest of every rank's `value` (a small int; the value itself in a single process), agreed on the CPU:
    where the default group is NCCL's, through a gloo group beside it, so the host never waits for the GPU's queue.
    Every rank calls it at the same point."""
    if not active():
        return value
    group = None
    if dist.get_backend() != "gloo":
        if not _CPU_GROUP:
            _CPU_GROUP.append(dist.new_group(backend="gloo"))  # collective: every rank's first call makes it
        group = _CPU_GROUP[0]
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t)


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    if active():
        dist.barrier()
