"""Training checkpoints, one format for every parallel mode and process count: the folder `ckpt_{step:07d}/`, written
by every process together with torch.distributed.checkpoint (DCP), as torchtitan does, and read back on any number of
processes in either mode (DCP reshards). Which run resumes from which is gptcore/train/run_folder.py's.

    __<rank>_0.distcp  the weights by name (a tied weight once) and each optimizer's state by its weight's name
    .metadata          DCP's index of the shards, naming this save's id
    record.pt          the rest (step, loader, every rank's RNG, params, fingerprint, the optimizers' groups, ...),
                       written by rank 0 with the save's id
    digests.json       written last: the save's id, its step, each file's bytes and sha256 (taken as it was written,
                       by a hashing stream under DCP's writer), and its own sha256

A save is built in a hidden temp folder and renamed in whole (a kill leaves the previous checkpoint whole). Reading one
back (`read`) checks every file against digests.json, the save id in the record and the index, and the step against
the folder's name, before any tensor is used: any mismatch is a CorruptCheckpoint naming the file (run_folder sets the
folder aside), a fault or another format a CheckpointRefused (every file kept). The shards hold tensors only, read with
torch's weights_only loader; record.pt too; `.metadata` is unpickled with torch's index classes only.

Checkpoints of the gptcore before this format (`ckpt_*.pt` files, `ckpt_*.dcp/` folders with record.pt) carry no
digests: they are refused in one line (`refuse_legacy`), never read. Also here: keep-last-K, the temp files of killed
saves, the RNG states and the best weights (train.export: best), each best file's sha256 in the checkpoints' records.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from gptcore import distributed
from gptcore.atomic import TMP_SUFFIX, fsync_dir, swap_dir, write_json
from gptcore.digests import HashingWriter, files_sha256, json_sha256
from gptcore.errors import UserError, cause, disk_error, read_failure
from gptcore.folders import check_writable
from gptcore.model.checkpoint_file import (
    ChangedFile,
    CheckpointRefused,
    CorruptCheckpoint,
    atomic_torch_save,
    check_sha256,
    read_checkpoint,
)

FORMAT = 2  # this layout; 1 was the ckpt_*.pt files and ckpt_*.dcp folders before it
RECORD, METADATA, DIGESTS = "record.pt", ".metadata", "digests.json"
CKPT_RE = re.compile(r"^ckpt_(\d{7})$")  # a checkpoint folder; temp folders of killed saves never match
LEGACY_RE = re.compile(r"^ckpt_(\d{7})\.(pt|dcp)$")  # format 1: refused
BEST_RE = re.compile(r"^best_(\d{7})\.pt$")
FOLDER_KEY = "folder"  # in a record read back: the checkpoint folder its tensors are in
load_checkpoint = read_checkpoint  # one torch.save file (a best file, model/model.pt), read as model/ reads it
# what .metadata may name when it is unpickled: torch.distributed.checkpoint's records of the shards, and no code
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "ChunkStorageMetadata",
                                              "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"} | {n for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
}


def checkpoint_path(ckpt_dir: Path, step: int) -> Path:
    """The folder of step `step`'s checkpoint (zero-padded, so names sort by step)."""
    return Path(ckpt_dir) / f"ckpt_{step:07d}"


