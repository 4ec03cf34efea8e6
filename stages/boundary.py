"""The one stage boundary every recipe enters: `with stage("train", reads=[...], writes=[...]) as s:`.

It holds the stage's promises (docs/resume-and-failures.md says each): the stage dies with dvc (gptcore.lifetime);
its folder locks, readers sharing and one writer, are held until it ends; the params sections it read are still
params.yaml's at the end, or DVC would record params its outputs were not made with; `s.launch` runs the ranks with
the launcher the stage gives it (gptcore.launch, imported only by a stage that launches); and the error contract
(gptcore.errors.ending): a user's mistake is one line with exit 1, a signal one line with exit 128 + its number,
anything else a traceback. Under a stage's launch the ranks take no locks and say nothing: the stage says the one line
for all of them. This module imports nothing of torch's or of the process group's, so that a stage depends (dvc.yaml)
only on the code it runs.
"""
from __future__ import annotations

import os
import shutil
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

from tqdm import tqdm

from gptcore.errors import UserError, ending
from gptcore.lifetime import (
    FINISHED,
    LOST_A_PEER,
    STOPPED,
    TRACEBACK,
    check_launcher_vars,
    last_beat,
    leave_line,
    mortal,
    rank_lines,
    under_torchrun,
)
from gptcore.locks import FolderLock
from gptcore.params import ParamError, Section, read_params_file
from gptcore.user_files import read_yaml

S = TypeVar("S", bound=Section)
PARAMS = Path("params.yaml")
DVC_YAML = Path("dvc.yaml")
RESULTS = "metrics"  # the folder of every stage's metrics and plots (model/, checkpoints/ and data/ are not results)


class ParamsChanged(UserError):
    """params.yaml's sections a stage read changed while it ran."""


class Stage:
    """What a recipe gets from the boundary: its params sections, its lines, the launch of its ranks."""

    def __init__(self, name: str, params_file: Path) -> None:
        self.name, self.params_file = name, params_file
        self.rank = int(os.environ.get("RANK", "0")) if under_torchrun() else 0
        self.launched = rank_lines() is not None  # a rank whose stage says its lines
        self.quiet = self.launched or self.rank != 0
        self.sections: dict[str, Any] = {}  # each section read, as params.yaml gave it
        self.status = 0

    def config(self, cls: type[S]) -> S:
        """One section of params.yaml as its typed class (`cls.section`), checked once; ParamError names the bad key."""
        params = read_params_file(self.params_file)
        if cls.section not in params:
            raise ParamError(cls.section, None, f"missing section (found: {', '.join(sorted(params)) or 'nothing'})")
        self.sections[cls.section] = params[cls.section]
        return cls.read(params[cls.section])

    def preset(self) -> str | None:
        """The preset params.yaml was composed from (its top-level `preset`), or None."""
        name = read_params_file(self.params_file).get("preset")
        return name if isinstance(name, str) else None

    def say(self, *lines: str) -> None:
        """Print each line as this stage's (rank 0 only)."""
        for line in lines if self.rank == 0 else ():
            print(f"[{self.name}] {line}", flush=True)

    def launch(self, nproc: int, run_ranks: Callable[..., Any], *args: Any) -> bool:
        """With `nproc` > 1 outside torchrun, run this stage on `nproc` ranks with `run_ranks` (gptcore.launch's: this
        process keeps the locks, does no rank's work, watches the ranks and says their one line; `args` go to it) and
        return True: the recipe returns. False where this process is to do the work itself."""
        if nproc <= 1 or under_torchrun():
            return False
        ended = run_ranks(f"stages.{self.name}", nproc, *args)
        self.status = ended.status
        if ended.line is not None:  # on a line of its own: a rank's progress bar may be half drawn on the current one
            label = self.name if ended.rank == 0 else f"{self.name} rank {ended.rank}"
            print(f"\n[{label}] {ended.line}", file=sys.stderr, flush=True)
        return True

    def check_params(self) -> None:
        """ParamsChanged naming each key of the sections read that params.yaml no longer gives as the run saw it."""
        if not self.sections:
            return
        now = read_params_file(self.params_file)
        changed = []
        for name, was in self.sections.items():
            new = now.get(name)
            if not (isinstance(was, dict) and isinstance(new, dict)):
                changed += [] if new == was else [f"{name}: {was!r} -> {new!r}"]
                continue
            changed += [f"{name}.{k}: {was.get(k)!r} -> {new.get(k)!r}" for k in sorted({*was, *new})
                        if was.get(k) != new.get(k)]
        if changed:
            raise ParamsChanged(
                f"{self.params_file} changed while {self.name} ran ({', '.join(changed)}): its outputs, kept, were "
                f"made with the old values, and failing keeps DVC from recording the new ones; rerun the stage. One "
                f"run per project at a time: queue experiments (dvc exp run --queue) or use a second clone")


