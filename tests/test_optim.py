import math

import pytest

from gptcore.train.optim import CosineSchedule, lr_at

MAX, MIN, WARM, STEPS = 6e-4, 6e-5, 715, 19073


def test_warmup_is_linear_from_one_step():
    assert lr_at(0, MAX, MIN, WARM, STEPS) == pytest.approx(MAX / WARM)
    assert lr_at(WARM - 1, MAX, MIN, WARM, STEPS) == pytest.approx(MAX)
    assert lr_at(356, MAX, MIN, WARM, STEPS) == pytest.approx(MAX * 357 / 715)


def test_cosine_decay_points():
    assert lr_at(WARM, MAX, MIN, WARM, STEPS) == pytest.approx(MAX)  # warmup end: cosine starts at max
    mid = WARM + (STEPS - WARM) // 2
    expected = MIN + 0.5 * (1 + math.cos(math.pi * (mid - WARM) / (STEPS - WARM))) * (MAX - MIN)
    assert lr_at(mid, MAX, MIN, WARM, STEPS) == pytest.approx(expected)
    assert lr_at(mid, MAX, MIN, WARM, STEPS) == pytest.approx((MAX + MIN) / 2, rel=1e-3)
    assert lr_at(STEPS, MAX, MIN, WARM, STEPS) == pytest.approx(MIN)
    assert lr_at(STEPS + 1000, MAX, MIN, WARM, STEPS) == MIN


def test_schedule_is_monotone_after_warmup():
    sched = CosineSchedule(MAX, MIN, 10, 100)
    lrs = [sched(s) for s in range(10, 120)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_bad_schedule_is_named():
    with pytest.raises(ValueError, match="warmup_steps"):
        CosineSchedule(MAX, MIN, 200, 100)
