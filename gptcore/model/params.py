"""The schema of params.yaml's `model:` section (read by model.load.init_model)."""
from __future__ import annotations

from typing import Any

from gptcore.model.gpt import MLPS, NORMS, POS_ENCODINGS, relation_problem
from gptcore.params import REQUIRED, Param, ParamError, Section


def _relations(p: dict[str, Any]) -> None:
    problem = relation_problem(p, "model.")
    # a loaded model's shape comes from its weights: only zero_init_head's rule applies to it
    if problem and (p["init_from"] == "scratch" or problem[0] == "zero_init_head"):
        raise ParamError(f"model.{problem[0]}", p[problem[0]], problem[1])


MODEL = Section("model", {
    "init_from": Param(str, "scratch", "scratch | gpt2 | gpt2-medium | gpt2-large | gpt2-xl | a HF folder | a .pt"),
    "n_layer": Param(int, REQUIRED, "transformer blocks", min=1),
    "n_head": Param(int, REQUIRED, "attention heads per block", min=1),
    "n_embd": Param(int, REQUIRED, "width of the residual stream", min=1),
    "block_size": Param(int, REQUIRED, "context length in tokens", min=1),
    "vocab_size": Param(int, "auto", "auto: the data's vocabulary padded up to a multiple of 64", min=1,
                        also=("auto",)),
    "bias": Param(bool, True, "biases in linear layers and layer norms, as GPT-2"),
    "dropout": Param(float, 0.0, "dropout probability while training", min=0.0, below=1.0),
    # the modern recipe's switches; the defaults are GPT-2 (conf/preset/modern_quickstart.yaml turns them on)
    "pos_encoding": Param(str, "learned", "learned (a position table) | rotary (RoPE on q and k)",
                          choices=POS_ENCODINGS),
    "rope_base": Param(float, 10000.0, "rotary: the wavelength base of the lowest frequency pair", above=1.0),
    "norm": Param(str, "layernorm", "layernorm | rmsnorm", choices=NORMS),
    "qk_norm": Param(bool, False, "RMSNorm of each head's q and k"),
    "mlp": Param(str, "gelu", "gelu | relu2 | swiglu (hidden 8/3 n_embd, rounded to a multiple of 64)", choices=MLPS),
    "tie_embeddings": Param(bool, True, "one matrix embeds and scores tokens; false: a separate lm_head"),
    "zero_init_proj": Param(bool, False, "attention and MLP output projections start at zero"),
    "zero_init_head": Param(bool, False, "the untied lm_head starts at zero (modded-nanogpt record 2024-11-03, "
                                         "with the untied head); needs tie_embeddings false"),
    "logit_softcap": Param(float, None, "a number c: logits -> c * tanh(logits / c); null: no cap", above=0.0,
                           also=(None,)),
}, _relations)
