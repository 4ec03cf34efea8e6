"""Every optimizer (AdamW everywhere as GPT-2, or Muon per matrix for the blocks' hidden matrices with AdamW for the
rest, as the NanoGPT speedrun) and its parameter groups (docs/modern-recipe.md)."""
from __future__ import annotations

from typing import Any, Iterator

import torch
from torch import nn

# torch.optim.Muon's private Newton-Schulz iteration and shape scaling: a matrix Muon updates whole gets torch's update
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz

from gptcore.model.gpt import GPT

OPTIMIZERS = ("adamw", "muon")


def hidden_matrices(model: GPT) -> list[nn.Parameter]:
    """The 2-D weights inside the blocks (attention and MLP projections): what Muon updates."""
    return [p for p in model.transformer.h.parameters() if p.dim() == 2 and p.requires_grad]


def adamw_groups(model: GPT, weight_decay: float, max_lr: float, embed_lr: float | None = None,
                 head_lr: float | None = None, scalar_lr: float | None = None,
                 exclude: list[nn.Parameter] | None = None) -> list[dict[str, Any]]:
    """AdamW's non-empty groups, each with "name", "lr" (None: max_lr) and "weight_decay": embed (token and position
    tables), head (lm_head), matrices (the blocks', unless `exclude`d), scalars (gains and biases: no decay, GPT-2)."""
    skip = {id(p) for p in exclude or []}
    head = model.lm_head.weight  # tied: also transformer.wte.weight, and parameters() yields it once
    tables = {id(m.weight) for name, m in model.transformer.items() if name in ("wte", "wpe")} - {id(head)}
    groups: dict[str, dict[str, Any]] = {
        "embed": {"lr": embed_lr or max_lr, "weight_decay": weight_decay, "params": []},
        "head": {"lr": head_lr or max_lr, "weight_decay": weight_decay, "params": []},
        "matrices": {"lr": max_lr, "weight_decay": weight_decay, "params": []},
        "scalars": {"lr": scalar_lr or max_lr, "weight_decay": 0.0, "params": []},
    }
    for p in model.parameters():
        if not p.requires_grad or id(p) in skip:
            continue
        kind = ("head" if p is head else "embed" if id(p) in tables else "matrices" if p.dim() >= 2 else "scalars")
        groups[kind]["params"].append(p)
    return [{"name": name, **g} for name, g in groups.items() if g["params"]]


class Muon(torch.optim.Muon):
    """torch.optim.Muon whose groups may carry "row_blocks" k: each parameter stores k matrices stacked by rows (the
    fused q/k/v), each orthogonalised and shape-scaled on its own; with k = 1 the update is torch's, step for step."""

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
                param.mul_(1 - lr * wd)  # momentum and decay are elementwise: the same fused or not
                for p_part, u_part in zip(param.chunk(k, dim=0), update.chunk(k, dim=0)):
                    ortho = _zeropower_via_newtonschulz(u_part, group["ns_coefficients"], group["ns_steps"],
                                                        group["eps"])
                    p_part.add_(ortho, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p_part.shape))
        return loss


def muon_groups(model: GPT) -> list[dict[str, Any]]:
    """Muon's non-empty groups: "muon" (whole matrices), "muon_qkv" (c_attn) and "muon_gate_up" (SwiGLU's c_fc)."""
    stacked = {}  # id(weight) -> the matrices it stores by rows
    for block in model.transformer.h:
        stacked[id(block.attn.c_attn.weight)] = 3
        if block.mlp.kind == "swiglu":
            stacked[id(block.mlp.c_fc.weight)] = 2
    names = {1: "muon", 3: "muon_qkv", 2: "muon_gate_up"}
    groups = {k: {"name": name, "params": [], "row_blocks": k} for k, name in names.items()}
    for p in hidden_matrices(model):
        groups[stacked.get(id(p), 1)]["params"].append(p)
    return [g for g in groups.values() if g["params"]]


class Optimizers:
    """{name: torch optimizer} on disjoint parameters, stepped and saved as one; `clip_params`: what the clip covers."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer], clip_params: list[nn.Parameter] | None = None):
        self.optimizers, self.clip_params = dict(optimizers), clip_params

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.optimizers.values())

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every optimizer's groups, in order (each has "name" and "peak_lr")."""
        return [g for opt in self for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Every optimizer's zero_grad (None frees the gradients' memory until the next backward)."""
        for opt in self:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """One step of every optimizer, each with its own groups' learning rates."""
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
    """AdamW everywhere, or Muon (Nesterov, per matrix) at muon_lr for the hidden matrices and AdamW for the rest;
    embed_lr / head_lr / scalar_lr: AdamW's peaks (None: max_lr); muon_clip False: the clip leaves Muon's out."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"train.optimizer={optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
    hidden = hidden_matrices(model) if optimizer == "muon" else []
    groups = adamw_groups(model, weight_decay, max_lr, embed_lr, head_lr, scalar_lr, exclude=hidden)
    # fused on CUDA and on the CPU, where it is faster than foreach too (docs/benchmarks.md); None: torch's choice
    fused = True if device_type in ("cuda", "cpu") else None
    opts = {"adamw": torch.optim.AdamW(groups, lr=max_lr, betas=tuple(betas), eps=eps, fused=fused)}
    if optimizer == "muon":
        opts["muon"] = Muon(muon_groups(model), lr=muon_lr, momentum=muon_momentum, weight_decay=weight_decay,
                            nesterov=True)
    for opt in opts.values():
        for group in opt.param_groups:
            group["peak_lr"] = group["lr"]  # what the schedule scales; saved with the optimizer state
    return Optimizers(opts, [p for g in groups for p in g["params"]] if optimizer == "muon" and not muon_clip else None)


def set_lr(optimizer: Optimizers | torch.optim.Optimizer, lr: float, max_lr: float) -> None:
    """Set each group's rate to lr scaled by its own peak, peak_lr * lr / max_lr (at max_lr: lr itself, bit for bit)."""
    for group in optimizer.param_groups:
        peak = group.get("peak_lr", max_lr)
        group["lr"] = lr if peak == max_lr else peak * (lr / max_lr)
