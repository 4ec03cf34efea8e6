"""The parallel modes (`train.parallel`), applied here and nowhere else: how a run's model is placed on its processes,
compiled, wrapped, evaluated and gathered whole. The Trainer, the evaluators, the memory estimate and the bench scripts
ask a `ParallelMode` (its `sharded`, `lockstep`, methods); none compares a mode's name. A new mode is a class here and
a row in MODES.

- ddp: every process holds the whole model; torch.compile over the whole model, then DistributedDataParallel (one
  all-reduce of the gradients a step), as build-nanogpt.
- fsdp: FSDP2 (`fully_shard`) shards weights, gradients and optimizer state over the processes, each block a unit
  gathered for its forward and its backward, then the root; with train.compile each block is compiled before it is
  sharded, as torchtitan does. Precision: under bf16 the blocks' weights are gathered in bf16 (half the bytes of fp32)
  and their gradients reduce-scattered in fp32; the root (embeddings, final norm, head) stays fp32, so the residual
  stream is fp32 and autocast does the rest, as in a ddp run. Only a block's norm gains and biases then differ from
  ddp's bf16 run: they are rounded to bf16 where ddp reads them in fp32.
- hsdp: fsdp inside each node, replicated across nodes (FSDP2 on a 2-D device mesh, (replicate, shard)): a node's
  processes (torchrun's LOCAL_WORLD_SIZE) shard the model among themselves, as fsdp does, and every node holds the
  same shards. A step's gathers and reduce-scatters stay inside a node (NVLink); across nodes only the gradient
  shards are all-reduced, once a step (the micro steps' reduce-scattered shards add up until the last), each
  1/(a node's processes) of ddp's all-reduce. On one node it is fsdp.
"""
from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from typing import Any, ContextManager, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from gptcore.distributed import DistEnv, all_gather_objects
from gptcore.model.gpt import GPT, GPTConfig
from gptcore.params import ParamError, choose
from gptcore.train.config import TrainConfig


class ParallelMode:
    """One choice of train.parallel. `sharded`: each process holds a shard of the weights, gradients and optimizer
    state (what the memory estimate counts; checkpoints have one format for every mode); `lockstep`: every rank runs
    every evaluation pass (each pass gathers weights). `prepare` places the model before its optimizers are built;
    `wrap` gives the module the loop calls, once a checkpoint is restored."""

    name: str
    sharded: bool = False
    lockstep: bool = False
    about: str = ""  # what describe() adds to the run's line

    def check(self, train: TrainConfig, device: torch.device | None) -> None:
        """A ParamError for a train: section this mode cannot run on `device` (None: not looked at, as in a torchrun
        launcher, which keeps off the GPUs; none here)."""

    def prepare(self, model: GPT, env: DistEnv, dtype: torch.dtype, compile: bool) -> None:
        """Put `model` on this process's device, in place."""
        model.to(env.device)

    def wrap(self, model: GPT, env: DistEnv, compile: bool) -> nn.Module:
        """The module the training loop calls (the model itself, compiled or wrapped)."""
        return model

    def no_sync(self, module: nn.Module, last_micro: bool) -> ContextManager:
        """Around one micro step's forward and backward: what holds gradients back until the last (nothing here)."""
        return nullcontext()

    def shards(self, processes: int) -> int:
        """Into how many shards the state is cut when `processes` processes train (1: each holds it whole)."""
        return 1

    def state_bytes(self, weights: int, root: int, block: int, bytes_per_weight: int, processes: int,
                    act_bytes: int) -> int:
        """A process's bytes of weights, gradients and optimizer state (fp32: `bytes_per_weight` a weight, of
        `weights` matrix weights, `root` of them outside the blocks, `block` in each block), with what the mode adds
        (gradient buckets, gathered weights)."""
        return weights * bytes_per_weight


