"""Checkpoint files: atomic save, keep-last-K, reading one back (damage named and set aside), the RNG states, the
temp files of killed saves, and the best weights (train.export: best). A `ckpt_{step:07d}.pt` (train.parallel ddp) or
a sharded `ckpt_{step:07d}.dcp/` folder (fsdp: sharded_checkpoints.py) holds all a bit-exact resume needs
(docs/resume-and-failures.md lists it); which run resumes from which is gptcore/train/run_folder.py's."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from gptcore.atomic import TMP_SUFFIX
from gptcore.errors import UserError
from gptcore.model.checkpoint_file import atomic_torch_save
from gptcore.model.checkpoint_file import read_checkpoint as load_checkpoint
from gptcore.train import sharded_checkpoints

CKPT_RE = re.compile(r"^ckpt_(\d{7})\.(pt|dcp)$")  # a file, or (fsdp) a folder of shards
BEST_RE = re.compile(r"^best_(\d{7})\.pt$")


def list_checkpoints(ckpt_dir: Path, pattern: re.Pattern = CKPT_RE) -> list[Path]:
    """Finished checkpoints (or other files `pattern` names), oldest first; temp files of a killed save never match."""
    ckpt_dir = Path(ckpt_dir)
    return sorted(p for p in ckpt_dir.iterdir() if pattern.match(p.name)) if ckpt_dir.is_dir() else []


def save_checkpoint(ckpt_dir: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Save `state` as ckpt_{step}.pt and delete all but the newest `keep` checkpoints."""
    path = Path(ckpt_dir) / f"ckpt_{step:07d}.pt"
    atomic_torch_save(state, path)
    remove_old(ckpt_dir, keep)
    return path


def remove_old(ckpt_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (after a new one is whole). A folder is first renamed to a hidden
    temp name, so a kill half way through deleting it leaves no checkpoint with shards missing."""
    for old in list_checkpoints(ckpt_dir)[: -max(1, keep)]:
        if old.is_dir():
            doomed = old.with_name(f".{old.name}.old{TMP_SUFFIX}")
            shutil.rmtree(doomed, ignore_errors=True)
            os.replace(old, doomed)
            shutil.rmtree(doomed)
        else:
            old.unlink(missing_ok=True)


def read_run_checkpoint(path: Path, mmap: bool = False) -> dict[str, Any]:
    """A checkpoint's record, file or sharded folder (CorruptCheckpoint, CheckpointRefused as load_checkpoint): a
    file whole; a folder its record and its shards' sizes checked, the tensors read when the run resumes."""
    if Path(path).is_dir():
        return sharded_checkpoints.read_record(path)
    return load_checkpoint(path, mmap=mmap)


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint (file or folder) to <name>.corrupt (.corrupt-2, ... if taken); the new path."""
    aside, n = path.with_name(path.name + ".corrupt"), 1
    while path.is_dir() and aside.exists():  # a folder cannot replace a folder that holds files
        n += 1
        aside = path.with_name(f"{path.name}.corrupt-{n}")
    os.replace(path, aside)
    return aside


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest finished checkpoint in ckpt_dir, or None."""
    return (list_checkpoints(ckpt_dir) or [None])[-1]


def capture_rng() -> dict[str, Any]:
    """This process's torch (and CUDA) RNG states, to save in a checkpoint."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set the RNG states capture_rng saved."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def remove_temp_files(ckpt_dir: Path) -> list[str]:
    """Delete what saves killed mid-write left in ckpt_dir (hidden `.ckpt_*` / `.best_*` temp files, as large as a
    checkpoint, or a sharded save's temp folder); call only while holding the folder's lock, so no save is under
    way. A note if any were found."""
    ckpt_dir = Path(ckpt_dir)
    found = [p for p in ckpt_dir.iterdir() if p.name.startswith((".ckpt_", ".best_")) and p.name.endswith(TMP_SUFFIX)
             ] if ckpt_dir.is_dir() else []
    size = sum(f.stat().st_size for p in found for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())
    for p in found:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    return [f"removed {len(found)} temp file(s) of interrupted saves ({size / 1e6:,.1f} MB) from {ckpt_dir}"
            ] if found else []


# -- the best weights (train.export: best) -----------------------------------------------------------------------
# one file per improvement, named by step (not nanoGPT's one ckpt.pt): after a kill the resumed run finds the best
# weights its checkpoint recorded, even if a later improvement was written before the kill

def best_path(ckpt_dir: Path, step: int) -> Path:
    """The best-weights file of `step` (zero-padded, so names sort by step)."""
    return Path(ckpt_dir) / f"best_{step:07d}.pt"


def save_best(ckpt_dir: Path, step: int, model_state: dict[str, Any], model_config: dict[str, Any], val_loss: float,
              run_fingerprint: str) -> None:
    """The weights of a new lowest val loss (whole: fsdp gathers them first), atomically, with their step, val loss
    and the run's fingerprint."""
    atomic_torch_save({"model": model_state, "model_config": model_config, "step": step,
                       "val_loss": val_loss, "fingerprint": run_fingerprint}, best_path(ckpt_dir, step))


def prune_best(ckpt_dir: Path, keep_step: int | None) -> None:
    """Delete the best-weights files other than that of `keep_step` (called right after a checkpoint is saved)."""
    for p in list_checkpoints(ckpt_dir, BEST_RE):
        if keep_step is None or p != best_path(ckpt_dir, keep_step):
            p.unlink(missing_ok=True)


def load_best(ckpt_dir: Path, step: int, run_fingerprint: str) -> dict[str, Any]:
    """The best weights recorded for `step`; a UserError naming the file if it is missing or of another run."""
    path = best_path(ckpt_dir, step)
    if not path.is_file():
        raise UserError(f"{path}: the best weights (step {step}) are missing; delete {ckpt_dir} and rerun train")
    best = load_checkpoint(path)
    if best.get("fingerprint") != run_fingerprint or int(best.get("step", -1)) != step:
        raise UserError(f"{path}: written by another run (fingerprint or step differ); delete {ckpt_dir} and rerun")
    return best