@contextmanager
def stage(name: str, reads: Sequence[str | Path] = (), writes: Sequence[str | Path] = (),
          params: str | Path = PARAMS) -> Iterator[Stage]:
    """Run a stage's recipe inside the boundary (see the module docstring); `reads` and `writes` are the folders
    whose locks it holds (shared and exclusive). Under torchrun rank 0 takes the locks, unless a stage launched the
    ranks and holds them."""
    mortal()
    s = Stage(name, Path(params))
    try:
        check_launcher_vars()  # before anything is removed, read or waited for
        if not s.launched and s.rank == 0:
            for path in copied_results(name):
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        with ExitStack() as locks:
            if not s.launched:
                for folder in reads:
                    locks.enter_context(FolderLock(folder, name, shared=True))
                for folder in writes if s.rank == 0 else ():
                    locks.enter_context(FolderLock(folder, name))
            yield s
            if s.status == 0 and s.rank == 0:
                s.check_params()
        if s.launched:
            last_beat(FINISHED)  # the stage watching this rank knows it ended as it should
    except BaseException as e:
        end = ending(e, in_rank=under_torchrun())
        if end is None and s.launched:
            _left_by_itself(e)
        if end is None:
            raise
        status, line = end
        if isinstance(e, KeyboardInterrupt):  # a signal, or Ctrl-C
            _interrupted(s, status - 128, getattr(e, "line", None))
        if line is None:  # a collective failed because another rank went away: that rank's line, not this one's
            if s.launched:
                last_beat(LOST_A_PEER)  # so the stage does not name this rank
            os._exit(status)
        if s.launched:
            leave_line(line)  # the stage that launched this rank says it
            os._exit(status)
        _say(f"[{name if s.rank == 0 else f'{name} rank {s.rank}'}] {line}")
        sys.exit(status)
    if s.status:
        sys.exit(s.status)


def _left_by_itself(e: BaseException) -> None:
    """A launched rank leaving for `e`, no mistake the stage says: its last beat says how, a bug's traceback (which
    follows) or sys.exit's status, so the stage names it. A SystemExit leaves at once: the other ranks learn it from
    their collectives, not from a timeout."""
    if not isinstance(e, SystemExit):
        last_beat(TRACEBACK)
        return
    status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    last_beat(status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def copied_results(name: str) -> list[Path]:
    """The results (files under metrics/) of stage `name` and every later stage, where DVC runs this experiment in a
    copy of the project (a queued run: DVC_ROOT names the project it was queued from, not this folder). The copy
    carries them from the workspace it was queued from: another run's figures, which `dvc exp show` would set beside
    this run's params until it writes its own. In the project itself nothing is listed: there a new run moves the
    previous one's results aside (later_results), never deletes them."""
    root = os.environ.get("DVC_ROOT")
    if not root or Path(root).resolve() == Path.cwd().resolve():
        return []
    return [path for path in _results(name, later=False) if path.exists()]


def later_results(name: str) -> list[Path]:
    """The results (paths under metrics/, dvc.yaml's outs, metrics and plots) of the stages after `name`: what the
    train stage moves aside with the previous run when it starts a fresh one, so that `dvc metrics show`, `dvc exp
    show`'s workspace row and the plots show the running run's figures alone."""
    return _results(name, later=True)


def _results(name: str, later: bool) -> list[Path]:
    """The paths under metrics/ that dvc.yaml's stages from `name` on (after it, if `later`) declare, in order."""
    if not DVC_YAML.is_file():
        return []
    stages = read_yaml(DVC_YAML)["stages"]  # in pipeline order
    if name not in stages:
        return []
    paths = []
    for spec in list(stages.values())[list(stages).index(name) + later:]:
        for entry in (e for kind in ("outs", "metrics", "plots") for e in spec.get(kind) or []):
            path = Path(next(iter(entry)) if isinstance(entry, dict) else entry)
            if path.parts[0] == RESULTS:
                paths.append(path)
    return paths


def _say(line: str) -> None:
    """Print `line` on stderr clear of any progress bar of this process (tqdm.write moves its bars out of the way)."""
    sys.stdout.flush()
    tqdm.write(line, file=sys.stderr)
    sys.stderr.flush()


def _interrupted(s: Stage, signum: int, line: str | None = None) -> None:
    """One line, `interrupted (SIGNAME); ` and `line` (what the code that stopped said it kept: a training run, the
    step it saved; the launch, how its ranks stopped) or the generic words, and exit 128 + signum, without interpreter
    teardown: no traceback from threads, atexit or half-shut pools. A rank that says nothing itself leaves at once; a
    launched rank 0 leaves that line for its stage to say, and every launched rank's last beat says it stopped."""
    import signal

    said = f"interrupted ({signal.Signals(signum).name}); {line or 'finished work is kept, rerun to resume'}"
    if s.launched:
        last_beat(STOPPED)  # the stage does not take its end for a cause to end the others: they are saving too
        if s.rank == 0 and line is not None:
            leave_line(said)
    if not s.quiet:
        # on a line of its own: a progress bar, this process's or a rank's, may be half drawn on the current one
        print(f"\n[{s.name}] {said}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(128 + signum)
