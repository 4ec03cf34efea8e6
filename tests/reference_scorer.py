"""The oracle for gptcore.eval.score's packed scorer, and bench_hellaswag's baseline: build-nanogpt's plain way,
one forward per example over its K context+ending rows (right-padded), full logits, masked cross-entropy."""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from gptcore.device import autocast_context
from gptcore.eval.scorer import ChoiceResult, Example, fit_example


def render_rows(example: Example, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [K, T] (context + ending i, right-padded with 0) and a mask [K, T] that is 1 over the ending tokens."""
    context, endings = fit_example(example, block_size)
    T = max(len(context) + len(e) for e in endings)
    tokens = torch.zeros(len(endings), T, dtype=torch.long)
    mask = torch.zeros(len(endings), T, dtype=torch.long)
    for i, ending in enumerate(endings):
        row = context + ending
        tokens[i, :len(row)] = torch.tensor(row)
        mask[i, len(context):len(row)] = 1
    return tokens, mask


@torch.no_grad()
def score_examples_reference(model: torch.nn.Module, examples: Sequence[Example], vocab_size: int, *,
                             device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> ChoiceResult:
    """What score_examples should give, one padded forward per example, softmax over the first `vocab_size` logits."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    predictions, t0 = [], time.perf_counter()
    try:
        for ex in examples:
            tokens, mask = (t.to(device) for t in render_rows(ex, model.config.block_size))
            with autocast_context(device, dtype):
                logits, _ = model(tokens)
            logits = logits[:, :-1, :vocab_size].float()
            losses = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
            mask = mask[:, 1:].float()
            sums = (losses.view(len(tokens), -1) * mask).sum(dim=1)
            means = sums / mask.sum(dim=1)
            predictions.append({"index": ex.index, "label": ex.label, "pred": int(sums.argmin()),
                                "pred_norm": int(means.argmin()), "sum_losses": sums.tolist(),
                                "mean_losses": means.tolist()})
    finally:
        model.train(was_training)
    n = len(predictions)
    correct = sum(p["pred"] == p["label"] for p in predictions)
    correct_norm = sum(p["pred_norm"] == p["label"] for p in predictions)
    return ChoiceResult(n, correct, correct_norm, correct / max(n, 1), correct_norm / max(n, 1), predictions,
                        n / max(time.perf_counter() - t0, 1e-9))
