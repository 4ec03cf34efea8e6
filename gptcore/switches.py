"""The environment switches gptcore reads, all in one place, each parsed strictly: a bad value is one line naming the
switch, as a bad param is. A switch that changes a run's numbers is recorded with the run (the LM head's chunk size:
checkpoints, model/'s manifest and metrics/measured_on.json say which path ran)."""
from __future__ import annotations

import os
import re

from gptcore.errors import UserError

LOSS_CHUNK_ELEMENTS = "GPTCORE_LOSS_CHUNK_ELEMENTS"
SWITCHES = {  # name -> what it sets (docs/benchmarks.md gives the measurements behind the defaults)
    LOSS_CHUNK_ELEMENTS: "logits the LM head's cross-entropy holds at once, a whole number (0: the plain path, every "
                         "logit at once)",
}


def count(name: str) -> int | None:
    """The whole number switch `name` is set to (ASCII digits only), or None when it is unset."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    if not re.fullmatch(r"[0-9]{1,18}", raw.strip(), flags=re.ASCII):
        raise UserError(f"{name}={raw!r}: expected {SWITCHES[name]}; set it so, or unset it")
    return int(raw)
