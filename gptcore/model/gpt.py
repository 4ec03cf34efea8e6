"""GPT-2, exactly: the same modules, parameter names and numerics as Hugging Face's GPT2LMHeadModel.

Reads top to bottom, as nanoGPT's model.py: config -> attention -> MLP -> block -> GPT (forward, sizes,
optimizer groups, sampling). Loading and saving weights live beside it (hf.py, load.py), FLOP accounting in
flops.py: this file does no I/O.

The design follows Andrej Karpathy's nanoGPT (model.py) and build-nanogpt (train_gpt2.py), MIT licensed: GPTConfig,
the fused q/k/v projection and its split, the scaled residual init, weight tying and the optimizer groups (NOTICE).
"""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    """The shape of a GPT: context length, vocabulary, depth, heads, width, dropout and biases."""

    block_size: int = 1024  # maximum context length
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for faster matmuls
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm, as in GPT-2

    def __post_init__(self) -> None:
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"GPTConfig.n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one matmul makes q, k and v for every head."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        # q, k, v for all heads in one matmul
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj._is_residual_proj = True  # GPT._init_weights scales its init by 1/sqrt(2 * n_layer)
        # a module (not a float) so that anything that resets nn.Dropout.p also reaches the attention dropout
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, C) -> (B, T, C); causal unless `attn_mask` (True = may attend) is given."""
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, n_head, T, head_size)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        # flash / memory-efficient kernels where available; the causal mask is implicit, so no mask buffer.
        # An explicit boolean mask (True = may attend) replaces it, e.g. for packed multiple-choice rows.
        p = self.attn_dropout.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=attn_mask is None)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """The position-wise feed-forward layer: n_embd -> 4 n_embd -> GELU -> n_embd."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new"
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj._is_residual_proj = True
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, T, C)."""
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """One transformer layer: attention then MLP, each on a LayerNorm'd residual stream."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, C) -> (B, T, C)."""
        # pre-norm residual stream, as in GPT-2
        x = x + self.attn(self.ln_1(x), attn_mask)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """GPT-2: token and position embeddings, n_layer blocks, a final LayerNorm and a tied LM head."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying (GPT-2 does it): one matrix embeds tokens and scores the next one
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02
            # residual projections are scaled down so the residual stream's variance does not grow with
            # depth (2 residual additions per layer)
            if getattr(module, "_is_residual_proj", False):
                std = 0.02 / math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # ------------------------------------------------------------------ forward

    def hidden_states(
        self, idx: torch.Tensor, pos: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Trunk output after the final LayerNorm, shape (B, T, n_embd), for token ids `idx` of shape (B, T).

        `forward` applies `lm_head` to every position of this; callers that need scores at only a few
        positions (e.g. the HellaSwag fast path) apply `model.lm_head` to just those rows and save the
        (B, T, vocab) logits tensor. By default positions are 0..T-1 and attention is causal; the fast path
        packs several sequences into one row and passes their position ids (B, T) and a boolean attention
        mask (B, 1, T, T), True where a query may attend to a key.
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (batch, time), got {tuple(idx.shape)}")
        T = idx.size(1)
        if pos is None:
            if T > self.config.block_size:
                raise ValueError(f"sequence length {T} exceeds the model's block_size {self.config.block_size}")
            pos = torch.arange(T, dtype=torch.long, device=idx.device)
        elif int(pos.max()) >= self.config.block_size:
            raise ValueError(f"position id {int(pos.max())} exceeds the model's block_size {self.config.block_size}")
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x, attn_mask)
        return self.transformer.ln_f(x)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, vocab_size) for every position, and the mean cross-entropy against `targets`
        (positions whose target is -1 are ignored) or None when no targets are given."""
        logits = self.lm_head(self.hidden_states(idx))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    # ------------------------------------------------------------------ sizes and surgery

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count, the tied wte/lm_head matrix once. With non_embedding, the position embeddings
        are left out (the token embeddings stay: as lm_head they do real compute)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context length, e.g. to run GPT-2 (1024) at 256. There is no causal-mask buffer to
        crop: attention takes causality from scaled_dot_product_attention(is_causal=True)."""
        if not 0 < block_size <= self.config.block_size:
            raise ValueError(f"block_size must be in [1, {self.config.block_size}], got {block_size}")
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size].detach().clone())

    def set_dropout(self, p: float) -> None:
        """Set every dropout in the model (embedding, attention, residual, MLP) and config.dropout to p."""
        if not 0.0 <= float(p) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {p!r}")
        self.config.dropout = float(p)
        for m in self.modules():
            if isinstance(m, nn.Dropout):
                m.p = float(p)

    # ------------------------------------------------------------------ optimizer

    def param_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """AdamW parameter groups: matrices and embeddings (dim >= 2) decay, biases and LayerNorm gains
        (dim < 2) do not. Each group carries a "name" ("decay" / "no_decay") for logging."""
        params = [p for p in self.parameters() if p.requires_grad]  # parameters() yields tied weights once
        return [
            {"name": "decay", "params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"name": "no_decay", "params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]

    def configure_optimizers(
        self,
        weight_decay: float,
        learning_rate: float,
        betas: tuple[float, float],
        eps: float = 1e-8,
        device_type: str = "cpu",
    ) -> torch.optim.AdamW:
        """AdamW over `param_groups(weight_decay)`, with the fused kernel on CUDA and on the CPU (torch >= 2.4
        has both; on the CPU it makes the 124M update about 4x faster than the foreach one). Logs nothing: read
        `optimizer.param_groups` (each has "name") to report group sizes."""
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        use_fused = device_type in ("cuda", "cpu") and "fused" in inspect.signature(torch.optim.AdamW).parameters
        extra = {"fused": True} if use_fused else {}
        return torch.optim.AdamW(
            self.param_groups(weight_decay), lr=learning_rate, betas=tuple(betas), eps=eps, **extra
        )

    # ------------------------------------------------------------------ sampling

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        vocab_limit: int | None = None,
    ) -> torch.Tensor:
        """Append max_new_tokens sampled tokens to idx (B, T) and return (B, T + max_new_tokens).

        temperature 0 or top_k 1 is greedy. vocab_limit restricts sampling to ids < vocab_limit, so a model
        with a padded vocabulary (50304) never emits ids its tokenizer lacks (>= 50257). `generator` must
        live on idx's device. Runs in eval mode (no dropout) and restores the previous mode.
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (batch, time), got {tuple(idx.shape)}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
        V = self.config.vocab_size
        if vocab_limit is not None and not 0 < vocab_limit <= V:
            raise ValueError(f"vocab_limit must be in [1, {V}], got {vocab_limit}")
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                idx_cond = idx[:, -self.config.block_size :]
                # score only the last position: the other T-1 rows of logits are not needed
                logits = self.lm_head(self.hidden_states(idx_cond)[:, -1, :]).float()
                if vocab_limit is not None:
                    logits = logits[:, :vocab_limit]
                if temperature == 0 or top_k == 1:
                    idx_next = logits.argmax(dim=-1, keepdim=True)
                else:
                    logits = logits / temperature
                    if top_k is not None:
                        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                        logits = logits.masked_fill(logits < kth, float("-inf"))
                    probs = F.softmax(logits, dim=-1)
                    idx_next = torch.multinomial(probs, num_samples=1, generator=generator)
                idx = torch.cat((idx, idx_next), dim=1)
        finally:
            self.train(was_training)
        return idx
