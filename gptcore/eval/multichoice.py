"""Multiple-choice scoring by completion loss (HellaSwag style), with a fast path and a plain reference.

An example is a shared context plus K candidate endings (token ids). Each ending is rendered as the row
`context + ending`; the model's cross-entropy over the ending tokens only gives two scores per ending:
the summed loss (lowest wins -> `acc`) and the mean loss per ending token (lowest wins -> `acc_norm`).
Contexts longer than the block size are cut from the left; endings are never cut.

`score_examples_reference` is the obvious version: one forward over the K padded rows per example,
full logits, masked loss (as in build-nanogpt). `score_examples` gives the same losses much faster:
  - the vocabulary projection (the dominant cost for small models) runs only at the positions whose
    next token is an ending token, not at every position of every padded row;
  - the context runs through the trunk once per example, not K times: the K endings are packed after
    it in one sequence, each ending attending to the context and to itself only, with its position
    ids continuing from the end of the context (a block-diagonal causal mask via SDPA);
  - many examples of similar length go through one forward; examples are sharded over DDP ranks.
The packed forward goes through `model.hidden_states(idx, pos=, attn_mask=)` (gptcore's GPT).
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
import torch.nn.functional as F
from tqdm import tqdm

from gptcore.atomic import atomic_write
from gptcore.distributed import autocast_context
from gptcore.errors import UserError

# positions scored through GPT.logits (lm_head, soft-cap) at once: bounds the [positions, vocab] float32 logits in memory
HEAD_CHUNK = 1024


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
    """Counts over all scored examples (all ranks) and, on rank 0, one prediction dict per example.

    A prediction holds index, label, pred (argmin summed loss), pred_norm (argmin mean loss),
    sum_losses and mean_losses (one per ending), so every number can be recomputed by hand.
    """
    count: int
    correct: int
    correct_norm: int
    acc: float
    acc_norm: float
    predictions: list[dict] = field(default_factory=list)
    examples_per_sec: float = 0.0


# -----------------------------------------------------------------------------
# rendering

def fit_example(example: Example, block_size: int) -> tuple[list[int], list[list[int]]]:
    """The context (cut from the left) and endings such that every context+ending row fits block_size."""
    if not example.endings:
        raise UserError(f"{example.name}: no endings")
    if not 0 <= example.label < len(example.endings):
        raise UserError(f"{example.name}: label {example.label} is not in 0..{len(example.endings) - 1}")
    if not example.context:
        raise UserError(f"{example.name}: empty context (the first ending token needs one to be predicted)")
    longest = max(len(e) for e in example.endings)
    if min(len(e) for e in example.endings) == 0:
        raise UserError(f"{example.name}: an ending has no tokens")
    if longest > block_size - 1:
        raise UserError(f"{example.name}: an ending of {longest} tokens does not fit block_size "
                         f"{block_size} with at least one context token")
    return example.context[-(block_size - longest):], example.endings


def render_rows(example: Example, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """build-nanogpt rendering: tokens [K, T] (rows context+ending, right-padded with 0) and a mask [K, T]
    that is 1 over the ending tokens."""
    context, endings = fit_example(example, block_size)
    T = max(len(context) + len(e) for e in endings)
    tokens = torch.zeros(len(endings), T, dtype=torch.long)
    mask = torch.zeros(len(endings), T, dtype=torch.long)
    for i, ending in enumerate(endings):
        row = context + ending
        tokens[i, :len(row)] = torch.tensor(row)
        mask[i, len(context):len(row)] = 1
    return tokens, mask


def masked_row_losses(logits: torch.Tensor, tokens: torch.Tensor,
                      mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed and mean cross-entropy over the masked (ending) tokens of each row: ([K], [K])."""
    shift_logits = logits[:, :-1, :].float()
    shift_tokens = tokens[:, 1:]
    shift_mask = mask[:, 1:].to(shift_logits.dtype)
    losses = F.cross_entropy(shift_logits.flatten(0, 1), shift_tokens.flatten(), reduction="none")
    losses = losses.view(tokens.size(0), -1) * shift_mask
    sum_loss = losses.sum(dim=1)
    return sum_loss, sum_loss / shift_mask.sum(dim=1)


