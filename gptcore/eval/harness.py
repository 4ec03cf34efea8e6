"""EleutherAI's lm-evaluation-harness (`lm_eval`, 0.4.x) on gptcore's own model, whatever its recipe.

`GPTCoreLM` is an lm-eval `LM` over a `GPT` and the run's tokenizer: lm-eval builds the requests (prompts,
few-shot examples, answer choices) and aggregates the metrics; this module only scores token sequences.
Scoring is batched as in the fast HellaSwag path (gptcore.eval.multichoice): the requests that share a context
(a multiple-choice question's choices) go through the trunk as one packed row, context once, each
continuation attending to the context and to itself; the vocabulary projection runs only at the positions
that predict a continuation token; rows of similar length share a forward. Requests whose context the
packing would have to cut run alone, cut exactly as lm-eval's `hf` model cuts them (the last block_size + 1
tokens of context + continuation), so the two score the same tokens.

Scores are log-probabilities over the tokenizer's vocabulary, not the padded one (50,304 for GPT-2 BPE): the
padding rows are no token, and the Hugging Face export drops them too.

`load_tasks` reads the task data before any model is loaded, so a task whose data cannot be reached costs
nothing; `run_tasks` scores them; `task_metrics` names the results as lm-eval does (`acc`, `acc_stderr`,
`acc_norm`, `perplexity`, ...) under `lm_eval.<task>` in metrics/eval.json, apart from the completion-style
`hellaswag.*` of `eval.task`.
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
from tqdm import tqdm

from gptcore.atomic import file_sha256
from gptcore.data.tokenizers import Tokenizer
from gptcore.distributed import autocast_context
from gptcore.errors import UserError
from gptcore.model.gpt import without_padding

# positions sent through GPT.logits at once: bounds the [positions, vocab] float32 logits in memory
HEAD_CHUNK = 1024
# the request kinds GPTCoreLM answers (generate_until tasks need sampling, which this adapter does not do)
SCORED_OUTPUTS = ("loglikelihood", "loglikelihood_rolling", "multiple_choice")


# -----------------------------------------------------------------------------
# scoring (context, continuation) token pairs

@dataclass
class _Row:
    """One sequence of a forward: a context and the continuations scored after it (request indices)."""
    context: list[int]
    continuations: list[list[int]]
    requests: list[int]

    def __len__(self) -> int:
        # the last token of a continuation is only a target, never an input
        return len(self.context) + sum(len(c) - 1 for c in self.continuations)


def plan_rows(pairs: Sequence[tuple[list[int], list[int]]], block_size: int) -> list[_Row]:
    """Group (context, continuation) pairs into rows of at most `block_size` input tokens.

    Pairs with the same context share a row when all of them fit uncut; otherwise each pair is a row of its
    own, its context cut from the left to the last block_size + 1 - len(continuation) tokens."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (context, continuation) in enumerate(pairs):
        if not context or not continuation:
            raise ValueError(f"request {i}: empty context or continuation (lm-eval gives at least one token each)")
        if len(continuation) > block_size:
            raise UserError(f"an lm-eval request continues with {len(continuation)} tokens, more than the model's "
                            f"block_size {block_size}: this task does not fit the model")
        groups.setdefault(tuple(context), []).append(i)
    rows = []
    for context, members in groups.items():
        row = _Row(list(context), [pairs[i][1] for i in members], members)
        if len(row) <= block_size:
            rows.append(row)
            continue
        for i in members:
            continuation = pairs[i][1]
            rows.append(_Row(list(context)[-(block_size + 1 - len(continuation)):], [continuation], [i]))
    return rows


