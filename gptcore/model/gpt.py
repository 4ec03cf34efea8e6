"""GPT-2, exactly: Hugging Face GPT2LMHeadModel's modules, parameter names and numerics, plus the modern recipe's
switches (rotary positions, RMSNorm, QK-norm, ReLU^2 or SwiGLU, untied head, zero-init projections, logit soft-cap),
each off by default and, off, changing nothing.

Reads top to bottom, as nanoGPT's model.py: config -> norms and rotary -> attention -> MLP -> block -> the chunked
LM loss -> GPT (generate included) -> text samples -> FLOPs per token and MFU (loading and saving: load.py). After
Andrej Karpathy's nanoGPT and build-nanogpt, MIT licensed (NOTICE).
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
from torch.nn import functional as F

from gptcore.atomic import read_utf8
from gptcore.distributed import autocast_context
from gptcore.params import REQUIRED, Param, ParamError, Section
from gptcore.process import UserError

if TYPE_CHECKING:
    from gptcore.data.tokenizers import Tokenizer

NORM_EPS = 1e-5  # LayerNorm's (GPT-2's) and RMSNorm's


def _relations(p: dict[str, Any]) -> None:
    # a loaded model's shape comes from its weights: only zero_init_head's rule applies to it
    if p["zero_init_head"] and p["tie_embeddings"]:
        raise ParamError("model.zero_init_head", True, "needs model.tie_embeddings: false (a tied head is the token "
                                                       "table, which must not start at zero)")
    if p["init_from"] != "scratch":
        return
    if p["n_embd"] % p["n_head"]:
        raise ParamError("model.n_embd", p["n_embd"], f"must be divisible by model.n_head={p['n_head']}")
    if p["pos_encoding"] == "rotary" and (p["n_embd"] // p["n_head"]) % 2:
        raise ParamError("model.n_embd", p["n_embd"], f"must give an even head size n_embd / n_head for rotary "
                                                      f"positions (model.n_head={p['n_head']})")


# params.yaml's `model:` section (read by model.load.init_model); GPTConfig's fields are its keys
MODEL = Section("model", {
    "init_from": Param(str, "scratch", "scratch | gpt2 | gpt2-medium | gpt2-large | gpt2-xl | a HF folder | a .pt"),
    "n_layer": Param(int, REQUIRED, "transformer blocks", min=1),
    "n_head": Param(int, REQUIRED, "attention heads per block", min=1),
    "n_embd": Param(int, REQUIRED, "width of the residual stream", min=1),
    "block_size": Param(int, REQUIRED, "context length in tokens", min=1),
    "vocab_size": Param(int, "auto", "auto: the data's vocabulary padded up to a multiple of 64", min=1,
                        also=("auto",)),
    "bias": Param(bool, True, "biases in linear layers and layer norms, as GPT-2"),
    "dropout": Param(float, 0.0, "dropout probability while training", min=0.0, below=1.0),
    # the modern recipe's switches; the defaults are GPT-2 (conf/preset/modern_quickstart.yaml turns them on)
    "pos_encoding": Param(str, "learned", "learned (a position table) | rotary (RoPE on q and k)",
                          choices=("learned", "rotary")),
    "rope_base": Param(float, 10000.0, "rotary: the wavelength base of the lowest frequency pair", above=1.0),
    "norm": Param(str, "layernorm", "layernorm | rmsnorm", choices=("layernorm", "rmsnorm")),
    "qk_norm": Param(bool, False, "RMSNorm of each head's q and k"),
    "mlp": Param(str, "gelu", "gelu | relu2 | swiglu (hidden 8/3 n_embd, rounded to a multiple of 64)",
                 choices=("gelu", "relu2", "swiglu")),
    "tie_embeddings": Param(bool, True, "one matrix embeds and scores tokens; false: a separate lm_head"),
    "zero_init_proj": Param(bool, False, "attention and MLP output projections start at zero"),
    "zero_init_head": Param(bool, False, "the untied lm_head starts at zero (modded-nanogpt record 2024-11-03, "
                                         "with the untied head); needs tie_embeddings false"),
    "logit_softcap": Param(float, None, "a number c: logits -> c * tanh(logits / c); null: no cap", above=0.0,
                           also=(None,)),
}, _relations)
# GPT-2 124M's shape, which GPTConfig() is; a preset states its own (the schema has no default for it)
GPT2_SHAPE = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "vocab_size": 50304}


@MODEL.config(omit=("init_from",), defaults=GPT2_SHAPE)
class GPTConfig:
    """The shape of a GPT: one field per key of MODEL but init_from, unchecked (MODEL or `file_config` checks)."""

    @property
    def swiglu_hidden(self) -> int:
        """SwiGLU's hidden width: 8/3 n_embd (GELU's weights in three matrices), rounded to a multiple of 64."""
        return max(64, 64 * round(8 * self.n_embd / 3 / 64))


class BadModelConfig(UserError):
    """A model config read from a file (a checkpoint, a Hugging Face config.json) that makes no GPT."""


def file_config(fields: dict[str, Any], source: str | os.PathLike) -> GPTConfig:
    """The GPTConfig of a config read from `source`, checked by MODEL as params.yaml's is (unknown fields dropped,
    missing shape fields GPT-2 124M's); BadModelConfig names the field it refuses."""
    known = {k: v for k, v in fields.items() if k in GPTConfig.__dataclass_fields__}
    try:
        checked = MODEL.validate({**GPT2_SHAPE, **known})  # init_from scratch: every rule of the shape applies
    except ParamError as e:
        raise BadModelConfig(f"{source}: its model config makes no GPT: {e}") from None
    if checked["vocab_size"] == "auto":
        raise BadModelConfig(f"{source}: its model config gives vocab_size 'auto', not a number")
    return GPTConfig(**{k: v for k, v in checked.items() if k != "init_from"})


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm whose gain takes the input's dtype: under bf16 autocast the QK-norm's input is bf16 while the gain
    stays fp32, and torch then falls back from its fused kernel (with a warning) to a slower composite."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """RMS-normalised `x`, the weight cast to its dtype."""
        weight = self.weight.to(x.dtype) if self.weight is not None else None
        return F.rms_norm(x, self.normalized_shape, weight, self.eps)


def make_norm(config: GPTConfig) -> nn.Module:
    """The model's normalisation layer over n_embd: GPT-2's LayerNorm, or RMSNorm (a gain, no bias)."""
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, eps=NORM_EPS)
    return nn.LayerNorm(config.n_embd, eps=NORM_EPS, bias=config.bias)


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021, RoFormer) in the rotate-half layout Hugging Face Llama uses:
    channel i of a head pairs with channel i + head_size/2, and the pair turns by pos * base^(-2i/head_size)."""

    def __init__(self, head_size: int, base: float):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # derived, so not in the state_dict

    def forward(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for position ids `pos` (T,) or (B, T): (T, head_size) or (B, 1, T, head_size), float32."""
        freqs = pos.to(torch.float32)[..., None] * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        if angles.dim() == 3:  # per-row positions: broadcast over heads
            angles = angles[:, None]
        return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate q or k (B, n_head, T, head_size) by the angles whose cos/sin Rotary gave."""
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one matmul makes q, k and v for every head."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj._is_residual_proj = True  # GPT._init_weights scales its init by 1/sqrt(2 * n_layer)
        # a module (not a float) so that anything that resets nn.Dropout.p also reaches the attention dropout
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        if config.qk_norm:  # one gain per head channel, shared by the heads
            self.q_norm = RMSNorm(config.n_embd // config.n_head, eps=NORM_EPS)
            self.k_norm = RMSNorm(config.n_embd // config.n_head, eps=NORM_EPS)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """(B, T, C) -> (B, T, C); causal unless `attn_mask` (True = may attend); `rope`: Rotary's (cos, sin)."""
        B, T, C = x.size()
        # each (B, T, C) -> (B, n_head, T, head_size)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(self.n_embd, dim=2))
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        # flash / memory-efficient kernels where available; causal without a mask buffer, or the packed rows' mask
        p = self.attn_dropout.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=attn_mask is None)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """The position-wise feed-forward layer: n_embd -> 4 n_embd -> GELU (or ReLU^2) -> n_embd, or SwiGLU:
    n_embd -> (gate, up) -> SiLU(gate) * up -> n_embd."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.kind = config.mlp
        hidden = config.swiglu_hidden if self.kind == "swiglu" else 4 * config.n_embd
        # swiglu: c_fc computes the gate and the value side by side, [gate; up] in its output rows
        self.c_fc = nn.Linear(config.n_embd, 2 * hidden if self.kind == "swiglu" else hidden, bias=config.bias)
        if self.kind == "gelu":
            self.gelu = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new"
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.c_proj._is_residual_proj = True
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The feed-forward block of one position."""
        h = self.c_fc(x)
        if self.kind == "gelu":
            h = self.gelu(h)
        elif self.kind == "relu2":
            h = F.relu(h).square()
        else:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    """One transformer layer: attention then MLP, each on a normalised (LayerNorm or RMSNorm) residual stream."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """One transformer block on the pre-norm residual stream, as in GPT-2."""
        x = x + self.attn(self.ln_1(x), attn_mask, rope)
        return x + self.mlp(self.ln_2(x))


# Logits lm_loss holds at once (about a server L3 of fp32 on the CPU; more on a GPU, for launch cost): a fixed switch,
# never a timing taken at run time. Off a GPU only heads up to CHUNKED_MAX_EMBD_OFF_GPU wide gain from chunking; a
# GPU always chunks, for memory (the measurements: docs/benchmarks.md).
LOSS_CHUNK_ELEMENTS = {"cpu": 1 << 23, "cuda": 1 << 26}
LOSS_CHUNK_ENV = "GPTCORE_LOSS_CHUNK_ELEMENTS"
CHUNKED_MAX_EMBD_OFF_GPU = 256


def loss_chunk_rows(device_type: str, vocab_size: int, n_embd: int) -> int:
    """Rows per chunk of lm_loss's default on `device_type` for a (vocab_size, n_embd) head; 0: the plain path."""
    raw = os.environ.get(LOSS_CHUNK_ENV)
    if raw is not None and not raw.strip().isdigit():
        raise UserError(f"{LOSS_CHUNK_ENV}={raw!r}: expected a whole number of logits per chunk, or 0 for the plain "
                        f"full-logits path (or unset it)")
    if raw is None and device_type != "cuda" and n_embd > CHUNKED_MAX_EMBD_OFF_GPU:
        return 0
    budget = int(raw) if raw is not None else LOSS_CHUNK_ELEMENTS["cuda" if device_type == "cuda" else "cpu"]
    # at least n_embd rows: each chunk also reads and writes the (vocab, n_embd) weight gradient, which should cost
    # no more memory traffic than the chunk's own (rows, vocab) logits
    return max(budget // vocab_size, n_embd, 1) if budget else 0


def without_padding(t: torch.Tensor, vocab_size: int, dim: int = -1) -> torch.Tensor:
    """`t` cut to a tokenizer's first `vocab_size` ids along `dim` (logits: the last; an embedding or a head: dim 0):
    the one place that drops the ids `model.load.padded_vocab` adds, which no tokenizer has."""
    return t.narrow(dim, 0, vocab_size)


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


class GPT(nn.Module):
    """GPT-2: token and position embeddings, n_layer blocks, a final LayerNorm and a tied LM head."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        modules = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
        if config.pos_encoding == "learned":
            modules["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        modules.update(drop=nn.Dropout(config.dropout), h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                       ln_f=make_norm(config))
        self.transformer = nn.ModuleDict(modules)
        if config.pos_encoding == "rotary":
            self.rotary = Rotary(config.n_embd // config.n_head, config.rope_base)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:  # GPT-2 does it: one matrix embeds tokens and scores the next one
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        if config.zero_init_head:
            nn.init.zeros_(self.lm_head.weight)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02
            # scaled down so the residual stream's variance does not grow with depth (2 additions per layer)
            if getattr(module, "_is_residual_proj", False):
                std = 0.0 if self.config.zero_init_proj else 0.02 / math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def hidden_states(self, idx: torch.Tensor, pos: torch.Tensor | None = None,
                      attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Trunk output after the final norm (B, T, n_embd) for token ids (B, T). Scorers apply `logits` to a few rows
        only; packed rows pass position ids (B, T) and a boolean mask (B, 1, T, T), True where a query may attend."""
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (batch, time), got {tuple(idx.shape)}")
        T = idx.size(1)
        if pos is None:
            if T > self.config.block_size:
                raise ValueError(f"sequence length {T} exceeds the model's block_size {self.config.block_size}")
            pos = torch.arange(T, dtype=torch.long, device=idx.device)
        elif int(pos.max()) >= self.config.block_size:
            raise ValueError(f"position id {int(pos.max())} exceeds the model's block_size {self.config.block_size}")
        x = self.transformer.wte(idx)
        rope = self.rotary(pos) if self.config.pos_encoding == "rotary" else None
        if rope is None:
            x = x + self.transformer.wpe(pos)
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x, attn_mask, rope)
        return self.transformer.ln_f(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token scores for trunk outputs (..., n_embd): lm_head, then the soft-cap when one is set."""
        logits = self.lm_head(hidden)
        cap = self.config.logit_softcap
        if cap is not None:
            logits = cap * torch.tanh(logits / cap)
        return logits

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                reduction: str = "mean") -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Without targets: logits (B, T, vocab_size) for every position, and None. With targets: None and the
        cross-entropy against them (positions whose target is -1 are ignored), their mean or (reduction "sum")
        their sum, computed by `lm_loss` without materialising the logits."""
        hidden = self.hidden_states(idx)
        if targets is None:
            return self.logits(hidden), None
        return None, lm_loss(hidden, self.lm_head.weight, targets, self.config.logit_softcap, reduction)

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count, the tied wte/lm_head matrix once; non_embedding leaves out the lookup tables: wpe, and wte
        when untied (tied, it is lm_head too and does real compute)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            if "wpe" in self.transformer:
                n -= self.transformer.wpe.weight.numel()
            if not self.config.tie_embeddings:
                n -= self.transformer.wte.weight.numel()
        return n

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context length, e.g. to run GPT-2 (1024) at 256 (there is no causal-mask buffer to crop)."""
        if not 0 < block_size <= self.config.block_size:
            raise ValueError(f"block_size must be in [1, {self.config.block_size}], got {block_size}")
        self.config.block_size = block_size
        if "wpe" in self.transformer:  # rotary positions have no table
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size].detach().clone())

    def set_dropout(self, p: float) -> None:
        """Set every dropout in the model (embedding, attention, residual, MLP) and config.dropout to p."""
        self.config.dropout = float(p)
        for m in self.modules():
            if isinstance(m, nn.Dropout):
                m.p = float(p)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None, vocab_limit: int | None = None) -> torch.Tensor:
        """idx (B, T) with max_new_tokens sampled tokens appended (temperature 0 or top_k 1: greedy), in eval mode.
        vocab_limit keeps a padded vocabulary from emitting ids its tokenizer lacks; `generator` is on idx's device."""
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                idx_cond = idx[:, -self.config.block_size :]
                # score only the last position: the other T-1 rows of logits are not needed
                logits = self.logits(self.hidden_states(idx_cond)[:, -1, :]).float()
                if vocab_limit is not None:
                    logits = without_padding(logits, vocab_limit)
                if temperature == 0 or top_k == 1:
                    idx_next = logits.argmax(dim=-1, keepdim=True)
                else:
                    logits = logits / temperature
                    if top_k is not None:
                        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                        logits = logits.masked_fill(logits < kth, float("-inf"))
                    idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)
                idx = torch.cat((idx, idx_next), dim=1)
        finally:
            self.train(was_training)
        return idx


# -- text samples, as nanoGPT's sample.py (gptcore-sample's CLI: eval/sampling.py) ------------------------------------
def read_prompt(prompt: str) -> str:
    """`FILE:path` reads the prompt from a file (as nanoGPT's sample.py); anything else is the prompt itself."""
    if not prompt.startswith("FILE:"):
        return prompt
    path = Path(prompt[5:])
    if not path.is_file():
        raise UserError(f"prompt file {path} not found (from --prompt {prompt!r})")
    return read_utf8(path)


def sample(model: GPT, tokenizer: Tokenizer, prompt: str = "", num_samples: int = 1, max_new_tokens: int = 100,
           temperature: float = 0.8, top_k: int | None = 200, seed: int = 1337, device: torch.device | str = "cpu",
           dtype: torch.dtype | None = None) -> list[str]:
    """`num_samples` continuations of `prompt` (or of end-of-text), decoded; `dtype`: autocast's (None: fp32)."""
    device = torch.device(device)
    ids = (tokenizer.encode(read_prompt(prompt)) if prompt else []) or [tokenizer.eot]
    ids = ids[-model.config.block_size :]
    x = torch.tensor([ids] * num_samples, dtype=torch.long, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    model = model.to(device)
    with autocast_context(device, dtype):
        out = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen,
                             vocab_limit=tokenizer.vocab_size)
    return [tokenizer.decode(row[len(ids):].tolist()) for row in out]


# -- FLOPs: what a run's size costs, and the share of a GPU's peak it reaches (MFU) ------------------------------------
def flops_per_token(model: GPT) -> int:
    """Training FLOPs per token (forward + backward) at context block_size: 6N + 12*L*H*Q*T, with N the
    non-embedding parameter count (PaLM, Chowdhery et al. 2022, appendix B)."""
    cfg = model.config
    N = model.get_num_params(non_embedding=True)
    L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
    return 6 * N + 12 * L * H * Q * T


def model_sizes(model: GPT) -> dict[str, int]:
    """What makes runs of different shapes comparable: "params" (all, the tied matrix once), "params_non_embedding"
    (GPT.get_num_params: lookup tables left out) and "flops_per_token" (training, at block_size)."""
    return {"params": model.get_num_params(non_embedding=False),
            "params_non_embedding": model.get_num_params(non_embedding=True),
            "flops_per_token": flops_per_token(model)}


def estimate_mfu(model: GPT, tokens_per_sec: float, device: torch.device | str) -> float | None:
    """Model FLOPs utilisation of ONE device's `tokens_per_sec` (a fraction of its peak); None if unknown, e.g. CPU."""
    peak_flops = device_peak_flops(device)
    return None if peak_flops is None else flops_per_token(model) * tokens_per_sec / peak_flops


# Peak dense (no 2:4 sparsity) tensor-core FLOP/s in bf16 (fp16 where there is no bf16) from NVIDIA's datasheets (the
# sources: docs/benchmarks.md), keyed on whole words of torch.cuda.get_device_name(): specific names first.
_PEAK_FLOPS: tuple[tuple[str, float], ...] = (  # one GPU family a line
    ("GB200", 2.5e15), ("B200", 2.25e15),
    ("GH200", 989e12), ("H200 NVL", 835e12), ("H200", 989e12),
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12),  # "NVIDIA H100 80GB HBM3" is the SXM part
    ("A100", 312e12), ("A10G", 70e12), ("A10", 125e12), ("A40", 149.7e12),
    ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12),
    ("RTX 4090", 165.2e12), ("RTX 3090 Ti", 80e12), ("RTX 3090", 71e12),
    ("V100S", 130e12), ("V100-PCIE", 112e12), ("V100", 125e12), ("T4", 65e12),
)


def peak_flops_for_name(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s for a CUDA device name as torch reports it; None if unknown or a MIG slice (a part)."""
    if "MIG" in device_name:
        return None
    for key, flops in _PEAK_FLOPS:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name, flags=re.IGNORECASE):
            return flops
    return None


def device_peak_flops(device: torch.device | str) -> float | None:
    """Peak dense bf16 FLOP/s of `device`; None off CUDA or if unknown."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_flops_for_name(torch.cuda.get_device_name(device))
