"""The run folder's lifecycle: which run checkpoints/ holds, and what a new run does with it. The same run (the same
fingerprint: the params that shape the weights and the data) resumes from its newest readable checkpoint; another
run's is never resumed: a fresh start moves it, with its step metrics, to checkpoints/previous/<UTC time>/ (never
deleting it), and a run of these params kept there comes back by itself. The later stages' results in the workspace
(evaluate's and compare's files, `results`) are the run's before this one: they move aside and come back with it, so
no view sets a running run beside another run's figures. Checkpoint files themselves are
gptcore/train/checkpoints.py's."""
from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptcore import distributed
from gptcore.atomic import write_text
from gptcore.digests import json_sha256
from gptcore.folders import NotRenamable, check_writable, is_mount_point
from gptcore.model.checkpoint_file import CheckpointRefused, CorruptCheckpoint
from gptcore.params import ParamError
from gptcore.train.checkpoints import (
    BEST_RE,
    CKPT_RE,
    LEGACY_RE,
    latest_checkpoint,
    list_checkpoints,
    read,
    refuse_legacy,
    remove_temp_files,
    set_aside,
)

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


def find_resume(ckpt_dir: Path, run_params: dict[str, Any], also: list[Path] = (),
                presets: Presets | None = None) -> tuple[Path | None, dict[str, Any] | None, str]:
    """(path, its record, what was decided, naming the params that differ): the newest checkpoint that passes its
    checks if a run with these params wrote it (every file's sha256 checked: `checkpoints.read`), else an earlier run
    of theirs in ckpt_dir/previous/ (see `bring_back`) or None (see `move_aside`): another run's is never resumed, nor
    a checkpoint of an older gptcore (refused in one line). Call on one process only: it renames damaged ones."""
    refuse_legacy(ckpt_dir)
    notes: list[str] = []
    for path in reversed(list_checkpoints(ckpt_dir)):
        try:
            ckpt = read(path, full=False)  # the record first: another run's shards need no reading
            if _same_run(ckpt, run_params):
                ckpt = read(path)  # every file's sha256, before any tensor is used
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
    fresh = f"; {retrain_note(ckpt, changes, presets)}" if changes is not None else ": starting from step 0"
    return None, None, "; ".join(notes + [why + fresh])


@dataclass(frozen=True)
class Presets:
    """What `dvc exp run` composes with no -S, for a replaced run's note: each preset's `model:` and `train:` values by
    dotted key (gptcore.presets.preset_table) and the preset this run's params.yaml was composed from (None:
    unknown, as for a params.yaml written by hand)."""

    current: str | None
    values: dict[str, dict[str, Any]] = field(default_factory=dict)

    def closest(self, params: dict[str, Any]) -> str | None:
        """The preset whose values a run's params (as its checkpoint records them) differ from in the fewest keys,
        the current one first on a tie; None without presets."""
        flat = {f"{section}.{key}": value for section in ("model", "train")
                for key, value in (params.get(section) or {}).items()}

        def misses(name: str) -> int:
            values = self.values[name]
            return sum(1 for k, v in flat.items() if k in values and values[k] != v)

        names = sorted((n for n, v in self.values.items() if v), key=lambda n: (misses(n), n != self.current))
        return names[0] if names else None


def retrain_note(ckpt: dict[str, Any], changes: list[tuple[str, Any, Any]], presets: Presets | None = None) -> str:
    """Why a checkpoint of other params is not resumed, in one short line. A switch of preset is named as such
    (`preset smoke -> quickstart, 17 params differ`); otherwise each key old -> new. When the run it replaces had
    finished and an -S of it is gone (its value was not its preset's, and this run has its own preset's), also the
    likely cause: `dvc exp run` composes params.yaml from conf/ afresh, so an earlier -S holds only where repeated,
    naming the -S to repeat. A change the user asked for gets no such sentence."""
    presets = presets or Presets(None)
    old_name = presets.closest(ckpt.get("params") or {})
    now = presets.values.get(presets.current, {})
    before = presets.values.get(old_name, {})
    if old_name is not None and presets.current is not None and old_name != presets.current:
        note = f"starting fresh (preset {old_name} -> {presets.current}, {len(changes)} params differ)"
    else:
        note = f"starting fresh ({'; '.join(f'{k}: {a!r} -> {b!r}' for k, a, b in changes) or '(params not recorded)'})"
    max_steps = (ckpt.get("params") or {}).get("train", {}).get("max_steps")
    finished = isinstance(max_steps, int) and max_steps > 0 and ckpt.get("step", -1) >= max_steps
    lost = [(k, a, b) for k, a, b in changes if k in now and now[k] == b and k in before and before[k] != a]
    if finished and lost:
        keep = " ".join(f"-S {k}={a}" for k, a, _ in lost)
        note += (f": the finished run it replaces (step {ckpt['step']} of {max_steps}) had "
                 f"{', '.join(f'{k}={a!r}' for k, a, _ in lost)}, and this run has the preset's; `dvc exp run` "
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
    """The newest undamaged checkpoint of a run with these params in ckpt_dir/previous/ (its record and index checked;
    its shards are once it is back), or None; and a note for each folder whose checkpoint cannot be read now, or of an
    older gptcore (it goes unconsidered; nothing there is renamed)."""
    previous = Path(ckpt_dir) / PREVIOUS
    skipped = []
    for folder in sorted(previous.iterdir(), reverse=True) if previous.is_dir() else []:
        if not list_checkpoints(folder) and list_checkpoints(folder, LEGACY_RE):
            skipped.append(f"{folder} holds checkpoints of an older gptcore, which this one does not resume")
        for path in reversed(list_checkpoints(folder)):
            try:
                ckpt = read(path, full=False)
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
    """A run's own file in a checkpoint folder: a checkpoint (of this format or the one before, set aside as corrupt
    or not) or best weights (set aside or not)."""
    name = re.sub(r"\.corrupt(-\d+)?$", "", p.name)
    return bool(CKPT_RE.match(name) or LEGACY_RE.match(name) or BEST_RE.match(name))


def _kept_in(folder: Path, p: Path) -> Path:
    """Where move_aside keeps `also` folder `p` inside `folder`: its relative path there, or its name if absolute."""
    return Path(folder) / (p.name if p.is_absolute() else p)


def _holds_files(p: Path) -> bool:
    """A file, or a folder with a file somewhere in it."""
    return p.is_file() or (p.is_dir() and any(f.is_file() for f in p.rglob("*")))


def bring_back(folder: Path, ckpt_dir: Path, also: list[Path] = ()) -> None:
    """Move an earlier run's files back from `folder` in previous/, after move_aside (so nothing replaced is lost);
    `also`: the files and folders kept with it (move_aside's)."""
    for p in sorted(Path(folder).iterdir()):
        if _run_file(p):
            os.replace(p, Path(ckpt_dir) / p.name)
    for p in map(Path, also):
        kept = _kept_in(folder, p)
        if kept.exists():
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)  # move_aside took whatever files it held: empty folders at most
            p.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(kept), str(p))
    if not any(f.is_file() for f in Path(folder).rglob("*")):
        shutil.rmtree(folder)


