"""The `model/` folder a run exports and the one function that writes it (docs/export-and-sampling.md lists what it
holds); nothing in it varies between two runs of the same params and data, so DVC does not rerun evaluate."""
from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gptcore.atomic import staged_dir, swap_dir, write_json, write_text
from gptcore.data.tokenizers import Tokenizer
from gptcore.model.gpt import GPT
from gptcore.model.hf import export_hf
from gptcore.model.load import MODEL_FILE
from gptcore.process import NotRepresentable
from gptcore.train.checkpoint import atomic_torch_save

NOT_EXPORTED = "NOT_EXPORTED.txt"  # in model/hf when no transformers architecture represents the model


def export_model(model_dir: Path, model: GPT, tokenizer: Tokenizer | None, record: dict[str, Any],
                 hardware: dict[str, Any] | None = None, hf_vocab_size: int | None = None) -> list[str]:
    """Build `model_dir` aside for `model` and its data's tokenizer, with `record` (step, export, ...) in model.pt and
    manifest.json, and swap it in whole; one note per fact worth showing (which HF architecture, or why none)."""
    model_dir = Path(model_dir)
    staged = staged_dir(model_dir)  # a kill leaves it behind, never a model_dir of two runs
    shutil.rmtree(staged, ignore_errors=True)  # what a killed export left
    staged.mkdir(parents=True)
    data = tokenizer.record() if tokenizer is not None else None
    if tokenizer is not None and hf_vocab_size is None:
        hf_vocab_size = tokenizer.vocab_size
    atomic_torch_save({"model": model.state_dict(), "model_config": asdict(model.config),
                       **({"data": data} if data else {}), **record}, staged / MODEL_FILE)
    notes = [_export_hf(model, staged / "hf", tokenizer, hf_vocab_size)]
    if tokenizer is not None:
        tokenizer.save(staged)  # the folder carries its tokenizer: sampling and evaluate need nothing else
        manifest = {"tokenizer": data, **{k: v for k, v in record.items() if k != "final"}}
        if hardware is not None:  # where it trained: compare turns training hours into GPU-hours with it
            manifest["hardware"] = hardware
        write_json(staged / "manifest.json", manifest)
    swap_dir(staged, model_dir)
    if record.get("export") == "best":
        notes.append(f"{model_dir}/: the best weights, step {record['step']} of {record['trained_steps']} (val_loss "
                     f"{record['best_val_loss']:.4f})")
    return [n.replace(str(staged), str(model_dir)) for n in notes]


def _export_hf(model: GPT, hf_dir: Path, tokenizer: Tokenizer | None, vocab_size: int | None) -> str:
    """model/hf: the Hugging Face export and, where the tokenizer can write them, its HF tokenizer files."""
    try:
        arch = export_hf(model, hf_dir, vocab_size=vocab_size, eot=None if tokenizer is None else tokenizer.eot)
    except NotRepresentable as e:
        hf_dir.mkdir(exist_ok=True)
        write_text(hf_dir / NOT_EXPORTED, f"{e}; model.pt holds the weights\n")
        return f"no Hugging Face export: {e}"
    if tokenizer is not None:
        tokenizer.save_hf(hf_dir, max_length=model.config.block_size)
    return f"Hugging Face export ({arch}): {hf_dir}"
