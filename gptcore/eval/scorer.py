"""The one continuation scorer: log P(continuation | context) over the tokenizer's ids, with contexts packed so
each runs through the trunk once. HellaSwag, cloze and lm-eval's loglikelihood requests all go through `score_rows`;
the multiple-choice picks (acc, acc_norm) are built on it."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from tqdm import tqdm

from gptcore import distributed
from gptcore.atomic import write_text
from gptcore.device import autocast_context
from gptcore.errors import UserError
from gptcore.model.gpt import without_padding

HEAD_CHUNK = 1024  # head positions per GPT.logits call: bounds the [positions, vocab] float32 logits in memory


@dataclass
class Example:
    """One multiple-choice item in token ids: `endings[label]` is the right continuation of `context`."""
    context: list[int]
    endings: list[list[int]]
    label: int
    index: int = 0
    where: str = ""  # file:line of the row it came from, for errors (empty: "example <index>")

    @property
    def name(self) -> str:
        """Where the example came from, for a message."""
        return self.where or f"example {self.index}"


@dataclass
class ChoiceResult:
    """Counts over all ranks and one prediction per example: index, label, pred (argmin summed loss), pred_norm
    (argmin mean loss), sum_losses and mean_losses (one per ending)."""
    count: int
    correct: int
    correct_norm: int
    acc: float
    acc_norm: float
    predictions: list[dict] = field(default_factory=list)
    examples_per_sec: float = 0.0


@dataclass
class Row:
    """One packed sequence [context | cont_0 | cont_1 | ...]: each continuation attends to the context and to itself,
    its position ids continuing the context's, so the context runs through the trunk once; `ids` number the
    continuations in `score_rows`' output."""
    context: list[int]
    continuations: list[list[int]]
    ids: list[int]

    def __len__(self) -> int:
        return len(self.context) + sum(len(c) - 1 for c in self.continuations)  # a last token is only a target


def _pack(rows: Sequence[Row]) -> tuple[torch.Tensor, ...]:
    """Rows packed: idx, pos [B, T]; attn_mask [B, 1, T, T] (True: may attend); head [P], flat positions through the
    head, each once; per target token (continuation by continuation) pair_head, its index into head, and target.
    Segments -1 padding, 0 context, j+1 continuation j; a continuation's last token is a target, never an input."""
    B, T = len(rows), max(len(r) for r in rows)
    idx, pos = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
    seg = torch.full((B, T), -1, dtype=torch.long)
    head, pair_head, target = [], [], []
    for b, row in enumerate(rows):
        C = len(row.context)
        idx[b, :C], pos[b, :C], seg[b, :C] = torch.tensor(row.context, dtype=torch.long), torch.arange(C), 0
        shared, start = len(head), C  # the context's last position predicts every continuation's first token
        head.append(b * T + C - 1)
        for j, cont in enumerate(row.continuations):
            n = len(cont) - 1  # token k > 0 is predicted from token k - 1, the input at start + k - 1
            idx[b, start:start + n] = torch.tensor(cont[:-1], dtype=torch.long)
            pos[b, start:start + n] = torch.arange(C, C + n)
            seg[b, start:start + n] = j + 1
            pair_head += [shared, *range(len(head), len(head) + n)]
            head += range(b * T + start, b * T + start + n)
            target += cont
            start += n
    ar = torch.arange(T)
    mask = (ar[None, :] <= ar[:, None]) & ((seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == 0))
    mask |= torch.eye(T, dtype=torch.bool)  # padding attends to itself: no all-masked softmax row
    return idx, pos, mask[:, None], torch.tensor(head), torch.tensor(pair_head), torch.tensor(target)


