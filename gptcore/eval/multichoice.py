"""The one continuation scorer: HellaSwag, cloze and lm-eval's loglikelihood requests all go through `score_rows`.

A row is a context and the continuations scored after it, packed as [context | cont_0 | cont_1 | ...]: each
continuation attends to the context and to itself, its position ids continuing the context's, so the context runs
through the trunk once; the head runs only where a continuation token is predicted; rows of similar length share a
forward. Log-probabilities are over the tokenizer's `vocab_size` ids: a padded head's extra ids are no token, and the
Hugging Face export drops them. `score_examples` picks multiple-choice endings by summed loss (acc) and mean loss per
token (acc_norm); contexts longer than the block are cut from the left, endings never.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from tqdm import tqdm

from gptcore.atomic import atomic_write
from gptcore.distributed import autocast_context
from gptcore.model.gpt import without_padding
from gptcore.process import UserError

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
        """How an error names this example: its file and line, else its index."""
        return self.where or f"example {self.index}"


@dataclass
class ChoiceResult:
    """Counts over all ranks and, on rank 0, one prediction per example: index, label, pred (argmin summed loss),
    pred_norm (argmin mean loss), sum_losses and mean_losses (one per ending)."""
    count: int
    correct: int
    correct_norm: int
    acc: float
    acc_norm: float
    predictions: list[dict] = field(default_factory=list)
    examples_per_sec: float = 0.0


@dataclass
class Row:
    """One packed sequence: a context, the continuations scored after it, and their ids in `score_rows`' output."""
    context: list[int]
    continuations: list[list[int]]
    ids: list[int]

    def __len__(self) -> int:
        return len(self.context) + sum(len(c) - 1 for c in self.continuations)  # a last token is only a target


@dataclass
class _Batch:
    """Rows packed: idx/pos [B, T]; attn_mask [B, 1, T, T] (True: may attend); head [P] flat positions through the
    head, each once; per target token: pair_head (index into head), target, owner (index into ids)."""
    idx: torch.Tensor
    pos: torch.Tensor
    attn_mask: torch.Tensor
    head: torch.Tensor
    pair_head: torch.Tensor
    target: torch.Tensor
    owner: torch.Tensor
    ids: list[int]


def _pack(rows: Sequence[Row]) -> _Batch:
    """Segments -1 padding, 0 context, j+1 continuation j; a continuation's last token is a target, never an input."""
    B, T = len(rows), max(len(r) for r in rows)
    idx, pos = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
    seg = torch.full((B, T), -1, dtype=torch.long)
    head, pair_head, target, owner, ids = [], [], [], [], []
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
            owner += [len(ids)] * len(cont)
            ids.append(row.ids[j])
            start += n
    ar = torch.arange(T)
    mask = (ar[None, :] <= ar[:, None]) & ((seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == 0))
    mask |= torch.eye(T, dtype=torch.bool)  # padding attends to itself: no all-masked softmax row
    return _Batch(idx, pos, mask[:, None], torch.tensor(head), torch.tensor(pair_head), torch.tensor(target),
                  torch.tensor(owner), ids)


