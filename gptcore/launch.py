"""`train.nproc` ranks on this machine, run under torch's own launcher (torchrun's agent) inside the stage's process,
which keeps its locks, does no rank's work, watches its ranks and says the one line for all of them
(docs/resume-and-failures.md). Only a stage that launches ranks imports this module.

The watch (`Watch`) looks at the ranks a few times a second: their processes, and the heartbeat each leaves in the
rank-lines folder (gptcore.lifetime.beat). A rank that makes no progress for the bound its heartbeat names, or that
ends before the run is done, with any status, is named and the other ranks are ended at once. SIGINT, SIGTERM, SIGHUP
and SIGUSR1 to the stage are passed on to the ranks (SIGHUP as SIGTERM, and SIGINT as SIGTERM to a rank still starting,
which then dies quietly): a training rank finishes its step within the stop bound, saves it and leaves the line
saying so (gptcore.lifetime.stop_requests); an eval or a save in flight has its heartbeat's bound; what is left at a
bound is killed. The same stop signal again within REPEAT_S counts once (SLURM
signals every process of a job step); a second one later kills the ranks at once."""
from __future__ import annotations

import logging
import math
import os
import re
import signal
import tempfile
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import psutil

from gptcore.lifetime import (
    FINISHED,
    LAUNCHED,
    LOST_A_PEER,
    REPEAT_S,
    STOPPED,
    TORCHRUN_ID,
    TRACEBACK,
    WARNING_SIGNAL,
    Interrupted,
    paused_together,
    read_beats,
)

POLL = 0.25  # seconds between two looks at the ranks
PAUSED = 5.0  # a look this much later than due: this process was stopped (Ctrl-Z) or starved, and the clocks wait too
UNSEEN = 30.0  # a rank not seen this long after the first one was: it ended before the watch could see it
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # passed on to the ranks, then bounded
WARNING = WARNING_SIGNAL  # a scheduler's early warning (SLURM's --signal=USR1@90): passed on as it is, not bounded
_BLAMELESS = (FINISHED, LOST_A_PEER, STOPPED)  # how a rank's last beat may say it ended: no cause of an end


class Bounds(Protocol):
    """What the launch reads of the params section that starts it (TrainConfig): its name and two bounds, in
    seconds: a rank's start-up before its first heartbeat, and the wait for the ranks to stop after a signal."""

    section: str
    init_timeout: float
    stop_timeout: float


@dataclass(frozen=True)
class RanksEnded:
    """How the ranks ended: the status to exit with, and the line to say, if any, with the rank that said it (a line
    the launcher writes names its rank itself and says 0)."""

    status: int
    line: str | None = None
    rank: int = 0


