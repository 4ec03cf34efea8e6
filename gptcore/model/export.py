"""The model/ folder a training run leaves: the weights and their record in model.pt and manifest.json (with model.pt's
sha256, taken as it was written), the tokenizer's files, and in hf/ the Hugging Face export; built aside and swapped in
whole."""
from __future__ import annotations

import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gptcore.atomic import swap_dir, write_json, write_text
from gptcore.data.shards import MANIFEST
from gptcore.data.tokenizers.base import Tokenizer
from gptcore.errors import NotRepresentable
from gptcore.folders import staged_dir
from gptcore.model.checkpoint_file import atomic_torch_save
from gptcore.model.gpt import GPT
from gptcore.model.hf import export_hf

MODEL_FILE = "model.pt"  # the final weights in this project's model/ folder
NOT_EXPORTED = "NOT_EXPORTED.txt"  # in model/hf when no transformers architecture represents the model
SHA256_KEY = "sha256"  # in the manifest: {file name: its sha256, taken as it was written}


def _interned(obj: Any) -> Any:
    """`obj` (nested dicts, lists, tuples) with every string interned. pickle writes a string once per object, so a
    resumed run, whose record's strings were read back from a checkpoint, would otherwise write other bytes than an
    uninterrupted run for the same values, and model/ (its sha256 in the manifest) would differ."""
    if isinstance(obj, str):
        return sys.intern(obj)
    if isinstance(obj, dict):
        return {_interned(k): _interned(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_interned(v) for v in obj)
    return obj


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
    sha256 = atomic_torch_save({"model": model.state_dict(), **_interned({"model_config": asdict(model.config),
                                **({"data": data} if data else {}), **record})}, staged / MODEL_FILE)
    hf_dir = staged / "hf"  # the Hugging Face export and, where the tokenizer can write them, its HF tokenizer files
    try:
        arch = export_hf(model, hf_dir, vocab_size=hf_vocab_size, eot=None if tokenizer is None else tokenizer.eot)
    except NotRepresentable as e:
        hf_dir.mkdir(exist_ok=True)
        write_text(hf_dir / NOT_EXPORTED, f"{e}; model.pt holds the weights\n")
        notes = [f"no Hugging Face export: {e}"]
    else:
        notes = [f"Hugging Face export ({arch}): {model_dir / 'hf'}"]
        if tokenizer is not None:
            tokenizer.save_hf(hf_dir, max_length=model.config.block_size)
    if tokenizer is not None:
        tokenizer.save(staged)  # the folder carries its tokenizer: sampling and evaluate need nothing else
        manifest = {"tokenizer": data, **{k: v for k, v in record.items() if k != "final"},
                    SHA256_KEY: {MODEL_FILE: sha256}}  # checked where the weights are read back (model/load.py)
        if hardware is not None:  # where it trained: compare turns training hours into GPU-hours with it
            manifest["hardware"] = hardware
        write_json(staged / MANIFEST, manifest)
    swap_dir(staged, model_dir)
    if record.get("export") == "best":
        notes.append(f"{model_dir}/: the best weights, step {record['step']} of {record['trained_steps']} (val_loss "
                     f"{record['best_val_loss']:.4f})")
    return notes
