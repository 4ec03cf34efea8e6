"""EleutherAI's lm-evaluation-harness (`lm_eval` 0.4.x) on gptcore's own model, whatever its recipe.

lm-eval builds the requests and aggregates the metrics; the log-likelihoods come from the one scorer, score_rows.
Results keep lm-eval's names, under `lm_eval.<task>` in metrics/eval.json (apart from `eval.task`'s `hellaswag.*`).
"""
from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gptcore.data.tokenizers.base import Tokenizer
from gptcore.digests import file_sha256
from gptcore.errors import UserError
from gptcore.eval.scorer import Row, score_rows

SCORED_OUTPUTS = ("loglikelihood", "loglikelihood_rolling", "multiple_choice")  # generate_until would need sampling


def score_pairs(model: nn.Module, pairs: Sequence[tuple[list[int], list[int]]], vocab_size: int, *,
                device: torch.device, dtype: torch.dtype | None = None, batch_size: int = 32,
                progress: bool = False) -> list[tuple[float, bool]]:
    """Per (context, continuation) in token ids, in input order: log P(continuation | context) over the tokenizer's
    `vocab_size` ids and whether every continuation token is the argmax (lm-eval's `is_greedy`). One context's pairs
    share a row when it fits block_size uncut, else each is a row of its own cut as lm-eval's `hf` model cuts it (the
    last block_size + 1 tokens), so both score alike."""
    block_size, groups = model.config.block_size, {}
    for i, (context, continuation) in enumerate(pairs):
        if not context or not continuation:
            raise ValueError(f"request {i}: empty context or continuation (lm-eval gives at least one token each)")
        if len(continuation) > block_size:
            raise UserError(f"an lm-eval request continues with {len(continuation)} tokens, more than the model's "
                            f"block_size {block_size}: this task does not fit the model")
        groups.setdefault(tuple(context), []).append(i)
    rows = []
    for context, members in groups.items():
        row = Row(list(context), [pairs[i][1] for i in members], members)
        rows += [row] if len(row) <= block_size else [
            Row(list(context)[-(block_size + 1 - len(pairs[i][1])):], [pairs[i][1]], [i]) for i in members]
    logprob, greedy = score_rows(model, rows, vocab_size, device=device, dtype=dtype, batch_size=batch_size,
                                 greedy=True, progress=progress)
    return [(float(lp), bool(g)) for lp, g in zip(logprob, greedy)]


def make_lm(model: nn.Module, tokenizer: Tokenizer, *, device: torch.device, dtype: torch.dtype | None = None,
            batch_size: int = 32, progress: bool = True):
    """An lm-eval `LM` (a `TemplateLM`) answering loglikelihood and rolling-loglikelihood requests with `model`."""
    from lm_eval.api.model import TemplateLM
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    class GPTCoreLM(TemplateLM):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.tok, self.max_length = model, tokenizer, model.config.block_size
            self._device = torch.device(device)  # what lm-eval's `device` property returns

        @property
        def eot_token_id(self) -> int:
            return self.tok.eot

        @property
        def tokenizer_name(self) -> str:
            return self.tok.name

        def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
            return self.tok.encode(string)

        def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, **kwargs: Any) -> list:
            pairs = [(list(context), list(continuation)) for _, context, continuation in requests]
            return score_pairs(self.model, pairs, self.tok.vocab_size, device=self._device, dtype=dtype,
                               batch_size=batch_size, progress=progress and not disable_tqdm)

        def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
            # disjoint windows of at most block_size predicted tokens, each after one token of context (as `hf`)
            windows, owner = [], []
            for i, req in enumerate(requests):
                for w in get_rolling_token_windows(self.tok_encode(req.args[0]), self.eot_token_id, self.max_length, 1):
                    windows.append((None, *make_disjoint_window(w)))
                    owner.append(i)
            totals = [0.0] * len(requests)
            for i, (lp, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)):
                totals[i] += lp
            return totals

        def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
            raise UserError("gptcore's lm-eval model scores loglikelihoods only; generation tasks are not supported")

    return GPTCoreLM()


def _quiet_lm_eval() -> None:
    # lm-eval logs each task it builds (and each default it fills in a YAML); the stage prints one line per task
    for name in ("lm-eval", "lm_eval"):
        logging.getLogger(name).setLevel(logging.ERROR)


@dataclass
class Tasks:
    """lm-eval tasks with their data read and the TaskManager that found them; per task, `sources` says where its
    YAML is (lm-eval's own or the include folder's: compare needs it); `python`, the folder's `!function` files."""
    manager: Any
    items: list
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    python: list[Path] = field(default_factory=list)


