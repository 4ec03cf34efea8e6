"""Every way a model comes in or goes out, so that one module knows the formats on disk, all read and written without
`transformers`. In, by a model spec (`model.init_from`, `eval.model`, `gptcore-sample`): scratch, an OpenAI name (gpt2,
gpt2-medium, -large, -xl), a Hugging Face GPT-2 folder, this project's model/ folder, or a .pt file (ours, nanoGPT's,
build-nanogpt's, read without running pickled code); a smaller block size crops the position table. Out: model/, with
in hf/ the transformers architecture that computes exactly what the model does (GPT-2, Llama or Qwen3)."""
from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from safetensors import SafetensorError

from gptcore.atomic import atomic_write, staged_dir, swap_dir, write_json, write_text
from gptcore.data.tokenizers import Tokenizer
from gptcore.model.gpt import GPT, NORM_EPS, GPTConfig, file_config, without_padding
from gptcore.process import NotRepresentable, UserError, cause, read_failure, user_error

MODEL_FILE = "model.pt"  # the final weights in this project's model/ folder
NOT_EXPORTED = "NOT_EXPORTED.txt"  # in model/hf when no transformers architecture represents the model
# The one list of OpenAI's GPT-2 checkpoints a model spec may name, and the Hub repositories that hold them.
HF_GPT2_NAMES = {name: f"openai-community/{name}" for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile, DistributedDataParallel
# build-nanogpt pickles its GPTConfig dataclass; run as a script its module is __main__, imported it is model
_PICKLED_CONFIGS = ("__main__.GPTConfig", "model.GPTConfig", "train_gpt2.GPTConfig")
# Hugging Face keeps these as Conv1D ([in, out]), i.e. transposed relative to nn.Linear: transposed in and out.
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GENERATION_CONFIG = "generation_config.json"
# a block's weights Llama (and Qwen3: the QK-norms) keep as they are under other names
_LLAMA_NAMES = {"attn.c_proj": "self_attn.o_proj", "mlp.c_proj": "mlp.down_proj", "ln_1": "input_layernorm",
                "ln_2": "post_attention_layernorm", "attn.q_norm": "self_attn.q_norm",
                "attn.k_norm": "self_attn.k_norm"}


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
        # the loader's own reason without its advice: the global it refused, where it names one
        found = re.search(r"Unsupported global: GLOBAL \S+", str(e))
        return CheckpointRefused(f"{path}: not loadable as plain tensors by torch {torch.__version__}'s "
                                 f"weights_only loader ({found.group(0) if found else cause(e)}); {kept}: use the "
                                 f"torch version that wrote it, or on a machine you trust save its tensors again")
    return None


def _from_checkpoint(path: Path) -> GPT:
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
        raise UserError(f"model {name!r}: no such file or folder; expected 'scratch', one of "
                        f"{', '.join(HF_GPT2_NAMES)}, a Hugging Face GPT-2 folder, this project's model/ folder, or a "
                        f"checkpoint file (.pt)")
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


# -- in: OpenAI's weights or any Hugging Face GPT-2 folder -------------------------------------------------------------
def load_hf_gpt2(name_or_dir: str | os.PathLike) -> GPT:
    """OpenAI's GPT-2 by name (from the Hub or its cache) or a local Hugging Face GPT-2 folder, without dropout."""
    model_dir, name = Path(name_or_dir), str(name_or_dir)
    if not model_dir.is_dir():
        if name not in HF_GPT2_NAMES:
            raise UserError(f"{name!r} is neither a local Hugging Face GPT-2 directory nor one of "
                            f"{', '.join(HF_GPT2_NAMES)}")
        repo = HF_GPT2_NAMES[name]
        try:
            from huggingface_hub import snapshot_download

            # snapshot_download falls back to the local cache when the Hub cannot be reached
            model_dir = Path(snapshot_download(repo_id=repo, allow_patterns=["config.json", "model.safetensors"]))
        except Exception as e:
            if user_error(e) is not None:  # a full or forbidden cache folder: not the network's fault
                raise user_error(e) from e
            raise UserError(
                f"model {name!r}: cannot fetch {repo} from the Hugging Face hub or its cache ({cause(e)}); "
                f"on a machine with internet run `hf download {repo} config.json model.safetensors --local-dir <dir>`, "
                f"copy <dir> here and give that folder instead of {name!r}") from e
    config = _config_from_hf(model_dir)
    state = _read_hf_weights(model_dir)
    # build on the meta device (no wasted init of up to 1.5B weights), then give it real storage
    with torch.device("meta"):
        model = GPT(config)
    model.to_empty(device="cpu")
    model.lm_head.weight = model.transformer.wte.weight  # to_empty may untie; tie again
    _load_hf_state(model, state, model_dir)
    return model


def _config_from_hf(model_dir: Path) -> GPTConfig:
    path = model_dir / "config.json"
    if not path.is_file():
        raise UserError(f"{path}: missing; a Hugging Face GPT-2 directory needs config.json")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from e
    except OSError as e:  # the disk's fault, not the folder's
        raise UserError(read_failure(path, e)) from e
    if hf.get("model_type", "gpt2") != "gpt2":
        raise UserError(f"{path}: model_type is {hf['model_type']!r}, expected 'gpt2'")
    # refuse variants whose maths differ from the model above instead of silently loading them wrong
    expect = {"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "layer_norm_epsilon": (1e-5,),
              "scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,),
              "tie_word_embeddings": (True,)}
    for key, allowed in expect.items():
        if key in hf and hf[key] not in allowed:
            raise UserError(f"{path}: {key}={hf[key]!r} is not supported (expected one of {allowed})")
    if hf.get("n_inner") not in (None, 4 * hf.get("n_embd", 768)):
        raise UserError(f"{path}: n_inner={hf['n_inner']} is not supported (only 4 * n_embd)")
    shape = {"block_size": hf.get("n_positions", hf.get("n_ctx", 1024)), "vocab_size": hf.get("vocab_size", 50257)}
    return file_config({**shape, **{k: hf[k] for k in ("n_layer", "n_head", "n_embd") if k in hf}}, path)


def _read_hf_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face checkpoint directory, read directly (no transformers)."""
    single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
    try:
        if single.is_file() or index.is_file():
            shards = {single.name} if single.is_file() else set(
                json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            return {key: t for shard in sorted(shards)
                    for key, t in safetensors.torch.load_file(str(model_dir / shard), device="cpu").items()}
    except FileNotFoundError as e:  # a shard the index lists is not there
        raise UserError(f"{model_dir}: a weights file is missing ({cause(e)}); copy the folder again") from e
    except OSError as e:  # the disk's fault, not the folder's
        raise UserError(read_failure(e.filename or model_dir, e)) from e
    except (SafetensorError, ValueError, KeyError, TypeError, AttributeError) as e:  # a damaged header or index
        raise UserError(f"{model_dir}: cannot read its safetensors weights ({cause(e)}); copy the folder again") from e
    if (model_dir / "pytorch_model.bin").is_file():
        return read_checkpoint(model_dir / "pytorch_model.bin")
    raise UserError(f"{model_dir}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin found")


def _load_hf_state(model: GPT, state: dict[str, torch.Tensor], model_dir: Path) -> None:
    """Copy a Hugging Face GPT-2 state dict into `model`, transposing Conv1D weights."""
    ours, seen, lm_head = model.state_dict(), set(), state.get("lm_head.weight")
    for key, tensor in state.items():
        if key == "lm_head.weight" or key.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # the tied head (checked below) and Hugging Face's causal-mask buffers, not parameters
        if not key.startswith("transformer."):
            key = "transformer." + key  # GPT2Model (no LM head) checkpoints lack the prefix
        if key not in ours:
            raise UserError(f"{model_dir}: unexpected tensor {key!r} for GPT-2 ({tuple(tensor.shape)})")
        if key.endswith(_CONV1D_SUFFIXES):
            tensor = tensor.t()
        if tuple(tensor.shape) != tuple(ours[key].shape):
            raise UserError(f"{model_dir}: {key} has shape {tuple(tensor.shape)}, config.json implies "
                            f"{tuple(ours[key].shape)}")
        with torch.no_grad():
            ours[key].copy_(tensor)
        seen.add(key)
    missing = sorted(set(ours) - {"lm_head.weight"} - seen)  # tied: filled through wte
    if missing:
        raise UserError(f"{model_dir}: checkpoint lacks {len(missing)} tensors, e.g. {missing[:5]}")
    if lm_head is not None and not torch.equal(lm_head.to(ours["transformer.wte.weight"].dtype),
                                               ours["transformer.wte.weight"]):
        raise UserError(f"{model_dir}: lm_head.weight differs from wte.weight; GPT-2 ties them")


def atomic_torch_save(obj: Any, path: Path) -> None:
    """torch.save through the atomic writer (a kill mid-save leaves the old file); a dict gets the format version."""
    if isinstance(obj, dict):
        obj = {FORMAT_KEY: CHECKPOINT_FORMAT, **obj}
    with atomic_write(path, "wb", needed=_tensor_bytes(obj)) as f:
        torch.save(obj, f)


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in a (nested) checkpoint dict: about what torch.save writes."""
    if isinstance(obj, torch.Tensor):
        return obj.nbytes
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return sum(_tensor_bytes(v) for v in items)


# -- out: model/ and its Hugging Face export ---------------------------------------------------------------------------
def export_model(model_dir: Path, model: GPT, tokenizer: Tokenizer | None, record: dict[str, Any],
                 hardware: dict[str, Any] | None = None, hf_vocab_size: int | None = None) -> list[str]:
    """Build `model_dir` aside for `model` and its data's tokenizer, with `record` (step, export, ...) in model.pt and
    manifest.json, and swap it in whole; one note per fact worth showing (which HF architecture, or why none)."""
    model_dir = Path(model_dir)
    staged = staged_dir(model_dir)  # a kill leaves it behind, never a model_dir of two runs
    shutil.rmtree(staged, ignore_errors=True)  # what a killed export left
    staged.mkdir(parents=True)
    data = tokenizer.record() if tokenizer is not None else None
    if tokenizer is not None and hf_vocab_size is None:
        hf_vocab_size = tokenizer.vocab_size
    atomic_torch_save({"model": model.state_dict(), "model_config": asdict(model.config),
                       **({"data": data} if data else {}), **record}, staged / MODEL_FILE)
    hf_dir = staged / "hf"  # the Hugging Face export and, where the tokenizer can write them, its HF tokenizer files
    try:
        arch = export_hf(model, hf_dir, vocab_size=hf_vocab_size, eot=None if tokenizer is None else tokenizer.eot)
    except NotRepresentable as e:
        hf_dir.mkdir(exist_ok=True)
        write_text(hf_dir / NOT_EXPORTED, f"{e}; model.pt holds the weights\n")
        notes = [f"no Hugging Face export: {e}"]
    else:
        notes = [f"Hugging Face export ({arch}): {model_dir / 'hf'}"]
        if tokenizer is not None:
            tokenizer.save_hf(hf_dir, max_length=model.config.block_size)
    if tokenizer is not None:
        tokenizer.save(staged)  # the folder carries its tokenizer: sampling and evaluate need nothing else
        manifest = {"tokenizer": data, **{k: v for k, v in record.items() if k != "final"}}
        if hardware is not None:  # where it trained: compare turns training hours into GPU-hours with it
            manifest["hardware"] = hardware
        write_json(staged / "manifest.json", manifest)
    swap_dir(staged, model_dir)
    if record.get("export") == "best":
        notes.append(f"{model_dir}/: the best weights, step {record['step']} of {record['trained_steps']} (val_loss "
                     f"{record['best_val_loss']:.4f})")
    return notes


def hf_architecture(cfg: GPTConfig) -> tuple[str | None, str]:
    """The transformers model_type that computes exactly what `cfg` does ("gpt2", "llama" or "qwen3") and a one-line
    description, or None and the reason none does (zero_init_proj is an init: it never matters)."""
    gpt2 = dict(pos_encoding="learned", norm="layernorm", qk_norm=False, mlp="gelu", tie_embeddings=True,
                logit_softcap=None, bias=True)
    if all(getattr(cfg, k) == v for k, v in gpt2.items()):
        return "gpt2", "GPT-2"
    if cfg.pos_encoding == "learned":
        return None, ("learned positions with the modern switches: GPT-2 needs all of layernorm, gelu, biases and "
                      "tied embeddings, and Llama/Qwen3 use rotary positions")
    checks = ((cfg.norm != "rmsnorm", "norm layernorm (Llama/Qwen3 use RMSNorm)"),
              (cfg.mlp != "swiglu", f"mlp {cfg.mlp} (Llama/Qwen3 use SwiGLU)"),
              (cfg.bias, "biases (Llama/Qwen3 projections and norms have none)"),
              (cfg.logit_softcap is not None, "a logit soft-cap (Llama/Qwen3 have none)"))
    reasons = [why for bad, why in checks if bad]
    if reasons:
        return None, "rotary positions with " + ", ".join(reasons)
    if cfg.qk_norm:
        return "qwen3", "Qwen3 (RMSNorm, rotary, SwiGLU, QK-norm, no biases)"
    return "llama", "Llama (RMSNorm, rotary, SwiGLU, no biases)"


def export_hf(model: GPT, save_dir: str | os.PathLike, vocab_size: int | None = None, eot: int | None = None) -> str:
    """Write `model` (fp32) as the transformers architecture with the same logits, and return its model_type (else
    NotRepresentable); `vocab_size` keeps the first rows (50257 of 50304), `eot` becomes bos and eos (generate ends)."""
    cfg = model.config
    arch, why = hf_architecture(cfg)
    if arch is None:
        raise NotRepresentable(f"no transformers architecture represents this model: {why}")
    vocab_size = cfg.vocab_size if vocab_size is None else vocab_size
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 0 < vocab_size <= cfg.vocab_size:
        raise ValueError(f"vocab_size must be an int in [1, {cfg.vocab_size}], got {vocab_size!r}")
    assert eot is None or 0 <= eot < vocab_size, (eot, vocab_size)  # the tokenizer's own id, inside its vocabulary
    sd = {k: v.detach().to(device="cpu", dtype=torch.float32) for k, v in model.state_dict().items()}
    tensors, hf_config = (_gpt2_export(sd, cfg, vocab_size) if arch == "gpt2" else
                          _llama_export(sd, cfg, arch, vocab_size))
    blob = safetensors.torch.save({k: t.contiguous().clone() for k, t in tensors.items()}, metadata={"format": "pt"})
    out = Path(save_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "model.safetensors", "wb") as f:  # weights first: a folder with a config is complete
        f.write(blob)
    if eot is None:
        (out / GENERATION_CONFIG).unlink(missing_ok=True)
    else:
        write_text(out / GENERATION_CONFIG, json.dumps({"bos_token_id": eot, "eos_token_id": eot}, indent=2) + "\n")
    hf_config.update(bos_token_id=eot, eos_token_id=eot)  # null without an eot
    write_text(out / "config.json", json.dumps(hf_config, indent=2, sort_keys=True) + "\n")  # last
    return arch


def save_hf_gpt2(model: GPT, save_dir: str | os.PathLike, vocab_size: int | None = None,
                 eot: int | None = None) -> None:
    """`export_hf` for a GPT-2 model (`GPT2LMHeadModel` loads it with the same logits), a ValueError for another."""
    if not model.config.bias:
        raise ValueError("a bias=False model cannot be exported as Hugging Face GPT-2, whose Linear and LayerNorm "
                         "layers always have biases")
    arch, why = hf_architecture(model.config)
    if arch != "gpt2":
        raise ValueError(f"not a GPT-2 model: {why}" if arch is None else f"not a GPT-2 model: export it as {arch}")
    export_hf(model, save_dir, vocab_size, eot)


def _gpt2_export(sd: dict[str, torch.Tensor], cfg: GPTConfig, vocab_size: int) -> tuple[dict[str, torch.Tensor], dict]:
    """GPT2LMHeadModel's tensors (our names are its own; the tied lm_head is left out) and config.json."""
    tensors = {name: t.t() if name.endswith(_CONV1D_SUFFIXES) else t for name, t in sd.items()
               if name != "lm_head.weight"}  # Hugging Face re-ties it from tie_word_embeddings
    tensors["transformer.wte.weight"] = without_padding(sd["transformer.wte.weight"], vocab_size, dim=0)
    return tensors, {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
        "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd, "n_inner": None,
        "n_positions": cfg.block_size, "n_ctx": cfg.block_size, "vocab_size": vocab_size,
        "attn_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "resid_pdrop": cfg.dropout,
        "layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": True,
        "initializer_range": 0.02, "torch_dtype": "float32", "use_cache": True,
        # the sequence-summary head's settings, as transformers' GPT2Config writes them
        "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
        "summary_type": "cls_index", "summary_use_proj": True,
    }


def _llama_export(sd: dict[str, torch.Tensor], cfg: GPTConfig, arch: str,
                  vocab_size: int) -> tuple[dict[str, torch.Tensor], dict]:
    """Llama's (or Qwen3's) tensors and config.json: c_attn's rows [q; k; v] and c_fc's [gate; up] split. Our rotary
    pairs channel i with i + head_size/2, as rotate_half does: q and k need no permutation."""
    tensors = {"model.embed_tokens.weight": without_padding(sd["transformer.wte.weight"], vocab_size, dim=0),
               "model.norm.weight": sd["transformer.ln_f.weight"]}
    if not cfg.tie_embeddings:
        tensors["lm_head.weight"] = without_padding(sd["lm_head.weight"], vocab_size, dim=0)
    for i in range(cfg.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        q, k, v = sd[ours + "attn.c_attn.weight"].split(cfg.n_embd, dim=0)
        gate, up = sd[ours + "mlp.c_fc.weight"].split(cfg.swiglu_hidden, dim=0)
        parts = {"self_attn.q_proj": q, "self_attn.k_proj": k, "self_attn.v_proj": v, "mlp.gate_proj": gate,
                 "mlp.up_proj": up, **{new: sd[f"{ours}{old}.weight"] for old, new in _LLAMA_NAMES.items()
                                       if f"{ours}{old}.weight" in sd}}
        tensors.update({f"{theirs}{name}.weight": t for name, t in parts.items()})
    hf_config = {
        "architectures": ["Qwen3ForCausalLM" if arch == "qwen3" else "LlamaForCausalLM"], "model_type": arch,
        "hidden_size": cfg.n_embd, "intermediate_size": cfg.swiglu_hidden, "head_dim": cfg.n_embd // cfg.n_head,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_head,
        "max_position_embeddings": cfg.block_size, "vocab_size": vocab_size, "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": "silu", "rms_norm_eps": NORM_EPS, "attention_bias": False, "attention_dropout": cfg.dropout,
        # transformers >= 5 reads rope_parameters, older versions rope_theta/rope_scaling
        "rope_parameters": {"rope_type": "default", "rope_theta": float(cfg.rope_base)},
        "rope_theta": float(cfg.rope_base), "rope_scaling": None,
        "initializer_range": 0.02, "torch_dtype": "float32", "use_cache": True,
    }
    if arch == "llama":
        hf_config["mlp_bias"] = False
    else:
        hf_config.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layer)
    return tensors, hf_config
