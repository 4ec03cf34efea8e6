"""The stage boundary's parts (stages/common.py puts them together): the error contract (a `UserError` is a
mistake the user can cause or meet, printed as one line; anything else is a bug and keeps its traceback), folder
locks, children that die with their parent, SIGTERM as Ctrl-C, and the torchrun launch (docs/resume-and-failures.md
says what each promises)."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from filelock import lock_descriptor, unlock_descriptor

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DENIED_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


class UserError(Exception):
    """A mistake the user can fix; str() names the file, key or value and what to do. Not a ValueError, so that no
    handler of another library's ValueError takes it. `file`: what it is about when str() does not say (ParamError)."""

    file: str = ""


def one_line(stage: str, e: UserError) -> str:
    """How a stage or a command prints `e`: `[stage] <file> message`, on one line (a wrapped message may span lines)."""
    text = " ".join(str(e).split())
    return f"[{stage}] {e.file} {text}" if e.file else f"[{stage}] {text}"


class NotRepresentable(ValueError):
    """No Hugging Face form gives what this tokenizer encodes or this model computes (not a user error by itself)."""


def user_error(e: BaseException) -> UserError | None:
    """`e` as the user's error (itself, or a UserError for an OSError of a full or unwritable disk), or None: a bug."""
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


LOCK_NAME = ".lock"
_PR_SET_PDEATHSIG = 1


class FolderBusyError(UserError):
    """Another live process holds the folder's lock; the message names it."""


class NotALockFile(UserError):
    """Something other than a regular file sits at a lock's path (a symlink, a folder, a fifo): never opened through."""


# O_NOFOLLOW: a symlink planted at the lock's path is refused, never followed to the file it names (the lock is
# written to); O_NONBLOCK|O_NOCTTY: opening a fifo or a device there neither waits nor takes a terminal
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


class FolderLock:
    """A non-blocking flock on folder/.lock until release() or exit, exclusive or `shared` (readers); `what` ("train")
    names the holder. A lock this process holds already (the stage boundary's) is held again for free."""

    _held: dict[tuple[int, int], bool] = {}  # (device, inode) of each lock file this process holds -> shared

    def __init__(self, folder: str | Path, what: str, shared: bool = False) -> None:
        self.folder, self.what, self.shared = Path(folder), what, shared
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None
        self._key: tuple[int, int] | None = None

    def acquire(self) -> "FolderLock":
        """Take the lock now (never waits) or raise FolderBusyError naming the holder, NotALockFile for a symlink."""
        if self.shared and not self.folder.is_dir():
            return self  # a missing folder: nothing a writer could swap under this reader
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = self._open()
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        if key in self._held and (self.shared or not self._held[key]):
            os.close(fd)  # held here already, at least as strongly
            return self
        try:
            got = _lock_shared(fd) if self.shared else lock_descriptor(fd, blocking=False)
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
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "a process that has not written its pid yet"
            os.close(fd)
            if self.shared:
                raise FolderBusyError(f"{self.folder} is being written by another run ({holder}); {self.what} cannot "
                                      f"read it meanwhile: wait for it to finish or stop it")
            if " reading " in holder:
                raise FolderBusyError(f"{self.folder} is being read by another run ({holder}); {self.what} would "
                                      f"change it under that run: wait for it to finish or stop it")
            raise FolderBusyError(f"{self.folder} is in use by another run ({holder}); only one {self.what} may write "
                                  f"there at a time: wait for it to finish or stop it")
        self._fd, self._key = fd, key
        self._held[key] = self.shared
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
            if not self.shared or lock_descriptor(self._fd, blocking=False):
                os.ftruncate(self._fd, 0)
            unlock_descriptor(self._fd)
            os.close(self._fd)
            self._held.pop(self._key, None)
            self._fd = self._key = None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def reading(folder: str | Path, what: str) -> FolderLock:
    """The reader's side of `folder`'s lock (`with reading("data/shards", "train")`): no writer starts meanwhile."""
    return FolderLock(folder, what, shared=True)


def _lock_shared(fd: int) -> bool:
    import fcntl  # Unix only, as the stages are (filelock has no shared lock)

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def writer_lock(folder: str | Path, what: str) -> FolderLock | None:
    """The writer's lock on `folder`, or None when an ancestor (the stage that started this torchrun) holds it."""
    try:
        return FolderLock(folder, what).acquire()
    except FolderBusyError:
        if holder_pid(folder) in ancestors():
            return None
        raise


