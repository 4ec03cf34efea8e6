"""The one atomic writer (temp file beside the target, fsync, rename, fsync the folder), the folder swap, checksums:
a reader, or a rerun after kill -9, sees the old file or the new one, never half of one (docs/architecture.md)."""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import secrets
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

from gptcore.errors import UserError, disk_error

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
    """Replace `path` with `data` as indented JSON (UTF-8, trailing newline) atomically."""
    with atomic_write(path) as f:
        json.dump(data, f, indent=indent, ensure_ascii=False)
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


class LinkedFolder(UserError):
    """A folder gptcore would write that is, or lies under, a symbolic link: writing through it would change what it
    points to (often shared, or outside the project)."""


class NotRenamable(UserError):
    """A folder gptcore replaces or fills by rename that a rename cannot reach: a mount point, another file system."""


def first_link(path: str | Path) -> Path | None:
    """The first symbolic link among `path` and the folders above it, from the project (the working directory) down;
    None for a path outside the project, whose folders are not the pipeline's to judge."""
    path = Path(os.path.abspath(path))
    root = Path.cwd()
    if not path.is_relative_to(root):
        return None
    for depth in range(1, len(path.relative_to(root).parts) + 1):
        step = root.joinpath(*path.relative_to(root).parts[:depth])
        if step.is_symlink():
            return step
    return None


def check_writable(folder: str | Path, what: str = "gptcore") -> None:
    """The one rule for where the pipeline writes: never through a symbolic link, at `folder` or above it inside the
    project (what it points to may be shared, or outside the project). A LinkedFolder naming the link and what to do;
    a link at a file's own name is no concern (the rename that publishes the file replaces the link itself)."""
    link = first_link(folder)
    if link is not None:
        raise LinkedFolder(f"{link} is a symbolic link (to {os.readlink(link)}): {what} writes nothing through a "
                           f"link (what it points to may be shared, or outside the project); remove the link (rm "
                           f"{link}: what it points to stays) and run again")


def refuse_link(final: str | Path, what: str, why: str = "the folder it points to may be shared") -> None:
    """LinkedFolder naming `final` and what to do, if `final` is a symbolic link (a dangling one included) or lies
    under one inside the project."""
    final = Path(final)
    if final.is_symlink():
        raise LinkedFolder(f"{final} is a symbolic link (to {os.readlink(final)}): {what} writes no folder through a "
                           f"link or over one ({why}); remove the link (rm {final}: what it points to stays) to "
                           f"write a local {final}, or point it at a folder made with these params")
    check_writable(final.parent, what)


def next_path(final: str | Path) -> Path:
    """The hidden name beside `final` where its next version is built (`staged_dir` checks it first)."""
    final = Path(final)
    return final.parent / f".{final.name}.next"


def staged_dir(final: str | Path) -> Path:
    """The hidden folder beside `final` where swap_dir's next version is built, once `final` is known to be swappable:
    no symbolic link at it or above it, and not a mount point (a rename cannot replace one)."""
    final = Path(final)
    refuse_link(final, "gptcore")
    if os.path.ismount(final):
        raise NotRenamable(f"{final} is a mount point: a run replaces {final}/ whole by a rename, which cannot move a "
                           f"mount point; mount the disk at a folder above it (e.g. the project's) or unmount it, "
                           f"then run again (nothing was written)")
    staged = next_path(final)
    if staged.is_symlink():
        raise LinkedFolder(f"{staged} is a symbolic link (to {os.readlink(staged)}) where {final}'s next version is "
                           f"built (an older gptcore moved a link that stood at {final} there): remove it "
                           f"(rm {staged}: what it points to stays) and rerun")
    return staged


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


@contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """Give an OSError raised inside that names no file (a read of an open file) the name `path`."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise


def read_utf8(path: Path) -> str:
    """A text file's content; bytes that are not UTF-8 are one line naming the file, offset and line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}: not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}, line {line})") from None


def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file, read in 4 MiB blocks (shards are 200 MB)."""
    h = hashlib.sha256()
    with naming(path), open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def json_sha256(obj: Any) -> str:
    """sha256 hex digest of `obj` as canonical JSON (sorted keys; non-JSON values as str): the one params
    fingerprint."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
