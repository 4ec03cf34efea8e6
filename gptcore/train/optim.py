"""Optimizers, their parameter groups and the learning-rate schedule: every optimizer is built here.

The schedules: linear warmup, then cosine decay to min_lr, then flat (GPT-3 paper, build-nanogpt); or
warmup-stable-decay ("trapezoid"): linear warmup, max_lr held, then a linear decay to min_lr over the last
decay_frac of the steps (the NanoGPT speedrun's warmdown, KellerJordan/modded-nanogpt; nanochat's base_train).

The optimizer: AdamW over every parameter (GPT-2), or Muon (Jordan et al. 2024) for the blocks' hidden matrices
with AdamW for the rest, as the NanoGPT speedrun does. Muon orthogonalises each logical matrix on its own: the
fused q/k/v projection (3C x C) as three C x C matrices and SwiGLU's [gate; up] as two, each with its own shape
scaling, while the weights stay stored fused (the HF names and layout do not change). Either way the trainer sees
one `Optimizers` object; the schedule scales every group by the same factor, each from its own peak rate:
the token (and position) embedding, the head, the gains and biases, and the hidden matrices may each have one.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

# Keller Jordan's quintic Newton-Schulz iteration and shape scaling, as torch ships them (private helpers of
# torch.optim.Muon): reused so that a matrix Muon updates whole gets exactly torch's update.
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz

from gptcore.model.gpt import GPT

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")


# ---------------------------------------------------------------------------------------------------- schedules

def lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """Cosine: (step+1)/warmup of max_lr while warming up (0-based `step`), cosine to min_lr at max_steps, then
    min_lr."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def wsd_decay_steps(max_steps: int, decay_frac: float) -> int:
    """The steps of the WSD schedule's final decay: decay_frac of max_steps, rounded."""
    return round(decay_frac * max_steps)


def wsd_lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, max_steps: int, decay_frac: float) -> float:
    """Warmup-stable-decay: the same warmup as cosine, max_lr until the last `decay_frac` of max_steps, then a
    straight line that reaches min_lr at max_steps (min_lr after)."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    decay = wsd_decay_steps(max_steps, decay_frac)
    left = max_steps - step
    if left >= decay:
        return max_lr
    return min_lr + (max_lr - min_lr) * left / decay


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate at each step: `kind` cosine (warmup, cosine to min_lr, flat) or wsd (warmup, stable,
    linear decay over the last decay_frac of the steps). A pure function of the step, so a resumed run gets
    exactly the rates of an uninterrupted one."""

    max_lr: float
    min_lr: float
    warmup_steps: int
    max_steps: int
    kind: str = "cosine"
    decay_frac: float = 0.2

    def __post_init__(self) -> None:
        # the train schema validated these (gptcore/train/params.py)
        assert 0 <= self.warmup_steps <= self.max_steps, (self.warmup_steps, self.max_steps)
        assert self.kind in SCHEDULES, self.kind

    def __call__(self, step: int) -> float:
        if self.kind == "wsd":
            return wsd_lr_at(step, self.max_lr, self.min_lr, self.warmup_steps, self.max_steps, self.decay_frac)
        return lr_at(step, self.max_lr, self.min_lr, self.warmup_steps, self.max_steps)


# ------------------------------------------------------------------------------------------ parameter groups

def hidden_matrices(model: GPT) -> list[nn.Parameter]:
    """The 2-D weights inside the blocks (attention and MLP projections): what Muon updates. Embeddings, lm_head,
    gains and biases are not among them."""
    return [p for p in model.transformer.h.parameters() if p.dim() == 2 and p.requires_grad]


def fused_blocks(model: GPT) -> dict[int, int]:
    """{id(weight): k} for the weights that store k matrices stacked by rows: c_attn holds q, k and v (3), a
    SwiGLU c_fc holds gate and up (2). Every other hidden matrix is one matrix."""
    out = {}
    for block in model.transformer.h:
        out[id(block.attn.c_attn.weight)] = 3
        if block.mlp.kind == "swiglu":
            out[id(block.mlp.c_fc.weight)] = 2
    return out