def list_checkpoints(ckpt_dir: Path, pattern: re.Pattern = CKPT_RE) -> list[Path]:
    """Finished checkpoints (or other files `pattern` names), oldest first; temp files of a killed save never match."""
    ckpt_dir = Path(ckpt_dir)
    return sorted(p for p in ckpt_dir.iterdir() if pattern.match(p.name)) if ckpt_dir.is_dir() else []


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest finished checkpoint in ckpt_dir, or None."""
    return (list_checkpoints(ckpt_dir) or [None])[-1]


def refuse_legacy(ckpt_dir: Path) -> None:
    """CheckpointRefused naming the newest checkpoint of the format before this one in ckpt_dir, if any. They hold no
    digests, so nothing could tell a damaged one from a whole one: they are not read (nor moved: the user chooses)."""
    old = list_checkpoints(ckpt_dir, LEGACY_RE)
    if old:
        more = f" (and {len(old) - 1} more)" if len(old) > 1 else ""
        raise CheckpointRefused(
            f"{old[-1]}{more}: a checkpoint of an older gptcore, without the digests this one checks before resuming, "
            f"so it is not read; every file is kept: finish that run with the gptcore that wrote it, or move the old "
            f"ckpt_*.pt / ckpt_*.dcp out of {ckpt_dir} to start this run fresh")


# -- what a checkpoint holds --------------------------------------------------------------------------------------

def _aliases(model: nn.Module) -> dict[str, str]:
    """{name: first name} of each parameter reachable under a second name (a tied embedding): stored once."""
    first: dict[int, str] = {}
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = first[id(p)]
        else:
            first[id(p)] = name
    return out


def state_of(model: nn.Module, optimizers: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what the shards hold, the optimizers' groups): the model's weights by name, a tied one once, and each
    optimizer's per-weight state by the weight's name (torch.distributed.checkpoint.state_dict, for a plain, a DDP or
    an FSDP2 model alike), as the live tensors, which loading fills in place (a sharded model's: this rank's shards);
    and each optimizer's param_groups (plain values, weights by name), which go in the record. An optimizer that has
    not stepped gets its state first (torch takes a step at rate 0 on zero gradients: no weight changes)."""
    aliases = _aliases(model)
    weights = {k: v for k, v in get_model_state_dict(model).items() if k not in aliases}
    states, groups = {}, {}
    for name, opt in optimizers.optimizers.items():
        full = get_optimizer_state_dict(model, opt)
        for weight, s in full["state"].items():
            for key, value in s.items():
                if not isinstance(value, torch.Tensor):  # DCP would pickle it, and reading it runs pickled code
                    raise TypeError(f"optimizer {name}: state {key!r} of {weight} is a {type(value).__name__}, not "
                                    f"a tensor: a checkpoint's shards hold tensors only")
        states[name], groups[name] = full["state"], full["param_groups"]
    return {"model": weights, "optimizer": states}, groups


# -- writing --------------------------------------------------------------------------------------------------------

class _HashingFileSystem(FileSystem):
    """torch.distributed.checkpoint's local file system, each file it writes hashed as it is written: `files` holds
    {name: {"bytes", "sha256"}} of this process's files, `errors` the OSErrors its writes met."""

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, dict[str, Any]] = {}
        self.errors: list[OSError] = []

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        """The file opened as torch's file system opens it; written through a HashingWriter."""
        if "w" not in mode:
            with super().create_stream(path, mode) as f:
                yield f
            return
        with super().create_stream(path, mode) as f:
            hashed = HashingWriter(f)
            try:
                yield hashed
            finally:
                hashed.close()  # torch closes it first (after its fsync): then a no-op
                if hashed.error is not None:
                    self.errors.append(hashed.error)
            self.files[Path(path).name] = {"bytes": hashed.size, "sha256": hashed.sha256}

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        """Rename, the digest following the file (torch writes .metadata under a temp name first)."""
        super().rename(path, new_path)
        if Path(path).name in self.files:
            self.files[Path(new_path).name] = self.files.pop(Path(path).name)


class _Writer(FileSystemWriter):
    """DCP's writer (a file per process, fsynced) on the hashing file system, under this save's id (DCP draws one
    per call otherwise), which its .metadata records."""

    def __init__(self, path: Path, fs: _HashingFileSystem, save_id: str) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=1)
        self.fs, self._id = fs, save_id
        self.save_id = save_id

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """As DCP's, keeping this save's id."""
        super().reset(checkpoint_id)
        self.save_id = self._id


