"""What every stage recipe shares: reading one validated section of params.yaml, and user errors as one line."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from gptcore.errors import UserError, one_line, user_error
from gptcore.params import ParamError, Section, read_params_file

PARAMS = Path("params.yaml")


def load_params(schema: Section, path: str | Path = PARAMS) -> dict[str, Any]:
    """One section of params.yaml, validated by its schema (defaults filled in); ParamError names the bad key."""
    params = read_params_file(path)
    if schema.name not in params:
        raise ParamError(schema.name, None, f"missing section (found: {', '.join(sorted(params)) or 'nothing'})")
    return schema.validate(params[schema.name])


@contextmanager
def user_errors(stage: str, path: str | Path = PARAMS, quiet: bool = False) -> Iterator[None]:
    """Turn a user's mistake (a UserError: a bad param, a missing or bad input file, a busy folder, no GPU, a full
    disk) into one line on stderr and exit status 1; any other exception is a bug and keeps its traceback.

    `quiet` (torchrun ranks other than 0, which meet the same mistake) exits 1 without a line of its own."""
    try:
        yield
    except ParamError as e:
        e.file = str(path)
        sys.exit(1 if quiet else one_line(stage, e))
    except (UserError, OSError) as e:
        err = user_error(e)
        if err is None:
            raise
        sys.exit(1 if quiet else one_line(stage, err))
