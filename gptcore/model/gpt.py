"""GPT-2, exactly: Hugging Face GPT2LMHeadModel's modules, parameter names and numerics, plus the modern recipe's
switches (rotary positions, RMSNorm, QK-norm, ReLU^2 or SwiGLU, untied head, zero-init projections, logit soft-cap),
each off by default and, off, changing nothing.

Reads top to bottom, as nanoGPT's model.py: config -> norms and rotary -> attention -> MLP -> block -> GPT (its loss
in lm_loss.py; loading in load.py). After Andrej Karpathy's nanoGPT and build-nanogpt, MIT licensed (NOTICE).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F

from gptcore.errors import UserError
from gptcore.model.lm_loss import lm_loss
from gptcore.params import ParamError, Section, param

NORM_EPS = 1e-5  # LayerNorm's (GPT-2's) and RMSNorm's


@dataclass(kw_only=True)
class GPTConfig(Section):
    """The shape of a GPT and the modern recipe's switches; the defaults are GPT-2 124M's. The `model:` section of
    params.yaml is this plus where the weights come from (`ModelConfig` in load.py)."""

    section = "model"
    n_layer: int = param(12, "transformer blocks", min=1)
    n_head: int = param(12, "attention heads per block", min=1)
    n_embd: int = param(768, "width of the residual stream", min=1)
    block_size: int = param(1024, "context length in tokens", min=1)
    vocab_size: int = param(50304, "the token table's rows: the tokenizer's ids, padded up to a multiple of 64", min=1)
    bias: bool = param(True, "biases in linear layers and layer norms, as GPT-2")
    dropout: float = param(0.0, "dropout probability while training", min=0.0, below=1.0)
    # the modern recipe's switches, each off by default (conf/preset/modern_quickstart.yaml turns them on)
    pos_encoding: str = param("learned", "learned (a position table) | rotary (RoPE on q and k)",
                              choices=("learned", "rotary"))
    rope_base: float = param(10000.0, "rotary: the wavelength base of the lowest frequency pair", above=1.0)
    norm: str = param("layernorm", "layernorm | rmsnorm", choices=("layernorm", "rmsnorm"))
    qk_norm: bool = param(False, "RMSNorm of each head's q and k")
    mlp: str = param("gelu", "gelu | relu2 | swiglu (hidden 8/3 n_embd, rounded to a multiple of 64)",
                     choices=("gelu", "relu2", "swiglu"))
    tie_embeddings: bool = param(True, "one matrix embeds and scores tokens; false: a separate lm_head")
    zero_init_proj: bool = param(False, "attention and MLP output projections start at zero")
    zero_init_head: bool = param(False, "the untied lm_head starts at zero (modded-nanogpt record 2024-11-03, with "
                                        "the untied head); needs tie_embeddings false")
    logit_softcap: float | None = param(None, "a number c: logits -> c * tanh(logits / c); null: no cap", above=0.0)

    def check(self) -> None:
        """The rules of a shape: heads divide the width, rotary needs an even head size, a zero head is untied."""
        if self.zero_init_head and self.tie_embeddings:
            raise ParamError("model.zero_init_head", True, "needs model.tie_embeddings: false (a tied head is the "
                                                           "token table, which must not start at zero)")
        if self.n_embd % self.n_head:
            raise ParamError("model.n_embd", self.n_embd, f"must be divisible by model.n_head={self.n_head}")
        if self.pos_encoding == "rotary" and (self.n_embd // self.n_head) % 2:
            raise ParamError("model.n_embd", self.n_embd, f"must give an even head size n_embd / n_head for rotary "
                                                          f"positions (model.n_head={self.n_head})")

    @property
    def swiglu_hidden(self) -> int:
        """SwiGLU's hidden width: 8/3 n_embd (GELU's weights in three matrices), rounded to a multiple of 64."""
        return max(64, 64 * round(8 * self.n_embd / 3 / 64))


class BadModelConfig(UserError):
    """A model config read from a file (a checkpoint, a Hugging Face config.json) that makes no GPT."""


def file_config(fields: dict[str, Any], source: str | os.PathLike) -> GPTConfig:
    """The GPTConfig of a config read from `source`, checked as params.yaml's is (unknown fields dropped, missing ones
    GPT-2 124M's); BadModelConfig names the field it refuses."""
    known = {k: v for k, v in fields.items() if k in GPTConfig.params()}
    try:
        return GPTConfig.read(known)
    except ParamError as e:
        raise BadModelConfig(f"{source}: its model config makes no GPT: {e}") from None


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm whose gain takes the input's dtype: under bf16 autocast the QK-norm's input is bf16 while the gain
    stays fp32, and torch then falls back from its fused kernel (with a warning) to a slower composite."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """RMS-normalised `x`, the weight cast to its dtype."""
        weight = self.weight.to(x.dtype) if self.weight is not None else None
        return F.rms_norm(x, self.normalized_shape, weight, self.eps)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose gain and bias take the input's dtype: train.parallel fsdp keeps a block's weights in bf16
    under bf16 while the residual stream it normalises stays fp32, and the CPU kernel refuses mixed dtypes. With fp32
    weights, as everywhere else, it computes exactly what nn.LayerNorm does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """LayerNorm of `x`, the weight and bias cast to its dtype."""
        weight = self.weight.to(x.dtype) if self.weight is not None else None
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


def make_norm(config: GPTConfig) -> nn.Module:
    """The model's normalisation layer over n_embd: GPT-2's LayerNorm, or RMSNorm (a gain, no bias)."""
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, eps=NORM_EPS)
    return LayerNorm(config.n_embd, eps=NORM_EPS, bias=config.bias)


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


def without_padding(t: torch.Tensor, vocab_size: int, dim: int = -1) -> torch.Tensor:
    """`t` cut to a tokenizer's first `vocab_size` ids along `dim` (logits: the last; an embedding or a head: dim 0):
    the one place that drops the ids `model.load.padded_vocab` adds, which no tokenizer has."""
    return t.narrow(dim, 0, vocab_size)


class GPT(nn.Module):
    """GPT-2: token and position embeddings, n_layer blocks, a final LayerNorm and a tied LM head."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        # rows a chunk of the LM head's loss: set by whoever records the run (the Trainer, evaluate); None: lm_loss's
        # default at each call (GPTCORE_LOSS_CHUNK_ELEMENTS, else the device's)
        self.loss_chunk_rows: int | None = None
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
        return None, lm_loss(hidden, self.lm_head.weight, targets, self.config.logit_softcap, reduction,
                             self.loss_chunk_rows)

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