@contextmanager
def _one_process_meant() -> Iterator[None]:
    """Around a DCP call: without a process group DCP warns that it assumes one process, which is what is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _coordinator() -> bool:
    """Whether this process writes what one process writes: rank 0 of the process group, or a process without one."""
    return not dist.is_initialized() or dist.get_rank() == 0


def save(ckpt_dir: Path, step: int, model: nn.Module, optimizers: Any, record: dict[str, Any], keep: int) -> Path:
    """Collective: `model`'s weights and `optimizers`' state (`state_of`) and `record` as the checkpoint of `step`
    (`write`); then all but the newest `keep` checkpoints are deleted. The new folder's path."""
    tensors, groups = state_of(model, optimizers)
    path = write(ckpt_dir, step, tensors, {**record, "optimizer": groups})
    if _coordinator():
        remove_old(ckpt_dir, keep)
    return path


def write(ckpt_dir: Path, step: int, tensors: dict[str, Any], record: dict[str, Any]) -> Path:
    """Collective: `tensors` (nested dicts of tensors) into every process's shard and `record` into record.pt, under
    one new save id, then digests.json; built in a hidden temp folder and renamed to ckpt_{step:07d} in whole once
    every process has written. A full or unwritable disk is the one line; the new folder's path."""
    ckpt_dir = Path(ckpt_dir)
    final = checkpoint_path(ckpt_dir, step)
    tmp = ckpt_dir / f".{final.name}{TMP_SUFFIX}"
    main = _coordinator()
    save_id = None
    if main:
        check_writable(ckpt_dir)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a killed save's (prepare_resume removes those already)
        tmp.mkdir()
        save_id = uuid.uuid4().hex
    save_id = distributed.all_gather_objects(save_id)[0]  # rank 0's, once its folder exists
    fs = _HashingFileSystem()
    try:
        with _one_process_meant():
            dcp.save(tensors, storage_writer=_Writer(tmp, fs, save_id))
    except (Exception, CheckpointException) as e:  # dcp gathers the ranks' failures into a BaseException
        failure = _save_failure(e, final, tmp, fs)
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise failure from e
    files = distributed.all_gather_objects(fs.files)
    failed: BaseException | None = None
    if main:
        try:
            _seal(tmp, final, step, save_id, {k: v for rank in files for k, v in rank.items()}, record)
        except BaseException as e:  # said below, once the other ranks know not to wait for the folder
            failed = e
    if distributed.all_gather_objects(failed is None)[0] is False:
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
            raise failed  # type: ignore[misc]
        raise dist.DistError(f"rank 0 could not publish {final}")  # its own line says why
    return final


def _seal(tmp: Path, final: Path, step: int, save_id: str, files: dict[str, Any], record: dict[str, Any]) -> None:
    """Rank 0's part of a save, once every shard is written: record.pt, then digests.json, then the rename."""
    full = {**record, "save_id": save_id, "step": step, "world_size": distributed.world_size()}
    files[RECORD] = {"bytes": None, "sha256": atomic_torch_save(full, tmp / RECORD)}
    files[RECORD]["bytes"] = (tmp / RECORD).stat().st_size
    seal = {"format": FORMAT, "save_id": save_id, "step": step, "files": dict(sorted(files.items()))}
    write_json(tmp / DIGESTS, {**seal, "sha256": json_sha256(seal)})
    fsync_dir(tmp)
    swap_dir(tmp, final)  # fsyncs every file, renames in one step (over a folder of the same step, if any)


def _causes(e: BaseException) -> list[BaseException]:
    """What failed under `e`: each rank's exception where dcp gathered them into one CheckpointException (as
    (exception, traceback) pairs), else `e`; each followed down its causes to the first OSError, if any."""
    failures = getattr(e, "failures", None)
    found = []
    for err in failures.values() if isinstance(failures, dict) and failures else [e]:
        err = err[0] if isinstance(err, tuple) else err
        inner = err
        while inner is not None and not isinstance(inner, OSError):
            inner = inner.__cause__ or inner.__context__
        found.append(inner if inner is not None else err)
    return found


