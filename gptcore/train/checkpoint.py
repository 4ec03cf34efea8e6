"""Checkpoints: atomic save, keep-last-K, a fingerprint of the params that shape a run, resume and moving aside.

A checkpoint is one `torch.save` file `ckpt_{step:07d}.pt` holding everything needed to continue bit-exactly:
model weights (never with torch.compile's `_orig_mod.` or DDP's `module.` prefixes), optimizer, GradScaler, the
loader state, every rank's RNG state, the step, the run's params with their fingerprint, and the format version
(gptcore.model.load.CHECKPOINT_FORMAT; a file of another version is refused, not guessed at).
"""
from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from gptcore import distributed
from gptcore.atomic import TMP_SUFFIX, atomic_write, json_sha256
from gptcore.errors import UserError
from gptcore.model.gpt import GPT
from gptcore.model.load import CHECKPOINT_FORMAT, FORMAT_KEY, CheckpointRefused, CorruptCheckpoint
from gptcore.model.load import read_checkpoint as load_checkpoint
from gptcore.params import ParamError

CKPT_RE = re.compile(r"^ckpt_(\d{7})\.pt$")
BEST_RE = re.compile(r"^best_(\d{7})\.pt$")
PREVIOUS = "previous"  # checkpoints/previous/<UTC time>/: what a fresh run moved aside


def run_fingerprint(params: dict[str, Any]) -> str:
    """The hash of the params that shape a run's weights (atomic.json_sha256, as the shards' fingerprint)."""
    return json_sha256(params)


def param_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Human-readable differences between two nested params dicts, e.g. ['train.max_lr: 0.0006 -> 0.001']."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += param_diff(a, b, name + ".")
        elif a != b:
            out.append(f"{name}: {a!r} -> {b!r}")
    return out