def run_ranks(module: str, nproc: int, bounds: Bounds) -> RanksEnded:
    """`python -m module` on `nproc` local ranks under torchrun's agent, run in this process (which keeps its locks and
    does no rank's work) and watched (`Watch`) within `bounds`. The one outcome is said here: a rank that stalled, a
    rank killed by a signal (the OOM killer), a rank's own line (rank 0's first), a rank that ended early. SIGINT,
    SIGTERM, SIGHUP or SIGUSR1 to this process stops the ranks and raises `Interrupted`."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # the ranks say what went wrong
    # the agent keeps SIGQUIT alone (it passes it on and stops the ranks); the watch takes the signals that stop a run
    args = ["--standalone", "--nnodes=1", f"--nproc_per_node={int(nproc)}", "--max-restarts=0",
            "--signals-to-handle=SIGQUIT", "-m", module]
    with tempfile.TemporaryDirectory(prefix="gptcore-ranks-") as lines, paused_together():
        watch = Watch(Path(lines), nproc, bounds)
        os.environ[LAUNCHED] = lines
        failures: dict[int, Any] = {}
        try:
            with watch:
                run(parse_args(args))
        except ChildFailedError as e:
            failures = e.failures
        except SignalException as e:
            raise Interrupted(e.sigval) from None
        finally:
            del os.environ[LAUNCHED]
        return watch.outcome(failures)


class Watch:
    """The ranks of one launch, seen from this process: which pid each has, when each ended, its last heartbeat and
    when that last changed; a thread looks every POLL seconds, ending every rank when one stalls or ends early, and
    this process's SIGINT, SIGTERM, SIGHUP and SIGUSR1 are passed on to the ranks (see the module docstring)."""

    def __init__(self, folder: Path, nproc: int, bounds: Bounds) -> None:
        self.folder, self.nproc, self.bounds = folder, nproc, bounds
        self.lock = threading.RLock()  # the signal handler takes it in the main thread, the looks in the watch's
        self.ranks: dict[int, psutil.Process] = {}
        self.gone: dict[int, float] = {}  # when each rank ended (its waiter's clock), or was first seen ended
        self.status: dict[int, int] = {}  # how it ended, as its waiter saw: the exit status, or minus the signal
        self.beats: dict[int, dict[str, Any]] = {}
        self.changed: dict[int, float] = {}  # when each rank's heartbeat last changed (or it was first seen)
        self.first_seen: float | None = None
        self.killed: set[int] = set()  # pids this watch killed: no cause of anything
        self.stalled: str | None = None  # the line for ranks that made no progress
        self.signum: int | None = None  # the signal that stops the run, and when it came
        self.signalled_at = 0.0
        self.repeated_at = -math.inf  # when the last stop signal came: one again within REPEAT_S is the same one
        self.late: list[int] = []  # ranks still running at the stop bound, killed
        self.twice = False  # a second stop signal killed the ranks
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gptcore-watch", daemon=True)
        self._waiters: list[threading.Thread] = []
        self._handlers: dict[int, Any] = {}

    def __enter__(self) -> Watch:
        for sig in (*STOPS, WARNING):
            self._handlers[sig] = signal.signal(sig, self._signalled)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        for waiter in self._waiters:  # the ranks have ended: each waiter is done, or about to say when
            waiter.join(timeout=5)
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)

    # -- the looks --------------------------------------------------------------------------------------------------
    def _watch(self) -> None:
        last = time.monotonic()
        while not self._done.wait(POLL):
            now = time.monotonic()
            with self.lock:
                if now - last > PAUSED:  # this process did not run meanwhile: neither did the time the ranks had
                    self._shift(now - last - POLL)
                last = now
                self._look(now)

    def _shift(self, gap: float) -> None:
        self.changed = {r: t + gap for r, t in self.changed.items()}
        self.signalled_at += gap
        if self.first_seen is not None:
            self.first_seen += gap

    def _look(self, now: float) -> None:
        self._find_ranks(now)
        for rank, proc in self.ranks.items():
            if rank not in self.gone and not _running(proc):  # its waiter missed it (the agent reaped it first)
                self.gone[rank] = now
        for rank, record in read_beats(self.folder).items():  # after the processes: a finished rank's last beat is in
            if record != self.beats.get(rank):
                self.beats[rank], self.changed[rank] = record, now
        live = [r for r in self.ranks if r not in self.gone]
        if self.signum in STOPS:  # the ranks are stopping: what is left at its bound is killed
            late = [r for r in live if now - max(self.signalled_at, self.changed[r]) > self.stop_bound(r)]
            if late:
                self.late += late
                self._kill(late)
            return
        if self.stalled is not None or self.killed:
            return  # already ending
        unseen = (self.first_seen is not None and now - self.first_seen > UNSEEN
                  and len(self.ranks) < self.nproc)
        early = [r for r in self.gone if self.beats.get(r, {}).get("ended") not in _BLAMELESS]
        if live and (early or unseen) and self.signum is None:  # after the warning signal ranks end as they save
            self._kill(live)
            return
        stale = {r: self.bound(r) for r in live if now - self.changed[r] > self.bound(r)[0]}
        if stale:
            self.stalled = self._stall_line(stale)
            self._kill(live)

    def _find_ranks(self, now: float) -> None:
        known = {p.pid for p in self.ranks.values()}
        for child in psutil.Process().children():
            if child.pid in known:
                continue
            try:
                env = child.environ()  # the agent's: a child not yet past its exec shows this process's
            except psutil.Error:
                continue
            if env.get(LAUNCHED) != str(self.folder) or TORCHRUN_ID not in env or "RANK" not in env:
                continue
            rank = int(env["RANK"])
            self.ranks[rank], self.changed[rank] = child, now
            waiter = threading.Thread(target=self._wait, args=(rank, child.pid), name=f"rank{rank}-end", daemon=True)
            waiter.start()
            self._waiters.append(waiter)
            self.first_seen = now if self.first_seen is None else self.first_seen
            if self.signum is not None:
                _send(child, self._passed(self.signum, rank))

    def _wait(self, rank: int, pid: int) -> None:
        """When and how rank `rank` ends: waitid without reaping it (the agent reaps it), so the order in which ranks
        ended is known to the millisecond (torchrun's failures have whole seconds only)."""
        with suppress(ChildProcessError):
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            if info is not None:
                self.status[rank] = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        at = time.monotonic()
        with self.lock:
            self.gone[rank] = min(at, self.gone.get(rank, at))

    def bound(self, rank: int) -> tuple[float, str]:
        """(seconds, param) a rank may go without a new heartbeat: what its last one says, else the start-up's."""
        record = self.beats.get(rank) or {}
        if record.get("bound"):
            return float(record["bound"]), str(record["key"])
        return self.bounds.init_timeout, f"{self.bounds.section}.init_timeout"

    def stop_bound(self, rank: int) -> float:
        """Seconds a rank may go without a new heartbeat once the ranks are asked to stop: the stop bound to finish a
        training step or to end, and an eval or a save in flight (what the stop waits for) its heartbeat's own bound."""
        record = self.beats.get(rank) or {}
        if record.get("doing") in ("evaluating", "saving") and record.get("bound"):
            return max(float(record["bound"]), self.bounds.stop_timeout)
        return self.bounds.stop_timeout

    def _passed(self, signum: int, rank: int) -> int:
        """The signal a rank is sent for this process's `signum`: SIGUSR1 and SIGTERM as they are, SIGINT as it is to a
        rank that has begun training (it saves, and its line names the signal); else SIGTERM, which a rank still
        starting dies of quietly (a SIGINT there is a KeyboardInterrupt's traceback)."""
        if signum in (WARNING, signal.SIGTERM):
            return signum
        started = (self.beats.get(rank) or {}).get("step") is not None
        return signal.SIGINT if signum == signal.SIGINT and started else signal.SIGTERM

    def _kill(self, ranks: list[int]) -> None:
        for rank in ranks:
            proc = self.ranks[rank]
            with suppress(psutil.Error):
                family = [proc, *proc.children(recursive=True)]  # its own workers (a compile's) with it
                for p in family:
                    self.killed.add(p.pid)
                    _send(p, signal.SIGKILL)

    # -- the signals ------------------------------------------------------------------------------------------------
    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        """This process's SIGINT, SIGTERM, SIGHUP or SIGUSR1: pass it on to the ranks (`_passed`); a second stop
        signal, REPEAT_S or more after the one before, kills them at once."""
        with self.lock:
            now = time.monotonic()
            live = [r for r in self.ranks if r not in self.gone]
            if self.signum is not None and now - self.repeated_at < REPEAT_S:
                return  # the same signal, sent to every process of a job step: this one was passed on already
            self.repeated_at = now
            if signum == WARNING:
                if self.signum is None:
                    self.signum = signum
                    for rank in live:
                        _send(self.ranks[rank], signal.SIGUSR1)
                return
            if self.signum in STOPS:  # asked twice: no more waiting (after the warning, a stop is the first)
                self.twice = True
                self._kill(live)
                return
            self.signum, self.signalled_at = signum, now
            for rank in live:
                _send(self.ranks[rank], self._passed(signum, rank))

    # -- the outcome ------------------------------------------------------------------------------------------------
    def outcome(self, failures: dict[int, Any]) -> RanksEnded:
        """The one outcome of the launch, once the agent is done: torchrun's `failures` ({rank: ProcessFailure}) with
        what the watch saw; `Interrupted` after a signal, unless every rank finished all the same."""
        with self.lock:
            beats = read_beats(self.folder)
            if all(beats.get(r, {}).get("ended") == FINISHED for r in range(self.nproc)):
                return RanksEnded(0)
            if self.signum is not None:
                raise Interrupted(self.signum, self._stop_detail())
            if self.stalled is not None:
                return RanksEnded(1, self.stalled)
            ends = {}
            for rank in range(self.nproc):  # in the order they ended; those the watch did not see after those it did
                f = failures.get(rank)
                status = self.status.get(rank, f.exitcode if f is not None else 0)
                pid = self.ranks[rank].pid if rank in self.ranks else (f.pid if f is not None else None)
                ends[rank] = End(self.gone.get(rank, math.inf), status, pid)
            return _ended(ends, self.folder, self.killed)

    def _stop_detail(self) -> str | None:
        """What to say of the ranks' stop after `interrupted (SIGNAME); `: killed at a second signal or at a bound,
        else what a rank's own line says it kept (rank 0's first), if any."""
        if self.twice:
            return "asked twice: the ranks were killed at once; finished checkpoints are kept, rerun to resume"
        if self.late:
            late = sorted(set(self.late))
            who = _ranks(late, {r: self.ranks[r].pid for r in late})
            bound = max(self.stop_bound(r) for r in late)
            key = f"{self.bounds.section}.stop_timeout" if bound == self.bounds.stop_timeout else self.bound(late[0])[1]
            return (f"{who} had not stopped {bound:g} s later ({key}) and {'was' if len(late) == 1 else 'were'} "
                    f"killed; finished checkpoints are kept, rerun to resume")
        said = _said(self.folder)
        return _kept(said[min(said)]) if said else None

    def _stall_line(self, stale: dict[int, tuple[float, str]]) -> str:
        """The line for ranks that made no progress for their bound: the one stopped or stuck in the kernel, else the
        one behind the others, else all of them."""
        states = {r: _state(self.ranks[r]) for r in stale}
        named = [r for r in stale if states[r] is not None]
        if not named:
            steps = {r: self.beats.get(r, {}).get("step") for r in stale}
            if all(isinstance(s, int) for s in steps.values()) and len(set(steps.values())) > 1:
                named = [r for r in stale if steps[r] == min(steps.values())]
        named = sorted(named or stale)
        seconds, key = stale[named[0]]
        who = _ranks(named, {r: self.ranks[r].pid for r in named})
        if len(named) == 1:
            where = _where(self.beats.get(named[0]))
            why = states[named[0]] or f"it is stuck, or slower than {key}={seconds:g} s allows"
        else:
            where = "(" + ", ".join(f"rank {r} {_where(self.beats.get(r))}" for r in named) + ")"
            why = f"one of them is stuck, or they are slower than {key}={seconds:g} s allows"
        others = "the other ranks were ended" if len(named) < len(self.ranks) else "the ranks were ended"
        hint = "" if states[named[0]] else f" (raise {key} if it was only slow)"
        return f"{who} made no progress for {seconds:g} s {where}: {why}; {others} and finished checkpoints are " \
               f"kept: rerun to resume{hint}"