# -----------------------------------------------------------------------------
# shared helpers

def _unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def _prediction(example: Example, sum_losses: Sequence[float], mean_losses: Sequence[float]) -> dict:
    sums, means = [float(x) for x in sum_losses], [float(x) for x in mean_losses]
    return {"index": example.index, "label": example.label,
            "pred": min(range(len(sums)), key=sums.__getitem__),
            "pred_norm": min(range(len(means)), key=means.__getitem__),
            "sum_losses": sums, "mean_losses": means}


def _result(predictions: list[dict], count: int, correct: int, correct_norm: int, seconds: float) -> ChoiceResult:
    if count == 0:  # an accuracy of zero examples is no number: the caller must refuse an empty task before this
        raise ValueError("no multiple-choice examples were scored: an accuracy over zero examples is undefined")
    return ChoiceResult(count=count, correct=correct, correct_norm=correct_norm,
                        acc=correct / count, acc_norm=correct_norm / count,
                        predictions=predictions, examples_per_sec=count / seconds if seconds > 0 else 0.0)


# -----------------------------------------------------------------------------
# reference path

@torch.no_grad()
def score_examples_reference(model: nn.Module, examples: Sequence[Example], *, device: str | torch.device,
                             dtype: torch.dtype | None = None, progress: bool = False) -> ChoiceResult:
    """One padded K-row forward per example with full logits (build-nanogpt style); no DDP sharding."""
    device = torch.device(device)
    model = _unwrap(model)
    block_size = model.config.block_size
    was_training = model.training
    model.eval()
    predictions, correct, correct_norm = [], 0, 0
    t0 = time.perf_counter()
    try:
        for ex in tqdm(examples, desc="multichoice (reference)", unit="ex", disable=not progress):
            tokens, mask = render_rows(ex, block_size)
            tokens, mask = tokens.to(device), mask.to(device)
            with autocast_context(device, dtype):
                logits, _ = model(tokens)
            if logits.shape[:2] != tokens.shape:
                raise RuntimeError(f"model(idx) returned logits {tuple(logits.shape)}; the reference path needs "
                                   f"logits at every position, shape {tuple(tokens.shape)} + (vocab,)")
            sum_loss, mean_loss = masked_row_losses(logits, tokens, mask)
            p = _prediction(ex, sum_loss.tolist(), mean_loss.tolist())
            correct += int(p["pred"] == ex.label)
            correct_norm += int(p["pred_norm"] == ex.label)
            predictions.append(p)
    finally:
        model.train(was_training)
    return _result(predictions, len(predictions), correct, correct_norm, time.perf_counter() - t0)


# -----------------------------------------------------------------------------
# fast path

@dataclass
class _Batch:
    """One forward's worth of examples, flattened to what the loss needs.

    idx/pos [B, T] token and position ids; attn_mask [B, 1, T, T] (True = may attend);
    head_pos [P] flat positions (into B*T) whose hidden state goes through GPT.logits, each once;
    pair_head [N] which head position predicts pair n, pair_target [N] its target token,
    pair_row [N] which (example, ending) row of this batch it belongs to; row_len [R] ending lengths.
    """
    idx: torch.Tensor
    pos: torch.Tensor
    attn_mask: torch.Tensor
    head_pos: torch.Tensor
    pair_head: torch.Tensor
    pair_target: torch.Tensor
    pair_row: torch.Tensor
    row_len: torch.Tensor
    rows_per_example: list[int]


def _packed_length(context: list[int], endings: list[list[int]]) -> int:
    return len(context) + sum(len(e) - 1 for e in endings)