def _pack(rows: Sequence[_Row]) -> tuple[torch.Tensor, ...]:
    """Token ids, position ids [B, T] and the attention mask [B, 1, T, T] of packed rows, plus per target token:
    the flat input position predicting it, the token, and which request it belongs to."""
    B, T = len(rows), max(len(r) for r in rows)
    idx = torch.zeros(B, T, dtype=torch.long)
    pos = torch.zeros(B, T, dtype=torch.long)
    seg = torch.full((B, T), -1, dtype=torch.long)  # -1 padding, 0 context, j+1 continuation j
    head, target, owner = [], [], []
    for b, row in enumerate(rows):
        C = len(row.context)
        idx[b, :C] = torch.tensor(row.context)
        pos[b, :C] = torch.arange(C)
        seg[b, :C] = 0
        start = C
        for j, (continuation, request) in enumerate(zip(row.continuations, row.requests)):
            n = len(continuation) - 1  # inputs of this continuation
            idx[b, start:start + n] = torch.tensor(continuation[:-1], dtype=torch.long)
            pos[b, start:start + n] = torch.arange(C, C + n)
            seg[b, start:start + n] = j + 1
            # token 0 is predicted by the context's last position, token k by this continuation's token k-1
            head += [b * T + C - 1] + [b * T + start + k for k in range(n)]
            target += continuation
            owner += [request] * len(continuation)
            start += n
    ar = torch.arange(T)
    causal = ar[None, :] <= ar[:, None]  # [query, key]
    mask = causal & ((seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == 0))
    mask |= torch.eye(T, dtype=torch.bool)  # padding attends to itself: no all-masked softmax row
    return idx, pos, mask[:, None], torch.tensor(head), torch.tensor(target), torch.tensor(owner)


@torch.no_grad()
def score_pairs(model: nn.Module, pairs: Sequence[tuple[list[int], list[int]]], vocab_size: int, *,
                device: torch.device, dtype: torch.dtype | None = None, batch_size: int = 32,
                progress: bool = False) -> list[tuple[float, bool]]:
    """For each (context, continuation) in token ids: log P(continuation | context) under `model` and whether
    every continuation token is the model's argmax (lm-eval's `is_greedy`), in input order.

    `model` is a gptcore GPT (it needs `hidden_states(idx, pos=, attn_mask=)`, `logits` and `config.block_size`);
    `vocab_size` is the tokenizer's (logits beyond it are padding); `batch_size` rows go through one forward.
    """
    block_size = model.config.block_size
    rows = sorted(plan_rows(pairs, block_size), key=len, reverse=True)  # similar lengths share a forward
    logprob = torch.zeros(len(pairs), dtype=torch.float64)
    misses = torch.zeros(len(pairs), dtype=torch.long)  # continuation tokens that are not the argmax
    was_training = model.training
    model.eval()
    try:
        for b in tqdm(range(0, len(rows), batch_size), desc="lm-eval", unit="batch", disable=not progress):
            idx, pos, mask, head, target, owner = _pack(rows[b:b + batch_size])
            with autocast_context(device, dtype):
                hidden = model.hidden_states(idx.to(device), pos=pos.to(device), attn_mask=mask.to(device))
            hidden = hidden.flatten(0, 1)
            for start in range(0, len(head), HEAD_CHUNK):
                h = hidden[head[start:start + HEAD_CHUNK].to(device)]
                t = target[start:start + HEAD_CHUNK].to(device)
                with autocast_context(device, dtype):
                    logits = model.logits(h)
                logits = without_padding(logits, vocab_size).float()
                lp = logits.gather(1, t[:, None])[:, 0] - logits.logsumexp(dim=-1)
                hit = logits.argmax(dim=-1) == t
                o = owner[start:start + HEAD_CHUNK]
                logprob.index_add_(0, o, lp.double().cpu())
                misses.index_add_(0, o, (~hit).long().cpu())
    finally:
        model.train(was_training)
    return [(float(lp), int(m) == 0) for lp, m in zip(logprob, misses)]


# -----------------------------------------------------------------------------
# the lm-eval model

def _lm_base() -> type:
    from lm_eval.api.model import TemplateLM

    return TemplateLM