def _batch_scores(model: nn.Module, rows: Sequence[Row], vocab_size: int, device: torch.device,
                  dtype: torch.dtype | None, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per continuation of the rows: summed log-probability (float32) and whether each token is the argmax, on CPU.
    The head runs only where a continuation token is predicted."""
    idx, pos, attn_mask, head, pair_head, target = _pack(rows)
    with autocast_context(device, dtype):
        hidden = model.hidden_states(idx.to(device), pos=pos.to(device), attn_mask=attn_mask.to(device))
    hidden = hidden.flatten(0, 1)[head.to(device)]
    by_head = torch.argsort(pair_head, stable=True)  # then each chunk of head positions owns a run of pairs
    pair_head = pair_head[by_head]
    bounds = torch.searchsorted(pair_head, torch.arange(0, len(hidden) + HEAD_CHUNK, HEAD_CHUNK)).tolist()
    pair_head, target = pair_head.to(device), target[by_head].to(device)
    lp = torch.empty(len(by_head), device=device)
    hit = torch.ones(len(by_head), dtype=torch.bool, device=device)
    for c, start in enumerate(range(0, len(hidden), HEAD_CHUNK)):
        with autocast_context(device, dtype):
            logits = model.logits(hidden[start:start + HEAD_CHUNK])
        logits = without_padding(logits, vocab_size).float()
        lo, hi = bounds[c], bounds[c + 1]
        local, t = pair_head[lo:hi] - start, target[lo:hi]
        lp[lo:hi] = logits[local, t] - logits.logsumexp(dim=-1)[local]
        if greedy:  # an argmax pass over the logits: only lm-eval's is_greedy asks for it
            hit[lo:hi] = logits.argmax(dim=-1)[local] == t
    lengths = torch.tensor([len(c) for row in rows for c in row.continuations])  # the targets, in order
    owner, R = torch.repeat_interleave(torch.arange(len(lengths)), lengths)[by_head].to(device), len(lengths)
    sums = torch.zeros(R, device=device).index_add_(0, owner, lp)
    misses = torch.zeros(R, dtype=torch.long, device=device).index_add_(0, owner, (~hit).long())
    return sums.cpu(), (misses == 0).cpu()


@torch.no_grad()
def score_rows(model: nn.Module, rows: Sequence[Row], vocab_size: int, *, device: str | torch.device,
               dtype: torch.dtype | None = None, batch_size: int = 32, greedy: bool = False,
               progress: bool = False, passes: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """log P(continuation | context) per continuation id (float64 [n], n the rows' ids) and, with `greedy`, whether
    every token is the argmax. `model` needs `hidden_states(idx, pos=, attn_mask=)`, `logits` and `config`;
    `vocab_size` is the tokenizer's; `dtype` bf16/fp16 runs under autocast; the train/eval mode is restored.
    `passes`: run at least this many batches (a sharded model's passes are collectives every rank makes alike), the
    extra ones scoring the first batch again, or a one-token row, and keeping nothing."""
    device = torch.device(device)
    if not 0 < vocab_size <= model.config.vocab_size:
        raise ValueError(f"vocab_size={vocab_size}: must be in 1..{model.config.vocab_size}, the model's head")
    n = sum(len(r.ids) for r in rows)
    logprob, is_greedy = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.bool)
    rows = sorted(rows, key=len, reverse=True)  # similar lengths share a forward; the longest (most memory) first
    was_training = model.training
    model.eval()
    try:
        batches = [rows[b:b + batch_size] for b in range(0, len(rows), batch_size)]
        spare = batches[0] if batches else [Row([0], [[0, 0]], [0])]
        for k in tqdm(range(max(len(batches), passes)), desc="scoring", unit="batch", disable=not progress):
            chunk = batches[k] if k < len(batches) else spare
            sums, hits = _batch_scores(model, chunk, vocab_size, device, dtype, greedy)
            if k < len(batches):
                ids = [i for row in chunk for i in row.ids]
                logprob[ids], is_greedy[ids] = sums.double(), hits
    finally:
        model.train(was_training)
    return logprob, is_greedy


def fit_example(example: Example, block_size: int) -> tuple[list[int], list[list[int]]]:
    """The context (cut from the left) and endings such that every context+ending row fits block_size."""
    if not 0 <= example.label < len(example.endings):
        raise UserError(f"{example.name}: label {example.label} is not in 0..{len(example.endings) - 1}")
    if not example.context:
        raise UserError(f"{example.name}: empty context (the first ending token needs one to be predicted)")
    if min(len(e) for e in example.endings) == 0:
        raise UserError(f"{example.name}: an ending has no tokens")
    longest = max(len(e) for e in example.endings)
    if longest > block_size - 1:
        raise UserError(f"{example.name}: an ending of {longest} tokens does not fit block_size "
                        f"{block_size} with at least one context token")
    return example.context[-(block_size - longest):], example.endings


def _prediction(example: Example, sums: list[float], lengths: list[int]) -> dict:
    means = [s / n for s, n in zip(sums, lengths)]
    return {"index": example.index, "label": example.label,
            "pred": min(range(len(sums)), key=sums.__getitem__),
            "pred_norm": min(range(len(means)), key=means.__getitem__),
            "sum_losses": sums, "mean_losses": means}


def score_examples(model: nn.Module, examples: Sequence[Example], vocab_size: int, *, device: str | torch.device,
                   batch_size: int = 32, dtype: torch.dtype | None = None, rank: int | None = None,
                   world_size: int | None = None, progress: bool = True, lockstep: bool = False) -> ChoiceResult:
    """Multiple-choice examples, one row each through `score_rows`: the pick is the ending of least summed loss (acc)
    and of least mean loss per token (acc_norm); contexts longer than the block are cut from the left, endings never.
    rank/world_size default to torch.distributed's (else 0/1): this rank scores examples[rank::world_size] and every
    rank gets all predictions back in input order, so every rank must call this. `lockstep`: every rank makes as
    many passes (a sharded model's), one with fewer examples repeating a batch."""
    joined = dist.is_available() and dist.is_initialized()
    rank = (dist.get_rank() if joined else 0) if rank is None else rank
    world_size = (dist.get_world_size() if joined else 1) if world_size is None else world_size
    if world_size > 1 and not joined:
        raise ValueError(f"world_size={world_size} but torch.distributed is not initialised: counts could not be "
                         "combined across ranks")
    positions, rows, n = list(range(rank, len(examples), world_size)), [], 0
    for i in positions:
        context, endings = fit_example(examples[i], model.config.block_size)
        rows.append(Row(context, endings, list(range(n, n + len(endings)))))
        n += len(endings)
    t0 = time.perf_counter()
    passes = max(-(-len(range(r, len(examples), world_size)) // batch_size) for r in range(world_size))
    logprob, _ = score_rows(model, rows, vocab_size, device=device, dtype=dtype, batch_size=batch_size,
                            progress=progress and rank == 0, passes=passes if lockstep else 0)
    losses = (-logprob).tolist()
    predictions = [_prediction(examples[i], [losses[k] for k in r.ids], [len(e) for e in r.continuations])
                   for i, r in zip(positions, rows)]
    if joined and world_size > 1:
        slots: list[dict] = [{}] * len(examples)
        for where, preds in distributed.all_gather_objects((positions, predictions)):
            for i, p in zip(where, preds):
                slots[i] = p
        predictions = slots
    if not predictions:  # an accuracy of zero examples is no number: the caller must refuse an empty task before this
        raise ValueError("no multiple-choice examples were scored: an accuracy over zero examples is undefined")
    count = len(predictions)
    correct = sum(p["pred"] == p["label"] for p in predictions)
    correct_norm = sum(p["pred_norm"] == p["label"] for p in predictions)
    seconds = time.perf_counter() - t0
    return ChoiceResult(count, correct, correct_norm, correct / count, correct_norm / count, predictions,
                        count / seconds if seconds > 0 else 0.0)


def write_predictions(path: str | Path, results: dict[str, ChoiceResult]) -> Path:
    """One JSON object per example of each task (task, index, label, pred, pred_norm, sum_losses, mean_losses);
    atomic."""
    write_text(path, "".join(json.dumps({"task": name, **p}, allow_nan=False) + "\n" for name, r in results.items()
                             for p in r.predictions))
    return Path(path)
