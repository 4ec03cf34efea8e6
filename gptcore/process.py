"""Process lifetime: one writer per output folder (an OS lock naming its holder), children that die with their
parent (Linux PR_SET_PDEATHSIG), and a stage interrupted by Ctrl-C or SIGTERM exiting with one line.

flock locks belong to the open file and the kernel drops them when the holder exits, however it exits, so a lock
left by a killed run never blocks the next one. The pid in the lock file is only there to name the holder.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from filelock import lock_descriptor, unlock_descriptor

from gptcore.errors import UserError, one_line, user_error

LOCK_NAME = ".lock"
_PR_SET_PDEATHSIG = 1


class FolderBusyError(UserError):
    """Another live process holds the folder's lock; the message names it."""


class FolderLock:
    """A non-blocking lock on `folder` (the file folder/.lock) held until release() or process exit: exclusive for a
    writer, `shared` for a reader (any number of readers together, never with a writer).

    `what` says who holds it ("train", "tokenize"), for the message a refused run gets. A reader of a folder that does
    not exist holds nothing (there is nothing a writer could swap under it)."""

    def __init__(self, folder: str | Path, what: str, shared: bool = False) -> None:
        self.folder, self.what, self.shared = Path(folder), what, shared
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> "FolderLock":
        """Take the lock now or raise FolderBusyError naming the holder's pid (never waits)."""
        if self.shared and not self.folder.is_dir():
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # no O_TRUNC: the holder's pid must survive
        try:
            got = _lock_shared(fd) if self.shared else lock_descriptor(fd, blocking=False)
        except OSError:
            os.close(fd)
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
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        os.ftruncate(fd, 0)  # with several readers, the last one to start is named
        os.pwrite(fd, f"pid {os.getpid()}, {self.what}{' reading' if self.shared else ''} since {stamp}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock up (the kernel does it anyway when this process exits)."""
        if self._fd is not None:
            # a reader clears the holder's name only when it is the last one (it can then lock exclusively)
            if not self.shared or lock_descriptor(self._fd, blocking=False):
                os.ftruncate(self._fd, 0)
            unlock_descriptor(self._fd)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def reading(folder: str | Path, what: str) -> FolderLock:
    """The reader's side of `folder`'s lock, as a context manager (or keep the acquired lock until exit): while it is
    held no writer (tokenize) can start there, and it is refused while a writer holds the folder.
    `with reading("data/shards", "train"): ...`"""
    return FolderLock(folder, what, shared=True)


def _lock_shared(fd: int) -> bool:
    import fcntl  # Unix only, as the stages are (filelock has no shared lock)

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def ancestors(pid: int | None = None) -> list[int]:
    """This process's parent, grandparent, ... up to init (from /proc; on other systems the parent alone)."""
    out, pid = [], os.getpid() if pid is None else pid
    while True:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return out or [os.getppid()]
        ppid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), 0)
        if ppid <= 1:
            return out
        out.append(ppid)
        pid = ppid


def lock_for_all_ranks(folder: str | Path, what: str, is_main: bool) -> FolderLock | None:
    """The run's lock on `folder`, taken once per run: rank 0 takes it (unless the launcher that started torchrun,
    one of its ancestors, already holds it) and every rank learns the outcome, so a busy folder stops all ranks
    together before any of them writes. Returns the lock rank 0 took (keep it until the run ends), else None."""
    from gptcore import distributed  # ground floor both; imported here so process.py stays free of torch at import

    lock, refusal = None, None
    if is_main:
        try:
            lock = FolderLock(folder, what).acquire()
        except FolderBusyError as e:
            if holder_pid(folder) not in ancestors():  # held by the launcher of this very run: ours already
                refusal = str(e)
    refusal = distributed.all_gather_objects(refusal)[0]  # rank 0's verdict, on every rank
    if refusal:
        if lock is not None:
            lock.release()
        raise FolderBusyError(refusal)
    return lock


