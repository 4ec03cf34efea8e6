"""The one model loader: the weights a model spec names (`model.init_from`, `eval.model`, `gptcore-sample`), as a
GPT. A spec is scratch, an OpenAI name (gpt2, gpt2-medium, -large, -xl), a Hugging Face GPT-2 folder, this project's
model/ folder, or a .pt file (ours, nanoGPT's, build-nanogpt's, read without running pickled code); a smaller block
size crops the position table. Also the tokenizer that goes with a model, and evaluate's check that a model's tokenizer
made the shards it is scored on."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from gptcore.data.shard_set import ShardSet
from gptcore.data.shards import MANIFEST
from gptcore.data.tokenizers import load_tokenizer
from gptcore.data.tokenizers.base import Tokenizer
from gptcore.data.tokenizers.gpt2 import GPT2Tokenizer
from gptcore.errors import UserError, cause
from gptcore.model.checkpoint_file import check_sha256, read_checkpoint, strip_prefixes
from gptcore.model.config import ModelConfig
from gptcore.model.export import MODEL_FILE, SHA256_KEY
from gptcore.model.gpt import GPT, GPTConfig, file_config
from gptcore.model.hf import HF_GPT2_NAMES, load_hf_gpt2

DCP_INDEX = ".metadata"  # torch.distributed.checkpoint's index, in every training checkpoint folder


def _from_checkpoint(path: Path) -> GPT:
    expected = recorded_sha256(path)
    if expected is not None:  # model/'s weights: the file as it was exported, or a line
        check_sha256(path, expected, str(path.parent / MANIFEST),
                     "export it again (rerun train: its checkpoints are kept), or restore DVC's copy (dvc checkout)")
    ckpt = read_checkpoint(path)
    # this project: model_config; nanoGPT: model_args; build-nanogpt: config
    key = next((k for k in ("model_config", "model_args", "config") if isinstance(ckpt.get(k), dict)), None)
    if key is None or "model" not in ckpt:
        raise UserError(f"{path}: not a GPT checkpoint (no model with model_config, model_args or config; "
                         f"keys: {sorted(ckpt)})")
    config = file_config(ckpt[key], path)
    model = GPT(config)
    # nanoGPT without flash attention keeps a causal-mask buffer `attn.bias`; it is not a weight
    state = {k: v for k, v in strip_prefixes(ckpt["model"]).items() if not k.endswith(".attn.bias")}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{path}: weights do not fit GPT({config}): {e}") from e
    return model


def recorded_sha256(path: Path) -> str | None:
    """The sha256 the manifest.json beside `path` recorded for it when model/ was exported; None where none is
    recorded (a file of another project, an export of an older gptcore). A manifest that is not JSON is a line."""
    manifest = Path(path).parent / MANIFEST
    if not manifest.is_file():
        return None
    try:
        record = json.loads(manifest.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{manifest}: not valid JSON ({cause(e)}): the record of the folder is damaged; export it "
                        f"again (rerun train), or restore DVC's copy (dvc checkout)") from e
    digests = record.get(SHA256_KEY) if isinstance(record, dict) else None
    found = digests.get(Path(path).name) if isinstance(digests, dict) else None
    return found if isinstance(found, str) else None


def _training_checkpoint(path: Path) -> Path | None:
    """The training checkpoint folder (torch.distributed.checkpoint's, with its index .metadata) that `path` is, or
    holds `path`; None if neither."""
    for folder in (path, path.parent):
        if folder.is_dir() and (folder / DCP_INDEX).is_file():
            return folder
    return None


def check_spec(spec: str | Path) -> None:
    """A UserError naming `spec` when it names no weights: 'scratch', a missing path, a folder of neither form, or a
    training checkpoint (a folder of shards) or one of its files. Cheap (nothing is read), so a launcher checks it
    before any rank starts."""
    name, path = str(spec), Path(spec)
    if name == "scratch":
        raise UserError("'scratch' names no weights: only model.init_from starts a model from scratch")
    folder = _training_checkpoint(path)
    if folder is not None or path.suffix == ".distcp":
        what = "a training checkpoint" if folder == path else \
            f"one file of the training checkpoint {folder}" if folder else "one shard of a training checkpoint"
        raise UserError(f"{path}: {what}, not a model (its weights are spread over files that only resuming reads "
                        f"together): name a model/ folder (what train exports), a .pt file of weights or a Hugging "
                        f"Face GPT-2 folder")
    if name in HF_GPT2_NAMES or path.is_file():
        return
    if path.is_dir() and not ((path / MODEL_FILE).is_file() or (path / "config.json").is_file()):
        raise UserError(f"{path}: a folder with neither {MODEL_FILE} (this project's model/ folder) nor config.json "
                        f"(a Hugging Face GPT-2 folder)")
    if not path.is_dir():
        raise UserError(f"model {name!r}: no such file or folder; expected 'scratch', one of "
                        f"{', '.join(HF_GPT2_NAMES)}, a Hugging Face GPT-2 folder, this project's model/ folder, or a "
                        f"checkpoint file (.pt)")


def load_model(spec: str | Path, block_size: int | None = None, dropout: float | None = None) -> GPT:
    """A GPT with the weights `spec` names (see the module docstring); `block_size` crops, `dropout` is set if given."""
    check_spec(spec)
    name, path = str(spec), Path(spec)
    if name in HF_GPT2_NAMES:
        model = load_hf_gpt2(name)
    elif path.is_dir() and (path / MODEL_FILE).is_file():
        model = _from_checkpoint(path / MODEL_FILE)
    elif path.is_dir():
        model = load_hf_gpt2(path)
    else:
        model = _from_checkpoint(path)
    if block_size is not None and block_size != model.config.block_size:
        if block_size > model.config.block_size:
            raise UserError(f"block_size={block_size} is larger than {name}'s {model.config.block_size}: "
                             f"its position table has no rows for the extra positions")
        model.crop_block_size(block_size)
    if dropout is not None:
        model.set_dropout(dropout)
    return model


def init_model(cfg: ModelConfig, data_vocab_size: int, seed: int = 1337) -> GPT:
    """The weights a run starts from, by `init_from` (scratch from `seed`, the same on every rank and rerun, or any
    spec of `load_model`); the vocabulary must hold every token id of the data."""
    if cfg.init_from == "scratch":
        shape = {k: v for k, v in asdict(cfg).items() if k in GPTConfig.params()}
        torch.manual_seed(seed)
        model = GPT(GPTConfig(**{**shape, "vocab_size": cfg.vocab(data_vocab_size)}))
    else:
        try:
            model = load_model(cfg.init_from, block_size=cfg.block_size, dropout=cfg.dropout)
        except UserError as e:  # the loader's own one-line reasons; anything else is a bug
            raise UserError(f"model.init_from={cfg.init_from!r}: {e}") from e
    if model.config.vocab_size < data_vocab_size:
        raise UserError(f"model vocab_size={model.config.vocab_size} is smaller than the data's tokenizer vocabulary "
                        f"({data_vocab_size}); set model.vocab_size: auto or at least {data_vocab_size}")
    return model


def tokenizer_for(spec: str, model: GPT, tokenizer_dir: str | Path | None = None) -> Tokenizer:
    """The tokenizer that goes with the model `spec` names: `tokenizer_dir`'s, else the one recorded beside the model
    (model/, or the folder above its hf/), else GPT-2 BPE as nanoGPT's sample.py assumes (OpenAI's weights)."""
    path = Path(spec)
    beside = [path, path.parent] if path.is_dir() else [path.parent] if path.is_file() else []
    found = [d for d in beside if (d / MANIFEST).is_file()]
    tok = load_tokenizer(tokenizer_dir) if tokenizer_dir else load_tokenizer(found[0]) if found else GPT2Tokenizer()
    if tok.vocab_size > model.config.vocab_size:
        raise UserError(f"{spec}: its vocabulary ({model.config.vocab_size}) is smaller than tokenizer {tok.name}'s "
                         f"({tok.vocab_size}); name the folder holding its tokenizer's manifest.json")
    return tok


def model_for_shards(spec: str, data: ShardSet) -> GPT:
    """The model `spec` names, refused unless its own tokenizer made the shards (gpt2: GPT-2 BPE)."""
    model = load_model(spec)
    model_tok = tokenizer_for(spec, model)
    a, b = ([getattr(t, key, None) for key in ("name", "vocab_size", "eot")] for t in (model_tok, data.tokenizer))
    if a != b:
        raise UserError(f"eval.model={spec} uses tokenizer {a[0]} (vocab {a[1]}, eot {a[2]}) but {data.folder} was "
                        f"tokenized with {b[0]} (vocab {b[1]}, eot {b[2]}); evaluate on matching shards")
    return model