def _batch_scores(model: nn.Module, batch: _Batch, vocab_size: int, device: torch.device, dtype: torch.dtype | None,
                  greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per continuation of the batch: summed log-probability (float32) and whether each token is the argmax, on CPU."""
    with autocast_context(device, dtype):
        hidden = model.hidden_states(batch.idx.to(device), pos=batch.pos.to(device),
                                     attn_mask=batch.attn_mask.to(device))
    hidden = hidden.flatten(0, 1)[batch.head.to(device)]
    by_head = torch.argsort(batch.pair_head, stable=True)  # then each chunk of head positions owns a run of pairs
    pair_head = batch.pair_head[by_head]
    bounds = torch.searchsorted(pair_head, torch.arange(0, len(hidden) + HEAD_CHUNK, HEAD_CHUNK)).tolist()
    pair_head, target = pair_head.to(device), batch.target[by_head].to(device)
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
    owner, R = batch.owner[by_head].to(device), len(batch.ids)
    sums = torch.zeros(R, device=device).index_add_(0, owner, lp)
    misses = torch.zeros(R, dtype=torch.long, device=device).index_add_(0, owner, (~hit).long())
    return sums.cpu(), (misses == 0).cpu()


def _unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


@torch.no_grad()
def score_rows(model: nn.Module, rows: Sequence[Row], vocab_size: int, *, device: str | torch.device,
               dtype: torch.dtype | None = None, batch_size: int = 32, greedy: bool = False,
               progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """log P(continuation | context) per continuation id (float64 [n], n the rows' ids) and, with `greedy`, whether
    every token is the argmax. `model` needs `hidden_states(idx, pos=, attn_mask=)`, `logits` and `config`;
    `vocab_size` is the tokenizer's; `dtype` bf16/fp16 runs under autocast; the train/eval mode is restored."""
    device, model = torch.device(device), _unwrap(model)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: must be >= 1")
    if not 0 < vocab_size <= model.config.vocab_size:
        raise ValueError(f"vocab_size={vocab_size}: must be in 1..{model.config.vocab_size}, the model's head")
    n = sum(len(r.ids) for r in rows)
    logprob, is_greedy = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.bool)
    rows = sorted(rows, key=len, reverse=True)  # similar lengths share a forward; the longest (most memory) first
    was_training = model.training
    model.eval()
    try:
        for b in tqdm(range(0, len(rows), batch_size), desc="scoring", unit="batch", disable=not progress):
            batch = _pack(rows[b:b + batch_size])
            sums, hits = _batch_scores(model, batch, vocab_size, device, dtype, greedy)
            logprob[batch.ids], is_greedy[batch.ids] = sums.double(), hits
    finally:
        model.train(was_training)
    return logprob, is_greedy


def fit_example(example: Example, block_size: int) -> tuple[list[int], list[list[int]]]:
    """The context (cut from the left) and endings such that every context+ending row fits block_size."""
    if not example.endings:
        raise UserError(f"{example.name}: no endings")
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


@torch.no_grad()
def score_examples(model: nn.Module, examples: Sequence[Example], vocab_size: int, *, device: str | torch.device,
                   batch_size: int = 32, dtype: torch.dtype | None = None, rank: int | None = None,
                   world_size: int | None = None, progress: bool = True) -> ChoiceResult:
    """Multiple-choice examples scored by completion loss through `score_rows`, one row per example.

    rank/world_size default to torch.distributed's (else 0/1): this rank scores examples[rank::world_size], counts
    are all-reduced and predictions gathered to rank 0 in input order, so every rank must call this."""
    distributed = dist.is_available() and dist.is_initialized()
    rank = (dist.get_rank() if distributed else 0) if rank is None else rank
    world_size = (dist.get_world_size() if distributed else 1) if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not in 0..{world_size - 1} (world_size={world_size})")
    if world_size > 1 and not distributed:
        raise ValueError(f"world_size={world_size} but torch.distributed is not initialised: counts could not be "
                         "combined across ranks")
    block_size = _unwrap(model).config.block_size
    positions, rows, n = list(range(rank, len(examples), world_size)), [], 0
    for i in positions:
        context, endings = fit_example(examples[i], block_size)
        rows.append(Row(context, endings, list(range(n, n + len(endings)))))
        n += len(endings)
    t0 = time.perf_counter()
    logprob, _ = score_rows(model, rows, vocab_size, device=device, dtype=dtype, batch_size=batch_size,
                            progress=progress and rank == 0)
    losses = (-logprob).tolist()
    local = [_prediction(examples[i], [losses[k] for k in r.ids], [len(e) for e in r.continuations])
             for i, r in zip(positions, rows)]
    counts = torch.tensor([len(local), sum(p["pred"] == p["label"] for p in local),
                           sum(p["pred_norm"] == p["label"] for p in local)], dtype=torch.long)
    predictions = local
    if distributed and world_size > 1:
        predictions = _combine(counts, positions, local, len(examples), rank, world_size, torch.device(device))
    count, correct, correct_norm = (int(x) for x in counts)
    if count == 0:  # an accuracy of zero examples is no number: the caller must refuse an empty task before this
        raise ValueError("no multiple-choice examples were scored: an accuracy over zero examples is undefined")
    seconds = time.perf_counter() - t0
    return ChoiceResult(count, correct, correct_norm, correct / count, correct_norm / count, predictions,
                        count / seconds if seconds > 0 else 0.0)


def _combine(counts: torch.Tensor, positions: list[int], local: list[dict], total: int, rank: int, world_size: int,
             device: torch.device) -> list[dict]:
    """Sum `counts` over the ranks in place; rank 0 gets every rank's predictions back in input order."""
    on_device = counts.to(device) if dist.get_backend() == "nccl" else counts
    dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
    counts.copy_(on_device.cpu())
    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object((positions, local), gathered, dst=0)
    if rank != 0:
        return local
    slots: list[dict] = [{}] * total
    for where, preds in gathered:
        for i, p in zip(where, preds):
            slots[i] = p
    return slots


def write_predictions(path: str | Path, result: ChoiceResult) -> Path:
    """One JSON object per example (index, label, pred, pred_norm, sum_losses, mean_losses); atomic."""
    path = Path(path)
    with atomic_write(path) as f:
        for p in result.predictions:
            f.write(json.dumps(p) + "\n")
    return path
