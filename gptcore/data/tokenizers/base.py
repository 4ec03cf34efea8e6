"""What every tokenizer kind shares: the interface (`Tokenizer`), what a kind reads of the `tokenize:` section
(`TokenizerParams`), the file names of a model/hf export, and GPT-2's byte-level alphabet with the builders of a
byte-level BPE's Hugging Face form (used by the gpt2 and tiktoken kinds)."""

from __future__ import annotations

import base64
import json
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Protocol

import numpy as np

from gptcore.atomic import atomic_write, write_text
from gptcore.errors import NotRepresentable

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizerObject


EOT_TEXT = "<|endoftext|>"
HF_TOKENIZER_FILE = "tokenizer.json"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"  # beside tokenizer.json in a model/hf export
HF_NOT_SUPPORTED = "TOKENIZER_NOT_SUPPORTED.txt"  # in model/hf instead, when transformers cannot represent it


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


def tiktoken_ranks_bytes(ranks: dict[bytes, int]) -> bytes:
    """{token bytes: rank} in the tiktoken ranks file format: `<base64 token> <rank>` per line, by rank."""
    return b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in sorted(ranks.items(), key=lambda kv: kv[1]))


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




