"""The error contract: a `UserError` is a mistake the user can cause or meet, printed as one line naming the file,
key or value and what to do; anything else is a bug and keeps its traceback. Also the one lines for disk faults."""
from __future__ import annotations

import errno
import os
import re
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DENIED_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


class UserError(Exception):
    """A mistake the user can fix; str() names the file, key or value and what to do. Not a ValueError, so that no
    handler of another library's ValueError takes it. `file`: what it is about when str() does not say (ParamError)."""

    file: str = ""


class MissingPackage(UserError):
    """An optional package a param needs is not installed; the message says how to install it."""


DEV_INSTALL = "pip install -r requirements-dev.txt"  # the pinned optional packages (README's test line)


def require(module: str, key: str, install: str = DEV_INSTALL) -> None:
    """MissingPackage naming `key` and `install` where `module` is not importable: said before any long pass."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingPackage(f"{key} needs the package {module} (not installed): {install}")


def message(e: UserError) -> str:
    """`e` on one line: `<file> message` (a wrapped message may span lines)."""
    text = " ".join(str(e).split())
    return f"{e.file} {text}" if e.file else text


def one_line(label: str, e: UserError) -> str:
    """How a stage or a command prints `e`: `[label] <file> message`."""
    return f"[{label}] {message(e)}"


def ending(e: BaseException, in_rank: bool = False) -> tuple[int, str | None] | None:
    """The error contract, one ladder for the stages and the console scripts: how a process ends for `e`, as (exit
    status, line to say). A user's mistake, or a full or forbidden disk: 1 and its one line. Ctrl-C, or a signal
    raised as an interrupt (gptcore.lifetime.Interrupted carries its number): 128 + the signal's number, `interrupted
    (SIGTERM)`. In a rank (`in_rank`), a wait for the other ranks that ran out of time: 1 and its line; a collective
    that failed because another rank went away: 1 and no line (that rank, or its launcher, says why). None: a bug,
    which keeps its traceback."""
    if isinstance(e, KeyboardInterrupt):
        signum = int(getattr(e, "signum", signal.SIGINT))
        return 128 + signum, getattr(e, "line", None) or f"interrupted ({signal.Signals(signum).name})"
    err = user_error(e)
    if err is not None:
        return 1, message(err)
    if in_rank and (line := waited_too_long(e)) is not None:
        return 1, line
    if in_rank and peer_lost(e):
        return 1, None
    return None


def waited_too_long(e: BaseException) -> str | None:
    """The line for `e` where it is a wait for other ranks that timed out (joining them, or a collective: gloo's,
    NCCL's and the store's words), naming the bound gptcore.distributed set, if this process loaded it; else None."""
    if not (isinstance(e, RuntimeError) and re.search(r"timed out|timeout", str(e), re.IGNORECASE)):
        return None
    dist = sys.modules.get("gptcore.distributed")
    bound = dist.current_bound() if dist is not None else None
    limit = f"{bound[1]}={bound[0]:g} s" if bound else "the process group's timeout"
    return (f"a wait for the other ranks timed out ({cause(e)}): one of them stopped, is stuck, has gone or took "
            f"longer than {limit}; finished checkpoints are kept: if it was only slow raise that bound, then rerun")


# what gloo and NCCL say when a collective's peer went away (killed, or failed first); gloo raises a plain
# RuntimeError, so its words are the only sign
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted")


def peer_lost(e: BaseException) -> bool:
    """Whether `e` is a collective failing because another rank went away: torch's own type for it (DistError: NCCL's
    backend errors, the store's), or gloo's words. torch.distributed is looked up only if this process loaded it."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(e, getattr(dist, "DistError", ())):
        return True
    return isinstance(e, RuntimeError) and any(s in str(e) for s in _PEER_LOST)


@contextmanager
def one_line_errors(label: str) -> Iterator[None]:
    """A console script's error contract (`ending`): a user's mistake, a full or forbidden disk, or Ctrl-C ends the
    process with one line `[label] ...` on stderr and its status; anything else keeps its traceback."""
    try:
        yield
    except BaseException as e:
        end = ending(e)
        if end is None:
            raise
        status, line = end
        if status == 1:
            sys.exit(f"[{label}] {line}")  # said on stderr, exit 1
        print(f"[{label}] {line}", file=sys.stderr)
        sys.exit(status)


class NotRepresentable(ValueError):
    """No Hugging Face form gives what this tokenizer encodes or this model computes (not a user error by itself)."""


def user_error(e: BaseException) -> UserError | None:
    """`e` as the user's error (itself, or a UserError for an OSError of a full or unwritable disk), or None."""
    if isinstance(e, UserError):
        return e
    if isinstance(e, OSError) and e.errno in FULL_ERRNOS + DENIED_ERRNOS:
        return disk_error(e, e.filename or ".")  # type: ignore[return-value]
    return None


def cause(e: BaseException) -> str:
    """`Type: first line` of another library's exception, for a one-line message (advice and colour codes dropped)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    first = text.splitlines()[0].strip() if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def read_failure(path: str | Path, e: OSError) -> str:
    """The one line for an OSError reading `path` (EIO, EACCES, ...): it says nothing of the file, which is kept."""
    code = errno.errorcode.get(e.errno or 0, type(e).__name__)
    return (f"{path}: cannot read it ({code}: {e.strerror or e}); the file is kept as it is: check the disk and this "
            f"user's access to it, then run again")


def disk_error(e: BaseException, path: str | Path, needed: int | None = None, written: int | None = None,
               free: int | None = None) -> BaseException:
    """A failed write to `path` the user can fix (a full disk, a read-only or forbidden folder) as a UserError naming
    it, its file system and what to do, else `e`. torch.save hides ENOSPC in its own error: one without an errno
    counts as a full disk when `free`, the bytes left when it failed, is under one MiB."""
    path = Path(path)
    code = e.errno if isinstance(e, OSError) else None
    if code in FULL_ERRNOS or (code is None and free is not None and free < 1 << 20):
        mount = _existing(path)
        while not os.path.ismount(mount) and mount != mount.parent:
            mount = mount.parent
        amounts = ", ".join(a for a in (needed and f"{needed:,} bytes needed", written and f"{written:,} written") if a)
        size = f" ({amounts})" if amounts else ""
        return UserError(f"{path}: no space left on {mount}{size}: free some space there (or point the "
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


@contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """Give an OSError raised inside that names no file (a read of an open file) the name `path`."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise
