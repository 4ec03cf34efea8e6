"""A sharded checkpoint (train.parallel fsdp): the folder `ckpt_{step:07d}.dcp/`, holding the weights and optimizer
states written by every rank with torch.distributed.checkpoint (`__<rank>_0.distcp` and its `.metadata`), and
`record.pt`, all the rest (written by rank 0, as a ddp checkpoint without its tensors, plus each file's size).

Promises, as a ddp checkpoint's: it is built in a hidden temp folder and renamed in whole once every rank has written
(a kill mid-save leaves the previous checkpoint whole, and a temp folder the next run removes); the record's format
and the run's fingerprint are read before any tensor; damage its own files show (a record, `.metadata` or shard
missing or cut short, a `.metadata` of another save) is named, and anything else (an I/O error) refuses in one line
with every file kept. It loads into any number of processes (torch.distributed.checkpoint reshards), sharded or not.
"""
from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException, FileSystemReader, FileSystemWriter

from gptcore import distributed
from gptcore.atomic import TMP_SUFFIX, fsync_dir, swap_dir
from gptcore.errors import UserError, cause, disk_error, read_failure
from gptcore.folders import check_writable
from gptcore.model.checkpoint_file import CheckpointRefused, CorruptCheckpoint, atomic_torch_save, read_checkpoint
from gptcore.train.parallel import init_optimizer_state

SUFFIX = ".dcp"
RECORD = "record.pt"
METADATA = ".metadata"  # torch.distributed.checkpoint's index of the shards
FOLDER_KEY = "sharded"  # in the record read back: the folder its tensors are in
SHARDED_FORMAT = 1  # the folder's layout (the record's keys, what the shards hold); record.pt has its own too
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


def tensors_of(model: nn.Module, optimizers: Any) -> dict[str, Any]:
    """What the shards hold: the model's state_dict and each optimizer's per-weight state (tensors only: a DTensor is
    this rank's shard of a weight); the optimizers' groups, plain values, go in the record."""
    out: dict[str, Any] = {"model": model.state_dict(), "optimizer": {}}
    for name, opt in optimizers.optimizers.items():
        state = opt.state_dict()["state"]  # the live tensors: dcp.load reads into them in place
        for i, s in state.items():
            for key, value in s.items():
                if not isinstance(value, torch.Tensor):  # dcp would pickle it, and reading it runs pickled code
                    raise TypeError(f"optimizer {name}: state {key!r} of weight {i} is a {type(value).__name__}, "
                                    f"not a tensor: a sharded checkpoint holds tensors only")
        out["optimizer"][name] = state
    return out


def save(ckpt_dir: Path, step: int, model: nn.Module, optimizers: Any, record: dict[str, Any], is_main: bool) -> Path:
    """Collective: every rank writes its shards into a hidden temp folder, rank 0 adds the record (with each file's
    size) and renames the folder to ckpt_{step:07d}.dcp once it is whole; the new folder's path."""
    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / f"ckpt_{step:07d}{SUFFIX}"
    tmp = ckpt_dir / f".{final.name}{TMP_SUFFIX}"
    if is_main:
        check_writable(ckpt_dir)
        shutil.rmtree(tmp, ignore_errors=True)  # a killed save's (prepare_resume removes those already)
        tmp.mkdir(parents=True)
    distributed.barrier()
    try:
        # one file per rank, fsynced before .metadata is written; rank 0 writes .metadata last
        dcp.save(tensors_of(model, optimizers), storage_writer=FileSystemWriter(tmp, single_file_per_rank=True,
                                                                                  sync_files=True, thread_count=1))
    except (Exception, CheckpointException) as e:  # dcp gathers the ranks' failures into a BaseException
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise _save_failure(e, tmp) from e
    if is_main:
        groups = {name: opt.state_dict()["param_groups"] for name, opt in optimizers.optimizers.items()}
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
        atomic_torch_save({**record, "sharded_format": SHARDED_FORMAT, "optimizer_groups": groups,
                           "world_size": distributed.world_size(), "files": files}, tmp / RECORD)
        fsync_dir(tmp)
        swap_dir(tmp, final)  # fsyncs every file, renames in one step (over a folder of the same step, if any)
    distributed.barrier()  # no rank goes on (to a next save, or to remove old ones) before the folder is in place
    return final


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