LM_EVAL = "lm-eval"  # a task's `task_from` when its YAML is one of lm-eval's own
INCLUDE = "eval.lm_eval_include"  # ... when it is the user's
_FUNCTION = re.compile(r"!function\s+([\w.]+)\.\w+")


def function_files(include: str | Path) -> list[Path]:
    """The existing Python files the YAMLs under `include` name with `!function module.name` (lm-eval imports
    `module.py` beside the YAML and runs it when that task loads), sorted."""
    found = set()
    for yaml_file in sorted(Path(include).rglob("*.yaml")) + sorted(Path(include).rglob("*.yml")):
        for module in _FUNCTION.findall(yaml_file.read_text(encoding="utf-8", errors="replace")):
            py = yaml_file.parent / f"{module.replace('.', '/')}.py"
            if py.is_file():
                found.add(py)
    return sorted(found)


def _task_source(manager: Any, task: Any) -> dict[str, Any]:
    """Where one loaded task comes from: lm-eval's own YAML or the include folder's, and its config's identity."""
    import lm_eval

    entry = manager.task_index.get(task.task_name)
    yaml_path = Path(entry.yaml_path).resolve() if entry is not None and entry.yaml_path else None
    builtin = Path(lm_eval.__file__).resolve().parent / "tasks"
    own = yaml_path is not None and yaml_path.is_relative_to(builtin)
    return {"task_from": LM_EVAL if own else INCLUDE if yaml_path is not None else "no YAML",
            "yaml": str(yaml_path.relative_to(builtin) if own else yaml_path),
            "yaml_sha256": file_sha256(yaml_path) if yaml_path is not None and yaml_path.is_file() else None,
            "version": task.VERSION, "dataset": [task.config.dataset_path, task.config.dataset_name],
            "lm_eval_version": lm_eval.__version__}


def check_fewshot(task: Any, num_fewshot: int) -> None:
    """Refuse a few-shot count the task's few-shot pool cannot give (lm-eval fails only once scoring starts)."""
    if num_fewshot == 0:
        return
    sampler = getattr(task, "sampler", None)
    pool = len(sampler.fewshot_docs()) if sampler is not None else 0
    # when the few-shot examples come from the scored split, lm-eval draws one more and drops the question itself
    need = num_fewshot + int(getattr(getattr(task, "fewshot_cfg", None), "split", None) == task.config.test_split)
    if pool < need:
        raise UserError(f"eval.lm_eval_fewshot={num_fewshot}: lm-eval task {task.task_name!r} has {pool} few-shot "
                        f"example(s){' (the question itself left out)' if need > num_fewshot else ''}; "
                        f"set eval.lm_eval_fewshot to at most {max(pool - (need - num_fewshot), 0)}")


def load_tasks(names: Sequence[str], include: str | Path | None = None, num_fewshot: int = 0,
               echo: Callable[[str], None] | None = None) -> Tasks:
    """The lm-eval tasks (or groups) `names` with their data read, before any model is loaded: an unknown name, a
    generation task, unreachable data or too few few-shot examples is a UserError naming the task and the fix.

    `include` is a folder of the user's task YAMLs (lm-eval's `include_path`; a name of both is the folder's task).
    `echo` gets a line naming the Python its YAMLs run (before lm-eval imports it) and one per task of the folder."""
    _quiet_lm_eval()
    from lm_eval.tasks import TaskManager

    if include is not None and not Path(include).is_dir():
        raise UserError(f"eval.lm_eval_include={str(include)!r}: no such folder (a folder of lm-eval task YAMLs)")
    # indexing lm-eval's thousands of built-in YAMLs takes seconds: skip it when the user's folder has them all
    manager = TaskManager(include_path=str(include), include_defaults=False) if include is not None else None
    if manager is None or not all(name in manager.all_tasks for name in names):
        manager = TaskManager(include_path=str(include) if include is not None else None)
    python = function_files(include) if include is not None else []
    if python and echo is not None:
        echo(f"lm-eval runs Python of eval.lm_eval_include (named by its YAMLs' !function): "
             f"{', '.join(str(f) for f in python)}")
    loaded, sources = [], {}
    for name in names:
        if name not in manager.all_tasks:
            where = f" or in {include}" if include is not None else " (eval.lm_eval_include adds a folder of yours)"
            raise UserError(f"eval.lm_eval_tasks: no lm-eval task {name!r} among lm-eval's tasks{where}")
        try:
            out = manager.load([name])
        except OSError as e:  # datasets: ConnectionError (no hub, offline cache miss), FileNotFoundError (local files)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            fix = ("check the data files its task YAML names (dataset_kwargs: data_files)"
                   if isinstance(e, FileNotFoundError) and not isinstance(e, ConnectionError) else
                   "run where the Hugging Face hub is reachable (once fills the cache; then HF_DATASETS_OFFLINE=1 "
                   "works offline), or write a task YAML over local files into eval.lm_eval_include")
            raise UserError(f"eval.lm_eval_tasks: the data of lm-eval task {name!r} cannot be read "
                            f"({type(e).__name__}: {first[:200]}): {fix}") from None
        for task in out["tasks"].values():
            kind = task.get_config("output_type")
            if kind not in SCORED_OUTPUTS:
                raise UserError(f"eval.lm_eval_tasks: lm-eval task {task.task_name!r} is a {kind} task; gptcore "
                                f"scores {', '.join(SCORED_OUTPUTS)} tasks only")
            check_fewshot(task, num_fewshot)
            source = sources[task.task_name] = _task_source(manager, task)
            if source["task_from"] == INCLUDE and echo is not None:
                echo(f"lm-eval task {task.task_name}: the YAML {source['yaml']} of eval.lm_eval_include, not lm-eval's "
                     f"own (compare sets only lm-eval's own beside a published figure)")
        loaded.append(out["groups"].get(name) or out["tasks"].get(name) or next(iter(out["tasks"].values())))
    return Tasks(manager, loaded, sources, python)


