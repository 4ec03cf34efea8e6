"""The schema of params.yaml's `compare:` section (read by the compare stage)."""
from __future__ import annotations

from gptcore.params import Param, Section

COMPARE = Section("compare", {
    "target_val_loss": Param(float, 3.2924, "the speedrun metric: tokens seen when the val loss first reaches this "
                                            "(3.2924: OpenAI GPT-2 124M on the FineWeb-Edu val shard); null: none",
                             above=0.0, also=(None,)),
})