def make_lm(model: nn.Module, tokenizer: Tokenizer, *, device: torch.device, dtype: torch.dtype | None = None,
            batch_size: int = 32, progress: bool = True):
    """An lm-eval `LM` (a `TemplateLM`) answering loglikelihood and rolling-loglikelihood requests with `model`."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    class GPTCoreLM(_lm_base()):
        """gptcore's GPT and tokenizer as an lm-eval model (loglikelihood requests only)."""

        def __init__(self) -> None:
            super().__init__()
            self.model, self.tok = model, tokenizer
            self._device, self.dtype, self.batch_size, self.progress = torch.device(device), dtype, batch_size, progress

        @property
        def eot_token_id(self) -> int:
            return self.tok.eot

        @property
        def max_length(self) -> int:
            return self.model.config.block_size

        @property
        def tokenizer_name(self) -> str:
            return self.tok.name

        def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
            return self.tok.encode(string)

        def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, **kwargs: Any) -> list:
            pairs = [(list(context), list(continuation)) for _, context, continuation in requests]
            return score_pairs(self.model, pairs, self.tok.vocab_size, device=self._device, dtype=self.dtype,
                               batch_size=self.batch_size, progress=self.progress and not disable_tqdm)

        def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
            # disjoint windows of at most block_size predicted tokens, each after one token of context (as `hf`)
            windows, owner = [], []
            for i, req in enumerate(requests):
                tokens = self.tok_encode(req.args[0])
                for w in get_rolling_token_windows(tokens, self.eot_token_id, self.max_length, 1):
                    windows.append((None, *make_disjoint_window(w)))
                    owner.append(i)
            scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
            totals = [0.0] * len(requests)
            for i, (lp, _) in zip(owner, scores):
                totals[i] += lp
            return totals

        def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
            raise UserError("gptcore's lm-eval model scores loglikelihoods only; generation tasks are not supported")

    return GPTCoreLM()


# -----------------------------------------------------------------------------
# tasks

def _quiet_lm_eval() -> None:
    # lm-eval logs each task it builds (and each default it fills in a YAML); the stage prints one line per task
    for name in ("lm-eval", "lm_eval"):
        logging.getLogger(name).setLevel(logging.ERROR)


@dataclass
class Tasks:
    """lm-eval tasks with their data read, and the TaskManager that found them (lm-eval would build a new one).

    `sources` says per task what it is (for compare: lm-eval's own task or a YAML of the include folder): where its
    YAML is, that file's sha256, its version and dataset; `python` lists the Python files that the include
    folder's YAMLs name with `!function`, which lm-eval imports and runs."""
    manager: Any
    items: list
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    python: list[Path] = field(default_factory=list)


LM_EVAL = "lm-eval"  # a task's `task_from` when its YAML is one of lm-eval's own
INCLUDE = "eval.lm_eval_include"  # ... when it is the user's
_FUNCTION = re.compile(r"!function\s+([\w.]+)\.\w+")


def function_files(include: str | Path) -> list[Path]:
    """The Python files the task YAMLs under `include` name with lm-eval's `!function module.name` tag (lm-eval
    imports `module.py` beside the YAML and runs it when that task loads), existing ones only, sorted."""
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
    config = task.config
    return {"task_from": LM_EVAL if own else INCLUDE if yaml_path is not None else "no YAML",
            "yaml": str(yaml_path.relative_to(builtin) if own else yaml_path),
            "yaml_sha256": file_sha256(yaml_path) if yaml_path is not None and yaml_path.is_file() else None,
            "version": task.VERSION, "dataset": [config.dataset_path, config.dataset_name],
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
    """The lm-eval tasks (or groups) `names`, their data read now: an unknown name, a generation task, data
    that cannot be reached or fewer few-shot examples than `num_fewshot` is a UserError naming the task and what
    to do, before any model is loaded.

    `include` is a folder of the user's own task YAMLs (lm-eval's `include_path`); their names join the
    built-in ones (a name of both is the folder's task). `echo` gets a line naming the folder's Python files that
    its YAMLs run (before lm-eval imports any), and one per task of the folder (compare sets only lm-eval's own
    beside a published figure)."""
    _quiet_lm_eval()
    from lm_eval.tasks import TaskManager

    if include is not None and not Path(include).is_dir():
        raise UserError(f"eval.lm_eval_include={str(include)!r}: no such folder (a folder of lm-eval task YAMLs)")
    # indexing lm-eval's thousands of built-in YAMLs takes seconds: skip it when the user's folder has them all
    manager = None
    if include is not None:
        manager = TaskManager(include_path=str(include), include_defaults=False)
        if not all(name in manager.all_tasks for name in names):
            manager = None
    manager = manager or TaskManager(include_path=str(include) if include is not None else None)
    python = function_files(include) if include is not None else []
    if python and echo is not None:
        echo(f"lm-eval runs Python of eval.lm_eval_include (named by its YAMLs' !function): "
             f"{', '.join(str(f) for f in python)}")
    loaded, sources = [], {}
    for name in names:
        out = _load_task(manager, name, include)
        for task in out["tasks"].values():
            kind = task.get_config("output_type")
            if kind not in SCORED_OUTPUTS:
                raise UserError(f"eval.lm_eval_tasks: lm-eval task {task.task_name!r} is a {kind} task; gptcore "
                                f"scores {', '.join(SCORED_OUTPUTS)} tasks only")
            check_fewshot(task, num_fewshot)
            sources[task.task_name] = _task_source(manager, task)
            if sources[task.task_name]["task_from"] == INCLUDE and echo is not None:
                echo(f"lm-eval task {task.task_name}: the YAML {sources[task.task_name]['yaml']} of "
                     f"eval.lm_eval_include, not lm-eval's own (compare sets only lm-eval's own beside a published "
                     f"figure)")
        loaded.append(out["groups"].get(name) or out["tasks"].get(name) or next(iter(out["tasks"].values())))
    return Tasks(manager, loaded, sources, python)


def _load_task(manager: Any, name: str, include: str | Path | None) -> dict:
    """manager.load([name]), an unknown name or unreadable data as one line."""
    if name not in manager.all_tasks:
        where = f" or in {include}" if include is not None else " (eval.lm_eval_include adds a folder of yours)"
        raise UserError(f"eval.lm_eval_tasks: no lm-eval task {name!r} among lm-eval's tasks{where}")
    try:
        return manager.load([name])
    except OSError as e:  # datasets: ConnectionError (no hub, offline cache miss), FileNotFoundError (local files)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fix = ("check the data files its task YAML names (dataset_kwargs: data_files)"
               if isinstance(e, FileNotFoundError) and not isinstance(e, ConnectionError) else
               "run where the Hugging Face hub is reachable (once fills the cache; then HF_DATASETS_OFFLINE=1 "
               "works offline), or write a task YAML over local files into eval.lm_eval_include")
        raise UserError(f"eval.lm_eval_tasks: the data of lm-eval task {name!r} cannot be read "
                        f"({type(e).__name__}: {first[:200]}): {fix}") from None


