"""tokenize.encoder: gigatoken gives GPT-2 ids identical to tiktoken's encode_ordinary, and byte-identical shards, on
real FineWeb-Edu documents and a stress set; a missing package is a one-line error."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from test_tokenize import fetch, tokenize

from gptcore.data.config import TokenizeConfig
from gptcore.data.tokenizers.gpt2 import GPT2Tokenizer, gigatoken_gpt2, gpt2_encoding
from gptcore.errors import MissingPackage, UserError

REF = Path(__file__).resolve().parents[1] / ".." / "shared" / "ref-data" / "fineweb_edu_sample.jsonl"
needs_gigatoken = pytest.mark.skipif(importlib.util.find_spec("gigatoken") is None,
                                     reason="gigatoken (the `fast` extra) not installed")


def stress_docs() -> list[str]:
    """Whitespace runs, no-break and other Unicode spaces, emoji sequences, CJK, every non-surrogate code point
    (in runs of 2,048, alone and between words), literal special-token text, contractions, digits."""
    docs = [
        " " * 37 + "a" + "\t" * 5 + "\n" * 9 + "  \n \n\t \r\n\r\n" + " " * 3,
        "a\u00a0b\u00a0\u00a0c \u00a0 d\u2009e\u202ff\u3000g\u2028h\u2029i\u0085j\u000bk\u000cl",
        "family 👨‍👩‍👧‍👦 flags 🇨🇳🇬🇧 skin 👍🏽 keycap 1️⃣ ❤️‍🔥 🀄 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
        "话说宝玉在林黛玉房中说“耗子精”，宝钗撞来。日本語のテキスト、한국어 텍스트。",
        "<|endoftext|>",
        "before <|endoftext|> after<|endoftext|><|endoftext|> <|endoftext",
        "I'm you're we'll they've it's I'd DON'T 'S 'll 123456789 3.14159 1,000,000 ١٢٣ ⅷ",
        "",
        "x",
        "Cafe\u0301 nai\u0308ve \u1100\u1161\u11a8 \ufeffBOM \u200bzero\u200dwidth",
    ]
    for start in range(0, 0x110000, 2048):
        run = "".join(chr(c) for c in range(start, start + 2048) if not 0xD800 <= c < 0xE000)
        if run:
            docs.append(run)
            docs.append(" ".join(f"w{c}{chr(c)}" for c in range(start, start + 2048, 97) if not 0xD800 <= c < 0xE000))
    return docs


def fineweb_docs() -> list[str]:
    if not REF.is_file():
        pytest.skip(f"{REF} not found (reference data)")
    return [json.loads(line)["text"] for line in REF.read_text(encoding="utf-8").splitlines()]


@needs_gigatoken
@pytest.mark.parametrize("which", ["stress", "fineweb"])
def test_gigatoken_ids_equal_tiktoken_encode_ordinary(which):
    docs = stress_docs() if which == "stress" else fineweb_docs()
    fast, ref = GPT2Tokenizer("gigatoken"), gpt2_encoding()
    for i, d in enumerate(docs):
        want = ref.encode_ordinary(d)
        got = fast.encode_numpy(d)
        assert got.dtype == np.uint32 and got.tolist() == want, f"document {i}: {d[:60]!r}"
        # tokenize hands gigatoken each document's UTF-8 bytes (takes_utf8): the same ids
        assert fast.encode_numpy(d.encode("utf-8")).tolist() == want, f"document {i} as bytes: {d[:60]!r}"
    assert fast.takes_utf8 and not GPT2Tokenizer("tiktoken").takes_utf8
    assert fast.encode("<|endoftext|>") != [50256]  # literal special-token text stays ordinary text


@needs_gigatoken
def test_shards_byte_identical_with_either_encoder(tmp_path):
    docs = stress_docs()[:60] + (fineweb_docs() if REF.is_file() else [])
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    fetch({"source": "local", "path": str(src)}, tmp_path / "raw")
    out = {}
    for encoder in ("tiktoken", "gigatoken"):
        d = tmp_path / encoder
        m = tokenize(tmp_path / "raw", d, {"tokenizer": "gpt2", "encoder": encoder, "shard_tokens": 50_000,
                                           "val_tokens": 20_000, "workers": 2}, progress=False)
        assert m["encoder"] == encoder and {s["encoder"] for s in m["shards"]} == {encoder}
        out[encoder] = (m, {p.name: p.read_bytes() for p in sorted(d.glob("*.npy"))})
    (mt, bt), (mg, bg) = out["tiktoken"], out["gigatoken"]
    assert len(bt) >= 3 and bt == bg
    assert mt["fingerprint"] == mg["fingerprint"]  # the encoder does not change the shards, so not the fingerprint


def test_missing_gigatoken_is_one_line_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "gigatoken", None)  # import gigatoken -> ImportError
    gigatoken_gpt2.cache_clear()  # as in a process where it was never built
    with pytest.raises(MissingPackage) as e:
        GPT2Tokenizer("gigatoken")
    msg = str(e.value)
    assert "\n" not in msg and "pip install gigatoken==" in msg and "tokenize.encoder=gigatoken" in msg


def test_encoder_param_is_checked():
    with pytest.raises(UserError, match="tokenize.encoder='fast'"):
        TokenizeConfig.read({"tokenizer": "gpt2", "val_tokens": 0, "encoder": "fast"})
    with pytest.raises(UserError, match="applies to tokenizer gpt2 only"):
        TokenizeConfig.read({"tokenizer": "char", "val_tokens": 0, "encoder": "gigatoken"})


def test_auto_encoder_is_gigatoken_where_installed_else_tiktoken(monkeypatch):
    import importlib.util as iu

    want = "gigatoken" if iu.find_spec("gigatoken") is not None else "tiktoken"
    assert GPT2Tokenizer("auto").encoder == want
    # the default, valid for every tokenizer
    assert TokenizeConfig.read({"tokenizer": "qwen2", "val_tokens": 0}).encoder == "auto"
    real = iu.find_spec
    monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "gigatoken" else real(name, *a))
    tok = GPT2Tokenizer("auto")
    assert tok.encoder == "tiktoken" and tok.encode("Hello world") == [15496, 995]
