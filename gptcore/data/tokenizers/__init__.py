"""Tokenizers behind one interface (`Tokenizer`, tokenizers/base.py): the table of kinds below, each a module of this
package, and how a `tokenize.tokenizer` spec or a manifest's record picks one. A new kind is a module here with its
`Tokenizer` subclass, a row below, and its keys in `TokenizeConfig`."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterable

from gptcore.data.shards import MANIFEST, read_manifest
from gptcore.data.tokenizers.base import Tokenizer, TokenizerParams
from gptcore.data.tokenizers.char import CharTokenizer
from gptcore.data.tokenizers.gpt2 import GPT2Tokenizer
from gptcore.data.tokenizers.hf import BPETokenizer, HFTokenizer
from gptcore.data.tokenizers.tiktoken_file import Qwen2Tokenizer, TiktokenFileTokenizer
from gptcore.errors import UserError

KINDS: dict[str, type[Tokenizer]] = {
    "gpt2": GPT2Tokenizer,  # OpenAI's GPT-2 BPE, offline
    "qwen2": Qwen2Tokenizer,  # Qwen2's BPE (dashscope's ranks)
    "tiktoken": TiktokenFileTokenizer,  # any tiktoken ranks file (a spec ending .tiktoken)
    "char": CharTokenizer,  # one id per character of the corpus
    "bpe": BPETokenizer,  # a byte-level BPE trained on the corpus
    "hf": HFTokenizer,  # any tokenizer.json (any other spec)
}


def kind_for(spec: str) -> type[Tokenizer]:
    """The kind of a `tokenize.tokenizer` spec ("gpt2", "qwen2", "char", "bpe", a `.tiktoken` ranks file, else a
    tokenizer.json) or of a recorded name (those four, "tiktoken:<path>", "hf:<path>")."""
    if spec in KINDS:
        return KINDS[spec]
    head, colon, _ = spec.partition(":")
    if colon and head in ("tiktoken", "hf"):
        return KINDS[head]
    return TiktokenFileTokenizer if spec.endswith(".tiktoken") else HFTokenizer


def get_tokenizer(spec: str, eot_token: str | None = None, tiktoken_pattern: str | None = None,
                  encoder: str = "tiktoken") -> Tokenizer:
    """The tokenizer of a `tokenize.tokenizer` spec not built from a corpus ("gpt2", "qwen2", a `.tiktoken` ranks file
    with its `tiktoken_pattern`, a tokenizer.json or its folder); load_tokenizer(shard_dir) reloads char and bpe."""
    p = SimpleNamespace(tokenizer=spec, eot_token=eot_token, tiktoken_pattern=tiktoken_pattern, encoder=encoder)
    return kind_for(spec).from_params(p)  # the fields of a TokenizeConfig it reads


def prepare_tokenizer(p: TokenizerParams, folder: Path, texts: Callable[[], Iterable[str]],
                      reuse: bool) -> Tokenizer:
    """The tokenize stage's tokenizer for params `p`, its file saved into `folder` (a kind built from the corpus reads
    `texts()`); when `reuse` (resuming a run of the same fingerprint) the file already there is kept: the same ids."""
    tok = kind_for(str(p.tokenizer)).from_params(p, folder, texts, reuse)
    if not reuse:
        tok.save(folder)
    return tok


def has_tokenizer_file(p: TokenizerParams, folder: Path) -> bool:
    """Whether `folder` holds what the tokenizer of params `p` needs to be reloaded (always, for a package kind)."""
    file = kind_for(str(p.tokenizer)).file
    return file is None or (Path(folder) / file).is_file()


def clear_tokenizer_files(folder: Path) -> None:
    """Delete every kind's tokenizer file from `folder` (when a run of other params starts over)."""
    for kind in KINDS.values():
        if kind.file is not None:
            (Path(folder) / kind.file).unlink(missing_ok=True)


def load_tokenizer(folder: str | Path) -> Tokenizer:
    """Rebuild the tokenizer recorded in folder/manifest.json (shards' or a model's; its file is read from `folder`).
    Without a manifest, build-nanogpt style shards (*_val_NNNNNN.npy) are GPT-2 tokens, so gpt2 is returned."""
    folder = Path(folder)
    if not (folder / MANIFEST).exists():
        if any(folder.glob("*_val_[0-9]*.npy")) or any(folder.glob("*_train_[0-9]*.npy")):
            return GPT2Tokenizer()
        raise UserError(f"{folder / MANIFEST}: no manifest, cannot tell which tokenizer made these shards")
    return tokenizer_of(folder, read_manifest(folder, require=("tokenizer",)))


def tokenizer_of(folder: Path, manifest: dict) -> Tokenizer:
    """The tokenizer a manifest of `folder` records, rebuilt (its file read from `folder`) and checked against it."""
    mpath, rec = Path(folder) / MANIFEST, manifest["tokenizer"]
    if not isinstance(rec, dict) or not isinstance(rec.get("name"), str):
        raise UserError(f"{mpath}: the 'tokenizer' entry has no name: {rec!r}")
    try:
        tok = kind_for(rec["name"]).load(Path(folder), rec)
    except (ValueError, UserError) as e:
        raise UserError(f"{mpath}: {e}") from None
    for key in ("vocab_size", "eot"):
        if key in rec and rec[key] != getattr(tok, key):
            raise UserError(f"{mpath}: tokenizer {key} {rec[key]} but the rebuilt {tok.name} tokenizer has "
                            f"{getattr(tok, key)}")
    return tok
