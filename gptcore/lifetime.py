"""Process lifetime: a stage dies with the program that started it; SIGINT, SIGTERM, SIGHUP and the early-warning
signal stop it as Ctrl-C does (`Interrupted`: one line, exit 128 + the signal's number), except where a loop asks to
finish its step first (`stop_requests`: training saves a checkpoint, then stops); Ctrl-Z pauses its ranks with it;
torchrun's variables count only in a process torchrun started; and a rank a stage launched (gptcore/launch.py) leaves
its one line, and its heartbeat, for that stage (docs/resume-and-failures.md)."""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Iterator

import psutil

from gptcore.errors import UserError

_PR_SET_PDEATHSIG = 1
# set by the stage that launches the ranks: the folder where a rank leaves its one line for the stage to say, and its
# heartbeat; a rank that finds it takes no locks and says nothing itself
LAUNCHED = "GPTCORE_RANK_LINES"
# what torchrun sets in each rank it starts; TORCHELASTIC_RUN_ID, set by its agent alone, tells its ranks from a
# process that merely inherited the others (a batch job's or a container's environment)
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TORCHRUN_ID = "TORCHELASTIC_RUN_ID"
# SLURM's early warning (sbatch --signal=USR1@90): the job's time is nearly up; a run saves and exits 128 + 10, which a
# batch script takes as "requeue me" (docs/resume-and-failures.md)
WARNING_SIGNAL = signal.SIGUSR1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, WARNING_SIGNAL)  # what stop_requests defers
REPEAT_S = 1.0  # the same stop delivered twice within this counts once (SLURM signals every process of a step, and a
# stage passes the signal on to its ranks too)


class Interrupted(KeyboardInterrupt):
    """The process was asked to stop by signal `signum` (SIGINT: Ctrl-C); finished work is kept. `line`: what to say
    of it after `interrupted (SIGNAME); `, where the code that stopped knows what it kept (a training run: the step it
    saved) or the stage knows how its ranks stopped (gptcore.launch); else the stage's generic words."""

    def __init__(self, signum: int = signal.SIGINT, line: str | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.line = signum, line


class StrayLauncherVars(UserError):
    """torchrun's variables ask for several processes, but torchrun did not start this one."""


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
    """True in a process torchrun started: LOCAL_RANK and WORLD_SIZE set, and TORCHELASTIC_RUN_ID, which only torchrun's
    agent sets (the first two alone may be left over in a batch job's or a container's environment)."""
    return all(k in os.environ for k in ("LOCAL_RANK", "WORLD_SIZE", TORCHRUN_ID))


def check_launcher_vars() -> None:
    """StrayLauncherVars where torchrun's variables ask for more than one process (WORLD_SIZE > 1) in a process torchrun
    did not start: joining them would wait for ranks nobody started, and running alone would drop what a launcher
    asked. With WORLD_SIZE 1 or unset they ask nothing, and the process runs alone."""
    if under_torchrun() or os.environ.get("WORLD_SIZE", "1").strip() == "1":
        return
    found = " ".join(f"{k}={os.environ[k]}" for k in TORCHRUN_VARS if k in os.environ)
    raise StrayLauncherVars(
        f"the environment says this is one of several torchrun processes ({found}) but torchrun did not start it "
        f"({TORCHRUN_ID} is unset): a batch job or a container left them. Unset them (unset "
        f"{' '.join(k for k in TORCHRUN_VARS if k in os.environ)}) and run again; train.nproc starts the ranks of "
        f"one machine, and README's torchrun recipe those of several")


def rank_lines() -> Path | None:
    """In a rank a stage launched: the folder where it leaves its one line and its heartbeat; else None."""
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


# how a rank's last beat says it ended: normally, because another rank went away (its collective failed), or stopped
# by a signal (having saved what it could, with the others), all no cause to end the others; or by itself: a bug's
# traceback, or an exit status (sys.exit), which the stage names
FINISHED, LOST_A_PEER, STOPPED, TRACEBACK = "finished", "lost a peer", "stopped", "traceback"
_BEAT_BYTES = 512  # one record, rewritten in place: never shorter, so no truncation, and read whole or parsed again
_beat_fd: int | None = None
_last_beat: dict[str, Any] = {"step": None, "doing": None}


def beat(step: int | None, doing: str, bound: float | None = None, key: str | None = None) -> None:
    """In a launched rank: tell the stage watching it that it is `doing` (training, evaluating, saving, ...) at
    `step`, and that it may take `bound` seconds (the param `key`) before its next beat; elsewhere nothing. One pwrite
    of a small record: cheap enough for every step."""
    _write_beat({"pid": os.getpid(), "step": step, "doing": doing, "bound": bound, "key": key})


def last_beat(ended: str | int) -> None:
    """In a launched rank: say how it ends, keeping what its last beat said it was doing: FINISHED, LOST_A_PEER,
    TRACEBACK (a bug) or the status it leaves with by itself (sys.exit); elsewhere nothing."""
    _write_beat({**_last_beat, "pid": os.getpid(), "ended": ended})


def _write_beat(record: dict[str, Any]) -> None:
    global _beat_fd, _last_beat
    folder = rank_lines()
    if folder is None:
        return
    _last_beat = record
    if _beat_fd is None:
        _beat_fd = os.open(folder / f"beat{os.environ['RANK']}", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.pwrite(_beat_fd, json.dumps(record).ljust(_BEAT_BYTES).encode("utf-8"), 0)


def read_beats(folder: Path) -> dict[int, dict[str, Any]]:
    """The last beat of each rank that left one in `folder` (a record caught mid-write is skipped until next time)."""
    beats = {}
    for path in folder.glob("beat*"):
        with suppress(OSError, ValueError):
            beats[int(path.name.removeprefix("beat"))] = json.loads(path.read_bytes())
    return beats
