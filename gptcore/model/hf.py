"""Hugging Face checkpoints in and out, without `transformers`: OpenAI's weights (or any HF GPT-2 folder) -> GPT, and
GPT -> the transformers architecture that computes exactly what it does (GPT-2, Llama or Qwen3; `hf_architecture`)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from gptcore.atomic import atomic_write, write_text
from gptcore.process import NotRepresentable, UserError, cause, read_failure, user_error
from gptcore.model.gpt import GPT, NORM_EPS, GPTConfig, file_config, without_padding

# The one list of OpenAI's GPT-2 checkpoints a model spec may name, and the Hub repositories that hold them.
HF_GPT2_NAMES = {name: f"openai-community/{name}" for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}
# Hugging Face keeps these as Conv1D ([in, out]), i.e. transposed relative to nn.Linear: transposed in and out.
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GENERATION_CONFIG = "generation_config.json"


def load_hf_gpt2(name_or_dir: str | os.PathLike) -> GPT:
    """OpenAI's GPT-2 by name (from the Hub or its cache) or a local Hugging Face GPT-2 folder, without dropout."""
    path = Path(name_or_dir)
    if path.is_dir():
        model_dir = path
    elif str(name_or_dir) in HF_GPT2_NAMES:
        model_dir = _download_gpt2(str(name_or_dir))
    else:
        raise UserError(f"{str(name_or_dir)!r} is neither a local Hugging Face GPT-2 directory nor one of "
                        f"{', '.join(HF_GPT2_NAMES)}")
    config = _config_from_hf(model_dir)
    state = _read_hf_weights(model_dir)
    # build on the meta device (no wasted init of up to 1.5B weights), then give it real storage
    with torch.device("meta"):
        model = GPT(config)
    model.to_empty(device="cpu")
    model.lm_head.weight = model.transformer.wte.weight  # to_empty may untie; tie again
    _load_hf_state(model, state, model_dir)
    return model


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
    reasons = []
    if cfg.norm != "rmsnorm":
        reasons.append("norm layernorm (Llama/Qwen3 use RMSNorm)")
    if cfg.mlp != "swiglu":
        reasons.append(f"mlp {cfg.mlp} (Llama/Qwen3 use SwiGLU)")
    if cfg.bias:
        reasons.append("biases (Llama/Qwen3 projections and norms have none)")
    if cfg.logit_softcap is not None:
        reasons.append("a logit soft-cap (Llama/Qwen3 have none)")
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
    if arch == "gpt2":
        tensors, hf_config = _gpt2_tensors(sd, vocab_size), _gpt2_config(cfg, vocab_size)
    else:
        tensors, hf_config = _llama_tensors(sd, cfg, vocab_size), _llama_config(cfg, arch, vocab_size)
    from safetensors.torch import save as safetensors_bytes

    out = Path(save_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "model.safetensors", "wb") as f:  # weights first: a folder with a config is complete
        f.write(safetensors_bytes({k: t.contiguous().clone() for k, t in tensors.items()}, metadata={"format": "pt"}))
    _write_config(out, hf_config, eot)
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


