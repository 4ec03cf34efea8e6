"""Checkpoints: atomic save, keep-last-K, a fingerprint of the params that shape a run, resume and moving aside; a
`ckpt_{step:07d}.pt` (train.parallel ddp) or a sharded `ckpt_{step:07d}.dcp/` folder (fsdp: sharded_checkpoints.py)
holds all a bit-exact resume needs (docs/resume-and-failures.md lists it). A run resumes from either kind."""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from gptcore import distributed
from gptcore.atomic import TMP_SUFFIX, NotRenamable, check_writable, json_sha256, write_text
from gptcore.errors import UserError
from gptcore.model.checkpoint_file import CheckpointRefused, CorruptCheckpoint, atomic_torch_save
from gptcore.model.checkpoint_file import read_checkpoint as load_checkpoint
from gptcore.params import ParamError
from gptcore.train import sharded_checkpoints

CKPT_RE = re.compile(r"^ckpt_(\d{7})\.(pt|dcp)$")  # a file, or (fsdp) a folder of shards
BEST_RE = re.compile(r"^best_(\d{7})\.pt$")
PREVIOUS = "previous"  # checkpoints/previous/<UTC time>/: what a fresh run moved aside
CURVES_STAMP = ".run_fingerprint"  # in metrics/train/: the run whose curves the folder holds


run_fingerprint = json_sha256  # the hash of the params that shape a run's weights (as the shards' fingerprint)


def param_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for each key two nested params dicts give differently."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += param_changes(a, b, name + ".")
        elif a != b:
            out.append((name, a, b))
    return out


def param_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable differences between two nested params dicts, e.g. ['train.max_lr: 0.0006 -> 0.001']."""
    return [f"{key}: {a!r} -> {b!r}" for key, a, b in param_changes(old, new)]


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


def find_resume(ckpt_dir: Path, run_params: dict[str, Any], also: list[Path] = (),
                preset: dict[str, Any] | None = None) -> tuple[Path | None, dict[str, Any] | None, str]:
    """(path, loaded checkpoint, what was decided, naming the params that differ): the newest readable checkpoint if
    a run with these params wrote it, else an earlier run of theirs in ckpt_dir/previous/ (see `bring_back`) or None
    (see `move_aside`): another run's is never resumed. Call on one process only: it renames damaged ones."""
    notes: list[str] = []
    for path in reversed(list_checkpoints(ckpt_dir)):
        try:
            ckpt = read_run_checkpoint(path)
            break
        except CorruptCheckpoint as e:  # set aside; any other failure leaves every file in place for the rerun
            aside = set_aside(path)
            notes.append(f"{e}; set aside as {aside}")
    else:
        path = ckpt = None
    changes: list[tuple[str, Any, Any]] | None = None
    if path is not None and _same_run(ckpt, run_params):
        foreign = _foreign_curves(also, run_fingerprint(run_params))
        if foreign is None:
            return path, ckpt, "; ".join(notes + [f"resuming from {path} (step {ckpt['step']})"])
        why = (f"{path} is this run's, but {foreign}/ holds another run's step metrics (`dvc exp apply` restores "
               f"them, not checkpoints/), so it is not resumed: the curves would mix two runs")
    elif path is None:
        why = f"no readable checkpoint in {ckpt_dir}"
    else:
        changes = param_changes(ckpt.get("params", {}), run_params)
        why = f"{path} was written by a run with other params, so it is not resumed"
    earlier, skipped = _earlier_run(ckpt_dir, run_params, also)
    notes += skipped
    if earlier is not None:
        return earlier[0], earlier[1], "; ".join(notes + [f"{why}; {earlier[0].parent} holds a run with these "
                                                          f"params (step {earlier[1]['step']}): bringing it back"])
    fresh = f"; {retrain_note(ckpt, changes, preset)}" if changes is not None else ": starting from step 0"
    return None, None, "; ".join(notes + [why + fresh])


