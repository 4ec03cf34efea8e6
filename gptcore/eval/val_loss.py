"""Validation loss over a fixed number of val tokens, the same whatever the world size or batch size.

The first `val_tokens` tokens of the val split are cut into `block_size` windows (targets shifted by one); windows
are dealt round-robin to ranks, each rank sums token losses, and one all-reduce gives the mean over all tokens.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from gptcore import distributed
from gptcore.data import shards
from gptcore.atomic import write_text
from gptcore.eval.multichoice import score_examples
from gptcore.precision import autocast_context


def first_tokens(paths: Sequence[Path], n: int) -> np.ndarray:
    """The first n tokens across the given shards (in order), as a read-only view when they fit in one shard."""
    parts, need = [], n
    for p in paths:
        toks = shards.load_tokens(p)
        parts.append(toks[:need])
        need -= len(parts[-1])
        if need <= 0:
            break
    if need > 0:
        raise ValueError(f"val split has {n - need} tokens, fewer than the {n} asked for (eval.val_tokens / train.val_tokens)")
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


@torch.no_grad()
def val_loss(
    model: torch.nn.Module,
    tokens: np.ndarray,
    block_size: int,
    batch_size: int,
    device: torch.device,
    dtype: torch.dtype | None = None,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = False,
) -> float:
    """Mean next-token cross-entropy over all windows of `tokens` (a model returning (logits, loss) from forward)."""
    n_windows = (len(tokens) - 1) // block_size
    if n_windows == 0:
        raise ValueError(f"{len(tokens)} val tokens do not fill one window of block_size={block_size} (+1)")
    mine = list(range(rank, n_windows, world_size))
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # summed loss, token count
    bar = tqdm(range(0, len(mine), batch_size), desc="val loss", unit="batch", disable=not progress, leave=False)
    for i in bar:
        starts = [w * block_size for w in mine[i : i + batch_size]]
        buf = np.stack([np.asarray(tokens[s : s + block_size + 1], dtype=np.int64) for s in starts])
        xy = torch.from_numpy(buf).to(device, non_blocking=True)
        x, y = xy[:, :-1], xy[:, 1:]
        with autocast_context(device, dtype):
            logits, _ = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1), reduction="sum")
        total[0] += loss.double()
        total[1] += y.numel()
    distributed.all_reduce_sum(total)
    model.train(was_training)
    return (total[0] / total[1]).item()


def check_same_tokenizer(model_tok: object, data_tok: object, model_spec: str, shard_dir: Path) -> None:
    """A model can only be scored on shards made by its own tokenizer (e.g. OpenAI's gpt2 on GPT-2 BPE shards)."""
    a = (getattr(model_tok, "name", None), getattr(model_tok, "vocab_size", None), getattr(model_tok, "eot", None))
    b = (getattr(data_tok, "name", None), getattr(data_tok, "vocab_size", None), getattr(data_tok, "eot", None))
    if a != b:
        raise ValueError(f"eval.model={model_spec} uses tokenizer {a[0]} (vocab {a[1]}, eot {a[2]}) but {shard_dir} was "
                         f"tokenized with {b[0]} (vocab {b[1]}, eot {b[2]}); evaluate on matching shards")


def write_samples(path: Path, prompt: str, texts: list[str], model_spec: str) -> None:
    """Generated samples as a small text file (atomic), prompt shown once per sample."""
    write_text(path, "".join(f"--- sample {i} ({model_spec}) ---\n{prompt}{t}\n\n" for i, t in enumerate(texts)))


class ValLoss:
    """Training-loop evaluator: `val_loss` over fixed val tokens (every rank calls it; all get the same value)."""

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, device: torch.device,
                 dtype: torch.dtype | None, rank: int = 0, world_size: int = 1, progress: bool = False) -> None:
        self.args = (tokens, block_size, batch_size, device, dtype, rank, world_size, progress)

    def __call__(self, model: torch.nn.Module, step: int) -> dict[str, float]:
        return {"val_loss": val_loss(model, *self.args)}


class ChoiceTask:
    """Training-loop evaluator for a multiple-choice task (HellaSwag): `<name>_acc_norm` and `<name>_acc`."""

    def __init__(self, name: str, examples: list, batch_size: int, device: torch.device, dtype: torch.dtype,
                 progress: bool = False) -> None:
        self.name, self.examples = name, examples
        self.kwargs = dict(device=device, batch_size=batch_size, dtype=dtype, progress=progress)

    def __call__(self, model: torch.nn.Module, step: int) -> dict[str, float]:
        r = score_examples(model, self.examples, **self.kwargs)
        return {f"{self.name}_acc_norm": r.acc_norm, f"{self.name}_acc": r.acc}