def _build_packed(fitted: list[tuple[list[int], list[list[int]]]]) -> _Batch:
    """Per example one sequence [context | ending_0 | ... | ending_K-1]; ending i sees the context and itself.
    An ending's last token predicts nothing and nothing attends to it, so it is left out of the sequence: it is
    only ever a target."""
    B, T = len(fitted), max(_packed_length(c, e) for c, e in fitted)
    idx = torch.zeros(B, T, dtype=torch.long)
    pos = torch.zeros(B, T, dtype=torch.long)
    seg = torch.full((B, T), -1, dtype=torch.long)  # -1 padding, 0 context, i+1 ending i
    head_pos, pair_head, pair_target, pair_row, row_len, rows_per_example = [], [], [], [], [], []
    row = 0
    for b, (context, endings) in enumerate(fitted):
        C = len(context)
        idx[b, :C] = torch.tensor(context)
        pos[b, :C] = torch.arange(C)
        seg[b, :C] = 0
        shared = len(head_pos)  # the last context position predicts every ending's first token
        head_pos.append(b * T + C - 1)
        start = C
        for i, ending in enumerate(endings):
            E = len(ending)
            idx[b, start:start + E - 1] = torch.tensor(ending[:-1], dtype=torch.long)
            pos[b, start:start + E - 1] = torch.arange(C, C + E - 1)
            seg[b, start:start + E - 1] = i + 1
            pair_head.append(shared)
            pair_target.append(ending[0])
            pair_row.append(row)
            for k in range(1, E):  # ending token k is predicted from ending token k-1
                pair_head.append(len(head_pos))
                head_pos.append(b * T + start + k - 1)
                pair_target.append(ending[k])
                pair_row.append(row)
            row_len.append(E)
            row += 1
            start += E - 1
        rows_per_example.append(len(endings))
    ar = torch.arange(T)
    causal = ar[None, :] <= ar[:, None]  # [query, key]
    same = seg[:, :, None] == seg[:, None, :]
    to_context = (seg[:, None, :] == 0).expand(B, T, T)
    attn_mask = causal & (same | to_context)
    attn_mask |= torch.eye(T, dtype=torch.bool)  # padding rows attend to themselves: no all-masked softmax
    return _Batch(idx, pos, attn_mask[:, None], torch.tensor(head_pos), torch.tensor(pair_head),
                  torch.tensor(pair_target), torch.tensor(pair_row), torch.tensor(row_len), rows_per_example)


