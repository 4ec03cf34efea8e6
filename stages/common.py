"""What every stage recipe shares: reading one validated section of params.yaml, and user errors as one line."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from gptcore.errors import UserError
from gptcore.params import ParamError, Section

PARAMS = Path("params.yaml")


def load_params(schema: Section, path: str | Path = PARAMS) -> dict[str, Any]:
    """One section of params.yaml, validated by its schema (defaults filled in); ParamError names the bad key."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path.resolve()}: params file not found (run stages from the project root)")
    with open(path, encoding="utf-8") as f:
        params = yaml.safe_load(f) or {}
    if schema.name not in params:
        raise ParamError(schema.name, None, f"missing section (found: {', '.join(sorted(params)) or 'nothing'})")
    return schema.validate(params[schema.name])


@contextmanager
def user_errors(stage: str, path: str | Path = PARAMS, quiet: bool = False) -> Iterator[None]:
    """Turn a user's mistake (a bad param, a missing or bad input file, a busy folder) into one line on stderr, exit 1.

    `quiet` (torchrun ranks other than 0, which meet the same mistake) exits 1 without a line of its own."""
    try:
        yield
    except ParamError as e:
        sys.exit(1 if quiet else f"[{stage}] {path} {e}")
    except (FileNotFoundError, UserError, ValueError) as e:  # ValueError: until every user error is a UserError
        sys.exit(1 if quiet else f"[{stage}] {e}")
