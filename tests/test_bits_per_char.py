"""Bits per character from the val loss: the characters counted are those of the scored target tokens."""
from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from gptcore.data.tokenizers import get_tokenizer
from gptcore.data.tokenizers.char import CharTokenizer
from gptcore.eval.val_loss import bits_per_char, scored_chars

DOCS = ["话说宝玉在林黛玉房中说“耗子精”。", "It was the best of times 😀,\n\tit was the worst.", "café naïve 1234"]


def stream(tok) -> np.ndarray:
    ids = []
    for d in DOCS:
        ids += [tok.eot] + tok.encode(d)
    return np.array(ids, dtype=np.uint32)


@pytest.mark.parametrize("kind", ["char", "gpt2", "qwen2"])
def test_scored_chars_are_the_text_of_the_targets(kind):
    if kind == "qwen2" and importlib.util.find_spec("dashscope") is None:
        pytest.skip("Qwen2's ranks (dashscope) not installed")
    tok = CharTokenizer.build(DOCS) if kind == "char" else get_tokenizer(kind)
    toks = stream(tok)
    # the targets are every token but the first (an eot), so all the text
    assert scored_chars(toks, tok) == sum(len(d) for d in DOCS)
    # a prefix: only the characters of its targets count (a byte-level cut may end inside a character)
    part = toks[:20]
    if kind == "char":
        assert scored_chars(part, tok) == int(np.count_nonzero(part[1:] != tok.eot))
    loss = 2.5
    assert bits_per_char(loss, toks, tok) == pytest.approx(loss * (len(toks) - 1) / sum(map(len, DOCS)) / math.log(2))


def test_bits_per_char_of_a_char_model_is_its_loss_in_bits_when_no_eot_is_scored():
    tok = CharTokenizer.build(DOCS)
    toks = np.array([tok.eot] + tok.encode(DOCS[0] * 3), dtype=np.uint32)
    assert bits_per_char(1.0, toks, tok) == pytest.approx(1 / math.log(2))
