"""The multiple-choice tasks evaluate can score (`eval.task`): a registry, each task a module of this package
(hellaswag.py, cloze.py) that registers a `Task`. Every task is scored by the one scorer (eval/scorer.py). A new one
is a module here plus its fields in `EvalConfig` (docs/architecture.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from gptcore.data.tokenizers import Tokenizer
from gptcore.registry import Registry

if TYPE_CHECKING:
    from gptcore.eval.config import EvalConfig
    from gptcore.eval.scorer import Example


def _nothing(cfg: EvalConfig) -> dict[str, Any] | None:
    return None


@dataclass(frozen=True)
class Task:
    """One choice of `eval.task`. `examples(cfg, tokenizer, val_tokens, block_size, progress)` builds its examples,
    every one checked to fit the block before any pass; `record(cfg)` says what its figures were measured on (a file
    and its hash, in metrics/measured_on.json under the task's name), None when the val split says it all."""

    examples: Callable[[EvalConfig, Tokenizer, np.ndarray, int, bool], list[Example]]
    record: Callable[[EvalConfig], dict[str, Any] | None] = _nothing


TASKS: Registry[Task] = Registry(__name__, "eval task")
