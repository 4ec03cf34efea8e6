"""Folder locks: one writer per folder, readers share it, never opened through a symlink (Unix flock)."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path

from gptcore.errors import UserError
from gptcore.folders import check_writable

LOCK_NAME = ".lock"


class FolderBusyError(UserError):
    """Another live process holds the folder's lock; the message names it."""


class NotALockFile(UserError):
    """Something other than a regular file sits at a lock's path (a symlink, a folder, a fifo): never opened through."""


# O_NOFOLLOW: a symlink planted at the lock's path is refused, never followed to the file it names (the lock is
# written to); O_NONBLOCK|O_NOCTTY: opening a fifo or a device there neither waits nor takes a terminal
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


class FolderLock:
    """A non-blocking flock on folder/.lock until release() or exit, exclusive or `shared` (readers); `what` ("train")
    names the holder. The stage boundary takes each of a stage's locks once; the library takes none."""

    def __init__(self, folder: str | Path, what: str, shared: bool = False) -> None:
        self.folder, self.what, self.shared = Path(folder), what, shared
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        """Take the lock now (never waits) or raise FolderBusyError naming the holder, NotALockFile for a symlink."""
        if self.shared and not self.folder.is_dir():
            return self  # a missing folder: nothing a writer could swap under this reader
        if not self.shared:  # nothing above the folder is a link (the folder's own link is judged where it is written)
            check_writable(self.folder.parent, self.what)
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = self._open()
        try:
            got = _flock(fd, fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX)
            if got:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
                os.ftruncate(fd, 0)  # with several readers, the last one to start is named
                os.pwrite(fd, f"pid {os.getpid()}, {self.what}{' reading' if self.shared else ''} since {stamp}\n"
                          .encode(), 0)
        except BaseException as e:
            os.close(fd)
            if isinstance(e, OSError) and e.filename is None:
                e.filename = str(self.path)  # pwrite's ENOSPC names no file; the one-line error must name this one
            raise
        if not got:
            holder = (os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
                      or "a process that has not written its pid yet")
            os.close(fd)
            if self.shared:
                raise FolderBusyError(f"{self.folder} is being written by another run ({holder}); {self.what} cannot "
                                      f"read it meanwhile: wait for it to finish or stop it")
            if " reading " in holder:
                raise FolderBusyError(f"{self.folder} is being read by another run ({holder}); {self.what} would "
                                      f"change it under that run: wait for it to finish or stop it")
            raise FolderBusyError(f"{self.folder} is in use by another run ({holder}); only one {self.what} may write "
                                  f"there at a time: wait for it to finish or stop it")
        self._fd = fd
        return self

    def _open(self) -> int:
        try:
            fd = os.open(self.path, _LOCK_FLAGS, 0o644)  # no O_TRUNC: the holder's pid must survive
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise
        else:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
        kind = "a symbolic link" if self.path.is_symlink() else "a folder" if self.path.is_dir() else "not a file"
        raise NotALockFile(f"{self.path} is {kind}, not a lock file: a run never opens its lock through it (it "
                           f"could overwrite what it points at); move it away and run again")

    def release(self) -> None:
        """Give the lock up (the kernel does it anyway when this process exits)."""
        if self._fd is not None:
            # a reader clears the holder's name only when it is the last one (it can then lock exclusively)
            if not self.shared or _flock(self._fd, fcntl.LOCK_EX):
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _flock(fd: int, kind: int) -> bool:
    """Take flock `kind` (LOCK_SH or LOCK_EX) on `fd` without waiting; False when another process holds it."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def holder_pid(folder: str | Path) -> int | None:
    """The pid recorded in folder/.lock, if any (the lock may be free)."""
    try:
        text = (Path(folder) / LOCK_NAME).read_text(encoding="utf-8")
    except OSError:
        return None
    parts = text.split()
    pid = parts[1].rstrip(",") if len(parts) > 1 and parts[0] == "pid" else ""
    return int(pid) if pid.isdigit() else None
