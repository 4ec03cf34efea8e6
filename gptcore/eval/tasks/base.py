"""What every multiple-choice task shares: a `Task` (how it builds its examples, what its figures were measured on), and
`TaskSettings`, the keys tasks read, which the `train:` and `eval:` sections both have under the same names, so that a
task runs at training's eval cadence and in evaluate alike."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from gptcore.data.tokenizers.base import Tokenizer
from gptcore.eval.scorer import Example


class TaskSettings(Protocol):
    """The keys tasks read, in TrainConfig and EvalConfig alike; `section` names the one they came from."""

    section: str
    seed: int  # cloze: which windows and distractors
    hellaswag_path: str | None
    hellaswag_examples: int | None
    cloze_examples: int | None
    cloze_context: int
    cloze_ending: int


def _nothing(cfg: TaskSettings) -> dict[str, Any] | None:
    return None


@dataclass(frozen=True)
class Task:
    """One multiple-choice task (`train.tasks`, `eval.tasks`). `examples(cfg, tokenizer, val_tokens, block_size,
    progress)` builds its examples, every one checked to fit the block before any pass; `record(cfg)` says what its
    figures were measured on (a file and its hash, in metrics/measured_on.json under the task's name), None when the
    val split says it all."""

    examples: Callable[[TaskSettings, Tokenizer, np.ndarray, int, bool], list[Example]]
    record: Callable[[TaskSettings], dict[str, Any] | None] = _nothing
