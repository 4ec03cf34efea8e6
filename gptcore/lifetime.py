"""Process lifetime: a stage dies with the program that started it; SIGINT, SIGTERM, SIGHUP and the early-warning
signal stop it as Ctrl-C does (`Interrupted`: one line, exit 128 + the signal's number), except where a loop asks to
finish its step first (`stop_requests`: training saves a checkpoint, then stops); Ctrl-Z pauses its ranks with it; and
a rank a stage launched (gptcore/launch.py) leaves its one line for that stage to say (docs/resume-and-failures.md)."""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

import psutil

_PR_SET_PDEATHSIG = 1
# set by the stage that launches the ranks: the folder where a rank leaves its one line for the stage to say; a rank
# that finds it takes no locks and says nothing itself
LAUNCHED = "GPTCORE_RANK_LINES"
# SLURM's early warning (sbatch --signal=USR1@90): the job's time is nearly up; a run saves and exits 128 + 10, which a
# batch script takes as "requeue me" (docs/resume-and-failures.md)
WARNING_SIGNAL = signal.SIGUSR1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, WARNING_SIGNAL)  # what stop_requests defers
REPEAT_S = 1.0  # the same stop delivered twice within this counts once (SLURM signals every process of a step, and a
# stage forwards the signal to its ranks too)


class Interrupted(KeyboardInterrupt):
    """The process was asked to stop by signal `signum` (SIGINT: Ctrl-C); finished work is kept. `line`: what to say
    of it, where the code that stopped knows what it kept (else the stage's generic line)."""

    def __init__(self, signum: int = signal.SIGINT, line: str | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.line = signum, line


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent exits (Linux PR_SET_PDEATHSIG); if the parent is
    already gone, die now. dvc.yaml's commands `exec` the stage, so its parent is dvc itself, not a shell."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return  # not fatal: only orphan protection is lost
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


def under_torchrun() -> bool:
    """True in a process torchrun started (it sets LOCAL_RANK and WORLD_SIZE)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank_lines() -> Path | None:
    """In a rank a stage launched: the folder where it leaves its one line; else None."""
    return Path(os.environ[LAUNCHED]) if under_torchrun() and LAUNCHED in os.environ else None


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def mortal() -> None:
    """Die with the parent when that is dvc or a launcher (a stage started by hand is left to the shell: nohup keeps
    it). SIGTERM and SIGHUP stop the process as Ctrl-C does, with one line; a rank that says nothing itself (a launched
    one, or one other than 0) dies at once instead, even inside a C call where no Python handler would run."""
    if "DVC_STAGE" in os.environ or under_torchrun():
        die_with_parent()
    quiet = rank_lines() is not None or (under_torchrun() and os.environ.get("RANK", "0") != "0")
    for sig in (signal.SIGTERM, signal.SIGHUP, WARNING_SIGNAL):
        signal.signal(sig, signal.SIG_DFL if quiet else _interrupt)


class StopRequest:
    """What `stop_requests` noted: `signum`, the first stop signal's number (0: none yet)."""

    signum: int = 0


@contextmanager
def stop_requests() -> Iterator[StopRequest]:
    """Inside the block, SIGINT, SIGTERM and WARNING_SIGNAL are noted in the StopRequest it yields, not raised: the
    loop finishes the step in flight, saves and stops itself. A second stop signal, REPEAT_S or more after the first,
    raises Interrupted at once (the save under way is dropped; the previous checkpoint is whole). A signal ignored on
    entry (SIGINT in a background job, as nohup leaves it) stays ignored. Outside the main thread nothing is
    deferred."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    first = [0.0]

    def note(signum: int, frame: object) -> None:
        now = time.monotonic()
        if not request.signum:
            request.signum, first[0] = signum, now
        elif now - first[0] >= REPEAT_S:
            raise Interrupted(signum)

    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, handler in before.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, note)
    try:
        yield request
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python


@contextmanager
def paused_together() -> Iterator[None]:
    """Ctrl-Z (SIGTSTP) stops this process's descendants with it, and a SIGCONT (`fg`) continues them: torch's launcher
    starts each rank in a session of its own, which the terminal's job control does not reach."""
    def each_child(sig: int) -> None:
        for child in psutil.Process().children(recursive=True):
            with suppress(psutil.NoSuchProcess):
                child.send_signal(sig)

    def stop(signum: int, frame: object) -> None:
        each_child(signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)

    old = signal.signal(signal.SIGTSTP, stop), signal.signal(signal.SIGCONT, lambda s, f: each_child(signal.SIGCONT))
    try:
        yield
    finally:
        signal.signal(signal.SIGTSTP, old[0])
        signal.signal(signal.SIGCONT, old[1])


def leave_line(text: str) -> None:
    """In a launched rank: leave `text`, this rank's one line, for the stage that launched it to say."""
    folder = rank_lines()
    assert folder is not None, "only a launched rank leaves its line"
    (folder / f"rank{os.environ['RANK']}").write_text(text, encoding="utf-8")
