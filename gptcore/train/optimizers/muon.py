"""Muon (Nesterov momentum, each update orthogonalised by Newton-Schulz) for the blocks' hidden matrices, each fused
q/k/v or gate/up matrix per matrix, and AdamW for the rest, as the NanoGPT speedrun (docs/modern-recipe.md)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

# torch.optim.Muon's private Newton-Schulz iteration and shape scaling: a matrix Muon updates whole gets torch's update
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz

from gptcore.model.gpt import GPT
from gptcore.train.config import TrainConfig
from gptcore.train.optimizers.adamw import make_adamw
from gptcore.train.optimizers.base import OptimizerKind, Optimizers


def hidden_matrices(model: GPT) -> list[nn.Parameter]:
    """The 2-D weights inside the blocks (attention and MLP projections): what Muon updates."""
    return [p for p in model.transformer.h.parameters() if p.dim() == 2 and p.requires_grad]


class Muon(torch.optim.Muon):
    """torch.optim.Muon whose groups may carry "row_blocks" k: each parameter stores k matrices stacked by rows (the
    fused q/k/v), each orthogonalised and shape-scaled on its own; with k = 1 the update is torch's, step for step.

    A weight sharded by FSDP (a DTensor, each rank holding some of its rows) is orthogonalised whole: its update is
    gathered, every rank runs Newton-Schulz on the whole matrix and keeps its own rows of the result. So the step is
    the unsharded one, at the cost of one gather per matrix and the iteration repeated on every rank."""

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
                if isinstance(param, DTensor):  # this rank's rows only: orthogonalise the whole matrix
                    whole = update.full_tensor()
                    parts = [self._orthogonal(u, group) for u in whole.chunk(k, dim=0)]
                    alpha = -_adjust_lr(lr, group["adjust_lr_fn"], parts[0].shape)  # the k parts share a shape
                    mine = distribute_tensor(torch.cat(parts), param.device_mesh, param.placements, src_data_rank=None)
                    param.add_(mine, alpha=alpha)
                    continue
                for p_part, u_part in zip(param.chunk(k, dim=0), update.chunk(k, dim=0)):
                    ortho = self._orthogonal(u_part, group)
                    p_part.add_(ortho, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p_part.shape))
        return loss

    @staticmethod
    def _orthogonal(update: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        return _zeropower_via_newtonschulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])


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


def build(model: GPT, cfg: TrainConfig, device_type: str) -> Optimizers:
    """Muon at muon_lr for the hidden matrices, AdamW for the rest; with muon_clip false the clip (and grad_norm)
    covers AdamW's parameters only, as modded-nanogpt, which clips nothing Muon updates."""
    hidden = hidden_matrices(model)
    adamw = make_adamw(model, cfg, device_type, exclude=hidden)
    muon = Muon(muon_groups(model), lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay,
                nesterov=True)
    clip = None if cfg.muon_clip else [p for g in adamw.param_groups for p in g["params"]]
    return Optimizers({"adamw": adamw, "muon": muon}, clip)


# fp32 weight, gradient and one momentum buffer
KIND = OptimizerKind(build, bytes_per_weight=12)