@dataclass(frozen=True)
class End:
    """How one rank ended: when (any clock: only the order counts), its status (an exit status, or minus the signal
    that killed it) and its pid (None where not known)."""

    at: float
    status: int
    pid: int | None


def _ended(ends: dict[int, End], lines: Path, killed: set[int] | frozenset[int] = frozenset()) -> RanksEnded:
    """The one outcome to say of how the ranks ended and the lines and heartbeats they left in `lines`, where no rank
    stalled: the first rank to end that was not killed by the watch (`killed`, pids) and whose last beat does not say
    it finished or lost a peer is the cause: a rank killed by a signal (the OOM killer), a rank's own line (rank 0's
    when it has one too: a mistake every rank meets), a rank that failed without one (a bug: its traceback is above),
    or one that ended with status 0 before the run was done. The agent and the watch end the others after it."""
    said, beats = _said(lines), read_beats(lines)
    causes = [(e.at, r) for r, e in ends.items()
              if e.pid not in killed and beats.get(r, {}).get("ended") not in _BLAMELESS]
    if not causes:
        stopped = sorted(r for r, b in beats.items() if b.get("ended") == STOPPED)
        if not stopped:
            return RanksEnded(0)
        # a rank was sent a stop signal (not the stage): every rank finished its step and saved; rank 0 says what
        rank = 0 if 0 in said else stopped[0]
        return RanksEnded(max(ends[rank].status, 1) if rank in ends else 1, said.get(rank), rank)
    _, rank = min(causes)
    end, where = ends[rank], _where(beats.get(rank))
    left = beats.get(rank, {}).get("ended")
    if left is not None and end.status < 0:  # it was leaving by itself when the agent's SIGTERM came
        end = End(end.at, 1 if left == TRACEBACK else left, end.pid)
    who = f"rank {rank} (pid {end.pid})" if end.pid is not None else f"rank {rank}"
    kept = "the other ranks were stopped and finished checkpoints are kept: rerun to resume"
    if end.status < 0:
        name = signal.Signals(-end.status).name
        why = " (out of memory, or a kill)" if end.status == -signal.SIGKILL else ""
        return RanksEnded(128 - end.status, f"{who} was killed by {name}{why} {where}; {kept}")
    if rank in said:
        first = 0 if 0 in said else rank  # rank 0's when it has one too: a mistake every rank meets
        return RanksEnded(max(end.status, 1), said[first], first)
    if left == TRACEBACK:
        return RanksEnded(max(end.status, 1), f"{who} failed {where}: its traceback is above; {kept}")
    return RanksEnded(end.status or 1, f"{who} ended with exit status {end.status} {where}, before the run was done "
                                       f"(its output above may say why); {kept}")


