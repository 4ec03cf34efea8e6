"""The multiple-choice tasks a run can score (`train.tasks` at its eval cadence, `eval.tasks` in evaluate): the table
below, each task a module of this package that makes a `Task` (tasks/base.py). Every task is scored by the one scorer
(eval/scorer.py). A new one is a module here, a row below, and its keys in both the train: and eval: sections
(`TaskSettings`; docs/architecture.md)."""
from __future__ import annotations

from gptcore.eval.tasks import cloze, hellaswag
from gptcore.eval.tasks.base import Task
from gptcore.params import choose

TASKS: dict[str, Task] = {
    "hellaswag": hellaswag.TASK,  # HellaSwag's validation file, completion style (build-nanogpt)
    "cloze": cloze.TASK,  # 4-way endings cut from the val split, for any corpus and tokenizer
}


def tasks_named(names: list[str], key: str) -> dict[str, Task]:
    """{name: task} of a tasks list param (`key`: train.tasks or eval.tasks); a ParamError for an unknown name."""
    return {name: choose(TASKS, key, name) for name in names}
