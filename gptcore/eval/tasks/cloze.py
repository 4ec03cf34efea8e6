"""A 4-way cloze task from val tokens, for where HellaSwag means nothing (char-level, tiny corpora, other languages).

A window of `context_len + ending_len` tokens inside one document: the true ending is its last `ending_len` tokens,
the distractors are spans of that length from elsewhere. Scored by gptcore/eval/scorer.py, as HellaSwag is.
"""
from __future__ import annotations

import numpy as np

from gptcore.data.tokenizers.base import Tokenizer
from gptcore.errors import UserError
from gptcore.eval.scorer import Example
from gptcore.eval.tasks.base import Task, TaskSettings
from gptcore.params import ParamError

MOST = 500  # cloze questions a null cloze_examples asks for, where the val tokens hold that many


def clean_windows(tokens: np.ndarray, eot: int, window: int) -> int:
    """How many window starts hold no document boundary (an eot may only open the window): the most examples."""
    n_starts = len(tokens) - window + 1
    if n_starts <= 0:
        return 0
    eots = np.concatenate(([0], np.cumsum(np.asarray(tokens) == eot)))  # eots[i]: eot count in tokens[:i]
    starts = np.arange(n_starts)
    return int(((eots[starts + window] - eots[starts + 1]) == 0).sum())


def build_cloze(tokens: np.ndarray, eot: int, n_examples: int, context_len: int, ending_len: int, seed: int,
                n_choices: int = 4, key: str = "n_examples") -> list[Example]:
    """`n_examples` cloze Examples from a 1-D token array, deterministic for (tokens, seed): distinct windows within
    one document (an eot may only open one); distractors from outside the window, without an eot, all different.
    More examples than the tokens hold windows are a ParamError naming `key`, the param that asked for them."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens: expected a 1-D array, got shape {tokens.shape}")
    for name, value in (("n_examples", n_examples), ("context_len", context_len), ("ending_len", ending_len)):
        if value < 1:
            raise ValueError(f"{name}={value}: must be >= 1")
    window = context_len + ending_len
    if len(tokens) < window + ending_len:
        raise UserError(f"tokens: {len(tokens):,} tokens are too few for windows of {window} "
                         f"(context_len={context_len} + ending_len={ending_len}) plus distractors")
    available = clean_windows(tokens, eot, window)
    if n_examples > available:  # refused at once, not after a long fruitless search
        raise ParamError(key, n_examples, f"must be <= the {available:,} windows of {window} tokens (context "
                                          f"{context_len} + ending {ending_len}) without a document boundary in the "
                                          f"{len(tokens):,} val tokens: lower it or shorten the windows")
    eots = np.concatenate(([0], np.cumsum(tokens == eot)))  # eots[i]: eot count in tokens[:i]
    rng = np.random.default_rng(seed)
    n_starts = len(tokens) - window + 1
    n_spans = len(tokens) - ending_len + 1
    max_draws = 100 * n_examples * n_choices + 1000  # rejection sampling; bounded so bad input fails fast

    used: set[int] = set()
    examples: list[Example] = []
    draws = 0
    while len(examples) < n_examples:
        draws += 1
        if draws > max_draws:
            raise UserError(f"tokens: found only {len(examples)} of {n_examples} cloze windows of {window} tokens "
                             f"without a document boundary; documents are too short or context_len/ending_len "
                             f"too long")
        start = int(rng.integers(n_starts))
        if start in used or eots[start + window] > eots[start + 1]:  # an eot may only open the window
            continue
        truth = tokens[start + context_len:start + window].tolist()
        endings = [truth]
        while len(endings) < n_choices:
            draws += 1
            if draws > max_draws:
                raise UserError(f"tokens: could not find {n_choices - 1} distinct distractor spans of {ending_len} "
                                 f"tokens without an eot; the split is too small or repetitive")
            s = int(rng.integers(n_spans))
            if start - ending_len < s < start + window or eots[s + ending_len] > eots[s]:
                continue
            span = tokens[s:s + ending_len].tolist()
            if span not in endings:
                endings.append(span)
        used.add(start)
        label = int(rng.integers(n_choices))
        endings[0], endings[label] = endings[label], endings[0]
        examples.append(Example(context=tokens[start:start + context_len].tolist(), endings=endings,
                                label=label, index=len(examples)))
    return examples


def cloze_examples(cfg: TaskSettings, tok: Tokenizer, tokens: np.ndarray, block_size: int,
                   progress: bool = False) -> list[Example]:
    """cloze_examples questions cut from the scored val tokens, each of which must fit the model's block (the keys
    are named with the section they came from: train. or eval.)."""
    s = cfg.section
    if cfg.cloze_context + cfg.cloze_ending > block_size:
        raise ParamError(f"{s}.cloze_context", cfg.cloze_context,
                         f"plus {s}.cloze_ending={cfg.cloze_ending} must be <= the model's block_size = "
                         f"{block_size} (a question is seen whole): lower one of them")
    scored = tokens[:-1]  # the val stream's last token is only a target
    n = cfg.cloze_examples
    if n is None:  # as many as the tokens hold, at most MOST
        n = min(MOST, clean_windows(scored, tok.eot, cfg.cloze_context + cfg.cloze_ending))
        if n == 0:
            raise ParamError(f"{s}.cloze_examples", None, f"the {len(scored):,} scored val tokens hold no window of "
                                                          f"{cfg.cloze_context + cfg.cloze_ending} tokens inside one "
                                                          f"document: shorten {s}.cloze_context or cloze_ending")
    return build_cloze(scored, tok.eot, n, cfg.cloze_context, cfg.cloze_ending, cfg.seed, key=f"{s}.cloze_examples")


TASK = Task(cloze_examples)