def adamw_groups(model: GPT, weight_decay: float, max_lr: float, embed_lr: float | None = None,
                 head_lr: float | None = None, scalar_lr: float | None = None,
                 exclude: list[nn.Parameter] | None = None) -> list[dict[str, Any]]:
    """AdamW's parameter groups, each with "name", "lr" and "weight_decay", empty ones left out:
    embed (token and position tables), head (lm_head; tied, the one shared matrix), matrices (the blocks' 2-D
    weights, unless `exclude`d for Muon), scalars (gains and biases). Matrices and tables decay, gains and biases
    do not (GPT-2). A rate left None is max_lr."""
    skip = {id(p) for p in exclude or []}
    head = model.lm_head.weight  # tied: also transformer.wte.weight, and parameters() yields it once
    tables = {id(m.weight) for name, m in model.transformer.items() if name in ("wte", "wpe")} - {id(head)}
    groups: dict[str, dict[str, Any]] = {
        "embed": {"lr": embed_lr or max_lr, "weight_decay": weight_decay},
        "head": {"lr": head_lr or max_lr, "weight_decay": weight_decay},
        "matrices": {"lr": max_lr, "weight_decay": weight_decay},
        "scalars": {"lr": scalar_lr or max_lr, "weight_decay": 0.0},
    }
    for g in groups.values():
        g["params"] = []
    for p in model.parameters():
        if not p.requires_grad or id(p) in skip:
            continue
        kind = ("head" if p is head else "embed" if id(p) in tables else "matrices" if p.dim() >= 2 else "scalars")
        groups[kind]["params"].append(p)
    return [{"name": name, **g} for name, g in groups.items() if g["params"]]


def adamw(groups: list[dict[str, Any]], max_lr: float, betas: tuple[float, float], eps: float,
          device_type: str) -> torch.optim.AdamW:
    """AdamW over `groups`, with the fused kernel on CUDA and on the CPU (torch >= 2.4 has both; on the CPU it
    makes the 124M update about 4x faster than the foreach one)."""
    use_fused = device_type in ("cuda", "cpu") and "fused" in inspect.signature(torch.optim.AdamW).parameters
    extra = {"fused": True} if use_fused else {}
    return torch.optim.AdamW(groups, lr=max_lr, betas=tuple(betas), eps=eps, **extra)


# ------------------------------------------------------------------------------------------------------ Muon

