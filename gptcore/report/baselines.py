"""Published reference figures (conf/baselines.yaml), read and named one way for compare, plots and README.

An entry such as `gpt2_124m` holds a `description` and figures (`val_loss`, `hellaswag_acc_norm`), each with a
`<figure>_source` and a `<figure>_measured_on` (the keys of MEASURED_ON, which compare matches against the run's
metrics/measured_on.json); a figure's one name everywhere is `<entry>_<figure>`, e.g. `gpt2_124m_val_loss`. An entry
may also hold published lm-evaluation-harness figures, `lm_eval: {<task>: {task_from, num_fewshot, samples, source,
<metric>: value, ...}}`, named `<entry>_lm_eval_<task>_<metric>`, e.g. `gpt2_124m_lm_eval_hellaswag_acc_norm`.
"""
from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any

from gptcore.errors import UserError
from gptcore.user_files import read_yaml

FIGURES = ("val_loss", "hellaswag_acc_norm")
REQUIRED = {"gpt2_124m": FIGURES}  # the entry every run is set beside
# what each figure was measured on: the val split (its data, tokenizer, size rule and scored tokens), the HellaSwag
# file
MEASURED_ON = {"val_loss": ("tokenizer", "dataset", "config", "revision", "split_tokens", "val_sha256",
                            "scored_tokens"),
               "hellaswag_acc_norm": ("sha256", "examples")}
# what a published lm-eval figure was measured on, besides its metrics (compare needs both to match the run's);
# task_from: "lm-eval", the harness's own task of that name
LM_EVAL_FACTS = ("task_from", "num_fewshot", "samples", "source")


def read_baselines(path: str | Path) -> dict[str, dict[str, Any]]:
    """conf/baselines.yaml, read by the one YAML reader (an entry given twice is named with its lines) and checked
    (check_baselines): errors name the file."""
    path = Path(path)
    data = read_yaml(path, missing="no such baselines file") or {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of baseline entries, got {type(data).__name__}")
    check_baselines(data, path)
    return data


def check_baselines(data: dict[str, Any], where: str | Path = "baselines") -> None:
    """A UserError naming `where` unless every entry is a mapping whose figures are numbers with a `_measured_on`."""
    for entry, need in REQUIRED.items():
        missing = [f for f in need if f not in (data.get(entry) or {})]
        if missing:
            raise UserError(f"{where}: {entry} needs numeric {' and '.join(missing)}")
    for entry, body in data.items():
        if not isinstance(body, dict):
            raise UserError(f"{where}: {entry} must be a mapping, got {body!r}")
        for figure in FIGURES:
            if figure in body and not _is_number(body[figure]):
                raise UserError(f"{where}: {entry}.{figure} must be a finite number, got {body[figure]!r}")
            measured = body.get(f"{figure}_measured_on")
            if figure in body and not (isinstance(measured, dict) and set(MEASURED_ON[figure]) <= set(measured)):
                raise UserError(f"{where}: {entry}.{figure}_measured_on must say what {figure} was measured on "
                                f"({', '.join(MEASURED_ON[figure])})")
        shape = body.get("shape")
        if shape is not None and not (isinstance(shape, dict) and all(
                isinstance(shape.get(k), int) and not isinstance(shape.get(k), bool) and shape[k] > 0
                for k in ("n_layer", "n_head", "n_embd"))):
            raise UserError(f"{where}: {entry}.shape must give the model's n_layer, n_head and n_embd as positive "
                            f"integers, got {shape!r}")
        _check_lm_eval(body.get("lm_eval"), f"{where}: {entry}.lm_eval")


def _is_number(value: Any) -> bool:
    """A finite real number (NaN or an infinity is no figure: JSON cannot hold one, no comparison means anything)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _check_lm_eval(tasks: Any, where: str) -> None:
    """An entry's `lm_eval` section: {task: {num_fewshot, samples, source, <metric>: number, ...}}."""
    if tasks is None:
        return
    if not isinstance(tasks, dict):
        raise UserError(f"{where} must be a mapping of lm-eval task names, got {tasks!r}")
    for task, figures in tasks.items():
        if not isinstance(figures, dict):
            raise UserError(f"{where}.{task} must be a mapping, got {figures!r}")
        for key in ("num_fewshot", "samples"):
            if not isinstance(figures.get(key), int) or isinstance(figures.get(key), bool) or figures[key] < 0:
                raise UserError(f"{where}.{task}.{key} must be an integer >= 0 (what the figures were measured on)")
        if not isinstance(figures.get("source"), str) or not figures["source"].strip():
            raise UserError(f"{where}.{task}.source must say where the figures come from")
        if figures.get("task_from") != "lm-eval":
            raise UserError(f"{where}.{task}.task_from must be lm-eval (a published figure is of lm-eval's own task)")
        metrics = lm_eval_metrics(figures)
        if not metrics:
            raise UserError(f"{where}.{task} has no metric (e.g. acc_norm: 0.3114)")
        for metric, value in metrics.items():
            if not _is_number(value):
                raise UserError(f"{where}.{task}.{metric} must be a finite number, got {value!r}")


def lm_eval_metrics(figures: dict[str, Any]) -> dict[str, Any]:
    """The metric values of one published lm-eval task entry (all but num_fewshot, samples and source)."""
    return {k: v for k, v in figures.items() if k not in LM_EVAL_FACTS}


def baseline_values(data: dict[str, Any]) -> dict[str, float]:
    """Every figure as {"<entry>_<figure>": value}, e.g. {"gpt2_124m_val_loss": 3.2924, ...}, in file order."""
    check_baselines(data)
    return {f"{entry}_{figure}": float(body[figure])
            for entry, body in data.items() for figure in FIGURES if figure in body}


def lm_eval_values(data: dict[str, Any]) -> dict[str, float]:
    """Every published lm-eval figure as {"<entry>_lm_eval_<task>_<metric>": value}, in file order."""
    return {f"{entry}_lm_eval_{task}_{metric}": float(value)
            for entry, body in data.items() for task, figures in (body.get("lm_eval") or {}).items()
            for metric, value in lm_eval_metrics(figures).items()}