def _gpt2_tensors(sd: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    tensors = {}
    for name, t in sd.items():
        if name == "lm_head.weight":
            continue  # tied to wte; Hugging Face re-ties it from tie_word_embeddings
        if name == "transformer.wte.weight":
            t = without_padding(t, vocab_size, dim=0)
        tensors[name] = t.t() if name.endswith(_CONV1D_SUFFIXES) else t
    return tensors


def _gpt2_config(cfg: GPTConfig, vocab_size: int) -> dict:
    return {
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


def _llama_tensors(sd: dict[str, torch.Tensor], cfg: GPTConfig, vocab_size: int) -> dict[str, torch.Tensor]:
    """Our names -> Llama's: c_attn's rows [q; k; v] and c_fc's [gate; up] split, c_proj -> o_proj / down_proj, the
    norms renamed. Our rotary pairs channel i with i + head_size/2, as rotate_half does: q and k need no permutation."""
    tensors = {"model.embed_tokens.weight": without_padding(sd["transformer.wte.weight"], vocab_size, dim=0),
               "model.norm.weight": sd["transformer.ln_f.weight"]}
    if not cfg.tie_embeddings:
        tensors["lm_head.weight"] = without_padding(sd["lm_head.weight"], vocab_size, dim=0)
    for i in range(cfg.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        q, k, v = sd[ours + "attn.c_attn.weight"].split(cfg.n_embd, dim=0)
        gate, up = sd[ours + "mlp.c_fc.weight"].split(cfg.swiglu_hidden, dim=0)
        tensors.update({
            theirs + "self_attn.q_proj.weight": q, theirs + "self_attn.k_proj.weight": k,
            theirs + "self_attn.v_proj.weight": v, theirs + "self_attn.o_proj.weight": sd[ours + "attn.c_proj.weight"],
            theirs + "mlp.gate_proj.weight": gate, theirs + "mlp.up_proj.weight": up,
            theirs + "mlp.down_proj.weight": sd[ours + "mlp.c_proj.weight"],
            theirs + "input_layernorm.weight": sd[ours + "ln_1.weight"],
            theirs + "post_attention_layernorm.weight": sd[ours + "ln_2.weight"],
        })
        if cfg.qk_norm:
            tensors[theirs + "self_attn.q_norm.weight"] = sd[ours + "attn.q_norm.weight"]
            tensors[theirs + "self_attn.k_norm.weight"] = sd[ours + "attn.k_norm.weight"]
    return tensors


def _llama_config(cfg: GPTConfig, arch: str, vocab_size: int) -> dict:
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
    return hf_config


def _write_config(out: Path, hf_config: dict, eot: int | None) -> None:
    """config.json (last: a folder with one is complete) and generation_config.json, `eot` as bos and eos (or null)."""
    hf_config = {**hf_config, "bos_token_id": eot, "eos_token_id": eot}
    if eot is None:
        (out / GENERATION_CONFIG).unlink(missing_ok=True)
    else:
        write_text(out / GENERATION_CONFIG, json.dumps({"bos_token_id": eot, "eos_token_id": eot}, indent=2) + "\n")
    write_text(out / "config.json", json.dumps(hf_config, indent=2, sort_keys=True) + "\n")


def _download_gpt2(name: str) -> Path:
    """Local directory holding OpenAI's `name` checkpoint, from the Hub or the Hugging Face cache."""
    repo = HF_GPT2_NAMES[name]
    try:
        from huggingface_hub import snapshot_download

        # snapshot_download falls back to the local cache when the Hub cannot be reached
        return Path(snapshot_download(repo_id=repo, allow_patterns=["config.json", "model.safetensors"]))
    except Exception as e:
        if user_error(e) is not None:  # a full or forbidden cache folder: not the network's fault
            raise user_error(e) from e
        raise UserError(
            f"model {name!r}: cannot fetch {repo} from the Hugging Face hub or its cache ({cause(e)}); "
            f"on a machine with internet run `hf download {repo} config.json model.safetensors --local-dir <dir>`, "
            f"copy <dir> here and give that folder instead of {name!r}") from e


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
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    bin_file = model_dir / "pytorch_model.bin"
    try:
        if single.is_file():
            return load_file(str(single), device="cpu")
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                state.update(load_file(str(model_dir / shard), device="cpu"))
            return state
    except FileNotFoundError as e:  # a shard the index lists is not there
        raise UserError(f"{model_dir}: a weights file is missing ({cause(e)}); copy the folder again") from e
    except OSError as e:  # the disk's fault, not the folder's
        raise UserError(read_failure(e.filename or model_dir, e)) from e
    except (SafetensorError, ValueError, KeyError, TypeError, AttributeError) as e:  # a damaged header or index
        raise UserError(f"{model_dir}: cannot read its safetensors weights ({cause(e)}); copy the folder again") from e
    if bin_file.is_file():
        from gptcore.model.load import read_checkpoint  # load.py imports this module

        return read_checkpoint(bin_file)
    raise UserError(f"{model_dir}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin found")


def _load_hf_state(model: GPT, state: dict[str, torch.Tensor], model_dir: Path) -> None:
    """Copy a Hugging Face GPT-2 state dict into `model`, transposing Conv1D weights."""
    ours = model.state_dict()
    expected = set(ours) - {"lm_head.weight"}  # tied: filled through wte
    seen: set[str] = set()
    lm_head = None
    for key, tensor in state.items():
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # Hugging Face's causal-mask buffers, not parameters
        if key == "lm_head.weight":
            lm_head = tensor
            continue
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
    missing = sorted(expected - seen)
    if missing:
        raise UserError(f"{model_dir}: checkpoint lacks {len(missing)} tensors, e.g. {missing[:5]}")
    if lm_head is not None and not torch.equal(lm_head.to(ours["transformer.wte.weight"].dtype),
                                               ours["transformer.wte.weight"]):
        raise UserError(f"{model_dir}: lm_head.weight differs from wte.weight; GPT-2 ties them")