def holder_pid(folder: str | Path) -> int | None:
    """The pid recorded in folder/.lock, if any (the lock may be free)."""
    try:
        text = (Path(folder) / LOCK_NAME).read_text(encoding="utf-8")
    except OSError:
        return None
    parts = text.split()
    return int(parts[1].rstrip(",")) if len(parts) > 1 and parts[0] == "pid" and parts[1].rstrip(",").isdigit() else None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent exits (Linux; a no-op elsewhere).

    Survives exec (of non-setuid programs), so a launcher can set it for torchrun. If the parent is already gone
    (we were reparented before the call), exit at once."""
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


def die_with_the_shells_parent(sig: int = signal.SIGKILL, every: float = 0.2) -> None:
    """When shells stand between this process and the program that started it, send `sig` to this process once that
    program dies (Linux; a no-op elsewhere or with no shell between).

    dvc runs a stage through `$SHELL -c cmd`. bash replaces itself with a lone command, but dash (/bin/sh on Debian,
    dvc's choice when SHELL is unset) stays as our parent, so PR_SET_PDEATHSIG would watch the shell, which outlives
    a killed dvc. A daemon thread notices instead that a shell in the chain was given another parent."""
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


def supervised() -> bool:
    """True when this process was started by dvc (it sets DVC_STAGE for a stage's command) or is a torchrun worker
    (LOCAL_RANK): a parent whose death means the run was abandoned."""
    return "DVC_STAGE" in os.environ or "LOCAL_RANK" in os.environ


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def stage_lifetime(stage: str, quiet: bool = False) -> Iterator[None]:
    """Run a stage's body so that it dies with its parent when that is dvc or torchrun, and SIGTERM or Ctrl-C end it
    with one line ("[stage] interrupted ...") and exit status 130 instead of a traceback; a user's error met past the
    stage's own checks (a full disk, a non-finite loss) is one line and exit status 1; `quiet` (ranks other than
    0) prints nothing. A stage started by hand from a shell is left to the shell's job control (nohup keeps it)."""
    if supervised():
        die_with_parent()
        die_with_the_shells_parent()
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    except (UserError, OSError) as e:  # one the stage met after its checks (a full disk, a non-finite loss)
        err = user_error(e)
        if err is None:
            raise
        if not quiet:  # on a line of its own: a progress bar may be half drawn on the current one
            print(f"\n{one_line(stage, err)}", file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt as e:
        why = str(e) or "SIGINT"
        if not quiet:
            # on a line of its own: a progress bar may be half drawn on the current one
            print(f"\n[{stage}] interrupted ({why}); finished work is kept, rerun to resume", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130)  # no interpreter teardown: no traceback from threads, atexit or half-shut pools


def under_torchrun() -> bool:
    """True in a process torchrun started (it sets LOCAL_RANK and WORLD_SIZE)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def launch_torchrun(module: str, nproc: int, lock_folder: str | Path, what: str) -> int:
    """Run `python -m module` under torchrun on `nproc` local processes (an argv list: no shell) and return its exit
    status (128 + N when a signal N killed it, as a shell reports it).

    This process takes `lock_folder`'s lock first (a busy folder raises FolderBusyError before torchrun starts) and
    holds it while torchrun runs as its child: rank 0 finds it held by its ancestor (`lock_for_all_ranks`); torchrun,
    and through it every worker, dies with this process; Ctrl-C or SIGTERM stop them all (see `run_child`)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={int(nproc)}",
            "-m", module]
    lock = FolderLock(lock_folder, what).acquire()
    sys.stdout.flush()
    try:
        status = run_child(argv)
    finally:
        lock.release()
    return status if status >= 0 else 128 - status


def run_child(argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Run argv as a child that dies with this process, in its own process group, and return its exit status.

    The terminal's Ctrl-C reaches only this process (the child has its own session); on it, or on SIGTERM, the
    child's whole group is killed at once and KeyboardInterrupt propagates: one line, no screen of tracebacks from
    torchrun and its workers."""
    proc = subprocess.Popen(list(argv), env=env, preexec_fn=die_with_parent, start_new_session=True)
    try:
        return proc.wait()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        raise
