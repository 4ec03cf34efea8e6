"""The one stage boundary every recipe enters: `with stage("train", reads=[...], writes=[...]) as s:`. It owns dying
with dvc or torchrun, the folder locks (readers share, one writer; held until the stage ends), the params sections
read (still params.yaml's at the end, or DVC would record params the outputs were not made with), the torchrun launch
and the one-line error contract: a user's error is one line and exit 1, Ctrl-C or SIGTERM one line and 130, anything
else a traceback. Under torchrun only rank 0 speaks and takes the writer locks (or the stage that launched it)."""
from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence, TypeVar

from gptcore.errors import UserError, one_line, user_error
from gptcore.lifetime import mortal, run_torchrun, under_torchrun
from gptcore.locks import reading, writer_lock
from gptcore.params import ParamError, Section, read_params_file

S = TypeVar("S", bound=Section)

PARAMS = Path("params.yaml")
# how long a rank other than 0 that fails waits for rank 0, which meets the same mistakes, to say it (torchrun then
# ends this rank): starting a moment sooner, it would exit first and torchrun's SIGTERM would be all rank 0 said
QUIET_RANK_GRACE_S = 10.0


class ParamsChanged(UserError):
    """params.yaml's sections a stage read changed while it ran."""


class Stage:
    """What a recipe gets from the boundary: its params sections, its lines, the torchrun launch."""

    def __init__(self, name: str, params_file: Path) -> None:
        self.name, self.params_file = name, params_file
        self.quiet = os.environ.get("RANK", "0") != "0"  # ranks other than 0 meet the same mistakes
        self.sections: dict[str, Any] = {}  # each section read, as params.yaml gave it
        self.status = 0

    def config(self, cls: type[S]) -> S:
        """One section of params.yaml as its typed class (`cls.section`), checked once; ParamError names the bad key."""
        params = read_params_file(self.params_file)
        if cls.section not in params:
            raise ParamError(cls.section, None, f"missing section (found: {', '.join(sorted(params)) or 'nothing'})")
        self.sections[cls.section] = params[cls.section]
        return cls.read(params[cls.section])

    def say(self, *lines: str) -> None:
        """Print each line as this stage's (rank 0 only)."""
        for line in lines if not self.quiet else ():
            print(f"[{self.name}] {line}", flush=True)

    def launch(self, nproc: int) -> bool:
        """With `nproc` > 1 outside torchrun, run this stage under torchrun on `nproc` processes (this process keeps
        the locks and does no rank's work) and return True: the recipe returns, the stage exits with torchrun's
        status. False where this process is to do the work itself."""
        if nproc <= 1 or under_torchrun():
            return False
        self.status = run_torchrun(f"stages.{self.name}", nproc)
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
    whose locks it holds (shared and exclusive)."""
    mortal()
    s = Stage(name, Path(params))
    try:
        with ExitStack() as locks:
            for folder in reads:
                locks.enter_context(reading(folder, name))
            for folder in writes if not s.quiet else ():
                if (lock := writer_lock(folder, name)) is not None:
                    locks.enter_context(lock)
            yield s
            if "gptcore.distributed" in sys.modules:  # the recipe joined a process group: leave it with every rank
                sys.modules["gptcore.distributed"].teardown()
            if s.status == 0:
                s.check_params()
    except (UserError, OSError) as e:
        err = user_error(e)
        if err is None:
            raise
        who = name
        if s.quiet:  # a rank other than 0 (QUIET_RANK_GRACE_S)
            time.sleep(QUIET_RANK_GRACE_S)
            s.quiet, who = False, f"{name} rank {os.environ['RANK']}"  # still here: a mistake of this rank's alone
        _fail(s, one_line(who, err), 1)
    except KeyboardInterrupt as e:
        _fail(s, f"[{name}] interrupted ({str(e) or 'SIGINT'}); finished work is kept, rerun to resume", 130)
    if s.status:
        sys.exit(s.status)


def _fail(s: Stage, line: str, status: int) -> None:
    if not s.quiet:
        # on a line of its own where a progress bar may be half drawn on the current one (an interrupt: also a rank's)
        bar = status == 130 or "tqdm" in sys.modules and len(getattr(sys.modules["tqdm"].tqdm, "_instances", ())) > 0
        print(("\n" if bar else "") + line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    if status == 130:
        os._exit(130)  # no interpreter teardown: no traceback from threads, atexit or half-shut pools
    sys.exit(status)