def run_tasks(lm: Any, tasks: Tasks, num_fewshot: int, limit: int | None,
              seed: int = 1234) -> tuple[dict[str, Any], dict[str, float]]:
    """Score `tasks` (from `load_tasks`) with `lm`; returns lm-eval's results dict and seconds per task
    (each task timed alone). Few-shot examples are drawn with lm-eval's default seed unless `seed` says otherwise."""
    _quiet_lm_eval()
    from lm_eval import simple_evaluate

    merged: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for task in tasks.items:
        t0 = time.perf_counter()
        out = simple_evaluate(model=lm, tasks=[task], num_fewshot=num_fewshot, limit=limit, log_samples=False,
                              task_manager=tasks.manager, fewshot_random_seed=seed)
        for key in ("results", "n-shot", "n-samples", "versions"):
            merged.setdefault(key, {}).update(out.get(key, {}))
        for name in out.get("results", {}):
            seconds[name] = time.perf_counter() - t0
    return merged, seconds


def score_tasks(model: nn.Module, tokenizer: Tokenizer, tasks: Tasks, num_fewshot: int, limit: int | None, *,
                device: torch.device, dtype: torch.dtype | None = None, batch_size: int = 32,
                progress: bool = True) -> tuple[dict[str, dict[str, float | int]], dict[str, float]]:
    """`tasks` scored on `model` through gptcore's LM: ({task: {metric: value}}, {task: seconds})."""
    lm = make_lm(model, tokenizer, device=device, dtype=dtype, batch_size=batch_size, progress=progress)
    results, seconds = run_tasks(lm, tasks, num_fewshot, limit)
    return task_metrics(results), seconds


def task_metrics(results: dict[str, Any]) -> dict[str, dict[str, float | int]]:
    """lm-eval's results as metrics/eval.json's `lm_eval` section: {task: {metric: value, ...}}.

    Metric names are lm-eval's (`acc`, `acc_stderr`, `acc_norm`, `perplexity`, ...); a filter other than lm-eval's
    default `none` is appended (`exact_match_strict-match`). Each task also records `num_fewshot`, `samples` (the
    examples scored) and `samples_total` (the task's full set), so compare can tell a partial run."""
    out: dict[str, dict[str, float | int]] = {}
    for task, values in results.get("results", {}).items():
        row: dict[str, float | int] = {}
        for key, value in values.items():
            if "," not in key or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # "alias", stderr "N/A", ...
            metric, filt = key.split(",", 1)
            if isinstance(value, float) and not math.isfinite(value):
                continue
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
