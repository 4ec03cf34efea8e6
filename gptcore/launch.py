"""`train.nproc` ranks on this machine, run under torch's own launcher (torchrun's agent) inside the stage's process,
which keeps its locks, does no rank's work, and says the one line for all of them (docs/resume-and-failures.md). Only a
stage that launches ranks imports this module."""
from __future__ import annotations

import logging
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gptcore.lifetime import LAUNCHED, WARNING_SIGNAL, Interrupted, paused_together

# the signals torchrun's agent passes on to the ranks (its own list, and the early warning): each rank then finishes
# its step, saves and says what it kept (gptcore/train/trainer.py)
FORWARDED = f"SIGTERM,SIGINT,SIGHUP,SIGQUIT,{WARNING_SIGNAL.name}"


@dataclass(frozen=True)
class RanksEnded:
    """How the ranks ended: the status to exit with, and the line to say, if any, with the rank that said it (a bug
    says nothing here: its rank printed its traceback)."""

    status: int
    line: str | None = None
    rank: int = 0


def run_ranks(module: str, nproc: int) -> RanksEnded:
    """`python -m module` on `nproc` local ranks under torchrun's agent, run in this process (which keeps its locks and
    does no rank's work). A rank's mistake is said once, here: a rank killed by a signal (the OOM killer) first, then
    rank 0's line, then the lowest rank's. SIGINT, SIGTERM or SIGHUP to this process stops the ranks and raises
    `Interrupted`."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # the ranks say what went wrong
    with tempfile.TemporaryDirectory(prefix="gptcore-ranks-") as lines, paused_together():
        os.environ[LAUNCHED] = lines
        try:
            run(parse_args(["--standalone", f"--nproc_per_node={int(nproc)}", f"--signals-to-handle={FORWARDED}",
                            "-m", module]))
        except ChildFailedError as e:
            return _ended(e.failures, Path(lines))
        except SignalException as e:
            raise Interrupted(e.sigval, _said(Path(lines)).get(0)) from None
        finally:
            del os.environ[LAUNCHED]
    return RanksEnded(0)


def _ended(failures: dict, lines: Path) -> RanksEnded:
    """The one outcome to say of torchrun's failures ({rank: ProcessFailure}) and the lines ranks left in `lines`. The
    agent stops the other ranks with SIGTERM once one fails, so a SIGTERM is the cause only when nothing else is. A
    rank's line ends the stage with that rank's status (1 for a mistake, 128 + n after a signal's save)."""
    said = _said(lines)
    deaths = sorted((f.timestamp, rank, f) for rank, f in failures.items() if f.exitcode < 0)
    exited = said or any(f.exitcode > 0 for f in failures.values())  # a rank failed on its own
    causes = [d for d in deaths if d[2].exitcode != -signal.SIGTERM] or ([] if exited else deaths)
    if causes:
        _, rank, f = causes[0]
        name = signal.Signals(-f.exitcode).name
        why = " (out of memory, or a kill)" if f.exitcode == -signal.SIGKILL else ""
        return RanksEnded(128 - f.exitcode, f"rank {rank} (pid {f.pid}) was killed by {name}{why}; the other ranks "
                                            f"were stopped and finished checkpoints are kept: rerun to resume")
    if said:
        rank = min(said)  # rank 0's line when it has one
        code = failures[rank].exitcode if rank in failures else 1
        return RanksEnded(code if code > 0 else 1, said[rank], rank)
    _, rank, f = min((f.timestamp, rank, f) for rank, f in failures.items())
    return RanksEnded(f.exitcode if f.exitcode > 0 else 1)  # a bug: its rank printed the traceback


def _said(lines: Path) -> dict[int, str]:
    """{rank: the line it left} in the ranks' lines folder."""
    return {int(p.stem.removeprefix("rank")): p.read_text(encoding="utf-8") for p in lines.glob("rank*")}
