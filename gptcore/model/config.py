"""params.yaml's `model:` section (`ModelConfig`): a GPTConfig, the network's own shape and switches (model/gpt.py),
plus where the weights come from and the vocabulary's padding."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gptcore.model.gpt import GPTConfig
from gptcore.params import ParamError, param


def padded_vocab(vocab_size: int, multiple: int = 64) -> int:
    """Round a tokenizer's vocabulary up for fast matmuls (50257 -> 50304), as nanoGPT does."""
    return ((vocab_size + multiple - 1) // multiple) * multiple


@dataclass(kw_only=True)
class ModelConfig(GPTConfig):
    """params.yaml's `model:` section: a GPTConfig (the shape of a scratch model, its switches) plus where the weights
    come from; a loaded model's shape comes from its weights, and block_size and dropout apply to it."""

    init_from: str = param("scratch", "scratch | gpt2 | gpt2-medium | gpt2-large | gpt2-xl | a HF folder | a .pt")
    vocab_size: int | Literal["auto"] = param("auto", "auto: the data's vocabulary padded up to a multiple of 64",
                                              min=1)

    def check(self) -> None:
        """A scratch model's shape rules; a loaded one's shape is its weights' (only zero_init_head's rule applies)."""
        if self.init_from == "scratch":
            super().check()
        elif self.zero_init_head and self.tie_embeddings:
            raise ParamError("model.zero_init_head", True, "needs model.tie_embeddings: false (a tied head is the "
                                                           "token table, which must not start at zero)")

    def vocab(self, data_vocab_size: int) -> int:
        """The model's vocabulary (`auto`: the data's, padded): the one place it is padded."""
        return padded_vocab(data_vocab_size) if self.vocab_size == "auto" else self.vocab_size
