"""The user-error class: a mistake the user can cause or meet (a param, an input file, a busy folder, missing
hardware, a full disk, no network), as opposed to a bug.

A stage prints a `UserError` as one line (its str(), which names the file, key or value and what to do) and exits 1;
anything else is a bug and keeps its traceback. It is not a ValueError: a handler for another library's ValueError
never mistakes a user's error (or a bug's ValueError for a user's error), and code that means both says so.
"""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path


class UserError(Exception):
    """A mistake the user can fix; str() names the file, key or value and what to do.

    `file` is the file the message is about when str() does not name it (ParamError: params.yaml)."""

    file: str = ""


def one_line(stage: str, e: UserError) -> str:
    """How a stage or a command prints `e`: `[stage] <file> message`, on one line whatever the message holds (a
    wrapped library's message may span lines)."""
    text = " ".join(str(e).split())
    return f"[{stage}] {e.file} {text}" if e.file else f"[{stage}] {text}"


class NotRepresentable(ValueError):
    """No Hugging Face form gives what this tokenizer encodes or this model computes; the message says why, in one
    line. Not a user error by itself: the caller decides (an export skips that part and says so)."""


def user_error(e: BaseException) -> UserError | None:
    """`e` as the user's error a stage prints in one line: itself if it is a UserError, a UserError naming the file
    for an OSError of a full disk or a folder that cannot be written (one that did not go through the atomic
    writer), None for anything else (a bug: let it keep its traceback)."""
    if isinstance(e, UserError):
        return e
    if isinstance(e, OSError) and e.errno in FULL_ERRNOS + DENIED_ERRNOS:
        return disk_error(e, e.filename or ".")  # type: ignore[return-value]
    return None


def cause(e: BaseException) -> str:
    """`Type: first line` of another library's exception, for the middle of a one-line message (their later lines
    are advice for their own API, or a traceback; terminal colour codes are dropped)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    first = text.splitlines()[0].strip() if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def read_failure(path: str | Path, e: OSError) -> str:
    """The one line for an OSError reading `path` (EIO, EACCES, ...): it says nothing about the file's content, so
    the file is left as it is and the same command is run again once the fault is fixed."""
    code = errno.errorcode.get(e.errno or 0, type(e).__name__)
    return (f"{path}: cannot read it ({code}: {e.strerror or e}); the file is kept as it is: check the disk and this "
            f"user's access to it, then run again")


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DENIED_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


def disk_error(e: BaseException, path: str | Path, needed: int | None = None, written: int | None = None,
               free: int | None = None) -> BaseException:
    """A write to `path` that failed for a reason the user can fix (a full disk, a read-only or forbidden folder),
    as a UserError naming the file, the file system and what to do; any other error comes back as it is (a bug
    keeps its traceback).

    `needed` (bytes the write was putting down) and `written` (bytes down when it failed) go into the message where
    the caller knows them. A library that hides ENOSPC in its own exception (torch.save: `inline_container.cc
    unexpected pos`) counts as a full disk when `free`, the bytes left on the file system when it failed, is under
    one MiB."""
    path = Path(path)
    code = e.errno if isinstance(e, OSError) else None
    if code in FULL_ERRNOS or (code is None and free is not None and free < 1 << 20):
        amounts = [f"{needed:,} bytes needed" if needed else "", f"{written:,} written" if written else ""]
        amounts = [a for a in amounts if a]
        size = f" ({', '.join(amounts)})" if amounts else ""
        return UserError(f"{path}: no space left on {_mount_point(path)}{size}: free some space there (or point the "
                         f"folder at a larger disk) and run again")
    if code == errno.EROFS:
        return UserError(f"{path}: cannot write (read-only file system): make {_existing(path.parent)} writable, or "
                         f"run from a copy of the project that is")
    if code in DENIED_ERRNOS:  # reading or writing: the OSError does not say which
        return UserError(f"{path}: permission denied: give this user access to {_existing(path.parent)}, or run from "
                         f"a copy of the project it owns")
    return e


def _existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _mount_point(path: Path) -> str:
    """The mount point of the file system `path` (or its nearest existing parent) lives on."""
    p = _existing(path)
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return str(p)
