"""A tiktoken ranks file (`tokenize.tokenizer: path/to/ranks.tiktoken` with its `tiktoken_pattern`), and Qwen2's BPE
(`qwen2`), whose ranks ship in the dashscope package."""
from __future__ import annotations

import base64
import binascii
import importlib.util
import unicodedata
from pathlib import Path

import numpy as np
from tiktoken_ext.openai_public import r50k_pat_str

from gptcore.data.config import TIKTOKEN_PATTERNS
from gptcore.data.tokenizers.base import EOT_TEXT, Tokenizer, byte_level_bpe
from gptcore.digests import file_sha256
from gptcore.errors import MissingPackage, UserError

TIKTOKEN_FILE = "tokenizer.tiktoken"


# Qwen2's added special tokens: <|endoftext|> separates documents; the two chat tokens complete its vocabulary
QWEN2_SPECIALS = (EOT_TEXT, "<|im_start|>", "<|im_end|>")


QWEN2_DIST = "dashscope==2.0.2"  # the PyPI package whose resources/qwen.tiktoken holds Qwen2's ranks


# tokenize.tiktoken_pattern: a ranks file's pre-tokenization and whether text is NFC-normalised first. qwen2 is
# transformers' Qwen2 PRETOKENIZE_REGEX (its tokenizer.json normalises to NFC); gpt2, cl100k: OpenAI's r50k and cl100k
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
                  r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s""")


PATTERNS = {"qwen2": (QWEN2_PATTERN, True), "gpt2": (r50k_pat_str, False), "cl100k": (CL100K_PATTERN, False)}
assert tuple(PATTERNS) == TIKTOKEN_PATTERNS  # one regex for each name tokenize.tiktoken_pattern takes


def qwen2_ranks_path() -> Path:
    """Path of Qwen2's ranks file, `dashscope/resources/qwen.tiktoken`, found without importing dashscope (its own
    dependencies are not installed); MissingPackage with the install command if it is missing."""
    spec = importlib.util.find_spec("dashscope")
    path = Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen.tiktoken" if (
        spec is not None and spec.submodule_search_locations) else None
    if path is None or not path.is_file():
        raise MissingPackage(f"tokenizer qwen2 needs Qwen2's ranks from the package dashscope (not installed): "
                             f"pip install --no-deps {QWEN2_DIST}")
    return path


def read_tiktoken_ranks(path: str | Path) -> dict[bytes, int]:
    """A tiktoken ranks file (`<base64 token> <rank>` lines) as {token bytes: rank}; UserError naming file and line."""
    path = Path(path)
    ranks: dict[bytes, int] = {}
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise UserError(f"{path}: cannot read the ranks file ({e.strerror})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            raise UserError(f"{path}:{n}: not a tiktoken ranks line (`<base64 token> <rank>`)") from None
    if not ranks:
        raise UserError(f"{path}: no ranks in the file")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise UserError(f"{path}: the ranks are not 0..{len(ranks) - 1}, each once")
    return ranks


class TiktokenFileTokenizer(Tokenizer):
    """Byte-level BPE from a tiktoken ranks file and a named pre-tokenization pattern (PATTERNS). The special
    tokens `specials` take the ids after the ranks, the first is the end-of-text; the file travels beside the shards."""

    kind = "tiktoken"
    file = TIKTOKEN_FILE

    def __init__(self, path: str | Path, pattern: str, name: str | None = None,
                 specials: tuple[str, ...] = (EOT_TEXT,), sha256: str | None = None) -> None:
        import tiktoken

        self.path, self.pattern, self.specials = Path(path), pattern, tuple(specials)
        self.name, self.encoder = name or f"{self.kind}:{self.path}", "tiktoken"
        if sha256 is not None and file_sha256(self.path) != sha256:  # load(): the file the manifest recorded
            raise UserError(f"tokenizer {self.name} was made from a ranks file with another sha256 than {self.path}")
        ranks = read_tiktoken_ranks(self.path)
        regex, self.nfc = PATTERNS[pattern]
        self._enc = tiktoken.Encoding(self.name, pat_str=regex, mergeable_ranks=ranks,
                                      special_tokens={t: len(ranks) + i for i, t in enumerate(self.specials)})
        self.vocab_size, self.eot = self._enc.n_vocab, len(ranks)

    @classmethod
    def identity(cls, p):
        """The spec, the ranks file's sha256 and the pattern."""
        spec = str(p.tokenizer)
        if not Path(spec).is_file():
            raise UserError(f"tokenize.tokenizer={spec!r}: ranks file not found")
        return {**super().identity(p), "sha256": file_sha256(spec), "tiktoken_pattern": p.tiktoken_pattern}

    @classmethod
    def from_params(cls, p, folder=None, texts=None, reuse=False) -> TiktokenFileTokenizer:
        """The ranks file `tokenize.tokenizer` with `tokenize.tiktoken_pattern`."""
        return cls(str(p.tokenizer), p.tiktoken_pattern)

    def record(self):
        """Name, vocab_size, eot, the file, the ranks' sha256, the pattern and the special tokens."""
        return {**super().record(), "sha256": file_sha256(self.path), "pattern": self.pattern,
                "specials": list(self.specials)}

    @classmethod
    def load(cls, folder, rec):
        """The ranks file beside the manifest, checked against the recorded sha256."""
        return cls(Path(folder) / rec.get("file", TIKTOKEN_FILE), rec["pattern"], name=rec["name"],
                   specials=tuple(rec.get("specials", (EOT_TEXT,))), sha256=rec.get("sha256"))

    def encode_numpy(self, text: str) -> np.ndarray:
        """Token ids of ordinary text, after NFC where the pattern asks for it (special-token strings stay text)."""
        text = unicodedata.normalize("NFC", text) if self.nfc else text
        return self._enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())

    def decode(self, ids: list[int]) -> str:
        """Text of token ids (special tokens as their strings; a cut UTF-8 sequence as U+FFFD)."""
        return self._enc.decode([int(i) for i in ids])

    def hf_tokenizer(self):
        """The ranks as a byte-level BPE with the same pattern, NFC and special tokens (Qwen2's tokenizer.json is
        this for Qwen2's ranks)."""
        return byte_level_bpe(self._enc._mergeable_ranks, PATTERNS[self.pattern][0], self.nfc, self.specials)

    def __reduce__(self):
        return (type(self), (self.path, self.pattern, self.name, self.specials))


class Qwen2Tokenizer(TiktokenFileTokenizer):
    """Qwen2's tokenizer, offline: the ranks of dashscope's qwen.tiktoken, Qwen2's pattern and NFC, its three
    special tokens (<|endoftext|> = 151643 is the document separator). Rebuilt from the package, not copied."""

    kind = "qwen2"
    file = None

    def __init__(self, sha256: str | None = None) -> None:
        super().__init__(qwen2_ranks_path(), "qwen2", "qwen2", QWEN2_SPECIALS, sha256)

    def __reduce__(self):  # every part is fixed: a worker rebuilds it from the package
        return (Qwen2Tokenizer, ())

    @classmethod
    def identity(cls, p):
        """The spec and the sha256 of the package's ranks file."""
        return {**Tokenizer.identity(p), "sha256": file_sha256(qwen2_ranks_path())}

    @classmethod
    def from_params(cls, p, folder=None, texts=None, reuse=False) -> Qwen2Tokenizer:
        """Qwen2's tokenizer."""
        return cls()

    @classmethod
    def load(cls, folder, rec):
        """Qwen2's tokenizer from the package, checked against the recorded sha256."""
        return cls(sha256=rec.get("sha256"))