def retrain_note(ckpt: dict[str, Any], changes: list[tuple[str, Any, Any]],
                 preset: dict[str, Any] | None = None) -> str:
    """Why a checkpoint of other params is not resumed, its keys old -> new. When the run it replaces had finished and
    a key went back to the preset's value (`preset`: {dotted key: value}, what `dvc exp run` composes with no -S),
    also the likely cause: `dvc exp run` composes params.yaml from conf/ afresh, so an earlier -S is gone unless
    repeated. A change the user asked for (a value that is not the preset's) gets no such sentence."""
    note = f"starting fresh ({'; '.join(f'{k}: {a!r} -> {b!r}' for k, a, b in changes) or '(params not recorded)'})"
    max_steps = (ckpt.get("params") or {}).get("train", {}).get("max_steps")
    finished = isinstance(max_steps, int) and max_steps > 0 and ckpt.get("step", -1) >= max_steps
    reverted = [(k, a, b) for k, a, b in changes if preset and k in preset and preset[k] == b]
    if finished and reverted:
        keep = " ".join(f"-S {k}={a}" for k, a, _ in reverted)
        note += (f": the finished run it replaces (step {ckpt['step']} of {max_steps}) had "
                 f"{', '.join(f'{k}={a!r}' for k, a, _ in reverted)}, and this run has the preset's; `dvc exp run` "
                 f"composes params.yaml from conf/ afresh, so an earlier -S holds only where repeated ({keep})")
    return note


def _same_run(ckpt: dict[str, Any], run_params: dict[str, Any]) -> bool:
    # equal params also resume a checkpoint whose fingerprint was written in an older (16-hex) form
    return ckpt.get("fingerprint") == run_fingerprint(run_params) or ckpt.get("params") == run_params


def _foreign_curves(also: list[Path], fingerprint: str) -> Path | None:
    """The first `also` folder whose stamp names another run (None: all this run's, or unstamped, as before stamps)."""
    for folder in map(Path, also):
        stamp = folder / CURVES_STAMP
        if stamp.is_file() and stamp.read_text(encoding="utf-8").strip() != fingerprint:
            return folder
    return None


def _earlier_run(ckpt_dir: Path, run_params: dict[str, Any], also: list[Path] = ()
                 ) -> tuple[tuple[Path, dict[str, Any]] | None, list[str]]:
    """The newest undamaged checkpoint (memory-mapped) of a run with these params in ckpt_dir/previous/, or None; and
    a note for each folder whose checkpoint cannot be read now (it goes unconsidered; nothing there is renamed)."""
    previous = Path(ckpt_dir) / PREVIOUS
    skipped = []
    for folder in sorted(previous.iterdir(), reverse=True) if previous.is_dir() else []:
        for path in reversed(list_checkpoints(folder)):
            try:
                ckpt = read_run_checkpoint(path, mmap=True)
            except CorruptCheckpoint:
                continue
            except CheckpointRefused as e:
                skipped.append(f"{e} (so the run in {folder} was not considered for resuming)")
                break
            kept = [_kept_in(folder, p) for p in map(Path, also)]
            if _same_run(ckpt, run_params) and _foreign_curves(kept, run_fingerprint(run_params)) is None:
                return (path, ckpt), skipped
            break  # the folder's newest undamaged checkpoint says which run it holds
    return None, skipped


def _run_file(p: Path) -> bool:
    """A run's own file in a checkpoint folder: a checkpoint (set aside as corrupt or not) or best weights."""
    return bool(CKPT_RE.match(re.sub(r"\.corrupt(-\d+)?$", "", p.name)) or BEST_RE.match(p.name))


def _kept_in(folder: Path, p: Path) -> Path:
    """Where move_aside keeps `also` folder `p` inside `folder`: its relative path there, or its name if absolute."""
    return Path(folder) / (p.name if p.is_absolute() else p)


def bring_back(folder: Path, ckpt_dir: Path, also: list[Path] = ()) -> None:
    """Move an earlier run's files back from `folder` in previous/, after move_aside (so nothing replaced is lost)."""
    for p in sorted(Path(folder).iterdir()):
        if _run_file(p):
            os.replace(p, Path(ckpt_dir) / p.name)
    for p in map(Path, also):
        kept = _kept_in(folder, p)
        if kept.exists():
            shutil.rmtree(p, ignore_errors=True)  # move_aside took whatever files it held: empty folders at most
            p.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(kept), str(p))
    if not any(f.is_file() for f in Path(folder).rglob("*")):
        shutil.rmtree(folder)