class DDP(ParallelMode):
    """train.parallel ddp: every process holds the whole model; gradients all-reduced once a step."""

    name = "ddp"

    def wrap(self, model: GPT, env: DistEnv, compile: bool) -> nn.Module:
        """torch.compile over the whole model, then (more than one process) DistributedDataParallel."""
        module: nn.Module = torch.compile(model) if compile else model
        if env.world_size > 1:
            module = DistributedDataParallel(module, device_ids=[env.local_rank] if env.device.type == "cuda" else None)
        return module

    def no_sync(self, module: nn.Module, last_micro: bool) -> ContextManager:
        """DDP all-reduces the gradients on the last micro step only."""
        return module.no_sync() if isinstance(module, DistributedDataParallel) and not last_micro else nullcontext()

    def state_bytes(self, weights: int, root: int, block: int, bytes_per_weight: int, processes: int,
                    act_bytes: int) -> int:
        """The whole state, and with other processes a second copy of the gradients in DDP's all-reduce buckets."""
        return weights * bytes_per_weight + (4 * weights if processes > 1 else 0)


class FSDP(ParallelMode):
    """train.parallel fsdp: FSDP2 shards weights, gradients and optimizer state over the processes."""

    name = "fsdp"
    sharded = lockstep = True
    about = " (fsdp: weights, gradients and optimizer state sharded)"

    def check(self, train: TrainConfig, device: torch.device | None) -> None:
        """fsdp computes in bf16 or fp32: float16's loss scaling is not sharded here."""
        if train.dtype == "float16":
            raise ParamError("train.dtype", train.dtype, f"with train.parallel {self.name} needs bfloat16 or float32 "
                                                         f"(float16's loss scaling is not sharded here): set "
                                                         f"train.dtype: bfloat16, or train.parallel: ddp")
        if device is not None and device.type == "cuda" and train.dtype == "bfloat16" \
                and not torch.cuda.is_bf16_supported():  # bf16 would fall back to float16 there
            raise ParamError("train.parallel", train.parallel, f"{device} has no bf16, and float16's loss scaling is "
                                                               f"not sharded here: set train.dtype: float32, or "
                                                               f"train.parallel: ddp")

    def shards(self, processes: int) -> int:
        """Every process holds its own shard."""
        return processes

    def mesh(self, device: torch.device) -> Any:
        """The device mesh the model is sharded over: every process of the default group, in one dimension."""
        return init_device_mesh(device.type, (dist.get_world_size(),))

    def prepare(self, model: GPT, env: DistEnv, dtype: torch.dtype, compile: bool) -> None:
        """Shard `model` in place over the default process group (a group of one is made for a lone process): each
        block (compiled first with train.compile) a unit gathered for its forward and its backward and resharded after
        each, then the root. The weights may still be on the CPU: each unit moves to the device as it is sharded, so
        the whole model is never on the device at once."""
        if not dist.is_initialized():  # one process: FSDP still needs a group, here of one
            cuda = env.device.type == "cuda"
            dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1,
                                    device_id=env.device if cuda else None)
        mesh = self.mesh(env.device)
        blocks = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if dtype == torch.bfloat16 else None,
                                      reduce_dtype=torch.float32, cast_forward_inputs=False)
        for block in model.transformer.h:
            if compile:
                block.compile()  # in place: the parameter names stay the model's
            fully_shard(block, mesh=mesh, mp_policy=blocks)
        fully_shard(model, mesh=mesh)  # the root's unit also moves the buffers no block holds (the rotary table)
        # an evaluator calls hidden_states, not forward: as forward, it runs the root's hooks, so the root is FSDP's
        # root (not the first block called) and its weights are gathered
        register_fsdp_forward_method(model, "hidden_states")

    def state_bytes(self, weights: int, root: int, block: int, bytes_per_weight: int, processes: int,
                    act_bytes: int) -> int:
        """A 1/processes shard of the state, plus what it gathers: the root's matrices (fp32 weights and gradients),
        and a block's weights and gradients, twice, as the next block's gather overlaps the current one."""
        return -(-weights * bytes_per_weight // self.shards(processes)) + 8 * root + 2 * 2 * act_bytes * block


class HSDP(FSDP):
    """train.parallel hsdp: fsdp over each node's processes, the shards replicated across nodes."""

    name = "hsdp"
    about = " (hsdp: weights, gradients and optimizer state sharded inside a node, replicated across nodes)"

    def shards(self, processes: int) -> int:
        """A node's processes: torchrun's LOCAL_WORLD_SIZE (all `processes` where it is not set: one node)."""
        return min(processes, int(os.environ.get("LOCAL_WORLD_SIZE", processes)))

    def mesh(self, device: torch.device) -> Any:
        """A 2-D mesh, (replicate, shard): a row is a node's processes. torchrun numbers ranks node by node (global
        rank = node rank x node size + local rank), so the rows are the nodes where every node runs as many ranks;
        nodes of different sizes are refused, since no row would be one node."""
        world, node = dist.get_world_size(), self.shards(dist.get_world_size())
        layout = all_gather_objects((node, int(os.environ.get("LOCAL_RANK", "0"))))
        sizes = sorted({size for size, _ in layout})
        if len(sizes) > 1 or world % node:
            raise ParamError("train.parallel", self.name, f"needs as many processes on every node, found "
                                                          f"{', '.join(map(str, sizes))} on the {world} processes' "
                                                          f"nodes: start the same number on each, or set "
                                                          f"train.parallel: fsdp")
        if any(rank % node != local for rank, (_, local) in enumerate(layout)):
            raise RuntimeError(f"hsdp: ranks are not numbered node by node ({layout}): no mesh row is one node")
        return init_device_mesh(device.type, (world // node, node), mesh_dim_names=("replicate", "shard"))

    def no_sync(self, module: nn.Module, last_micro: bool) -> ContextManager:
        """Each micro step reduce-scatters its gradients inside the node, as fsdp; FSDP adds the shards up and
        all-reduces them across nodes on the last micro step only, once a step."""
        return _all_reduce_across_nodes(module, last_micro) if is_sharded(module) else nullcontext()


MODES: dict[str, ParallelMode] = {
    "ddp": DDP(),
    "fsdp": FSDP(),
    "hsdp": HSDP(),
}


@contextmanager
def _all_reduce_across_nodes(module: nn.Module, now: bool) -> Iterator[None]:
    """Around one micro step's backward of an HSDP module: its gradient shards all-reduced across the replicas now,
    or kept and added to the next micro step's (FSDP's own accumulation)."""
    module.set_requires_all_reduce(now)
    try:
        yield
    finally:
        module.set_requires_all_reduce(True)


def parallel_mode(train: TrainConfig) -> ParallelMode:
    """The mode train.parallel names (a ParamError naming it and the modes there are)."""
    return choose(MODES, "train.parallel", train.parallel)


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` is sharded by FSDP2."""
    return isinstance(model, FSDPModule)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t` (its shard of a DTensor; `t` itself otherwise)."""
    return t.to_local() if isinstance(t, DTensor) else t


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """torch's clip_grad_norm_ over sharded or whole gradients: the norm of the whole gradient either way."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Around evaluation of a sharded model: the root's weights (embeddings, final norm, head) stay gathered, so that
    logits may be called outside forward; a block gathers its own when called. Every rank must run the same passes
    (each gather is a collective). A whole model: nothing to do."""
    if not is_sharded(model):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


def whole_state(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """Collective: the whole weights of `model` (plain, DDP or FSDP2: torch.distributed.checkpoint's state_dict
    gathers a sharded one) on rank 0's CPU, tied names sharing one tensor; None on the other ranks."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if not dist.is_initialized() or dist.get_rank() == 0 else None


def empty_gpt(config: GPTConfig) -> GPT:
    """A GPT of `config` on the CPU with uninitialised weights (no random init of up to 1.5B weights, and no draw from
    the global RNG), ties and derived buffers as GPT() makes them: for weights loaded next."""
    with torch.device("meta"):
        model = GPT(GPTConfig(**{k: getattr(config, k) for k in GPTConfig.params()}))
    model.to_empty(device="cpu")
    if config.tie_embeddings:
        model.lm_head.weight = model.transformer.wte.weight  # to_empty may untie
    if hasattr(model, "rotary"):  # a non-persistent buffer: not in any state_dict, made again
        model.rotary = type(model.rotary)(config.n_embd // config.n_head, config.rope_base)
    return model


def whole_model(model: GPT) -> GPT | None:
    """Collective: `model`'s weights as an unsharded GPT on rank 0's CPU (None elsewhere), whatever the mode."""
    state = whole_state(model)
    if state is None:
        return None
    whole = empty_gpt(model.config)
    whole.load_state_dict(state)
    whole.loss_chunk_rows = model.loss_chunk_rows
    return whole
