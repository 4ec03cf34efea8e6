"""Turning a model spec into a GPT: scratch, OpenAI's weights, a Hugging Face folder or a checkpoint file."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gptcore.model.gpt import GPT, GPTConfig
from gptcore.model.hf import HF_GPT2_NAMES, load_hf_gpt2


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


def read_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A torch.save file as plain containers and tensors (weights_only: no pickled code runs); names the file on failure."""
    try:
        # Our checkpoints hold plain containers, tensors and numbers; weights_only keeps loading safe.
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # a truncated or foreign file: say which
        raise ValueError(f"{path}: cannot read checkpoint ({type(e).__name__}: {e})") from e


def load_model(path: str | Path, override_args: dict[str, Any] | None = None) -> GPT:
    """A GPT from one of our checkpoints / final model files, or a nanoGPT `ckpt.pt` (`model`, `model_args`)."""
    ckpt = read_checkpoint(Path(path))
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


OPENAI_NAMES = tuple(HF_GPT2_NAMES)


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
        model = load_hf_gpt2(init_from, override_args=overrides)
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
