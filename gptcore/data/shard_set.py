"""A tokenize run's shard folder opened once: its manifest read and its files checked once, its tokenizer rebuilt,
each split's shards and token counts, and the identity a checkpoint resumes on. Train and evaluate open one each."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptcore.data.shards import identity, load_tokens, open_splits
from gptcore.data.tokenizers import tokenizer_of
from gptcore.data.tokenizers.base import Tokenizer
from gptcore.data.tokenizers.gpt2 import GPT2Tokenizer


@dataclass(frozen=True)
class ShardSet:
    """The shards of one folder: `splits` ("val", "train") are lists of shard files, `tokens` their token counts."""

    folder: Path
    manifest: dict | None  # None: build-nanogpt's shards, which are GPT-2 tokens with no manifest
    splits: dict[str, list[Path]]
    tokens: dict[str, int]
    tokenizer: Tokenizer
    identity: str

    @classmethod
    def open(cls, folder: str | Path) -> ShardSet:
        """Open `folder` (its checks: `shards.open_splits`); a UserError names what is wrong."""
        folder = Path(folder)
        m, splits = open_splits(folder)
        tokens = {split: (sum(s["tokens"] for s in m["shards"] if s["split"] == split) if m is not None
                          else sum(len(load_tokens(p)) for p in paths)) for split, paths in splits.items()}
        tok = tokenizer_of(folder, m) if m is not None else GPT2Tokenizer()
        return cls(folder, m, splits, tokens, tok, identity(m, splits))

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary: every id in the shards is below it."""
        return self.tokenizer.vocab_size

    def record(self) -> dict[str, Any]:
        """What a run records of its data and resumes only on: the tokenizer's record and the shards' identity."""
        return {**self.tokenizer.record(), "shards": self.identity}