def holder_pid(folder: str | Path) -> int | None:
    """The pid recorded in folder/.lock, if any (the lock may be free)."""
    try:
        text = (Path(folder) / LOCK_NAME).read_text(encoding="utf-8")
    except OSError:
        return None
    parts = text.split()
    return int(parts[1].rstrip(",")) if len(parts) > 1 and parts[0] == "pid" and parts[1].rstrip(",").isdigit() else None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent exits (Linux PR_SET_PDEATHSIG, which survives
    exec: a launcher sets it for torchrun); if the parent is already gone, die now."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return  # not fatal: only orphan protection is lost
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


# the shells dvc may run a stage's command through ($SHELL -c, /bin/sh when SHELL is unset), as /proc names them
_SHELLS = frozenset({"sh", "dash", "bash", "zsh", "ksh", "mksh", "fish"})


def _name_and_parent(pid: int) -> tuple[str, int] | None:
    """(command name, parent pid) of `pid` from /proc/<pid>/stat, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    close = text.rindex(")")  # the name may itself hold spaces and parentheses
    return text[text.index("(") + 1:close], int(text[close + 2:].split()[1])


def ancestors(pid: int | None = None) -> list[int]:
    """This process's parent, grandparent, ... up to init (from /proc; on other systems the parent alone)."""
    out, pid = [], os.getpid() if pid is None else pid
    while (name_parent := _name_and_parent(pid)) is not None:
        if name_parent[1] <= 1:
            return out
        pid = name_parent[1]
        out.append(pid)
    return out or [os.getppid()]


def die_with_the_shells_parent(sig: int = signal.SIGKILL, every: float = 0.2) -> None:
    """Send `sig` to this process once the program above the shells between us dies (Linux): dash (`$SHELL -c` of
    dvc) outlives a killed dvc, so a daemon thread watches for a shell in the chain given another parent."""
    if not sys.platform.startswith("linux"):
        return
    links, pid = [], os.getppid()
    while (name_parent := _name_and_parent(pid)) is not None and name_parent[0] in _SHELLS and name_parent[1] > 1:
        links.append((pid, name_parent[1]))
        pid = name_parent[1]
    if not links:
        return

    def watch() -> None:
        while True:
            time.sleep(every)
            for shell, parent in links:
                now = _name_and_parent(shell)
                if now is None or now[1] != parent:  # reparented (or gone): whoever started the shell died
                    os.kill(os.getpid(), sig)

    threading.Thread(target=watch, name="die-with-the-shells-parent", daemon=True).start()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def mortal() -> None:
    """Die with the parent when that is dvc or torchrun (a stage started by hand is left to the shell: nohup keeps
    it), and turn SIGTERM into KeyboardInterrupt, so the stage boundary ends it with Ctrl-C's one line."""
    if "DVC_STAGE" in os.environ or "LOCAL_RANK" in os.environ:  # under dvc or torchrun: its death abandons the run
        die_with_parent()
        die_with_the_shells_parent()
    # a rank other than 0 says nothing and may sit in a C call (waiting for rank 0 at rendezvous) where a Python
    # handler never runs: when torchrun stops it (rank 0 refused, say), it dies at once instead of after 30 s
    quiet_rank = under_torchrun() and os.environ.get("RANK", "0") != "0"
    signal.signal(signal.SIGTERM, signal.SIG_DFL if quiet_rank else _raise_interrupt)


def under_torchrun() -> bool:
    """True in a process torchrun started (it sets LOCAL_RANK and WORLD_SIZE)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_torchrun(module: str, nproc: int) -> int:
    """Run `python -m module` under torchrun on `nproc` local processes as a child that dies with this one; its exit
    status (128 + N for signal N). torchrun's failure report is left out: the failed rank has said its line."""
    argv = [sys.executable, "-c", "import sys; from gptcore.process import _torchrun; _torchrun(sys.argv[1:])",
            "--standalone", f"--nproc_per_node={int(nproc)}", "-m", module]
    sys.stdout.flush()
    status = run_child(argv)
    return status if status >= 0 else 128 - status


def _torchrun(args: list[str]) -> None:
    """torchrun's main without its failure report; exits with the first failed rank's status."""
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(parse_args(args))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if failure.exitcode < 0:
            name = signal.Signals(-failure.exitcode).name
            stage = args[-1].rsplit(".", 1)[-1]  # the module: stages.<name>
            print(f"[{stage}] rank {rank} (pid {failure.pid}) was killed by {name}; rerun to resume", file=sys.stderr)
        sys.exit(failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode)


def run_child(argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Run argv in its own session as a child that dies with this process; its exit status. On Ctrl-C or SIGTERM
    (which reach only us) the child's group is killed and KeyboardInterrupt propagates: one line, no tracebacks."""
    proc = subprocess.Popen(list(argv), env=env, preexec_fn=die_with_parent, start_new_session=True)
    try:
        return proc.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