def _save_failure(e: BaseException, final: Path, tmp: Path, fs: _HashingFileSystem) -> BaseException:
    """A full or unwritable disk under any rank's write as the one line naming the checkpoint `final`, else `e` (a
    bug). This rank's own writes kept their OSError; another rank's reach here as torch.save's `unexpected pos` (the
    errno lost on the way), so a file system with under a MiB left then counts as full, as gptcore.atomic counts
    torch.save's own report."""
    for err in fs.errors + [c for c in _causes(e) if isinstance(c, OSError)]:
        if isinstance(said := disk_error(err, final), UserError):
            return said
    try:
        free = shutil.disk_usage(tmp).free
    except OSError:
        return e
    return disk_error(e, final, free=free)


# -- reading ---------------------------------------------------------------------------------------------------------

def read(path: Path, full: bool = True) -> dict[str, Any]:
    """The record of the checkpoint folder `path`, its folder under FOLDER_KEY, once its files are checked:
    digests.json whole, of this format and this step; every file it lists present, of its size and (`full`; else
    record.pt and .metadata alone, for ranks that follow rank 0's full check) of its sha256; record.pt and .metadata
    of this save and step; the index naming only these shards, and tensors only. CorruptCheckpoint for any mismatch,
    CheckpointRefused for a fault or another format; both name the folder and the file."""
    folder = Path(path)
    step = int(CKPT_RE.match(folder.name).group(1))  # type: ignore[union-attr]
    seal = _read_seal(folder)
    if seal["step"] != step:
        raise CorruptCheckpoint(f"{folder}: its {DIGESTS} is of step {seal['step']}, not of step {step} as the folder "
                                f"is named (a folder renamed, or files of another checkpoint)")
    files = seal["files"]
    if RECORD not in files or METADATA not in files:
        raise CorruptCheckpoint(f"{folder}: its {DIGESTS} lists no {RECORD if RECORD not in files else METADATA}")
    for name, meta in files.items():
        try:
            size = (folder / name).stat().st_size
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{folder}: {name} is missing (one of the {len(files)} files it was saved "
                                    f"with)") from None
        except OSError as e:
            raise CheckpointRefused(read_failure(folder / name, e)) from e
        if size != meta["bytes"]:
            raise CorruptCheckpoint(f"{folder}: {name} is {size:,} bytes, but it was saved with {meta['bytes']:,} "
                                    f"(cut short, or a file of another save)")
    names = sorted(files) if full else [n for n in (RECORD, METADATA) if n in files]
    for name, found in zip(names, _hashes(folder, names)):
        if found != files[name]["sha256"]:
            raise CorruptCheckpoint(f"{folder}: {name} is not the file it was saved with (its sha256 differs from "
                                    f"the one {DIGESTS} records: damaged, or a file of another save)")
    record = read_checkpoint(folder / RECORD)
    for key, want in (("save_id", seal["save_id"]), ("step", step)):
        if record.get(key) != want:
            raise CorruptCheckpoint(f"{folder}: its {RECORD} gives {key} {record.get(key)!r}, its {DIGESTS} "
                                    f"{want!r} (files of two saves)")
    index = read_index(folder / METADATA)
    meta = getattr(index, "storage_meta", None)
    if getattr(meta, "save_id", None) != seal["save_id"]:
        raise CorruptCheckpoint(f"{folder}: its {METADATA} is of another save (save id "
                                f"{getattr(meta, 'save_id', None)!r}, not {seal['save_id']!r})")
    for item in index.storage_data.values():
        if item.relative_path not in files:
            raise CorruptCheckpoint(f"{folder}: its {METADATA} names {item.relative_path}, which this save did not "
                                    f"write")
    for key, kind in index.state_dict_metadata.items():
        if type(kind).__name__ != "TensorStorageMetadata":  # torch would unpickle it with weights_only=False
            raise CheckpointRefused(f"{folder}: its {METADATA} says {key} is a pickled object, where this gptcore "
                                    f"saves tensors only; not read, the folder is kept: move it away to go on "
                                    f"without it")
    return {**record, FOLDER_KEY: str(folder)}


def _hashes(folder: Path, names: list[str]) -> list[str]:
    """The sha256 of each named file of `folder` (several at once); a fault reading one refuses in one line."""
    try:
        return files_sha256([folder / n for n in names])
    except OSError as e:
        raise CheckpointRefused(read_failure(e.filename or folder, e)) from e


