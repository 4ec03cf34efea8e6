"""Checkpoints: atomic save, keep-last-K, a fingerprint of the params that shape a run, and weight loading.

A checkpoint is one `torch.save` file `ckpt_{step:07d}.pt` holding everything needed to continue bit-exactly:
model weights (never with torch.compile's `_orig_mod.` or DDP's `module.` prefixes), optimizer, GradScaler, the
loader state, every rank's RNG state, the step, and the run's params with their fingerprint.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .atomic import atomic_write
from .model import GPT, GPTConfig, strip_prefixes

CKPT_RE = re.compile(r"^ckpt_(\d{7})\.pt$")


def fingerprint(params: dict[str, Any]) -> str:
    """A short stable hash of the params that shape a run (canonical JSON, sorted keys)."""
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def param_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Human-readable differences between two nested params dicts, e.g. ['train.max_lr: 0.0006 -> 0.001']."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += param_diff(a, b, name + ".")
        elif a != b:
            out.append(f"{name}: {a!r} -> {b!r}")
    return out


def atomic_torch_save(obj: Any, path: Path) -> None:
    """torch.save through a temp file and a rename: a kill mid-save leaves the old file intact."""
    with atomic_write(path, "wb") as f:
        torch.save(obj, f)


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Finished checkpoints, oldest first (temp files from an interrupted save never match)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if CKPT_RE.match(p.name))


def save_checkpoint(ckpt_dir: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Save `state` as ckpt_{step}.pt and delete all but the newest `keep` checkpoints."""
    path = Path(ckpt_dir) / f"ckpt_{step:07d}.pt"
    atomic_torch_save(state, path)
    for old in list_checkpoints(ckpt_dir)[: -max(1, keep)]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    try:
        # Our checkpoints hold plain containers, tensors and numbers; weights_only keeps loading safe.
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # a truncated or foreign file: say which
        raise ValueError(f"{path}: cannot read checkpoint ({type(e).__name__}: {e})") from e


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def load_model(path: str | Path, override_args: dict[str, Any] | None = None) -> GPT:
    """A GPT from one of our checkpoints / final model files, or a nanoGPT `ckpt.pt` (`model`, `model_args`)."""
    ckpt = load_checkpoint(Path(path))
    if "model_args" in ckpt:  # nanoGPT / build-nanogpt style
        args = dict(ckpt["model_args"])
    elif "model_config" in ckpt:
        args = dict(ckpt["model_config"])
    elif "config" in ckpt and isinstance(ckpt["config"], dict):
        args = dict(ckpt["config"])
    else:
        raise ValueError(f"{path}: not a GPT checkpoint (no model_config or model_args; keys: {sorted(ckpt)})")
    known = set(GPTConfig.__dataclass_fields__)
    config = GPTConfig(**{k: v for k, v in args.items() if k in known})
    model = GPT(config)
    model.load_state_dict(strip_prefixes(ckpt["model"]))
    override_args = dict(override_args or {})
    block_size = override_args.pop("block_size", None)
    if block_size is not None and block_size < config.block_size:
        model.crop_block_size(block_size)
    if override_args.get("dropout") is not None:
        model.set_dropout(override_args["dropout"])
    return model


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


OPENAI_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def padded_vocab(vocab_size: int, multiple: int = 64) -> int:
    """Round a tokenizer's vocabulary up for fast matmuls (50257 -> 50304), as nanoGPT does."""
    return ((vocab_size + multiple - 1) // multiple) * multiple


def init_model(model_params: dict[str, Any], data_vocab_size: int, seed: int = 1337) -> GPT:
    """The weights a run starts from, by `model.init_from`: scratch, OpenAI weights, a HF dir, or a .pt checkpoint.

    Scratch weights come from `seed`, so every rank (and every rerun) builds the same initial model.

    `model.vocab_size: auto` pads the data's vocabulary; an explicit size must hold every token id of the data.
    """
    params = dict(model_params)
    init_from = str(params.pop("init_from", "scratch"))
    vocab = params.get("vocab_size", "auto")
    params["vocab_size"] = padded_vocab(data_vocab_size) if vocab in (None, "auto") else int(vocab)
    overrides = {"dropout": params.get("dropout", 0.0), "block_size": params.get("block_size")}
    if init_from == "scratch":
        torch.manual_seed(seed)
        model = GPT(GPTConfig(**params))
    elif init_from in OPENAI_NAMES or Path(init_from).is_dir():
        model = GPT.from_pretrained(init_from, override_args=overrides)
    elif Path(init_from).is_file():
        model = load_model(init_from, override_args=overrides)
    else:
        raise ValueError(
            f"model.init_from={init_from!r}: expected 'scratch', one of {OPENAI_NAMES}, a Hugging Face GPT-2 "
            f"directory, or a checkpoint file (.pt); no such file or directory")
    if model.config.vocab_size < data_vocab_size:
        raise ValueError(
            f"model vocab_size={model.config.vocab_size} is smaller than the data's tokenizer vocabulary "
            f"({data_vocab_size}); set model.vocab_size: auto or at least {data_vocab_size}")
    return model


def find_resume(ckpt_dir: Path, run_params: dict[str, Any]) -> tuple[Path | None, str]:
    """The newest checkpoint written by a run with these params, and a sentence saying what was decided.

    A checkpoint of a run with other params is never resumed: the caller starts fresh, and the sentence says which
    params differ.
    """
    last = latest_checkpoint(ckpt_dir)
    if last is None:
        return None, f"no checkpoint in {ckpt_dir}: starting from step 0"
    ckpt = load_checkpoint(last)
    if ckpt.get("fingerprint") == fingerprint(run_params):
        return last, f"resuming from {last} (step {ckpt['step']})"
    diff = param_diff(ckpt.get("params", {}), run_params) or ["(params not recorded)"]
    return None, f"{last} was written by a run with other params, so it is not resumed; starting fresh ({'; '.join(diff)})"


def remove_checkpoints(ckpt_dir: Path) -> None:
    for p in list_checkpoints(ckpt_dir):
        p.unlink(missing_ok=True)


def save_final(model: GPT, out_dir: Path, extra: dict[str, Any], hf_vocab_size: int | None = None) -> Path:
    """The run's final weights as `model.pt` (config + weights + `extra`), plus a Hugging Face export when possible."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.pt"
    atomic_torch_save({"model": model.state_dict(), "model_config": asdict(model.config), **extra}, path)
    if model.config.bias:  # HF GPT-2 has biases everywhere; bias-free models stay in our format only
        model.save_pretrained(out_dir / "hf", vocab_size=hf_vocab_size)
    return path
