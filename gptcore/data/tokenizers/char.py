"""Character-level tokens (`tokenize.tokenizer: char`), nanoGPT's shakespeare_char: one id per character of the corpus,
its vocabulary saved beside the shards."""
from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Iterable

import numpy as np

from gptcore.atomic import write_text
from gptcore.data.tokenizers.base import EOT_TEXT, Tokenizer
from gptcore.errors import UserError

CHAR_VOCAB_FILE = "vocab.json"


class CharTokenizer(Tokenizer):
    """Character-level vocabulary (as nanoGPT's shakespeare_char): ids 0..n-1 are the sorted unique characters of the
    corpus, id n is the end-of-text token. Saved as vocab.json beside the shards."""

    kind = "char"
    file = CHAR_VOCAB_FILE

    def __init__(self, chars: Iterable[str]) -> None:
        chars = sorted(set(chars))
        if bad := [c for c in chars if len(c) != 1]:
            raise UserError(f"char vocabulary entry {bad[0]!r} is not a single character")
        self.chars = chars
        # code point -> id lookup table for vectorised encoding (-1 = not in the vocabulary)
        self._lut = np.full(max(map(ord, chars), default=0) + 1, -1, dtype=np.int64)
        self._lut[[ord(c) for c in chars]] = np.arange(len(chars))
        self.name, self.encoder = "char", "numpy"
        self.eot, self.vocab_size = len(chars), len(chars) + 1

    @classmethod
    def build(cls, texts: Iterable[str]) -> CharTokenizer:
        """The vocabulary of every character in `texts`."""
        seen = set(itertools.chain.from_iterable(texts))
        if not seen:
            raise UserError("cannot build a char vocabulary from an empty corpus")
        return cls(seen)

    @classmethod
    def from_params(cls, p, folder=None, texts=None, reuse=False) -> CharTokenizer:
        """The corpus's characters, or the vocabulary already in `folder` when `reuse`."""
        if texts is None:
            raise ValueError("tokenizer 'char' is built from the corpus; use load_tokenizer(shard_dir) to reload it")
        if reuse and folder is not None and (Path(folder) / CHAR_VOCAB_FILE).is_file():
            return cls.read(Path(folder) / CHAR_VOCAB_FILE)
        return cls.build(texts())

    def encode_numpy(self, text: str) -> np.ndarray:
        """One id per character, vectorised over the code points; UserError on a character outside the vocabulary."""
        cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
        ids = self._lut[np.minimum(cps, len(self._lut) - 1)]
        bad = (ids < 0) | (cps >= len(self._lut))
        if bad.any():
            c = chr(int(cps[int(np.argmax(bad))]))
            raise UserError(f"character {c!r} is not in the char vocabulary ({len(self.chars)} chars)")
        return ids.astype(np.uint32)

    def decode(self, ids: list[int]) -> str:
        """The characters of ids (the end-of-text id as <|endoftext|>)."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i <= self.eot]
        if bad:
            raise UserError(f"token id {bad[0]} is outside the char vocabulary (size {self.vocab_size})")
        return "".join(EOT_TEXT if i == self.eot else self.chars[i] for i in ids)

    def save(self, folder):
        """Write the vocabulary as folder/vocab.json (atomic)."""
        write_text(Path(folder) / CHAR_VOCAB_FILE,
                   json.dumps({"type": "char", "chars": self.chars, "eot": self.eot}, ensure_ascii=False))

    @classmethod
    def load(cls, folder, rec):
        """The vocabulary save() wrote into `folder`."""
        return cls.read(Path(folder) / rec.get("file", CHAR_VOCAB_FILE))

    def hf_tokenizer(self):
        """A word-level vocabulary over single characters (a character outside it is an error there too)."""
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as _HF

        tok = _HF(models.WordLevel(vocab={c: i for i, c in enumerate(self.chars)}))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        tok.add_special_tokens([AddedToken(EOT_TEXT, special=True, normalized=False)])
        return tok

    @classmethod
    def read(cls, path: str | Path) -> CharTokenizer:
        """The vocabulary file at `path`; UserError naming the file if it is not one."""
        path = Path(path)
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            tok = cls(meta["chars"])
        except (OSError, ValueError, KeyError, TypeError, UserError) as e:
            raise UserError(f"{path}: not a char vocabulary ({e})") from None
        if meta.get("eot", tok.eot) != tok.eot:
            raise UserError(f"{path}: eot {meta['eot']} does not match {len(tok.chars)} chars")
        return tok