def _read_seal(folder: Path) -> dict[str, Any]:
    """digests.json, whole (its own sha256) and of this format; CorruptCheckpoint or CheckpointRefused otherwise."""
    path = folder / DIGESTS
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{folder}: its {DIGESTS} is missing (a checkpoint is published whole, with it: the "
                                f"folder was copied in part, or something removed it)") from None
    except OSError as e:
        raise CheckpointRefused(read_failure(path, e)) from e
    try:
        seal = json.loads(text.decode("utf-8"))
        own = seal.pop("sha256") if isinstance(seal, dict) else None
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptCheckpoint(f"{folder}: its {DIGESTS} is damaged ({cause(e)})") from e
    if own is None or own != json_sha256(seal):
        raise CorruptCheckpoint(f"{folder}: its {DIGESTS} is damaged (its own sha256 does not match it)")
    if seal.get("format") != FORMAT:
        raise CheckpointRefused(f"{folder}: checkpoint format {seal.get('format')!r}, but this gptcore reads format "
                                f"{FORMAT}; the folder is kept: use the gptcore that wrote it, or move it away to go "
                                f"on without it")
    files = seal.get("files")
    if not isinstance(files, dict) or not isinstance(seal.get("step"), int) or not all(
            isinstance(m, dict) and isinstance(m.get("bytes"), int) and isinstance(m.get("sha256"), str)
            for m in files.values()):
        raise CorruptCheckpoint(f"{folder}: its {DIGESTS} is not a record of a save (no step, or files without "
                                f"bytes and sha256)")
    return seal


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles .metadata's records of the shards and nothing else: no code a file names runs."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a global {module}.{name} that a checkpoint's {METADATA} never holds")


def read_index(path: Path) -> Any:
    """torch.distributed.checkpoint's index of the shards (`.metadata`: its state_dict_metadata names every tensor),
    read without running pickled code."""
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except OSError as e:
        raise CheckpointRefused(read_failure(path, e)) from e
    except pickle.UnpicklingError as e:
        if "never holds" in str(e):
            raise CheckpointRefused(f"{path}: not read ({e}); the folder is kept: move it away to go on without "
                                    f"it") from e
        raise CorruptCheckpoint(f"{path.parent}: its {METADATA} is damaged or cut short ({cause(e)})") from e
    except (EOFError, ValueError, AttributeError, TypeError, IndexError) as e:  # what a cut or garbled pickle raises
        raise CorruptCheckpoint(f"{path.parent}: its {METADATA} is damaged or cut short ({cause(e)})") from e
    if not isinstance(getattr(metadata, "storage_data", None), dict) or \
            not isinstance(getattr(metadata, "state_dict_metadata", None), dict):
        raise CorruptCheckpoint(f"{path.parent}: its {METADATA} is not an index of shards")
    return metadata


def load(record: dict[str, Any], model: nn.Module, optimizers: Any) -> None:
    """Collective: the checkpoint `read` returned the record of, into `model` and `optimizers` by name, whatever the
    mode and the number of processes that wrote it (DCP reads each process's part: its shards of a sharded model,
    every weight whole otherwise), and the optimizers' groups from the record. A fault while reading stops in one
    line, every file kept."""
    folder = Path(record[FOLDER_KEY])
    tensors, _ = state_of(model, optimizers)
    try:
        with _one_process_meant():
            dcp.load(tensors, storage_reader=FileSystemReader(folder))
    except (Exception, CheckpointException) as e:  # nothing is known of the bytes here: read() checked them
        causes = _causes(e)
        first = next((c for c in causes if isinstance(c, OSError)), causes[0])
        if isinstance(first, OSError):
            raise CheckpointRefused(read_failure(folder, first)) from e
        raise CheckpointRefused(f"{folder}: cannot load it ({cause(first)}); the folder is kept: move it away to go "
                                f"on without it, or rerun with the gptcore that wrote it") from e
    weights = tensors["model"]
    weights.update({alias: weights[name] for alias, name in _aliases(model).items()})
    set_model_state_dict(model, weights)
    for name, opt in optimizers.optimizers.items():
        set_optimizer_state_dict(model, opt, {"state": tensors["optimizer"][name],
                                              "param_groups": record["optimizer"][name]})