def _save_failure(e: Exception, tmp: Path) -> Exception:
    """A full or unwritable disk under a rank's write as the one line (the first OSError among the ranks' failures
    decides); else `e`, a bug."""
    for err in _causes(e):
        if isinstance(err, OSError) and isinstance(said := disk_error(err, tmp), UserError):
            return said
    return e


def read_record(folder: Path) -> dict[str, Any]:
    """The record of a sharded checkpoint with its files checked against it (sizes, .metadata's shard list), the
    folder under FOLDER_KEY: CorruptCheckpoint for damage the files show, CheckpointRefused for a fault or a refusal
    (another format), both naming the folder."""
    folder = Path(folder)
    record_path = folder / RECORD
    try:
        if not record_path.exists():
            raise CorruptCheckpoint(f"{folder}: a sharded checkpoint without its {RECORD} (a folder is published "
                                    f"whole: something removed it)")
        record = read_checkpoint(record_path)
    except OSError as e:
        raise CheckpointRefused(read_failure(record_path, e)) from e
    version = record.get("sharded_format")
    if version != SHARDED_FORMAT:
        raise CheckpointRefused(f"{folder}: sharded checkpoint format {version!r}, but this gptcore reads format "
                                f"{SHARDED_FORMAT}; the folder is kept: use the gptcore that wrote it, or move it away "
                                f"to go on without it")
    files = record.get("files")
    if not isinstance(files, dict) or METADATA not in files:
        raise CorruptCheckpoint(f"{folder}: its {RECORD} lists no {METADATA} (not a record of a whole save)")
    sizes = {}
    for name in files:
        path = folder / name
        try:
            sizes[name] = path.stat().st_size
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{folder}: {name} is missing (one of the {len(files)} files it was saved "
                                    f"with)") from None
        except OSError as e:
            raise CheckpointRefused(read_failure(path, e)) from e
    # the index first: one of another save (say of another number of processes) is named as such
    for item in _read_metadata(folder / METADATA).storage_data.values():
        if item.relative_path not in files:
            raise CorruptCheckpoint(f"{folder}: its {METADATA} names {item.relative_path}, which this save did not "
                                    f"write ({METADATA} of another save, say of another number of processes)")
    for name, size in files.items():
        if sizes[name] != size:
            raise CorruptCheckpoint(f"{folder}: {name} is {sizes[name]:,} bytes, but it was saved with {size:,} (cut "
                                    f"short or replaced)")
    return {**record, FOLDER_KEY: str(folder)}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles .metadata's records of the shards and nothing else: no code a file names runs."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a global {module}.{name} that a checkpoint's {METADATA} never holds")


def _read_metadata(path: Path) -> Any:
    """torch.distributed.checkpoint's index of the shards, read without running pickled code."""
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
    if not hasattr(metadata, "storage_data") or not isinstance(metadata.storage_data, dict):
        raise CorruptCheckpoint(f"{path.parent}: its {METADATA} is not an index of shards")
    return metadata


def load(record: dict[str, Any], model: nn.Module, optimizers: Any, collective: bool) -> None:
    """The checkpoint's weights and optimizer states into `model` and `optimizers`, whatever the number of processes
    that wrote it: `collective` (a sharded model, every rank together) reads each rank's shards; else this process
    reads every weight whole (a ddp rank, or one process). A fault while reading stops in one line, every file kept."""
    folder = Path(record[FOLDER_KEY])
    init_optimizer_state(optimizers)  # dcp reads into existing tensors
    tensors = tensors_of(model, optimizers)
    try:
        dcp.load(tensors, storage_reader=FileSystemReader(folder), no_dist=not collective)
    except (Exception, CheckpointException) as e:  # nothing is known of the bytes here: read_record checked them
        causes = _causes(e)
        first = next((c for c in causes if isinstance(c, OSError)), causes[0])
        if isinstance(first, OSError):
            raise CheckpointRefused(read_failure(folder, first)) from e
        raise CheckpointRefused(f"{folder}: cannot load it ({cause(first)}); the folder is kept: move it away to go "
                                f"on without it, or rerun with the gptcore that wrote it") from e
    model.load_state_dict(tensors["model"])
    for name, opt in optimizers.optimizers.items():
        opt.load_state_dict({"state": tensors["optimizer"][name], "param_groups": record["optimizer_groups"][name]})
