"""params.yaml's `compare:` section (`CompareConfig`), read by the compare stage."""
from __future__ import annotations

from dataclasses import dataclass

from gptcore.params import Section, param


@dataclass(frozen=True, kw_only=True)
class CompareConfig(Section):
    """params.yaml's `compare:` section: the speedrun's target."""

    section = "compare"
    target_val_loss: float | None = param(3.2924, "the speedrun metric: tokens seen when the val loss first reaches "
                                                  "this (3.2924: OpenAI GPT-2 124M on the FineWeb-Edu val shard); "
                                                  "null: none", above=0.0)
