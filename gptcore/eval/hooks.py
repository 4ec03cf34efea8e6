"""Evaluator hooks, what the training loop runs at its eval cadence, and the one place they are built: the loop knows
only the `Evaluator` protocol, this module knows the tasks."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch

from gptcore.atomic import write_text
from gptcore.data.tokenizers import Tokenizer
from gptcore.eval.score import Example, hellaswag_examples, score_examples, val_loss, val_stream
from gptcore.model.gpt import sample


class Evaluator(Protocol):
    """Runs on every rank at the eval cadence; returns metrics (the same on every rank) for rank 0 to log."""

    def __call__(self, model: torch.nn.Module, step: int) -> dict[str, float]: ...


class ValLoss:
    """`val_loss` over fixed val tokens (every rank calls it; all get the same value)."""

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, device: torch.device,
                 dtype: torch.dtype | None, rank: int = 0, world_size: int = 1, progress: bool = False) -> None:
        self.args = (tokens, block_size, batch_size, device, dtype, rank, world_size, progress)

    def __call__(self, model: torch.nn.Module, step: int) -> dict[str, float]:
        return {"val_loss": val_loss(model, *self.args)}


class ChoiceTask:
    """A multiple-choice task (HellaSwag): `<name>_acc_norm` and `<name>_acc`."""

    def __init__(self, name: str, examples: list[Example], vocab_size: int, batch_size: int, device: torch.device,
                 dtype: torch.dtype | None, progress: bool = False) -> None:
        self.name, self.examples, self.vocab_size = name, examples, vocab_size
        self.kwargs = dict(device=device, batch_size=batch_size, dtype=dtype, progress=progress)

    def __call__(self, model: torch.nn.Module, step: int) -> dict[str, float]:
        r = score_examples(model, self.examples, self.vocab_size, **self.kwargs)
        return {f"{self.name}_acc_norm": r.acc_norm, f"{self.name}_acc": r.acc}


class TrainingSamples:
    """On rank 0, `num_samples` continuations of `prompt` to out_dir/step_NNNNNNN.txt and `echo`; no metrics. Their
    generator is seeded by (seed, step), never the global RNG, so a run with samples resumes bit-exactly."""

    def __init__(self, tokenizer: Tokenizer, out_dir: str | Path, prompt: str, num_samples: int, max_new_tokens: int,
                 seed: int, device: torch.device, is_main: bool, dtype: torch.dtype | None = None,
                 echo: Callable[[str], None] | None = None) -> None:
        self.tokenizer, self.out_dir, self.prompt = tokenizer, Path(out_dir), prompt
        self.num_samples, self.max_new_tokens, self.seed = num_samples, max_new_tokens, seed
        self.device, self.is_main, self.dtype, self.echo = device, is_main, dtype, echo

    def __call__(self, model: torch.nn.Module, step: int) -> dict[str, float]:
        if self.is_main and self.num_samples > 0:
            texts = sample(model, self.tokenizer, self.prompt, self.num_samples, self.max_new_tokens,
                           seed=self.seed * 1_000_003 + step, device=self.device, dtype=self.dtype)
            body = "".join(f"--- step {step}, sample {i} ---\n{self.prompt}{t}\n\n" for i, t in enumerate(texts))
            write_text(self.out_dir / f"step_{step:07d}.txt", body)
            if self.echo is not None:
                self.echo(body.rstrip())
        return {}


def samples_folder(folder: Path, samples: int, is_main: bool) -> None:
    """metrics/train/samples, a declared out: made even when train.samples is 0, and then never empty (DVC warns of
    an empty out after every train)."""
    folder.mkdir(parents=True, exist_ok=True)
    if is_main and not samples:
        write_text(folder / "README.txt", "train.samples is 0: no samples\n")


def training_evaluators(train: dict[str, Any], tok: Tokenizer, shard_dir: Path, samples_dir: Path, block_size: int,
                        device: torch.device, dtype: torch.dtype | None, rank: int, world_size: int,
                        echo: Callable[[str], None] | None = None) -> list[Evaluator]:
    """The evaluators a `train:` section asks for (val loss, HellaSwag, samples), their data read before training."""
    is_main = rank == 0
    tokens = val_stream(shard_dir, train["val_tokens"], tok.vocab_size)
    out: list[Evaluator] = [ValLoss(tokens, block_size, train["val_batch"], device, dtype, rank, world_size, is_main)]
    if train["hellaswag"]:
        examples = hellaswag_examples(tok, train["hellaswag_path"], train["hellaswag_examples"],
                                      "train.hellaswag_path", progress=is_main, block_size=block_size)
        out.append(ChoiceTask("hellaswag", examples, tok.vocab_size, train["val_batch"], device, dtype, is_main))
    if train["samples"] > 0:
        out.append(TrainingSamples(tok, samples_dir, train["sample_prompt"], train["samples"], train["sample_tokens"],
                                   train["seed"], device, is_main, dtype, echo))
    return out
