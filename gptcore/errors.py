"""The user-error class: a mistake the user can cause or meet (a param, an input file, a busy folder, missing
hardware, a full disk, no network), as opposed to a bug.

A stage prints a `UserError` as one line (its str(), which names the file, key or value and what to do) and exits 1;
anything else is a bug and keeps its traceback. It is also a ValueError, so code that caught the ValueErrors
the library raised for bad input before this class existed still catches them.
"""
from __future__ import annotations

import errno
import re
from pathlib import Path


class UserError(ValueError):
    """A mistake the user can fix; str() names the file, key or value and what to do.

    `file` is the file the message is about when str() does not name it (ParamError: params.yaml)."""

    file: str = ""


def one_line(stage: str, e: UserError) -> str:
    """How a stage or a command prints `e`: `[stage] <file> message`, on one line whatever the message holds (a
    wrapped library's message may span lines)."""
    text = " ".join(str(e).split())
    return f"[{stage}] {e.file} {text}" if e.file else f"[{stage}] {text}"


def cause(e: BaseException) -> str:
    """`Type: first line` of another library's exception, for the middle of a one-line message (their later lines
    are advice for their own API, or a traceback; terminal colour codes are dropped)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    first = text.splitlines()[0].strip() if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def disk_error(e: OSError, path: str | Path, needed: int | None = None) -> UserError | OSError:
    """A write that failed for a reason the user can fix (a full disk, a read-only or forbidden folder) as a
    UserError naming `path` and what to do; any other OSError comes back as it is (a bug keeps its traceback).

    `needed` is the number of bytes the write was putting down, where the caller knows it."""
    path = Path(path)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        size = f" (the write needed {needed:,} bytes)" if needed else ""
        return UserError(f"{path}: no space left on the device holding {_mount_point(path)}{size}: "
                         f"free some space there and run again")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        why = "read-only file system" if e.errno == errno.EROFS else "permission denied"
        return UserError(f"{path}: cannot write there ({why}): make the folder writable or run from a copy of the "
                         f"project that is")
    return e


def _mount_point(path: Path) -> str:
    """The mount point of the file system `path` (or its nearest existing parent) lives on."""
    import os

    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return str(p)
