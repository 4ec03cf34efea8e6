"""One checkpoint file: read as plain tensors without running pickled code (damage named, anything else kept
as it is), written atomically with its format version. Ours, nanoGPT's and build-nanogpt's files read the same way."""
from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from gptcore.atomic import atomic_write
from gptcore.digests import HashingWriter, file_sha256
from gptcore.errors import UserError, cause, read_failure

_WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile, DistributedDataParallel
# build-nanogpt pickles its GPTConfig dataclass; run as a script its module is __main__, imported it is model
_PICKLED_CONFIGS = ("__main__.GPTConfig", "model.GPTConfig", "train_gpt2.GPTConfig")


def strip_prefixes(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The state dict without torch.compile's `_orig_mod.` and DDP's `module.` key prefixes, to load into a bare GPT."""
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        new = key
        while new.startswith(_WRAPPER_PREFIXES):
            new = new.split(".", 1)[1]
        if new in out:
            raise UserError(f"state dict keys collide after stripping wrapper prefixes: {key!r} -> {new!r}")
        out[new] = value
    return out


class _PickledConfig:
    """Stand-in for a pickled config dataclass: unpickling only fills its fields, no foreign code runs."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots) form
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict):
            raise UserError(f"pickled GPTConfig has state of type {type(state).__name__}, expected a dict")
        self.fields = dict(state)


class CorruptCheckpoint(UserError):
    """A file its own bytes show damaged (empty, a zip cut short, not a torch.save file): the only kind set aside."""


class CheckpointRefused(UserError):
    """A checkpoint not read now though nothing says it is damaged (a fault, a refusal, another format): kept as is."""


CHECKPOINT_FORMAT = 1  # the layout of what this project saves; files from before the key existed are layout 1
FORMAT_KEY = "format"
_ZIP_MAGIC, _LEGACY_MAGIC = b"PK\x03\x04", b"\x80\x02\x8a\x0a"  # torch.save's zip; its pre-1.6 pickle format


def read_checkpoint(path: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """A torch.save file as plain containers and tensors (weights_only; `mmap` maps them): CorruptCheckpoint only when
    its bytes show damage, CheckpointRefused for a fault or refusal that says nothing of them, else a traceback."""
    try:
        with torch.serialization.safe_globals([(_PickledConfig, name) for name in _PICKLED_CONFIGS]):
            ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:
        try:
            damage = _damage(path, e)
        except OSError as again:  # the disk still fails: nothing is known of the file
            raise CheckpointRefused(read_failure(path, again)) from e
        if damage:
            raise CorruptCheckpoint(f"{path}: cannot read checkpoint: {damage}") from e
        refused = _refusal(path, e)
        if refused is None:
            raise
        raise refused from e
    if not isinstance(ckpt, dict):
        raise CorruptCheckpoint(f"{path}: not a checkpoint (a {type(ckpt).__name__}, expected a dict)")
    version = ckpt.get(FORMAT_KEY, CHECKPOINT_FORMAT)
    if version != CHECKPOINT_FORMAT:
        raise CheckpointRefused(f"{path}: checkpoint format {version!r}, but this gptcore reads format "
                                f"{CHECKPOINT_FORMAT}; the file is kept: use the gptcore that wrote it, or move the "
                                f"file away to go on without it")
    if isinstance(ckpt.get("config"), _PickledConfig):
        ckpt["config"] = ckpt["config"].fields
    return ckpt


def _damage(path: Path, e: Exception) -> str:
    """What in the file's own bytes (and, for the legacy format, the unpickler's end of file `e`) shows it damaged
    or foreign; '' if nothing does. An OSError reading it propagates: an unreadable disk says nothing of the file."""
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        return "an empty file"
    if head == _LEGACY_MAGIC:
        return "torch's legacy format, cut short" if isinstance(e, EOFError) else ""
    if head != _ZIP_MAGIC:
        return "not a torch.save file (neither a zip archive nor torch's legacy format)"
    try:
        with zipfile.ZipFile(path) as z:  # reads the central directory, which ends the file
            names = z.namelist()
    except zipfile.BadZipFile as bad:
        return f"a zip archive cut short or damaged ({bad})"
    if not any(n.rsplit("/", 1)[-1] == "data.pkl" for n in names):
        return "a zip archive but not a torch.save file (no data.pkl)"
    return ""


def _refusal(path: Path, e: Exception) -> CheckpointRefused | None:
    """The one line for a readable-looking file that did not load for a reason other than damage; None: a bug."""
    kept = "the file is kept as it is"
    if isinstance(e, OSError):
        return CheckpointRefused(read_failure(path, e))
    if isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and "can't allocate memory" in str(e)):
        return CheckpointRefused(f"{path}: out of memory while loading it ({cause(e)}); {kept}: free memory (or "
                                 f"use a machine with more) and run again")
    if isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e):
        # the loader's own reason without its advice: the global it refused, where it names one
        found = re.search(r"Unsupported global: GLOBAL \S+", str(e))
        return CheckpointRefused(f"{path}: not loadable as plain tensors by torch {torch.__version__}'s "
                                 f"weights_only loader ({found.group(0) if found else cause(e)}); {kept}: use the "
                                 f"torch version that wrote it, or on a machine you trust save its tensors again")
    return None


def atomic_torch_save(obj: Any, path: Path) -> str:
    """torch.save through the atomic writer (a kill mid-save leaves the old file); a dict gets the format version. The
    file's sha256, taken as it was written."""
    if isinstance(obj, dict):
        obj = {FORMAT_KEY: CHECKPOINT_FORMAT, **obj}
    with atomic_write(path, "wb", needed=_tensor_bytes(obj)) as f:
        with HashingWriter(f) as hashed:
            torch.save(obj, hashed)
        # closing the hashing writer closed the temp file too; the atomic writer's own close is then a no-op
    return hashed.sha256


class ChangedFile(UserError):
    """A file whose sha256 is not the one recorded when it was written: damaged, or replaced since."""


def check_sha256(path: Path, expected: str, recorded_in: str, fix: str) -> None:
    """ChangedFile naming `path` unless its sha256 is `expected` (recorded at write in `recorded_in`); `fix`: what to
    do."""
    try:
        found = file_sha256(path)
    except OSError as e:
        raise CheckpointRefused(read_failure(path, e)) from e
    if found != expected:
        raise ChangedFile(f"{path}: its sha256 is not the one {recorded_in} recorded when it was written (the file "
                          f"was damaged or replaced since); {fix}")


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in a (nested) checkpoint dict: about what torch.save writes."""
    if isinstance(obj, torch.Tensor):
        return obj.nbytes
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return sum(_tensor_bytes(v) for v in items)
