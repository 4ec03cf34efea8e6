"""The one atomic writer (temp file beside the target, fsync, rename, fsync the folder) and the folder swap: a reader,
or a rerun after kill -9, sees the old file or the new one, never half of one (docs/architecture.md)."""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

from gptcore.errors import disk_error
from gptcore.folders import check_writable, staged_dir

TMP_SUFFIX = ".tmp"  # every temp name is hidden (a leading dot) and ends so: a killed run's leftovers are recognisable


def temp_beside(path: str | Path) -> Path:
    """A fresh hidden name in `path`'s folder (created there empty, so no two writers get the same one), a folder no
    symbolic link leads to (`check_writable`)."""
    path = Path(path)
    check_writable(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")
        with contextlib.suppress(FileExistsError):  # taken: draw another name
            open(tmp, "x").close()
            return tmp


def fsync_dir(path: str | Path) -> None:
    """fsync a folder, so that a rename or unlink in it survives a power cut (a no-op where folders cannot be
    opened)."""
    with contextlib.suppress(OSError):  # some filesystems refuse fsync on a directory: nothing more to do there
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def publish(tmp: str | Path, path: str | Path, synced: bool = False) -> None:
    """fsync `tmp`, rename it over `path`, fsync the folder; `synced`: the writer does both fsyncs itself (shards)."""
    if not synced:
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if not synced:
        fsync_dir(Path(path).parent)


@contextmanager
def atomic_path(path: str | Path, needed: int | None = None) -> Iterator[Path]:
    """Yield a temp path beside `path`, published over it on a clean exit and removed on an error; a full disk (torch's
    report of one included) or an unwritable folder is a UserError naming `path` and the bytes `needed`."""
    tmp = written = free = None
    try:
        tmp = temp_beside(path)
        yield tmp
        publish(tmp, path)
    except (OSError, RuntimeError) as e:
        if tmp is not None:
            with contextlib.suppress(OSError):  # measured before the temp file goes: a full disk is still full now
                written, free = tmp.stat().st_size, shutil.disk_usage(tmp.parent).free
            tmp.unlink(missing_ok=True)
        err = disk_error(e, path, needed, written, free)
        if err is e:
            raise
        raise err from e
    except BaseException:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_write(path: str | Path, mode: str = "w", encoding: str | None = "utf-8",
                 needed: int | None = None) -> Iterator[IO]:
    """atomic_path with the temp file open: raise inside the block to abandon the write (`path` stays as it was)."""
    with atomic_path(path, needed) as tmp:  # O_NOFOLLOW: a link put in its place meanwhile is refused, not written to
        with open(tmp, mode, encoding=None if "b" in mode else encoding,
                  opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW, 0o666)) as f:
            yield f


def write_text(path: str | Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8) atomically."""
    with atomic_write(path) as f:
        f.write(text)


def write_json(path: str | Path, data: Any, indent: int = 2) -> None:
    """Replace `path` with `data` as indented, strict JSON (UTF-8, trailing newline) atomically: a NaN or an infinity
    in `data` is a ValueError (JSON has neither; the caller gives a finite number or None) and `path` stays."""
    with atomic_write(path) as f:
        json.dump(data, f, indent=indent, ensure_ascii=False, allow_nan=False)
        f.write("\n")


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:  # a libc without renameat2 (glibc < 2.28)
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: this filesystem cannot exchange
        return False
    raise OSError(err, os.strerror(err), str(a))


def swap_dir(staged: str | Path, final: str | Path) -> None:
    """fsync the complete folder `staged` and put it at `final` in one rename (Linux: exchanged; elsewhere the old one
    is moved aside first), then delete the old one. A `final` that is a symbolic link is refused (LinkedFolder)."""
    staged, final = Path(staged), Path(final)
    staged_dir(final)  # no link, no mount point
    for root, _, files in os.walk(staged):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(root)
    if final.exists() and _exchange(staged, final):
        old = staged  # the exchange put the old folder where the staged one was
    else:
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(staged, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


