"""The LM head's loss: cross-entropy of `hidden @ weight.T` computed in row chunks, each chunk's gradients made
while its logits are in cache, so all the logits are never held at once (as fused linear-cross-entropy kernels do)."""
from __future__ import annotations

import os
import re
from typing import Any

import torch
from torch.nn import functional as F

from gptcore.errors import UserError

# the environment switch of the chunk size, recorded with the run where it changes its numbers (checkpoints, model/'s
# manifest and metrics/measured_on.json say which path ran)
CHUNK_SWITCH = "GPTCORE_LOSS_CHUNK_ELEMENTS"
# Logits lm_loss holds at once (about a server L3 of fp32 on the CPU; more on a GPU, for launch cost): a fixed default,
# never a timing taken at run time. Chunking is never slower than the plain path in any machine's median measured
# (docs/benchmarks.md: 1.0-1.4x on CPUs, and on a GPU it saves the logits' memory), so every device chunks.
LOSS_CHUNK_ELEMENTS = {"cpu": 1 << 23, "cuda": 1 << 26}


def loss_chunk_rows(device_type: str, vocab_size: int, n_embd: int) -> int:
    """Rows per chunk of lm_loss on `device_type` for a (vocab_size, n_embd) head (GPTCORE_LOSS_CHUNK_ELEMENTS, else
    the default); 0: the plain path."""
    budget = _switch()
    if budget is None:
        budget = LOSS_CHUNK_ELEMENTS["cuda" if device_type == "cuda" else "cpu"]
    # at least n_embd rows: each chunk also reads and writes the (vocab, n_embd) weight gradient, which should cost
    # no more memory traffic than the chunk's own (rows, vocab) logits
    return max(budget // vocab_size, n_embd, 1) if budget else 0


def _switch() -> int | None:
    """The whole number GPTCORE_LOSS_CHUNK_ELEMENTS is set to (ASCII digits only), or None when it is unset; a bad
    value is one line naming the switch, as a bad param is."""
    raw = os.environ.get(CHUNK_SWITCH)
    if raw is None:
        return None
    if not re.fullmatch(r"[0-9]{1,18}", raw.strip(), flags=re.ASCII):
        raise UserError(f"{CHUNK_SWITCH}={raw!r}: expected the logits the LM head's cross-entropy holds at once, a "
                        f"whole number (0: the plain path, every logit at once); set it so, or unset it")
    return int(raw)


def lm_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float | None = None,
            reduction: str = "mean", chunk_rows: int | None = None) -> torch.Tensor:
    """F.cross_entropy(softcapped hidden @ weight.T, targets) (-1 = ignored) within float rounding, for trunk outputs
    `hidden` (..., n_embd) and LM head `weight` (vocab, n_embd), without ever holding all the logits: rows go in chunks
    of `chunk_rows` (default: `loss_chunk_rows`; 0: the plain computation), each chunk's gradients made while its
    logits are in cache (as fused linear-cross-entropy kernels do)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    h = hidden.reshape(-1, hidden.size(-1))
    if chunk_rows is None:
        chunk_rows = loss_chunk_rows(h.device.type, weight.size(0), weight.size(1))
    if chunk_rows == 0:  # the plain path: every logit at once
        logits = (h @ weight.t()).float()
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        return F.cross_entropy(logits, targets.reshape(-1), ignore_index=-1, reduction=reduction)
    # under no_grad (evaluation) autograd still marks the weight as needing a gradient inside the Function, so the
    # grad mode is passed in: without it every val-loss batch would also compute both gradients of the head
    return _ChunkedLMLoss.apply(h, weight, targets.reshape(-1), softcap, chunk_rows, reduction == "mean",
                                torch.is_grad_enabled())


class _ChunkedLMLoss(torch.autograd.Function):
    """lm_loss's kernel: the forward makes the loss and (when asked) both gradients; the backward scales them."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float | None,
                chunk_rows: int, mean: bool, grads: bool) -> torch.Tensor:
        # under autocast the matmuls run in its dtype, as they would in the plain path; softmax is always fp32
        dtype = torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else h.dtype
        hc, wc = h.to(dtype), weight.to(dtype)
        want_h, want_w = grads and ctx.needs_input_grad[0], grads and ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        valid = targets != -1
        count = valid.sum()
        for start in range(0, h.size(0), chunk_rows):
            rows = slice(start, start + chunk_rows)
            x, y, keep = hc[rows], targets[rows], valid[rows]
            z = (x @ wc.t()).float()
            if softcap is not None:
                t = torch.tanh(z / softcap)
                z = softcap * t
            lse = torch.logsumexp(z, dim=-1)
            safe_y = y.clamp(min=0)
            picked = z.gather(1, safe_y[:, None]).squeeze(1)
            total += torch.where(keep, lse - picked, 0.0).sum()
            if not (want_h or want_w):
                continue
            # d loss / d logits = softmax - onehot, zero on ignored rows
            g = z.sub_(lse[:, None]).exp_()
            g[torch.arange(g.size(0), device=g.device), safe_y] -= 1.0
            g.mul_(keep[:, None])
            if softcap is not None:
                g.mul_(1.0 - t * t)
            g = g.to(dtype)
            if want_h:
                grad_h[rows] = (g @ wc).to(h.dtype)
            if want_w:  # accumulated in fp32 whatever the matmul dtype
                if g.dtype == torch.float32:
                    grad_w.addmm_(g.t(), x)
                else:
                    grad_w.add_(g.t() @ x)
        scale = 1.0 / count.clamp(min=1) if mean else torch.ones((), device=h.device)
        ctx.save_for_backward(grad_h if want_h else None, grad_w if want_w else None, scale)
        ctx.weight_dtype = weight.dtype
        # no valid target: nan for the mean, as F.cross_entropy gives
        return total / count if mean else total

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_h, grad_w, scale = ctx.saved_tensors
        s = grad_out * scale
        gh = grad_h * s.to(grad_h.dtype) if grad_h is not None else None
        gw = (grad_w * s).to(ctx.weight_dtype) if grad_w is not None else None
        return gh, gw, None, None, None, None, None