def move_aside(ckpt_dir: Path, also: list[Path] = ()) -> Path | None:
    """Move a previous run's checkpoints, best weights and `also` (its step metrics) into ckpt_dir/previous/<UTC
    time>/, which it returns (None: nothing to move); a fresh run never deletes the run before it."""
    ckpt_dir = Path(ckpt_dir)
    ckpts = [p for p in ckpt_dir.iterdir() if _run_file(p)] if ckpt_dir.is_dir() else []
    others = [Path(p) for p in also if Path(p).exists() and any(f.is_file() for f in Path(p).rglob("*"))]
    if not ckpts and not others:
        return None
    _check_previous(ckpt_dir)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest, n = ckpt_dir / PREVIOUS / stamp, 1
    while dest.exists():  # two fresh starts within one second
        n += 1
        dest = ckpt_dir / PREVIOUS / f"{stamp}-{n}"
    dest.mkdir(parents=True)
    for p in ckpts:
        os.replace(p, dest / p.name)
    for p in others:
        target = _kept_in(dest, p)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(p), str(target))
    return dest


def _check_previous(ckpt_dir: Path) -> None:
    """ckpt_dir/previous/ takes a run by rename: no symbolic link on the way there, and the same file system as
    ckpt_dir (a rename cannot cross one). Checked before anything moves."""
    previous = ckpt_dir / PREVIOUS
    check_writable(previous, "a fresh run")
    if previous.is_dir() and os.stat(previous).st_dev != os.stat(ckpt_dir).st_dev:
        raise NotRenamable(f"{previous} is on another file system than {ckpt_dir}: a fresh run keeps the previous run "
                           f"there by rename, which cannot cross file systems; make {previous} a folder on the same "
                           f"disk (move what it holds out first), then run again (nothing was moved)")


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


def check_init_from(init_from: str | None, ckpt_dir: Path) -> None:
    """ParamError for an init_from directly in ckpt_dir: a fresh start moves it aside (or keep_checkpoints deletes it),
    so a rerun after a kill would find its starting weights gone. ckpt_dir/previous/ is fine."""
    if init_from and Path(init_from).resolve().parent == Path(ckpt_dir).resolve():
        raise ParamError("model.init_from", init_from,
                         f"is in {ckpt_dir}/, whose checkpoints a fresh run moves aside and keep_checkpoints deletes; "
                         f"copy it out first (cp {init_from} init.pt) and set model.init_from: init.pt")


def prepare_resume(ckpt_dir: Path, run_params: dict[str, Any], is_main: bool, also: list[Path] = (),
                   preset: dict[str, Any] | None = None) -> tuple[dict[str, Any] | None, list[str]]:
    """Collective: the checkpoint every rank resumes from (None: a fresh start), and what rank 0 decided, as lines.
    Rank 0 decides (`find_resume`), moving the run in ckpt_dir and `also` aside and an earlier one back; the others
    then load what it left: the run to resume, if any."""
    check_init_from(run_params["model"].get("init_from"), ckpt_dir)  # every rank: all refuse together
    resume, notes = None, []
    if is_main:
        notes += remove_temp_files(ckpt_dir)
        path, resume, why = find_resume(ckpt_dir, run_params, also, preset)
        notes.append(why)
        earlier = path is not None and path.parent != Path(ckpt_dir)
        if resume is None or earlier:
            moved = move_aside(ckpt_dir, also=also)
            # a line only when a run's checkpoints moved: a fresh clone has just git's step metrics (kept there too)
            if moved is not None and any(_run_file(p) for p in moved.iterdir()):
                others = "".join(f" and {p}/" for p in also)
                notes.append(f"the previous run's checkpoints{others} are kept in {moved}")
        if earlier:
            bring_back(path.parent, ckpt_dir, also)
            resume = read_run_checkpoint(Path(ckpt_dir) / path.name)
            notes.append(f"resuming from {Path(ckpt_dir) / path.name} (step {resume['step']})")
        for folder in map(Path, also):  # the step metrics are this run's: a resume never continues another run's
            folder.mkdir(parents=True, exist_ok=True)
            write_text(folder / CURVES_STAMP, run_fingerprint(run_params) + "\n")
    distributed.barrier()
    if not is_main:
        last = latest_checkpoint(ckpt_dir)
        resume = read_run_checkpoint(last) if last else None
    return resume, notes


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
