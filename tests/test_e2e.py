"""A fresh clone of the repository runs the whole stage graph with `dvc repro` on a micro budget (the session's one
clone, tests/conftest.py's micro_repro)."""
import math

import pytest

pytestmark = pytest.mark.slow


def finite_numbers(d):
    for v in d.values():
        if isinstance(v, dict):
            yield from finite_numbers(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield v


def test_fresh_clone_dvc_repro_micro(micro_repro):
    for stage in ("fetch", "tokenize", "train", "evaluate", "compare"):
        assert f"Running stage '{stage}'" in micro_repro.repro
    for name, data in micro_repro.metrics.items():
        values = list(finite_numbers(data))
        assert values and all(math.isfinite(v) for v in values), (name, data)
    assert micro_repro.metrics["metrics/eval.json"]["cloze"]["count"] == 20
    assert micro_repro.metrics["metrics/train/metrics.json"]["step"] == 6
    assert all(micro_repro.files.values()), micro_repro.files
    assert "metrics/eval.json" in micro_repro.shown and "metrics/summary.json" in micro_repro.shown
    # Nothing changed: a second repro reruns nothing.
    assert "Running stage" not in micro_repro.again
