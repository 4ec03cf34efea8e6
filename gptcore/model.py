"""GPT-2, exactly: the same modules, parameter names and numerics as Hugging Face's GPT2LMHeadModel.

Reads top to bottom: config -> attention -> MLP -> block -> GPT (forward, init, Hugging Face import/export,
optimizer, FLOPs/MFU, sampling), then the state-dict and peak-FLOP/s helpers.

Hugging Face stores GPT-2's projections as Conv1D (weight shape [in, out]); we use nn.Linear ([out, in]), so
those four weights are transposed on the way in and out. Everything else maps one to one.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F

from .atomic import atomic_write, write_text

# Names `from_pretrained` accepts for OpenAI's checkpoints, and the Hub repositories that hold them.
HF_GPT2_NAMES = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
}
# Hugging Face keeps these as Conv1D, i.e. transposed relative to nn.Linear.
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GPT2_EOT = 50256  # <|endoftext|> in the GPT-2 BPE vocabulary


@dataclass
class GPTConfig:
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
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new"
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj._is_residual_proj = True
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        # pre-norm residual stream, as in GPT-2
        x = x + self.attn(self.ln_1(x), attn_mask)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
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

    # ------------------------------------------------------------------ Hugging Face import

    @classmethod
    def from_pretrained(cls, name_or_dir: str | os.PathLike, override_args: dict | None = None) -> "GPT":
        """OpenAI's GPT-2 (`gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`, fetched from the Hugging Face Hub
        or its local cache) or a local Hugging Face GPT-2 directory (config.json plus model.safetensors,
        a sharded model.safetensors.index.json, or pytorch_model.bin). Does not need `transformers`.

        override_args may set `dropout` (default 0.0) and a `block_size` no larger than the checkpoint's
        n_positions (the position table is cropped).
        """
        override_args = dict(override_args or {})
        unknown = set(override_args) - {"dropout", "block_size"}
        if unknown:
            raise ValueError(f"override_args may only set 'dropout' and 'block_size', got {sorted(unknown)}")

        path = Path(name_or_dir)
        if path.is_dir():
            model_dir = path
        elif str(name_or_dir) in HF_GPT2_NAMES:
            model_dir = _download_gpt2(str(name_or_dir))
        else:
            raise ValueError(
                f"{str(name_or_dir)!r} is neither a local Hugging Face GPT-2 directory nor one of "
                f"{', '.join(HF_GPT2_NAMES)}"
            )

        config = _config_from_hf(model_dir)
        state = _read_hf_weights(model_dir)

        # build on the meta device (no wasted init of up to 1.5B weights), then give it real storage
        with torch.device("meta"):
            model = cls(config)
        model.to_empty(device="cpu")
        model.lm_head.weight = model.transformer.wte.weight  # to_empty may untie; tie again
        _load_hf_state(model, state, model_dir)

        model.set_dropout(override_args.get("dropout") or 0.0)  # None means the default, no dropout
        block_size = override_args.get("block_size")
        if block_size is not None and block_size != config.block_size:
            if block_size > config.block_size:
                raise ValueError(
                    f"override_args block_size={block_size} is larger than {model_dir}'s "
                    f"n_positions={config.block_size}"
                )
            model.crop_block_size(block_size)
        return model

    # ------------------------------------------------------------------ Hugging Face export

    def save_pretrained(self, save_dir: str | os.PathLike, vocab_size: int | None = None) -> None:
        """Write this model as a Hugging Face GPT-2 checkpoint (config.json + model.safetensors, fp32) that
        `transformers.GPT2LMHeadModel.from_pretrained(save_dir)` loads with the same logits.

        vocab_size keeps only the first rows of the (tied) embedding, e.g. 50257 of a 50304-padded model.
        Each file is written to a temporary name in save_dir and renamed into place.
        """
        from safetensors.torch import save as safetensors_bytes

        cfg = self.config
        if not cfg.bias:
            raise ValueError(
                "a bias=False model cannot be exported as Hugging Face GPT-2, whose Linear and LayerNorm "
                "layers always have biases"
            )
        vocab_size = cfg.vocab_size if vocab_size is None else vocab_size
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 0 < vocab_size <= cfg.vocab_size:
            raise ValueError(f"vocab_size must be an int in [1, {cfg.vocab_size}], got {vocab_size!r}")

        tensors = {}
        for name, t in strip_prefixes(self.state_dict()).items():
            if name == "lm_head.weight":
                continue  # tied to wte; Hugging Face re-ties it from tie_word_embeddings
            t = t.detach().to(device="cpu", dtype=torch.float32)
            if name == "transformer.wte.weight":
                t = t[:vocab_size]
            if name.endswith(_CONV1D_SUFFIXES):
                t = t.t()
            tensors[name] = t.contiguous().clone()

        hf_config = {
            "activation_function": "gelu_new",
            "architectures": ["GPT2LMHeadModel"],
            "attn_pdrop": cfg.dropout,
            "bos_token_id": GPT2_EOT if vocab_size > GPT2_EOT else None,
            "embd_pdrop": cfg.dropout,
            "eos_token_id": GPT2_EOT if vocab_size > GPT2_EOT else None,
            "initializer_range": 0.02,
            "layer_norm_epsilon": 1e-5,
            "model_type": "gpt2",
            "n_ctx": cfg.block_size,
            "n_embd": cfg.n_embd,
            "n_head": cfg.n_head,
            "n_inner": None,
            "n_layer": cfg.n_layer,
            "n_positions": cfg.block_size,
            "reorder_and_upcast_attn": False,
            "resid_pdrop": cfg.dropout,
            "scale_attn_by_inverse_layer_idx": False,
            "scale_attn_weights": True,
            "summary_activation": None,
            "summary_first_dropout": 0.1,
            "summary_proj_to_labels": True,
            "summary_type": "cls_index",
            "summary_use_proj": True,
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
            "use_cache": True,
            "vocab_size": vocab_size,
        }

        out = Path(save_dir)
        out.mkdir(parents=True, exist_ok=True)
        # weights first, config last: a directory with a config.json is a complete checkpoint
        with atomic_write(out / "model.safetensors", "wb") as f:
            f.write(safetensors_bytes(tensors, metadata={"format": "pt"}))
        text = json.dumps(hf_config, indent=2, sort_keys=True) + "\n"
        write_text(out / "config.json", text)

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

    # ------------------------------------------------------------------ FLOPs and MFU

    def flops_per_token(self) -> int:
        """Training FLOPs per token (forward + backward) at context block_size: 6N + 12*L*H*Q*T, with N the
        non-embedding parameter count (PaLM, Chowdhery et al. 2022, appendix B)."""
        cfg = self.config
        N = self.get_num_params(non_embedding=True)
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        return 6 * N + 12 * L * H * Q * T

    def estimate_mfu(
        self,
        tokens_per_sec: float,
        device: torch.device | str | None = None,
        peak_flops: float | None = None,
    ) -> float | None:
        """Model FLOPs utilisation, a fraction of peak dense bf16 FLOP/s, for `tokens_per_sec` processed by
        ONE device (divide a global rate by the world size). The peak is `peak_flops` if given, else looked
        up for `device` (default: where the model's parameters are); None when it is unknown, e.g. on CPU."""
        if peak_flops is None:
            if device is None:
                device = next(self.parameters()).device
            peak_flops = _peak_flops(device)
            if peak_flops is None:
                return None
        if peak_flops <= 0:
            raise ValueError(f"peak_flops must be > 0, got {peak_flops}")
        return self.flops_per_token() * tokens_per_sec / peak_flops

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


# ---------------------------------------------------------------------- state dicts

_WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile, DistributedDataParallel


def strip_prefixes(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The same state dict with torch.compile's `_orig_mod.` and DDP's `module.` key prefixes removed
    (in any nesting), so checkpoints from wrapped models load into a bare GPT."""
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        new = key
        while new.startswith(_WRAPPER_PREFIXES):
            new = new.split(".", 1)[1]
        if new in out:
            raise ValueError(f"state dict keys collide after stripping wrapper prefixes: {key!r} -> {new!r}")
        out[new] = value
    return out


# ---------------------------------------------------------------------- Hugging Face helpers


def _download_gpt2(name: str) -> Path:
    """Local directory holding OpenAI's `name` checkpoint, from the Hub or the Hugging Face cache."""
    repo = HF_GPT2_NAMES[name]
    try:
        from huggingface_hub import snapshot_download

        # snapshot_download falls back to the local cache when the Hub cannot be reached
        return Path(snapshot_download(repo_id=repo, allow_patterns=["config.json", "model.safetensors"]))
    except Exception as e:
        raise RuntimeError(
            f"could not fetch GPT-2 '{name}' ({repo}) from the Hugging Face Hub or its cache: "
            f"{type(e).__name__}: {e}\n"
            f"On a machine with internet, download it with\n"
            f"  huggingface-cli download {repo} config.json model.safetensors --local-dir <dir>\n"
            f"(or transformers.GPT2LMHeadModel.from_pretrained('{name}').save_pretrained('<dir>')), copy <dir> "
            f"here and pass that local Hugging Face directory to GPT.from_pretrained instead of '{name}'."
        ) from e


def _config_from_hf(model_dir: Path) -> GPTConfig:
    path = model_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; a Hugging Face GPT-2 directory needs config.json")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"{path}: model_type is {hf['model_type']!r}, expected 'gpt2'")
    # refuse variants whose maths differ from the model above instead of silently loading them wrong
    expect = {
        "activation_function": ("gelu_new", "gelu_pytorch_tanh"),
        "layer_norm_epsilon": (1e-5,),
        "scale_attn_weights": (True,),
        "scale_attn_by_inverse_layer_idx": (False,),
        "tie_word_embeddings": (True,),
    }
    for key, allowed in expect.items():
        if key in hf and hf[key] not in allowed:
            raise ValueError(f"{path}: {key}={hf[key]!r} is not supported (expected one of {allowed})")
    if hf.get("n_inner") not in (None, 4 * hf.get("n_embd", 768)):
        raise ValueError(f"{path}: n_inner={hf['n_inner']} is not supported (only 4 * n_embd)")
    try:
        return GPTConfig(
            block_size=hf.get("n_positions", hf.get("n_ctx", 1024)),
            vocab_size=hf.get("vocab_size", 50257),
            n_layer=hf.get("n_layer", 12),
            n_head=hf.get("n_head", 12),
            n_embd=hf.get("n_embd", 768),
            dropout=0.0,
            bias=True,
        )
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def _read_hf_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face checkpoint directory, read directly (no transformers)."""
    from safetensors.torch import load_file

    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    bin_file = model_dir / "pytorch_model.bin"
    if single.is_file():
        return load_file(str(single), device="cpu")
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(model_dir / shard), device="cpu"))
        return state
    if bin_file.is_file():
        return torch.load(bin_file, map_location="cpu", weights_only=True)
    raise FileNotFoundError(
        f"{model_dir}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin found"
    )


def _load_hf_state(model: GPT, state: dict[str, torch.Tensor], model_dir: Path) -> None:
    """Copy a Hugging Face GPT-2 state dict into `model`, transposing Conv1D weights."""
    ours = model.state_dict()
    expected = set(ours) - {"lm_head.weight"}  # tied: filled through wte
    seen: set[str] = set()
    lm_head = None
    for key, tensor in strip_prefixes(state).items():
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # Hugging Face's causal-mask buffers, not parameters
        if key == "lm_head.weight":
            lm_head = tensor
            continue
        if not key.startswith("transformer."):
            key = "transformer." + key  # GPT2Model (no LM head) checkpoints lack the prefix
        if key not in ours:
            raise ValueError(f"{model_dir}: unexpected tensor {key!r} for GPT-2 ({tuple(tensor.shape)})")
        if key.endswith(_CONV1D_SUFFIXES):
            tensor = tensor.t()
        if tuple(tensor.shape) != tuple(ours[key].shape):
            raise ValueError(
                f"{model_dir}: {key} has shape {tuple(tensor.shape)}, config.json implies {tuple(ours[key].shape)}"
            )
        with torch.no_grad():
            ours[key].copy_(tensor)
        seen.add(key)
    missing = sorted(expected - seen)
    if missing:
        raise ValueError(f"{model_dir}: checkpoint lacks {len(missing)} tensors, e.g. {missing[:5]}")
    if lm_head is not None and not torch.equal(lm_head.to(ours["transformer.wte.weight"].dtype),
                                               ours["transformer.wte.weight"]):
        raise ValueError(f"{model_dir}: lm_head.weight differs from wte.weight; GPT-2 ties them")


# ---------------------------------------------------------------------- peak FLOP/s

# Peak dense (no 2:4 sparsity) tensor-core FLOP/s in bf16, or fp16 where the GPU has no bf16 (V100, T4),
# keyed on substrings of torch.cuda.get_device_name(). Checked in order, so specific names come first;
# a key matches only as a whole word ("A10" does not match "A100" or "A10G"). Sources: NVIDIA datasheets,
# halving the "with sparsity" figures they print:
#   H100 SXM / PCIe / NVL: H100 Tensor Core GPU datasheet (1,979 / 1,513 / 1,671 TFLOPS sparse BF16)
#   H200 SXM / NVL and GH200: H200 datasheet (1,979 / 1,671 sparse), GH200 datasheet (same die as H100 SXM)
#   B200 / GB200: HGX B200 and GB200 NVL72 specifications (4.5 / 5 PFLOPS sparse BF16 per GPU)
#   A100 (SXM and PCIe): A100 datasheet, 312 TFLOPS BF16 dense
#   A10: A10 datasheet, 125 dense; A10G (AWS g5): 70, per Baseten "NVIDIA A10 vs A10G for ML model inference"
#   A40: A40 datasheet, 149.7 dense; L40S: L40S datasheet, 362.05 dense; L40: 181.05 dense; L4: 242 sparse
#   RTX 4090: Ada (AD102) whitepaper, 165.2 FP16/BF16 with FP32 accumulate; RTX 3090 / 3090 Ti: Ampere
#   GA102 whitepaper, 71 / 80 with FP32 accumulate (training accumulates in fp32)
#   V100 SXM2 / PCIe / V100S: V100 datasheet, 125 / 112 / 130 fp16; T4: T4 datasheet, 65 fp16
_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("GH200", 989e12),
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # "NVIDIA H100 80GB HBM3" is the SXM part
    ("A100", 312e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("A40", 149.7e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("RTX 4090", 165.2e12),
    ("RTX 3090 Ti", 80e12),
    ("RTX 3090", 71e12),
    ("V100S", 130e12),
    ("V100-PCIE", 112e12),
    ("V100", 125e12),
    ("T4", 65e12),
)


def peak_flops_for_name(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s for a CUDA device name as torch reports it; None if not in the table or a
    MIG slice (which gets only part of the chip)."""
    if "MIG" in device_name:
        return None
    for key, flops in _PEAK_FLOPS:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name, flags=re.IGNORECASE):
            return flops
    return None


def peak_flops(device: torch.device | str | None = None) -> float | None:
    """Peak dense bf16 FLOP/s of `device` (default: the current CUDA device); None on CPU/MPS, without
    CUDA, or for a GPU not in the table, so that callers never report a made-up MFU."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_flops_for_name(torch.cuda.get_device_name(device))


_peak_flops = peak_flops  # estimate_mfu's `peak_flops` argument shadows the module function