class Muon(torch.optim.Muon):
    """torch.optim.Muon whose groups may carry "row_blocks" k: each parameter of such a group stores k matrices
    stacked by rows, and each is orthogonalised and shape-scaled on its own (the speedrun updates q, k and v as
    separate matrices). Momentum and weight decay are elementwise, so they are the same fused or not; with k = 1
    the update is torch's, step for step."""

    @torch.no_grad()
    def step(self, closure=None):
        """One update: momentum, decoupled decay, then each stored matrix's orthogonalised step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            self._init_group(group, params, grads, bufs)
            lr, wd, momentum, k = group["lr"], group["weight_decay"], group["momentum"], group.get("row_blocks", 1)
            for param, grad, buf in zip(params, grads, bufs):
                buf.lerp_(grad, 1 - momentum)
                update = grad.lerp(buf, momentum) if group["nesterov"] else buf
                param.mul_(1 - lr * wd)
                for p_part, u_part in zip(param.chunk(k, dim=0), update.chunk(k, dim=0)):
                    ortho = _zeropower_via_newtonschulz(u_part, group["ns_coefficients"], group["ns_steps"],
                                                        group["eps"])
                    p_part.add_(ortho, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p_part.shape))
        return loss


def muon_groups(model: GPT) -> list[dict[str, Any]]:
    """Muon's groups over the hidden matrices: "muon" (whole matrices), "muon_qkv" (3 blocks) and "muon_gate_up"
    (2 blocks), empty ones left out."""
    fused = fused_blocks(model)
    names = {1: "muon", 3: "muon_qkv", 2: "muon_gate_up"}
    groups = {k: {"name": name, "params": [], "row_blocks": k} for k, name in names.items()}
    for p in hidden_matrices(model):
        groups[fused.get(id(p), 1)]["params"].append(p)
    return [g for g in groups.values() if g["params"]]


# ---------------------------------------------------------------------------------------------- Optimizers

class Optimizers:
    """Several torch optimizers over disjoint parameters, stepped as one: {name: optimizer}, e.g. {"adamw": ...}
    or {"adamw": ..., "muon": ...}. The state_dict is keyed by the same names, so a checkpoint holds each one's.
    `clip_params` are the parameters the gradient-norm clip covers when not all of the model's (None)."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer], clip_params: list[nn.Parameter] | None = None):
        self.optimizers = dict(optimizers)
        self.clip_params = clip_params

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.optimizers.values())

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every optimizer's groups, in order (each has "name" and "peak_lr")."""
        return [g for opt in self for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every optimizer's gradients."""
        for opt in self:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """One update of every optimizer."""
        for opt in self:
            opt.step()

    def state_dict(self) -> dict[str, Any]:
        """{name: that optimizer's state_dict}."""
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned; the names must be this run's optimizers."""
        if set(state) != set(self.optimizers):
            raise ValueError(f"optimizer state holds {sorted(state)}, this run uses {sorted(self.optimizers)}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])


def build_optimizers(model: GPT, optimizer: str, max_lr: float, weight_decay: float, betas: tuple[float, float],
                     eps: float, device_type: str, muon_lr: float = 0.02, muon_momentum: float = 0.95,
                     embed_lr: float | None = None, head_lr: float | None = None, scalar_lr: float | None = None,
                     muon_clip: bool = True) -> Optimizers:
    """`optimizer` adamw: AdamW everywhere, the hidden matrices at max_lr. muon: Muon (Nesterov momentum
    muon_momentum, per-matrix orthogonalisation, torch's default shape scaling) at muon_lr for the hidden matrices,
    AdamW for the rest. embed_lr / head_lr / scalar_lr: AdamW's peak rates of the token table, the head and the
    gains and biases (None: max_lr). Weight decay is decoupled and scaled by the rate in both. muon_clip False
    leaves Muon's matrices out of the gradient-norm clip."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"train.optimizer={optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
    if weight_decay < 0 or max_lr <= 0:
        raise ValueError(f"weight_decay must be >= 0 and max_lr > 0, got {weight_decay} and {max_lr}")
    rates = dict(embed_lr=embed_lr, head_lr=head_lr, scalar_lr=scalar_lr)
    clip = None
    if optimizer == "adamw":
        opts = {"adamw": adamw(adamw_groups(model, weight_decay, max_lr, **rates), max_lr, betas, eps, device_type)}
    else:
        hidden = hidden_matrices(model)
        groups = adamw_groups(model, weight_decay, max_lr, exclude=hidden, **rates)
        muon = Muon(muon_groups(model), lr=muon_lr, momentum=muon_momentum, weight_decay=weight_decay,
                    nesterov=True)
        opts = {"adamw": adamw(groups, max_lr, betas, eps, device_type), "muon": muon}
        if not muon_clip:
            clip = [p for g in groups for p in g["params"]]
    for opt in opts.values():
        for group in opt.param_groups:
            group["peak_lr"] = group["lr"]  # what the schedule scales; saved with the optimizer state
    return Optimizers(opts, clip)


def set_lr(optimizer: Optimizers | torch.optim.Optimizer, lr: float, max_lr: float) -> None:
    """Set each group's rate to lr scaled by its own peak: peak_lr * lr / max_lr (groups peaking at max_lr get lr
    itself, bit for bit)."""
    for group in optimizer.param_groups:
        peak = group.get("peak_lr", max_lr)
        group["lr"] = lr if peak == max_lr else peak * (lr / max_lr)
