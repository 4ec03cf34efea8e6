"""The held-out loss: mean next-token cross-entropy over a split's first `val_tokens` targets, whatever the world
size or batch size, and the same loss in bits per character (comparable across tokenizers)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from gptcore import distributed
from gptcore.data import shards
from gptcore.data.shard_set import ShardSet
from gptcore.device import autocast_context
from gptcore.errors import UserError
from gptcore.params import ParamError


def first_tokens(paths: Sequence[Path], n: int, vocab_size: int | None = None) -> np.ndarray:
    """The first n tokens across these shards (a view when one holds them), ids checked against `vocab_size`."""
    parts, need = [], n
    for p in paths:
        parts.append(shards.load_tokens(p)[:need])
        if vocab_size is not None:
            shards.check_token_range(parts[-1], vocab_size, p)
        need -= len(parts[-1])
        if need <= 0:
            break
    if need > 0:
        raise ValueError(f"the shards hold {n - need} tokens, fewer than the {n} asked for")
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def scored_count(key: str, val_tokens: int | None, block_size: int, split_tokens: int | None = None) -> int | None:
    """How many val tokens a val loss scores: `val_tokens` (train.val_tokens, eval.val_tokens) at most, all of the split
    where it holds fewer or with null, as lm-eval's --limit; one full window of the model's context at least. With the
    split's size unknown, only `val_tokens` is checked (None comes back for null)."""
    if val_tokens is not None and val_tokens < block_size:
        raise ParamError(key, val_tokens, f"must be >= the model's block_size = {block_size} (at least one full "
                                          f"window of targets)")
    if split_tokens is None:
        return val_tokens
    n = split_tokens if val_tokens is None else min(val_tokens, split_tokens)
    if n < block_size:
        raise ParamError(key, val_tokens, f"the val split holds {split_tokens:,} tokens, under one window of the "
                                          f"model's block_size = {block_size}: tokenize a larger val split "
                                          f"(tokenize.val_tokens, or val_fraction with val_tokens null)")
    return n


def val_stream(data: ShardSet, val_tokens: int) -> np.ndarray:
    """The `val_tokens + 1` tokens val_loss scores: the val split, then, when it holds exactly val_tokens, the train
    split's first token (which the loader only uses as an input); ids are checked against the tokenizer's."""
    if data.tokens["val"] < val_tokens:
        raise UserError(f"{data.folder}: the val split has {data.tokens['val']:,} tokens, fewer than "
                        f"val_tokens={val_tokens:,} (eval.val_tokens / train.val_tokens)")
    return first_tokens(data.splits["val"] + data.splits["train"], val_tokens + 1, data.vocab_size)


@torch.no_grad()
def val_loss(model: torch.nn.Module, tokens: np.ndarray, block_size: int, batch_size: int, device: torch.device,
             dtype: torch.dtype | None = None, rank: int = 0, world_size: int = 1, progress: bool = False,
             lockstep: bool = False) -> float:
    """Mean next-token cross-entropy over the len(tokens) - 1 targets of `tokens` (`model(x, y, reduction="sum")`),
    whatever the world size or batch size: block_size windows (the last may be shorter) dealt round-robin to ranks,
    as build-nanogpt does. `lockstep`: every rank runs as many passes (a sharded model's passes are collectives), a
    rank with fewer windows scoring its first batch again and counting nothing of it."""
    n = len(tokens) - 1
    if n < 1:
        raise ValueError(f"{len(tokens)} val tokens hold no target")
    starts = list(range(0, n, block_size))[rank::world_size]
    full = [s for s in starts if s + block_size <= n]
    # a shorter last window, when block_size does not divide n, goes in a batch of its own (it can only be the last)
    batches = [full[i : i + batch_size] for i in range(0, len(full), batch_size)] + [[s] for s in starts[len(full):]]
    counted = len(batches)
    if lockstep and world_size > 1:
        most = max(_batch_count(n, block_size, batch_size, r, world_size) for r in range(world_size))
        batches += [batches[0] if batches else [0]] * (most - len(batches))
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # summed loss, token count
    for i, batch in enumerate(tqdm(batches, desc="val loss", unit="batch", disable=not progress, leave=False)):
        length = min(block_size, n - batch[0])
        buf = np.stack([np.asarray(tokens[s : s + length + 1], dtype=np.int64) for s in batch])
        xy = torch.from_numpy(buf).to(device, non_blocking=True)
        x, y = xy[:, :-1], xy[:, 1:]
        with autocast_context(device, dtype):
            _, loss = model(x, y, reduction="sum")
        if i < counted:
            total[0] += loss.double()
            total[1] += y.numel()
    distributed.all_reduce_sum(total)
    model.train(was_training)
    return (total[0] / total[1]).item()


def _batch_count(n: int, block_size: int, batch_size: int, rank: int, world_size: int) -> int:
    """How many batches val_loss makes for `rank`: its full windows in batches, and its shorter last one alone."""
    starts = list(range(0, n, block_size))[rank::world_size]
    full = sum(1 for s in starts if s + block_size <= n)
    return -(-full // batch_size) + len(starts) - full


def scored_chars(tokens: np.ndarray, tokenizer: object) -> int:
    """How many characters the targets `val_loss` scores (tokens[1:]) decode to, document by document (end-of-text is
    scored but no character): a loss per character compares across tokenizers."""
    targets, eot = np.asarray(tokens[1:]), tokenizer.eot
    documents = np.split(targets, np.flatnonzero(targets == eot))  # each but the first opens with its eot
    return sum(len(tokenizer.decode(d[d != eot].tolist())) for d in documents)


def bits_per_char(loss: float, tokens: np.ndarray, tokenizer: object) -> float:
    """`val_loss` over `tokens` (nats per target token) as bits per character: loss x targets / characters / ln 2."""
    chars = scored_chars(tokens, tokenizer)
    if chars == 0:
        raise UserError(f"the {len(tokens) - 1:,} scored val tokens decode to no characters (only end-of-text "
                        f"tokens): bits per character is undefined; raise eval.val_tokens")
    return loss * (len(tokens) - 1) / chars / math.log(2)
