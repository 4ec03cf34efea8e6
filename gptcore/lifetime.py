"""Process lifetime: children that die with their parent, SIGTERM as Ctrl-C, and the torchrun launch."""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

_PR_SET_PDEATHSIG = 1


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
    argv = [sys.executable, "-c", "import sys; from gptcore.lifetime import _torchrun; _torchrun(sys.argv[1:])",
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
