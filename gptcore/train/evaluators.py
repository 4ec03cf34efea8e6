"""What a training run measures at its eval cadence (val loss, the multiple-choice tasks of train.tasks, text
samples): each an `Evaluator`, its data read before training starts; the loop knows only the protocol."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from gptcore.atomic import write_text
from gptcore.data.shard_set import ShardSet
from gptcore.distributed import DistEnv
from gptcore.eval.sampling import sample
from gptcore.eval.scorer import score_examples
from gptcore.eval.tasks import tasks_named
from gptcore.eval.val_loss import scored_count, val_loss, val_stream
from gptcore.train.config import TrainConfig
from gptcore.train.parallel import parallel_mode

Evaluator = Callable[[torch.nn.Module, int], dict[str, float]]


def samples_folder(folder: Path, samples: int, is_main: bool) -> None:
    """metrics/train/samples, a declared out: made even when train.samples is 0, and then never empty (DVC warns of
    an empty out after every train)."""
    folder.mkdir(parents=True, exist_ok=True)
    if is_main and not samples:
        write_text(folder / "README.txt", "train.samples is 0: no samples\n")


def training_evaluators(cfg: TrainConfig, data: ShardSet, samples_dir: Path, block_size: int, env: DistEnv,
                        dtype: torch.dtype | None, echo: Callable[[str], None] | None = None) -> list[Evaluator]:
    """The evaluators a `train:` section asks for (val loss, each task of train.tasks, samples), their data read
    before training starts. Where the parallel mode shards, every rank runs the same passes (each block's weights are
    gathered for each pass)."""
    is_main, batch, tok, device = env.is_main, cfg.eval_batch, data.tokenizer, env.device
    lockstep = parallel_mode(cfg).lockstep
    tokens = val_stream(data, scored_count("train.val_tokens", cfg.val_tokens, block_size, data.tokens["val"]))
    out: list[Evaluator] = [lambda model, step: {"val_loss": val_loss(model, tokens, block_size, batch, device, dtype,
                                                                      env.rank, env.world_size, is_main, lockstep)}]
    for name, task in tasks_named(cfg.tasks, "train.tasks").items():
        out.append(_task_evaluator(name, task.examples(cfg, tok, tokens, block_size, is_main), tok.vocab_size, batch,
                                   device, dtype, is_main, lockstep))
    if cfg.samples > 0:

        def samples(model: torch.nn.Module, step: int) -> dict[str, float]:
            """Rank 0 writes samples_dir/step_NNNNNNN.txt; seeded by (seed, step), never the global RNG, so a run
            with samples resumes bit-exactly (with fsdp every rank draws the same samples, rank 0 writes them)."""
            if is_main or lockstep:
                texts = sample(model, tok, cfg.sample_prompt, cfg.samples, cfg.sample_tokens,
                               seed=cfg.seed * 1_000_003 + step, device=device, dtype=dtype)
            if is_main:
                body = "".join(f"--- step {step}, sample {i} ---\n{cfg.sample_prompt}{t}\n\n"
                               for i, t in enumerate(texts))
                write_text(samples_dir / f"step_{step:07d}.txt", body)
                if echo is not None:
                    echo(body.rstrip())
            return {}
        out.append(samples)
    return out


def _task_evaluator(name: str, examples: list, vocab_size: int, batch: int, device: torch.device,
                    dtype: torch.dtype | None, progress: bool, lockstep: bool) -> Evaluator:
    """A task's examples scored by the one scorer: `<name>_acc_norm` and `<name>_acc`."""
    def evaluate(model: torch.nn.Module, step: int) -> dict[str, float]:
        r = score_examples(model, examples, vocab_size, device=device, batch_size=batch, dtype=dtype,
                           progress=progress, lockstep=lockstep)
        return {f"{name}_acc_norm": r.acc_norm, f"{name}_acc": r.acc}
    return evaluate