def atomic_torch_save(obj: Any, path: Path) -> None:
    """torch.save through a temp file and a rename: a kill mid-save leaves the old file intact. A dict gets the
    format version, so every checkpoint and model.pt says which layout it holds."""
    if isinstance(obj, dict):
        obj = {FORMAT_KEY: CHECKPOINT_FORMAT, **obj}
    with atomic_write(path, "wb", needed=_tensor_bytes(obj)) as f:
        torch.save(obj, f)


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in a (nested) checkpoint dict: about what torch.save writes."""
    if isinstance(obj, torch.Tensor):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Finished checkpoints, oldest first (temp files from an interrupted save never match)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if CKPT_RE.match(p.name))


def save_checkpoint(ckpt_dir: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Save `state` as ckpt_{step}.pt and delete all but the newest `keep` checkpoints."""
    path = Path(ckpt_dir) / f"ckpt_{step:07d}.pt"
    atomic_torch_save(state, path)
    for old in list_checkpoints(ckpt_dir)[: -max(1, keep)]:
        old.unlink(missing_ok=True)
    return path


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest finished checkpoint in ckpt_dir, or None."""
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


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


def newest_readable(ckpt_dir: Path) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
    """The newest checkpoint that loads, and a note for each newer one that is damaged.

    A damaged checkpoint (CorruptCheckpoint: empty, cut short, foreign) is set aside as `<name>.corrupt`, never
    deleted, so an older good one (train.keep_checkpoints) is used and later runs are not blocked by it. Any other
    failure (CheckpointRefused: an I/O or memory error, another format version; or a bug) propagates with every file
    left in place, so the rerun after the fault resumes from the newest."""
    notes = []
    for path in reversed(list_checkpoints(ckpt_dir)):
        try:
            return path, load_checkpoint(path), notes
        except CorruptCheckpoint as e:
            aside = path.with_name(path.name + ".corrupt")
            os.replace(path, aside)
            notes.append(f"{e}; set aside as {aside}")
    return None, None, notes


def find_resume(ckpt_dir: Path, run_params: dict[str, Any]) -> tuple[Path | None, dict[str, Any] | None, str]:
    """(path, loaded checkpoint, what was decided): the newest readable checkpoint, if a run with these params wrote it.

    Call on one process only (it renames damaged checkpoints). A checkpoint of a run with other params is never
    resumed: the path is then that of an earlier run of these params kept in ckpt_dir/previous/ (the caller brings
    it back, see `bring_back`), or None (the caller starts fresh, see `move_aside`); the sentence says which
    params differ."""
    path, ckpt, notes = newest_readable(ckpt_dir)
    if path is not None and _same_run(ckpt, run_params):
        return path, ckpt, "; ".join(notes + [f"resuming from {path} (step {ckpt['step']})"])
    if path is None:
        why = f"no readable checkpoint in {ckpt_dir}"
    else:
        diff = param_diff(ckpt.get("params", {}), run_params) or ["(params not recorded)"]
        why = f"{path} was written by a run with other params, so it is not resumed"
    earlier, skipped = _earlier_run(ckpt_dir, run_params)
    notes += skipped
    if earlier is not None:
        return earlier[0], earlier[1], "; ".join(notes + [f"{why}; {earlier[0].parent} holds a run with these "
                                                          f"params (step {earlier[1]['step']}): bringing it back"])
    fresh = ": starting from step 0" if path is None else f"; starting fresh ({'; '.join(diff)})"
    return None, None, "; ".join(notes + [why + fresh])


def _same_run(ckpt: dict[str, Any], run_params: dict[str, Any]) -> bool:
    # equal params also resume a checkpoint whose fingerprint was written in an older (16-hex) form
    return ckpt.get("fingerprint") == run_fingerprint(run_params) or ckpt.get("params") == run_params


def _earlier_run(ckpt_dir: Path, run_params: dict[str, Any]) -> tuple[tuple[Path, dict[str, Any]] | None, list[str]]:
    """The newest undamaged checkpoint in ckpt_dir/previous/ of a run with these params (an experiment applied
    again), newest folder first, with its entries (tensors memory-mapped: only the fingerprint is wanted), or None;
    and a note for each folder that could not be looked at. Nothing in previous/ is renamed, and a file there that
    cannot be read now (CheckpointRefused) never stops a run: it only goes unconsidered, which the note says."""
    previous = Path(ckpt_dir) / PREVIOUS
    skipped = []
    for folder in sorted(previous.iterdir(), reverse=True) if previous.is_dir() else []:
        for path in reversed(list_checkpoints(folder)):
            try:
                ckpt = load_checkpoint(path, mmap=True)
            except CorruptCheckpoint:
                continue
            except CheckpointRefused as e:
                skipped.append(f"{e} (so the run in {folder} was not considered for resuming)")
                break
            if _same_run(ckpt, run_params):
                return (path, ckpt), skipped
            break  # the folder's newest undamaged checkpoint says which run it holds
    return None, skipped


def bring_back(folder: Path, ckpt_dir: Path, also: list[Path] = ()) -> None:
    """Move an earlier run's checkpoints, best weights and `also` (as move_aside kept them) from
    ckpt_dir/previous/<time>/ back into place; call after move_aside, so nothing they replace is lost."""
    for p in sorted(Path(folder).iterdir()):
        if CKPT_RE.match(p.name.removesuffix(".corrupt")) or BEST_RE.match(p.name):
            os.replace(p, Path(ckpt_dir) / p.name)
    for p in map(Path, also):
        kept = Path(folder) / (p.name if p.is_absolute() else p)
        if kept.exists():
            shutil.rmtree(p, ignore_errors=True)  # move_aside took whatever files it held: empty folders at most
            p.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(kept), str(p))
    if not any(f.is_file() for f in Path(folder).rglob("*")):
        shutil.rmtree(folder)


def move_aside(ckpt_dir: Path, also: list[Path] = ()) -> Path | None:
    """Move a previous run's checkpoints and best weights (and `also`, e.g. its step metrics) into
    ckpt_dir/previous/<UTC time>/. A fresh run never deletes the work of the run before it (nor inherits its best);
    returns the folder, or None when there was nothing."""
    ckpt_dir = Path(ckpt_dir)
    ckpts = [p for p in ckpt_dir.iterdir() if CKPT_RE.match(p.name.removesuffix(".corrupt")) or BEST_RE.match(p.name)
             ] if ckpt_dir.is_dir() else []
    others = [Path(p) for p in also if Path(p).exists() and any(f.is_file() for f in Path(p).rglob("*"))]
    if not ckpts and not others:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = ckpt_dir / PREVIOUS / stamp
    n = 1
    while dest.exists():  # two fresh starts within one second
        n += 1
        dest = ckpt_dir / PREVIOUS / f"{stamp}-{n}"
    dest.mkdir(parents=True)
    for p in ckpts:
        os.replace(p, dest / p.name)
    for p in others:
        target = dest / (p.name if p.is_absolute() else p)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(p), str(target))
    return dest


def remove_temp_files(ckpt_dir: Path) -> list[str]:
    """Delete what saves killed mid-write left in ckpt_dir (hidden `.ckpt_*` / `.best_*` temp files, as large as a
    checkpoint); call only while holding the folder's lock, so no save is under way. A note if any were found."""
    ckpt_dir = Path(ckpt_dir)
    found = [p for p in ckpt_dir.iterdir() if p.name.startswith((".ckpt_", ".best_")) and p.name.endswith(TMP_SUFFIX)
             ] if ckpt_dir.is_dir() else []
    size = sum(p.stat().st_size for p in found)
    for p in found:
        p.unlink(missing_ok=True)
    if not found:
        return []
    return [f"removed {len(found)} temp file(s) of interrupted saves ({size / 1e6:,.1f} MB) from {ckpt_dir}"]