# -- the folder ------------------------------------------------------------------------------------------------------

def remove_old(ckpt_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (after a new one is whole). Each folder is first renamed to a
    hidden temp name, so a kill half way through deleting it leaves no checkpoint with files missing."""
    for old in list_checkpoints(ckpt_dir)[: -max(1, keep)]:
        doomed = old.with_name(f".{old.name}.old{TMP_SUFFIX}")
        shutil.rmtree(doomed, ignore_errors=True)
        os.replace(old, doomed)
        shutil.rmtree(doomed)


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint (folder or file) to <name>.corrupt (.corrupt-2, ... if taken); the new path."""
    aside, n = path.with_name(path.name + ".corrupt"), 1
    while aside.exists():  # nothing set aside is ever replaced
        n += 1
        aside = path.with_name(f"{path.name}.corrupt-{n}")
    os.replace(path, aside)
    return aside


def remove_temp_files(ckpt_dir: Path) -> list[str]:
    """Delete what saves killed mid-write left in ckpt_dir (a checkpoint's hidden temp folder, a best file's temp
    file, as large as what they were writing); call only while holding the folder's lock, so no save is under way. A
    note if any were found."""
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


# -- the best weights (train.export: best) -----------------------------------------------------------------------
# one file per improvement, named by step (not nanoGPT's one ckpt.pt): after a kill the resumed run finds the best
# weights its checkpoint recorded, even if a later improvement was written before the kill

def best_path(ckpt_dir: Path, step: int) -> Path:
    """The best-weights file of `step` (zero-padded, so names sort by step)."""
    return Path(ckpt_dir) / f"best_{step:07d}.pt"


def save_best(ckpt_dir: Path, step: int, model_state: dict[str, Any], model_config: dict[str, Any], val_loss: float,
              run_fingerprint: str) -> str:
    """The weights of a new lowest val loss (whole: a sharded model's gathered first), atomically, with their step,
    val loss and the run's fingerprint; the file's sha256, which the next checkpoint records."""
    return atomic_torch_save({"model": model_state, "model_config": model_config, "step": step,
                              "val_loss": val_loss, "fingerprint": run_fingerprint}, best_path(ckpt_dir, step))


def prune_best(ckpt_dir: Path, keep_step: int | None) -> None:
    """Delete the best-weights files other than that of `keep_step` (called right after a checkpoint is saved)."""
    for p in list_checkpoints(ckpt_dir, BEST_RE):
        if keep_step is None or p != best_path(ckpt_dir, keep_step):
            p.unlink(missing_ok=True)


def load_best(ckpt_dir: Path, step: int, run_fingerprint: str, sha256: str | None) -> dict[str, Any]:
    """The best weights recorded for `step`, checked against the `sha256` the run recorded when it wrote them; a
    UserError naming the file if it is missing, changed since (then set aside as .corrupt) or of another run."""
    path = best_path(ckpt_dir, step)
    if not path.is_file():
        raise UserError(f"{path}: the best weights (step {step}) are missing; set train.export: final to export the "
                        f"last weights, or move {ckpt_dir} away and train again")
    if sha256 is not None:
        try:
            check_sha256(path, sha256, "the run's checkpoint", "")
        except ChangedFile:
            aside = set_aside(path)
            raise ChangedFile(f"{path}: the best weights (step {step}) are not the file the run wrote (its sha256 "
                              f"differs from the one its checkpoint records): set aside as {aside.name}, nothing is "
                              f"exported from it; set train.export: final to export the last weights, or move "
                              f"{ckpt_dir} away and train again") from None
    best = read_checkpoint(path)
    if best.get("fingerprint") != run_fingerprint or int(best.get("step", -1)) != step:
        raise UserError(f"{path}: written by another run (fingerprint or step differ); delete {ckpt_dir} and rerun")
    return best
