"""`train.parallel: fsdp`: a GPT sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`), each block and then the
root, and what the loop needs of a sharded model: the gradient-norm clip, evaluation with the root's weights
gathered, the full weights on rank 0, and a whole (ddp) checkpoint's tensors cut into this rank's shards.

Precision: under bf16 the blocks' weights are gathered in bf16 (half the bytes of fp32) and their gradients
reduce-scattered in fp32; the root (embeddings, final norm, head) stays fp32, so the residual stream is fp32 and
autocast does the rest, as in a ddp run. Only a block's norm gains and biases then differ from ddp's bf16 run: they
are rounded to bf16 where ddp reads them in fp32.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from gptcore.model.gpt import GPT, GPTConfig

PARALLEL = ("ddp", "fsdp")  # train.parallel's choices


def shard_model(model: GPT, dtype: torch.dtype, device: torch.device) -> None:
    """Shard `model` in place over the default process group (a group of one is made for a lone process): each block
    a unit gathered for its forward and its backward and resharded after each, then the root. The weights may still
    be on the CPU: each unit moves to `device` as it is sharded, so the whole model is never on the device at once."""
    if not dist.is_initialized():  # one process: FSDP still needs a group, here of one
        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=device if cuda else None)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    blocks = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if dtype == torch.bfloat16 else None,
                                  reduce_dtype=torch.float32, cast_forward_inputs=False)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=blocks)
    fully_shard(model, mesh=mesh)  # the root's unit also moves the buffers no block holds (the rotary table)
    # the root must be FSDP's root before anything calls a block alone (an evaluator's hidden_states): the first
    # module to run forward would become the root otherwise; torch exposes no public call for it
    model._get_fsdp_state()._lazy_init()


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` is sharded by FSDP2 (train.parallel fsdp)."""
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
    hidden_states and logits may be called outside forward; a block gathers its own when called. Every rank must
    run the same passes (each gather is a collective). A whole model: nothing to do."""
    if not is_sharded(model):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


@torch.no_grad()
def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """Collective: the whole weights of a sharded model on rank 0's CPU (None on the other ranks), each gathered
    once (tied names share one tensor, as in a whole model's state_dict)."""
    main = dist.get_rank() == 0
    gathered: dict[int, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if id(t) not in gathered:
            whole = t.detach().full_tensor() if isinstance(t, DTensor) else t.detach()
            gathered[id(t)] = whole.cpu() if main else whole[:0]  # only rank 0 keeps a copy
        out[name] = gathered[id(t)]
    return out if main else None


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
    """Collective: a sharded model's weights as an unsharded GPT on rank 0's CPU (None on the other ranks)."""
    state = full_state_dict(model)
    if state is None:
        return None
    whole = empty_gpt(model.config)
    whole.load_state_dict(state)
    whole.loss_chunk_rows = model.loss_chunk_rows
    return whole


def shard_like(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`whole` cut as the DTensor `like` is (this rank's rows, no communication), or `whole` where `like` is not one."""
    if not isinstance(like, DTensor) or not isinstance(whole, torch.Tensor) or whole.shape != like.shape:
        return whole
    return distribute_tensor(whole.detach(), like.device_mesh, like.placements, src_data_rank=None)


def load_whole(model: nn.Module, optimizers: Any, model_state: dict[str, torch.Tensor],
               optimizer_state: dict[str, Any]) -> None:
    """A whole (ddp) checkpoint's weights and optimizer states into a sharded model and its optimizers: every tensor
    shaped as a weight is cut into this rank's shard of it (Adam's moments, Muon's momentum), the rest kept."""
    live = model.state_dict()
    model.load_state_dict({k: shard_like(v, live[k]) for k, v in model_state.items()})
    for name, opt in optimizers.optimizers.items():
        saved = optimizer_state[name]
        params = [p for group in opt.param_groups for p in group["params"]]  # the ids state_dict numbers
        state = {i: {k: shard_like(v, params[i]) for k, v in s.items()} for i, s in saved["state"].items()}
        opt.load_state_dict({"state": state, "param_groups": saved["param_groups"]})


@torch.no_grad()
def init_optimizer_state(optimizers: Any) -> None:
    """Give every optimizer its state tensors without changing a weight (a step at rate 0 on zero gradients), so
    that a sharded checkpoint has somewhere to be read into."""
    params = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
    if any(opt.state for opt in optimizers) or any(p.grad is not None for p in params):
        raise RuntimeError("init_optimizer_state is for optimizers that have not stepped yet")
    rates = [(group, group["lr"]) for opt in optimizers for group in opt.param_groups]
    for p in params:
        p.grad = torch.zeros_like(p)
    for group, _ in rates:
        group["lr"] = 0.0
    try:
        for opt in optimizers:
            opt.step()
    finally:
        for group, lr in rates:
            group["lr"] = lr
        for p in params:
            p.grad = None
