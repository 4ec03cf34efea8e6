"""Cloze examples from val tokens: deterministic, within documents, true ending in place; a model that
knows the stream gets every one right."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcore.errors import UserError
from gptcore.eval.scorer import score_examples
from gptcore.eval.tasks.cloze import build_cloze, clean_windows
from gptcore.params import ParamError

EOT = 50


def stream(n_docs: int = 40, doc_len: int = 120, seed: int = 0) -> np.ndarray:
    """Documents that each open with EOT and then count upwards modulo EOT from a random start."""
    rng = np.random.default_rng(seed)
    docs = [np.concatenate([[EOT], (rng.integers(EOT) + np.arange(doc_len)) % EOT]) for _ in range(n_docs)]
    return np.concatenate(docs).astype(np.uint16)


class CountingLM(nn.Module):
    """Puts almost all probability on next = current + 1 (mod EOT): right on the stream above."""

    def __init__(self):
        super().__init__()
        V = EOT + 1
        self.config = SimpleNamespace(block_size=64, vocab_size=V)
        self.lm_head = nn.Linear(V, V, bias=False)
        table = torch.zeros(V, V)
        table[torch.arange(V), (torch.arange(V) + 1) % EOT] = 10.0
        with torch.no_grad():
            self.lm_head.weight.copy_(table.T)

    def hidden_states(self, idx, pos=None, attn_mask=None):  # next-token odds depend on the current token only
        return F.one_hot(idx, self.config.vocab_size).float()

    def logits(self, hidden):
        return self.lm_head(hidden)

    def forward(self, idx, targets=None):
        return self.logits(self.hidden_states(idx)), None


def test_examples_are_deterministic_and_well_formed():
    tokens = stream()
    examples = build_cloze(tokens, EOT, n_examples=200, context_len=12, ending_len=6, seed=3)
    again = build_cloze(tokens, EOT, n_examples=200, context_len=12, ending_len=6, seed=3)
    other = build_cloze(tokens, EOT, n_examples=200, context_len=12, ending_len=6, seed=4)
    assert examples == again and examples != other
    assert [e.index for e in examples] == list(range(200))
    assert min(np.bincount([e.label for e in examples], minlength=4)) > 30  # labels spread over all 4
    for e in examples:
        assert len(e.context) == 12 and len(e.endings) == 4 and all(len(x) == 6 for x in e.endings)
        assert EOT not in e.context[1:] and all(EOT not in x for x in e.endings)
        assert len({tuple(x) for x in e.endings}) == 4
        truth = e.context[1:] + e.endings[e.label]  # counting on from the context, within one document
        assert all((b - a) % EOT == 1 for a, b in zip(truth, truth[1:]))


def test_a_model_that_knows_the_stream_gets_every_example_right():
    examples = build_cloze(stream(), EOT, n_examples=60, context_len=8, ending_len=5, seed=0)
    result = score_examples(CountingLM(), examples, EOT + 1, device="cpu", progress=False)
    assert (result.count, result.acc, result.acc_norm) == (60, 1.0, 1.0)


def test_bad_input_is_a_clear_error():
    short_docs = stream(n_docs=50, doc_len=6)
    with pytest.raises(UserError, match="n_examples=5: must be <= the 0 windows of 12 tokens"):
        build_cloze(short_docs, EOT, n_examples=5, context_len=8, ending_len=4, seed=0)
    with pytest.raises(ValueError, match="ending_len=0: must be >= 1"):
        build_cloze(stream(), EOT, n_examples=5, context_len=8, ending_len=0, seed=0)
    with pytest.raises(UserError, match="too few for windows of 14"):
        build_cloze(stream(n_docs=1, doc_len=10), EOT, n_examples=1, context_len=10, ending_len=4, seed=0)
    with pytest.raises(ValueError, match="expected a 1-D array"):
        build_cloze(stream().reshape(-1, 11), EOT, n_examples=1, context_len=4, ending_len=2, seed=0)


def test_more_examples_than_windows_are_refused_at_once_naming_the_param():
    tokens = stream(n_docs=30, doc_len=20)
    window = 12
    # by hand: a start is usable when no eot sits in the window after its first token
    usable = sum(1 for s in range(len(tokens) - window + 1) if EOT not in tokens[s + 1:s + window].tolist())
    assert clean_windows(tokens, EOT, window) == usable
    with pytest.raises(ParamError, match=rf"eval.cloze_examples={usable + 1}: must be <= the {usable:,} windows"):
        build_cloze(tokens, EOT, n_examples=usable + 1, context_len=8, ending_len=4, seed=0,
                    key="eval.cloze_examples")
    assert len(build_cloze(tokens, EOT, n_examples=usable // 4, context_len=8, ending_len=4, seed=0)) == usable // 4
