"""The one way to turn a model spec into a GPT (`model.init_from`, `eval.model`, `gptcore-sample`): scratch, an OpenAI
name (gpt2, gpt2-medium, -large, -xl), a Hugging Face GPT-2 folder, this project's model/ folder, or a .pt file (ours,
nanoGPT's with `model_args`, build-nanogpt's with a pickled GPTConfig, read without running pickled code). A smaller
block size crops the position table, a larger one is an error."""
from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from gptcore.process import UserError, cause, read_failure
from gptcore.model.gpt import GPT, GPTConfig, file_config
from gptcore.model.hf import HF_GPT2_NAMES, load_hf_gpt2

MODEL_FILE = "model.pt"  # the final weights in this project's model/ folder
SPECS = (f"'scratch', one of {', '.join(HF_GPT2_NAMES)}, a Hugging Face GPT-2 folder, this project's model/ "
         f"folder, or a checkpoint file (.pt)")
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile, DistributedDataParallel
# build-nanogpt pickles its GPTConfig dataclass; run as a script its module is __main__, imported it is model
_PICKLED_CONFIGS = ("__main__.GPTConfig", "model.GPTConfig", "train_gpt2.GPTConfig")


def strip_prefixes(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The state dict without torch.compile's `_orig_mod.` and DDP's `module.` key prefixes, to load into a bare GPT."""
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        new = key
        while new.startswith(_WRAPPER_PREFIXES):
            new = new.split(".", 1)[1]
        if new in out:
            raise UserError(f"state dict keys collide after stripping wrapper prefixes: {key!r} -> {new!r}")
        out[new] = value
    return out


class _PickledConfig:
    """Stand-in for a pickled config dataclass: unpickling only fills its fields, no foreign code runs."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots) form
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict):
            raise UserError(f"pickled GPTConfig has state of type {type(state).__name__}, expected a dict")
        self.fields = dict(state)


class CorruptCheckpoint(UserError):
    """A file its own bytes show damaged (empty, a zip cut short, not a torch.save file): the only kind set aside."""


class CheckpointRefused(UserError):
    """A checkpoint not read now though nothing says it is damaged (a fault, a refusal, another format): kept as is."""


CHECKPOINT_FORMAT = 1  # the layout of what this project saves; files from before the key existed are layout 1
FORMAT_KEY = "format"
_ZIP_MAGIC, _LEGACY_MAGIC = b"PK\x03\x04", b"\x80\x02\x8a\x0a"  # torch.save's zip; its pre-1.6 pickle format


def read_checkpoint(path: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """A torch.save file as plain containers and tensors (weights_only; `mmap` maps them): CorruptCheckpoint only when
    its bytes show damage, CheckpointRefused for a fault or refusal that says nothing of them, else a traceback."""
    try:
        with torch.serialization.safe_globals([(_PickledConfig, name) for name in _PICKLED_CONFIGS]):
            ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:
        try:
            damage = _damage(path, e)
        except OSError as again:  # the disk still fails: nothing is known of the file
            raise CheckpointRefused(read_failure(path, again)) from e
        if damage:
            raise CorruptCheckpoint(f"{path}: cannot read checkpoint: {damage}") from e
        refused = _refusal(path, e)
        if refused is None:
            raise
        raise refused from e
    if not isinstance(ckpt, dict):
        raise CorruptCheckpoint(f"{path}: not a checkpoint (a {type(ckpt).__name__}, expected a dict)")
    version = ckpt.get(FORMAT_KEY, CHECKPOINT_FORMAT)
    if version != CHECKPOINT_FORMAT:
        raise CheckpointRefused(f"{path}: checkpoint format {version!r}, but this gptcore reads format "
                                f"{CHECKPOINT_FORMAT}; the file is kept: use the gptcore that wrote it, or move the "
                                f"file away to go on without it")
    if isinstance(ckpt.get("config"), _PickledConfig):
        ckpt["config"] = ckpt["config"].fields
    return ckpt


def _damage(path: Path, e: Exception) -> str:
    """What in the file's own bytes (and, for the legacy format, the unpickler's end of file `e`) shows it damaged
    or foreign; '' if nothing does. An OSError reading it propagates: an unreadable disk says nothing of the file."""
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        return "an empty file"
    if head == _LEGACY_MAGIC:
        return "torch's legacy format, cut short" if isinstance(e, EOFError) else ""
    if head != _ZIP_MAGIC:
        return "not a torch.save file (neither a zip archive nor torch's legacy format)"
    try:
        with zipfile.ZipFile(path) as z:  # reads the central directory, which ends the file
            names = z.namelist()
    except zipfile.BadZipFile as bad:
        return f"a zip archive cut short or damaged ({bad})"
    if not any(n.rsplit("/", 1)[-1] == "data.pkl" for n in names):
        return "a zip archive but not a torch.save file (no data.pkl)"
    return ""


def _refusal(path: Path, e: Exception) -> CheckpointRefused | None:
    """The one line for a readable-looking file that did not load for a reason other than damage; None: a bug."""
    kept = "the file is kept as it is"
    if isinstance(e, OSError):
        return CheckpointRefused(read_failure(path, e))
    if isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and "can't allocate memory" in str(e)):
        return CheckpointRefused(f"{path}: out of memory while loading it ({cause(e)}); {kept}: free memory (or "
                                 f"use a machine with more) and run again")
    if isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e):
        return CheckpointRefused(f"{path}: not loadable as plain tensors by torch {torch.__version__}'s "
                                 f"weights_only loader ({_refused_global(e)}); {kept}: use the torch version that "
                                 f"wrote it, or on a machine you trust save its tensors again")
    return None