def score_tasks(model: nn.Module, tokenizer: Tokenizer, tasks: Tasks, num_fewshot: int, limit: int | None, *,
                device: torch.device, dtype: torch.dtype | None = None, batch_size: int = 32, progress: bool = True,
                seed: int = 1234) -> tuple[dict[str, dict[str, float | int]], dict[str, float]]:
    """`tasks` scored on `model` through gptcore's LM, each timed alone: ({task: {metric: value}}, {task: seconds});
    `seed` is lm-eval's few-shot seed (1234, its default)."""
    _quiet_lm_eval()
    from lm_eval import simple_evaluate

    lm = make_lm(model, tokenizer, device=device, dtype=dtype, batch_size=batch_size, progress=progress)
    merged: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for task in tasks.items:
        t0 = time.perf_counter()
        out = simple_evaluate(model=lm, tasks=[task], num_fewshot=num_fewshot, limit=limit, log_samples=False,
                              task_manager=tasks.manager, fewshot_random_seed=seed)
        for key in ("results", "n-shot", "n-samples", "versions"):
            merged.setdefault(key, {}).update(out.get(key, {}))
        seconds.update(dict.fromkeys(out.get("results", {}), time.perf_counter() - t0))
    return task_metrics(merged), seconds


def task_metrics(results: dict[str, Any]) -> dict[str, dict[str, float | int]]:
    """lm-eval's results as {task: {metric: value}} under lm-eval's names, a filter other than `none` appended
    (`exact_match_strict-match`), plus `num_fewshot`, `samples` and `samples_total` (compare tells a partial run)."""
    out: dict[str, dict[str, float | int]] = {}
    for task, values in results.get("results", {}).items():
        row: dict[str, float | int] = {}
        for key, value in values.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if "," not in key or not number:
                continue  # "alias", stderr "N/A" or nan, ...
            metric, filt = key.split(",", 1)
            row[metric if filt == "none" else f"{metric}_{filt}"] = value
        shots = results.get("n-shot", {}).get(task)
        if shots is not None:
            row["num_fewshot"] = int(shots)
        n = results.get("n-samples", {}).get(task)
        if n:
            row["samples"], row["samples_total"] = int(n["effective"]), int(n["original"])
        out[task] = row
    return out


def describe(metrics: dict[str, dict[str, float | int]], seconds: dict[str, float] | None = None) -> list[str]:
    """One line per task: its metrics (stderr in brackets), few-shot count, examples and time."""
    lines = []
    for task, row in metrics.items():
        figures = ", ".join(f"{k} {v:.4f}" + (f" (±{row[k + '_stderr']:.4f})" if k + "_stderr" in row else "")
                            for k, v in row.items()
                            if not k.endswith("_stderr") and k not in ("num_fewshot", "samples", "samples_total"))
        took = f", {seconds[task]:.1f} s" if seconds and task in seconds else ""
        lines.append(f"lm-eval {task}: {figures} ({row.get('num_fewshot', 0)}-shot, "
                     f"{row.get('samples', '?')} of {row.get('samples_total', '?')} examples{took})")
    return lines