def move_aside(ckpt_dir: Path, also: list[Path] = ()) -> Path | None:
    """Move a previous run's checkpoints, best weights and `also` (its step metrics and results: folders or files)
    into ckpt_dir/previous/<UTC time>/, which it returns (None: nothing to move); a fresh run never deletes the run
    before it."""
    ckpt_dir = Path(ckpt_dir)
    ckpts = [p for p in ckpt_dir.iterdir() if _run_file(p)] if ckpt_dir.is_dir() else []
    others = [Path(p) for p in also if _holds_files(Path(p))]
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
    """ckpt_dir/previous/ takes a run by rename: no symbolic link on the way there, the same file system as ckpt_dir
    and no mount point (a rename crosses neither, a bind mount of the same disk included). Checked before anything
    moves."""
    previous = ckpt_dir / PREVIOUS
    check_writable(previous, "a fresh run")
    if previous.is_dir() and (os.stat(previous).st_dev != os.stat(ckpt_dir).st_dev or is_mount_point(previous)):
        raise NotRenamable(f"{previous} is on another file system than {ckpt_dir}, or a mount point: a fresh run keeps "
                           f"the previous run there by rename, which cannot cross file systems or mounts; make "
                           f"{previous} a plain folder on the same disk (move what it holds out first), then run "
                           f"again (nothing was moved)")


def check_init_from(init_from: str | None, ckpt_dir: Path) -> None:
    """ParamError for an init_from directly in ckpt_dir: a fresh start moves it aside (or keep_checkpoints deletes it),
    so a rerun after a kill would find its starting weights gone. ckpt_dir/previous/ is fine."""
    if init_from and Path(init_from).resolve().parent == Path(ckpt_dir).resolve():
        raise ParamError("model.init_from", init_from,
                         f"is in {ckpt_dir}/, whose checkpoints a fresh run moves aside and keep_checkpoints deletes; "
                         f"copy it out first (cp {init_from} init.pt) and set model.init_from: init.pt")


def prepare_resume(ckpt_dir: Path, run_params: dict[str, Any], is_main: bool, also: list[Path] = (),
                   presets: Presets | None = None, results: list[Path] = ()
                   ) -> tuple[dict[str, Any] | None, list[str]]:
    """Collective: the checkpoint every rank resumes from (None: a fresh start), and what rank 0 decided, as lines.
    Rank 0 decides (`find_resume`), moving the run in ckpt_dir, `also` (its step metrics folders) and `results` (the
    later stages' files and folders: the run's before this one) aside and an earlier one back; the others then load
    what it left: the run to resume, if any. A resumed run keeps `results` where they are: they are its own, or no
    run's (DVC reruns the stages that write them)."""
    check_init_from(run_params["model"].get("init_from"), ckpt_dir)  # every rank: all refuse together
    resume, notes = None, []
    if is_main:
        notes += remove_temp_files(ckpt_dir)
        while True:  # again after an earlier run is brought back: its files are checked once they are here
            path, resume, why = find_resume(ckpt_dir, run_params, also, presets)
            notes.append(why)
            earlier = path is not None and path.parent != Path(ckpt_dir)
            if resume is None or earlier:
                # its results too, git's on a fresh clone: `dvc metrics show` would set them beside this run's figures
                present = [Path(p) for p in results if _holds_files(Path(p))]
                moved = move_aside(ckpt_dir, also=[*also, *present])
                # a line only when a run's checkpoints moved: a fresh clone has just git's step metrics (kept too)
                if moved is not None and any(_run_file(p) for p in moved.iterdir()):
                    others = "".join(f" and {p}/" for p in also)
                    theirs = f", with its {len(present)} result files of later stages" if present else ""
                    notes.append(f"the previous run's checkpoints{others} are kept in {moved}{theirs}")
            if not earlier:
                break
            bring_back(path.parent, ckpt_dir, [*also, *results])
        for folder in map(Path, also):  # the step metrics are this run's: a resume never continues another run's
            folder.mkdir(parents=True, exist_ok=True)
            write_text(folder / CURVES_STAMP, run_fingerprint(run_params) + "\n")
    distributed.barrier()
    if not is_main:  # rank 0 checked every file of what it left; the record and the index are checked again here
        last = latest_checkpoint(ckpt_dir)
        resume = read(last, full=False) if last else None
    return resume, notes