def _refused_global(e: Exception) -> str:
    """The weights_only loader's own reason without its advice: the global it refused, where it names one."""
    found = re.search(r"Unsupported global: GLOBAL \S+", str(e))
    return found.group(0) if found else cause(e)


def _from_checkpoint(path: Path) -> GPT:
    ckpt = read_checkpoint(path)
    # this project: model_config; nanoGPT: model_args; build-nanogpt: config
    for key in ("model_config", "model_args", "config"):
        if isinstance(ckpt.get(key), dict) and "model" in ckpt:
            args = ckpt[key]
            break
    else:
        raise UserError(f"{path}: not a GPT checkpoint (no model with model_config, model_args or config; "
                         f"keys: {sorted(ckpt)})")
    config = file_config(args, path)
    model = GPT(config)
    # nanoGPT without flash attention keeps a causal-mask buffer `attn.bias`; it is not a weight
    state = {k: v for k, v in strip_prefixes(ckpt["model"]).items() if not k.endswith(".attn.bias")}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{path}: weights do not fit GPT({config}): {e}") from e
    return model


def load_model(spec: str | Path, block_size: int | None = None, dropout: float | None = None) -> GPT:
    """A GPT with the weights `spec` names (see the module docstring); `block_size` crops, `dropout` is set if given."""
    name, path = str(spec), Path(spec)
    if name == "scratch":
        raise UserError("'scratch' names no weights: only model.init_from starts a model from scratch")
    if name in HF_GPT2_NAMES:
        model = load_hf_gpt2(name)
    elif path.is_dir() and (path / MODEL_FILE).is_file():
        model = _from_checkpoint(path / MODEL_FILE)
    elif path.is_dir() and (path / "config.json").is_file():
        model = load_hf_gpt2(path)
    elif path.is_dir():
        raise UserError(f"{path}: a folder with neither {MODEL_FILE} (this project's model/ folder) nor config.json "
                         f"(a Hugging Face GPT-2 folder)")
    elif path.is_file():
        model = _from_checkpoint(path)
    else:
        raise UserError(f"model {name!r}: no such file or folder; expected {SPECS}")
    if block_size is not None and block_size != model.config.block_size:
        if block_size > model.config.block_size:
            raise UserError(f"block_size={block_size} is larger than {name}'s {model.config.block_size}: "
                             f"its position table has no rows for the extra positions")
        model.crop_block_size(block_size)
    if dropout is not None:
        model.set_dropout(dropout)
    return model


def padded_vocab(vocab_size: int, multiple: int = 64) -> int:
    """Round a tokenizer's vocabulary up for fast matmuls (50257 -> 50304), as nanoGPT does."""
    return ((vocab_size + multiple - 1) // multiple) * multiple


def model_vocab(vocab_param: int | str | None, data_vocab_size: int) -> int:
    """The model's vocabulary for `model.vocab_size` (`auto`/None: the data's, padded): the one place it is padded."""
    return padded_vocab(data_vocab_size) if vocab_param in (None, "auto") else int(vocab_param)


def init_model(model_params: dict[str, Any], data_vocab_size: int, seed: int = 1337) -> GPT:
    """The weights a run starts from, by `model.init_from` (scratch from `seed`, the same on every rank and rerun, or
    any spec of `load_model`); the vocabulary must hold every token id of the data."""
    params = dict(model_params)
    init_from = str(params.pop("init_from", "scratch"))
    params["vocab_size"] = model_vocab(params.get("vocab_size", "auto"), data_vocab_size)
    if init_from == "scratch":
        torch.manual_seed(seed)
        model = GPT(GPTConfig(**params))
    else:
        try:
            model = load_model(init_from, block_size=params.get("block_size"), dropout=params.get("dropout", 0.0))
        except UserError as e:  # the loader's own one-line reasons; anything else is a bug
            raise UserError(f"model.init_from={init_from!r}: {e}") from e
    if model.config.vocab_size < data_vocab_size:
        raise UserError(f"model vocab_size={model.config.vocab_size} is smaller than the data's tokenizer vocabulary "
                        f"({data_vocab_size}); set model.vocab_size: auto or at least {data_vocab_size}")
    return model