def check_init_from(init_from: str | None, ckpt_dir: Path) -> None:
    """A run may not start from a file directly in its checkpoint folder: a fresh start moves those aside (and
    keep_checkpoints deletes old ones), so a rerun after a kill would find its starting weights gone. ParamError
    saying to copy it out; files in ckpt_dir/previous/ stay where they are and are fine."""
    if init_from and Path(init_from).resolve().parent == Path(ckpt_dir).resolve():
        raise ParamError("model.init_from", init_from,
                         f"is in {ckpt_dir}/, whose checkpoints a fresh run moves aside and keep_checkpoints deletes; "
                         f"copy it out first (cp {init_from} init.pt) and set model.init_from: init.pt")


def prepare_resume(ckpt_dir: Path, run_params: dict[str, Any], is_main: bool, also: list[Path] = ()
                   ) -> tuple[dict[str, Any] | None, list[str]]:
    """Collective: the checkpoint every rank resumes from (None: a fresh start), and what rank 0 decided, as lines.

    Rank 0 alone decides (`find_resume`) and, unless the run in ckpt_dir is resumed, moves it and `also` (its step
    metrics) aside, then brings back an earlier run of these params from previous/ if there is one; the other ranks
    then load what it left: the run to resume, if any."""
    check_init_from(run_params["model"].get("init_from"), ckpt_dir)  # every rank: all refuse together
    resume, notes = None, []
    if is_main:
        notes += remove_temp_files(ckpt_dir)
        path, resume, why = find_resume(ckpt_dir, run_params)
        notes.append(why)
        earlier = path is not None and path.parent != Path(ckpt_dir)
        if resume is None or earlier:
            moved = move_aside(ckpt_dir, also=also)
            # a line only when a run's checkpoints moved: a fresh clone has just git's step metrics (kept there too)
            if moved is not None and any(CKPT_RE.match(p.name.removesuffix(".corrupt")) or BEST_RE.match(p.name)
                                         for p in moved.iterdir()):
                others = "".join(f" and {p}/" for p in also)
                notes.append(f"the previous run's checkpoints{others} are kept in {moved}")
        if earlier:
            bring_back(path.parent, ckpt_dir, also)
            resume = load_checkpoint(Path(ckpt_dir) / path.name)
            notes.append(f"resuming from {Path(ckpt_dir) / path.name} (step {resume['step']})")
    distributed.barrier()
    if not is_main:
        last = latest_checkpoint(ckpt_dir)
        resume = load_checkpoint(last) if last else None
    return resume, notes


# -- the best weights (train.export: best) -----------------------------------------------------------------------
# One file per improvement, named by step, rather than nanoGPT's single ckpt.pt overwritten on improvement: a
# checkpoint records the best step it knows, so after a kill the resumed run finds exactly those weights even if a
# later improvement (which the resumed run will redo) was written before the kill. Weights only: a 124M model's
# file is 0.5 GB, written at the eval cadence when the val loss improves.

def best_path(ckpt_dir: Path, step: int) -> Path:
    """checkpoints/best_{step:07d}.pt"""
    return Path(ckpt_dir) / f"best_{step:07d}.pt"


def list_best(ckpt_dir: Path) -> list[Path]:
    """Best-weights files, oldest first."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if BEST_RE.match(p.name))


def save_best(ckpt_dir: Path, step: int, model: GPT, val_loss: float, run_fingerprint: str) -> Path:
    """The weights of a new lowest val loss, atomically, with their step, val loss and the run's fingerprint."""
    path = best_path(ckpt_dir, step)
    atomic_torch_save({"model": model.state_dict(), "model_config": asdict(model.config), "step": step,
                       "val_loss": val_loss, "fingerprint": run_fingerprint}, path)
    return path


def prune_best(ckpt_dir: Path, keep_step: int | None) -> None:
    """Delete the best-weights files other than that of `keep_step` (called right after a checkpoint is saved)."""
    for p in list_best(ckpt_dir):
        if keep_step is None or p != best_path(ckpt_dir, keep_step):
            p.unlink(missing_ok=True)


def load_best(ckpt_dir: Path, step: int, run_fingerprint: str) -> dict[str, Any]:
    """The best weights recorded for `step`; ValueError naming the file if it is missing or of another run."""
    path = best_path(ckpt_dir, step)
    if not path.is_file():
        raise UserError(f"{path}: the best weights (step {step}) are missing; delete {ckpt_dir} and rerun train")
    best = load_checkpoint(path)
    if best.get("fingerprint") != run_fingerprint or int(best.get("step", -1)) != step:
        raise UserError(f"{path}: written by another run (fingerprint or step differ); delete {ckpt_dir} and rerun")
    return best
