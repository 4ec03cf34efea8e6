"""params.yaml's `eval:` section (`EvalConfig`), read by the evaluate stage, and what train checks of it before it
trains (the val tokens and a task cut from them)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gptcore.data.shard_set import ShardSet
from gptcore.device import DEVICE_RULES, DTYPE_RULES
from gptcore.errors import DEV_INSTALL, require
from gptcore.eval.tasks import tasks_named
from gptcore.eval.val_loss import scored_count, val_stream
from gptcore.params import REQUIRED, Section, param

# conf/lm_eval or a folder below it, written relative to the project, with no "." or ".." step out of it
INCLUDE_PATTERN = r"conf/lm_eval(/(?!\.\.?(/|$))[^/]+)*/?"


@dataclass(frozen=True, kw_only=True)
class EvalConfig(Section):
    """What evaluate scores, on what, and how: the model, the val loss, multiple-choice tasks, samples, lm-eval. The
    task keys (tasks, hellaswag_*, cloze_*) are train:'s too, under the same names (tasks/base.py's TaskSettings)."""

    section = "eval"
    model: str = param("checkpoint", "checkpoint (this run's model/) | gpt2 | path to a Hugging Face GPT-2 folder")
    tasks: list[str] = param(REQUIRED, "the multiple-choice tasks scored: hellaswag, cloze (gptcore/eval/tasks/)")
    hellaswag_path: str | None = param(None, "a local HellaSwag val jsonl (null: download it)")
    hellaswag_examples: int | None = param(None, "score the first this many HellaSwag examples (null: all 10,042)",
                                           min=1)
    cloze_examples: int | None = param(500, "cloze questions cut from the scored val tokens (null: as many as they "
                                            "hold, at most 500)", min=1)
    cloze_context: int = param(64, "context tokens of a cloze question", min=1)
    cloze_ending: int = param(16, "tokens of each cloze ending", min=1)
    device: str = param(**DEVICE_RULES)
    dtype: str = param(**DTYPE_RULES)
    # rank 0 scores lm-eval and draws the samples alone while the other ranks wait to leave with it: gloo's own default
    dist_timeout: float = param(1800.0, "seconds a rank under torchrun waits for the others (to join, in a collective)",
                                above=0.0)
    eval_batch: int = param(32, "sequences per forward pass when evaluating", min=1)
    val_tokens: int | None = param(None, "val loss over at most the first val_tokens tokens of the val split (null: "
                                         "all of it)", min=1)
    seed: int = param(1337, "seed of the cloze questions and the samples", min=0)
    samples: int = param(3, "text samples written to metrics/samples.txt", min=0)
    sample_prompt: str = param(REQUIRED, "prompt of those samples")
    sample_tokens: int = param(64, "tokens per sample", min=1)
    temperature: float = param(0.8, "sampling temperature", above=0.0)
    top_k: int | None = param(200, "sample from the k most likely tokens (null: all)", min=1)
    lm_eval_tasks: list[str] = param([], "lm-evaluation-harness tasks scored on the model, e.g. [hellaswag, "
                                         "lambada_openai] ([]: none)")
    lm_eval_fewshot: int = param(0, "few-shot examples before each lm-eval question", min=0)
    lm_eval_limit: int | None = param(None, "score the first this many examples of each lm-eval task (null: all)",
                                      min=1)
    # under conf/lm_eval/, which dvc.yaml lists among evaluate's deps: a changed YAML or !function file reruns it
    lm_eval_include: str | None = param(None, "a folder of your own lm-eval task YAMLs under conf/lm_eval/ (null: "
                                              "lm-eval's tasks only)", pattern=INCLUDE_PATTERN,
                                        what="a folder under conf/lm_eval/ (DVC tracks that folder for evaluate)")


def scored_tokens(cfg: EvalConfig, block_size: int, data: ShardSet) -> np.ndarray:
    """The val tokens evaluate scores (eval.val_tokens at most; null: all of the split) and the one after them, checked
    against the model's block first: evaluate calls it before its first pass, and train before it trains, for
    the model it will export."""
    return val_stream(data, scored_count("eval.val_tokens", cfg.val_tokens, block_size, data.tokens["val"]))


def check_scoring(cfg: EvalConfig, block_size: int, data: ShardSet) -> None:
    """What evaluate will meet before its passes, checked now: the task names, the val tokens, and a task cut from them
    (cloze)."""
    if cfg.lm_eval_tasks:
        require("lm_eval", "eval.lm_eval_tasks", f"{DEV_INSTALL} (or pip install -e '.[lm-eval]')")
    tasks = tasks_named(cfg.tasks, "eval.tasks")
    tokens = scored_tokens(cfg, block_size, data)
    if "cloze" in tasks:  # HellaSwag's file is evaluate's own to read (or download)
        tasks["cloze"].examples(cfg, data.tokenizer, tokens, block_size, False)