def _batch_losses(model: nn.Module, batch: _Batch, device: torch.device,
                  dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed and mean ending loss per row of the batch: ([R], [R]) float32 on the CPU."""
    idx, pos = batch.idx.to(device), batch.pos.to(device)
    with autocast_context(device, dtype):
        hidden = model.hidden_states(idx, pos=pos, attn_mask=batch.attn_mask.to(device))
    hidden = hidden.flatten(0, 1)[batch.head_pos.to(device)]
    # sorted by head position, each chunk of head positions owns a contiguous range of pairs
    by_head = torch.argsort(batch.pair_head, stable=True)
    pair_head_cpu = batch.pair_head[by_head]
    bounds = torch.searchsorted(pair_head_cpu, torch.arange(0, len(hidden) + HEAD_CHUNK, HEAD_CHUNK)).tolist()
    pair_head, pair_target = pair_head_cpu.to(device), batch.pair_target[by_head].to(device)
    pair_row = batch.pair_row[by_head].to(device)
    losses = torch.empty(len(pair_head), device=device)
    for c, start in enumerate(range(0, len(hidden), HEAD_CHUNK)):
        with autocast_context(device, dtype):
            logits = model.logits(hidden[start:start + HEAD_CHUNK])
        logits = logits.float()
        lo, hi = bounds[c], bounds[c + 1]
        local = pair_head[lo:hi] - start
        losses[lo:hi] = logits.logsumexp(dim=-1)[local] - logits[local, pair_target[lo:hi]]
    sums = torch.zeros(len(batch.row_len), device=device).index_add_(0, pair_row, losses).cpu()
    return sums, sums / batch.row_len.to(sums.dtype)


@torch.no_grad()
def score_examples(model: nn.Module, examples: Sequence[Example], *, device: str | torch.device,
                   batch_size: int = 32, dtype: torch.dtype | None = None, rank: int | None = None,
                   world_size: int | None = None, progress: bool = True) -> ChoiceResult:
    """Score multiple-choice examples by completion loss, fast; same predictions as the reference path.

    rank/world_size default to torch.distributed's when it is initialised (else 0/1): this rank scores
    examples[rank::world_size], counts are all-reduced and predictions gathered to rank 0 (in the input
    order). Every rank must call this. `batch_size` is examples per forward; `dtype` bfloat16/float16 runs
    the forward under autocast (None or float32: full precision).
    Model mode (train/eval) is restored afterwards, so this can run inside a training loop.
    """
    device = torch.device(device)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: must be >= 1")
    distributed = dist.is_available() and dist.is_initialized()
    rank = (dist.get_rank() if distributed else 0) if rank is None else rank
    world_size = (dist.get_world_size() if distributed else 1) if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not in 0..{world_size - 1} (world_size={world_size})")
    if world_size > 1 and not distributed:
        raise ValueError(f"world_size={world_size} but torch.distributed is not initialised: counts could not be "
                         "combined across ranks")
    model = _unwrap(model)
    block_size = model.config.block_size
    positions = list(range(rank, len(examples), world_size))
    shard = [examples[i] for i in positions]
    fitted = [fit_example(ex, block_size) for ex in shard]

    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    try:
        # similar lengths in one batch waste little padding; results go back to input order below
        order = sorted(range(len(fitted)), key=lambda i: _packed_length(*fitted[i]))
        local: list[dict | None] = [None] * len(shard)
        bar = tqdm(total=len(shard), desc="multichoice", unit="ex", disable=not progress or rank != 0)
        for b in range(0, len(order), batch_size):
            ids = order[b:b + batch_size]
            part = [fitted[i] for i in ids]
            batch = _build_packed(part)
            sums, means = _batch_losses(model, batch, device, dtype)
            r = 0
            for i, k in zip(ids, batch.rows_per_example):
                local[i] = _prediction(shard[i], sums[r:r + k].tolist(), means[r:r + k].tolist())
                r += k
            bar.update(len(ids))
        bar.close()
    finally:
        model.train(was_training)

    counts = torch.tensor([len(local), sum(p["pred"] == p["label"] for p in local),
                           sum(p["pred_norm"] == p["label"] for p in local)], dtype=torch.long)
    predictions: list[dict] = local  # type: ignore[assignment]
    if distributed and world_size > 1:
        on_device = dist.get_backend() == "nccl"
        counts = counts.to(device) if on_device else counts
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        counts = counts.cpu()
        gathered: list[Any] | None = [None] * world_size if rank == 0 else None
        dist.gather_object((positions, local), gathered, dst=0)
        if rank == 0:
            slots: list[dict | None] = [None] * len(examples)
            for where, preds in gathered:
                for i, p in zip(where, preds):
                    slots[i] = p
            predictions = slots  # type: ignore[assignment]
    count, correct, correct_norm = (int(x) for x in counts)
    return _result(predictions, count, correct, correct_norm, time.perf_counter() - t0)


# -----------------------------------------------------------------------------
# output

def write_predictions(path: str | Path, result: ChoiceResult) -> Path:
    """One JSON object per example (index, label, pred, pred_norm, sum_losses, mean_losses); atomic."""
    path = Path(path)
    with atomic_write(path) as f:
        for p in result.predictions:
            f.write(json.dumps(p) + "\n")
    return path
