"""Hugging Face's formats, without `transformers`: OpenAI's GPT-2 weights or any GPT-2 folder in, and out the
transformers architecture that computes exactly what a model does (GPT-2, Llama or Qwen3)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import safetensors.torch
import torch
from safetensors import SafetensorError

from gptcore.atomic import atomic_write, write_text
from gptcore.errors import NotRepresentable, UserError, cause, read_failure, user_error
from gptcore.model.checkpoint_file import read_checkpoint
from gptcore.model.gpt import GPT, NORM_EPS, GPTConfig, file_config, without_padding

# The one list of OpenAI's GPT-2 checkpoints a model spec may name, and the Hub repositories that hold them.
HF_GPT2_NAMES = {name: f"openai-community/{name}" for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}
# Hugging Face keeps these as Conv1D ([in, out]), i.e. transposed relative to nn.Linear: transposed in and out.
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GENERATION_CONFIG = "generation_config.json"
# a block's weights Llama (and Qwen3: the QK-norms) keep as they are under other names
_LLAMA_NAMES = {"attn.c_proj": "self_attn.o_proj", "mlp.c_proj": "mlp.down_proj", "ln_1": "input_layernorm",
                "ln_2": "post_attention_layernorm", "attn.q_norm": "self_attn.q_norm",
                "attn.k_norm": "self_attn.k_norm"}


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
    write_text(out / "config.json", json.dumps(hf_config, indent=2, sort_keys=True, allow_nan=False) + "\n")  # last
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