def _said(lines: Path) -> dict[int, str]:
    """{rank: the line it left} in the ranks' lines folder."""
    return {int(p.name.removeprefix("rank")): p.read_text(encoding="utf-8") for p in lines.glob("rank*")}


def _kept(line: str) -> str:
    """What a rank's line says it kept, without its own `interrupted (SIGNAME); `: the stage names its own signal
    (a rank may have been sent another, `Watch._passed`)."""
    return re.sub(r"^interrupted \([A-Z0-9]+\); ", "", line)


def _where(record: dict[str, Any] | None) -> str:
    """Where a rank was, by its last heartbeat: `in step 2 (training)`, or `at start-up` before any."""
    if not record or record.get("step") is None:
        return "at start-up"
    return f"in step {record['step']} ({record['doing']})"


def _ranks(ranks: list[int], pids: dict[int, int]) -> str:
    """`rank 1 (pid 4712)`, or `ranks 0 and 1 (pids 4711, 4712)`."""
    if len(ranks) == 1:
        return f"rank {ranks[0]} (pid {pids[ranks[0]]})"
    names = ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"
    return f"ranks {names} (pids {', '.join(str(pids[r]) for r in ranks)})"


def _state(proc: psutil.Process) -> str | None:
    """Why a process makes no progress, where its state says: stopped, or waiting in the kernel; else None."""
    with suppress(psutil.Error):
        status = proc.status()
        if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            return "it was stopped (SIGSTOP, or a debugger holds it)"
        if status == psutil.STATUS_DISK_SLEEP:
            return "it is stuck in the kernel, waiting for a disk or a network file system"
    return None


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (a process that ends while it is asked counts as ended)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _send(proc: psutil.Process, sig: int) -> None:
    with suppress(psutil.Error):  # it ended meanwhile
        proc.send_signal(sig)
