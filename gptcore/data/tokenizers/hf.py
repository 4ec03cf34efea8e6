"""A Hugging Face tokenizer.json (`tokenize.tokenizer: path/to/tokenizer.json`), and a byte-level BPE trained on the
corpus itself (`bpe`, `tokenize.bpe_vocab_size`)."""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterable

import numpy as np

from gptcore.atomic import atomic_path, write_text
from gptcore.data.tokenizers.base import EOT_TEXT, HF_TOKENIZER_FILE, Tokenizer
from gptcore.digests import file_sha256
from gptcore.errors import UserError


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` tokenizer.json, copied beside the shards. eot: the id of `eot_token` if given, else
    of "<|endoftext|>", else of the first special added token (e.g. "</s>"). Special-token strings inside the text
    are encoded as ordinary text (encode_special_tokens=True), as tiktoken's encode_ordinary does."""

    kind = "hf"
    file = HF_TOKENIZER_FILE
    bounded_by_bytes = False  # any tokenizer.json: no bound known

    def __init__(self, path: str | Path, name: str | None = None, eot_token: str | None = None) -> None:
        from tokenizers import Tokenizer as _HF

        self.path, self.eot_token = Path(path), eot_token
        try:
            self._tok = _HF.from_file(str(self.path))
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise UserError(f"{self.path}: cannot load as a HF tokenizer.json ({e})") from None
        self._tok.encode_special_tokens = True
        self.name, self.encoder = name or f"{self.kind}:{self.path}", "tokenizers"
        # ids may have holes (e.g. Qwen2's added tokens), so the size is the largest id + 1
        ids = self._tok.get_vocab(with_added_tokens=True).values()
        self.vocab_size = max(self._tok.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)
        self.eot = self._find_eot(eot_token)

    def _find_eot(self, eot_token: str | None) -> int:
        i = self._tok.token_to_id(EOT_TEXT if eot_token is None else eot_token)
        if i is not None:
            return i
        if eot_token is not None:
            raise UserError(f"{self.path}: eot token {eot_token!r} is not in the vocabulary")
        specials = sorted(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)
        if specials:
            return specials[0]
        raise UserError(f"{self.path}: no {EOT_TEXT} and no special token to use as end-of-text; pass eot_token")

    @staticmethod
    def _spec_path(spec: str) -> Path:
        path = Path(spec)
        path = path / HF_TOKENIZER_FILE if path.is_dir() else path
        if not path.is_file():
            raise UserError(f"tokenize.tokenizer={spec!r}: expected gpt2, qwen2, char, bpe, a .tiktoken or a "
                            f"tokenizer.json path (not found: {path})")
        return path

    @classmethod
    def identity(cls, p):
        """The spec, its eot_token and the tokenizer.json's sha256."""
        return {**super().identity(p), "sha256": file_sha256(cls._spec_path(str(p.tokenizer)))}

    @classmethod
    def from_params(cls, p, folder=None, texts=None, reuse=False) -> HFTokenizer:
        """The tokenizer.json `tokenize.tokenizer` names (a file or its folder), with `tokenize.eot_token`."""
        return cls(cls._spec_path(str(p.tokenizer)), eot_token=p.eot_token)

    def record(self):
        """Name, vocab_size, eot, the file, and the eot_token if one was named."""
        rec = super().record()
        return rec if self.eot_token is None else {**rec, "eot_token": self.eot_token}

    @classmethod
    def load(cls, folder, rec):
        """The tokenizer.json beside the manifest."""
        return cls(Path(folder) / rec.get("file", HF_TOKENIZER_FILE), name=rec["name"], eot_token=rec.get("eot_token"))

    def encode_numpy(self, text: str) -> np.ndarray:
        """Token ids of ordinary text as a uint32 array (special-token strings are encoded as text)."""
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.uint32)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """encode() of each text, on tokenizers' Rust thread pool (the tokenize workers turn it off)."""
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """The text of token ids, special tokens included."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def hf_tokenizer(self):
        """The tokenizer.json as it was given (or trained)."""
        return type(self._tok).from_file(str(self.path))

    def __reduce__(self):
        return (type(self), (self.path, self.name, self.eot_token))


class BPETokenizer(HFTokenizer):
    """A byte-level BPE trained on the corpus (see train_bpe), kept as a tokenizer.json beside the shards."""

    kind = "bpe"
    bounded_by_bytes = True  # byte-level: at most one id per byte

    def __init__(self, path: str | Path, name: str | None = "bpe", eot_token: str | None = None) -> None:
        super().__init__(path, name="bpe", eot_token=eot_token)

    @classmethod
    def identity(cls, p):
        """The spec and the vocabulary size it is trained to."""
        return {**Tokenizer.identity(p), "bpe_vocab_size": p.bpe_vocab_size}

    @classmethod
    def from_params(cls, p, folder=None, texts=None, reuse=False) -> BPETokenizer:
        """Trained on `texts()` into folder/tokenizer.json, or the one already there when `reuse`."""
        if texts is None or folder is None:
            raise ValueError("tokenizer 'bpe' is built from the corpus; use load_tokenizer(shard_dir) to reload it")
        path = Path(folder) / HF_TOKENIZER_FILE
        if not (reuse and path.is_file()):
            with atomic_path(path) as tmp:
                train_bpe(texts(), p.bpe_vocab_size, tmp)
        return cls(path)


def train_bpe(texts: Iterable[str], vocab_size: int, path: str | Path) -> BPETokenizer:
    """Train a byte-level BPE (GPT-2 style pre-tokenization, "<|endoftext|>" as id 0) and save it to `path`."""
    from tokenizers import Tokenizer as _HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = _HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT_TEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = iter(texts)
    first = next(texts, None)
    if first is None:
        raise UserError("cannot train a BPE tokenizer on an empty corpus")
    tok.train_from_iterator(itertools.chain([first], texts), trainer=trainer)
    write_text(path, tok.to_str())  # creates the folder
    return BPETokenizer(path)
