"""eval_stall calibrated on seeded eval curves of varied shapes (tests/eval_curves.py; bench/eval_stall_calibration.py
runs the same at full size): few false stalls on stall-free curves, and stalls found within 3 eval intervals."""

from __future__ import annotations

from functools import cache

import pytest
from eval_curves import SHAPES, Calibration, calibrate, draw

pytestmark = pytest.mark.slow(reason="80 seeded eval curves through the streaming detector")


@cache
def forty() -> Calibration:
    """40 stall-free curves and 40 stalled ones, the benchmark's first seeds."""
    return calibrate(40)


def test_the_curves_are_seeded_and_varied() -> None:
    curves = [draw(seed, stalled=seed % 2 == 1) for seed in range(60)]
    assert [c.clean.tolist() for c in curves[:5]] == [draw(s, stalled=s % 2 == 1).clean.tolist() for s in range(5)]
    assert {c.shape for c in curves} == set(SHAPES)
    assert {c.noise for c in curves} == {"gaussian", "student_t3", "ar1"}
    assert min(c.evals for c in curves) < 20 and max(c.evals for c in curves) > 45
    stalled = [c for c in curves if c.stall_at is not None]
    assert all(6 <= c.stall_at <= c.evals - 4 for c in stalled)


def test_few_false_stalls_on_stall_free_curves_and_stalls_still_found() -> None:
    # Before the prediction interval, 11 of these 40 stall-free curves raised a false stall (18.7% over 300).
    cal = forty()
    assert cal.false_stall_rate <= 0.05, cal
    assert cal.found_ever >= 10, cal


@pytest.mark.xfail(
    strict=True,
    reason="measured over 300 stalled curves: recall 0.48 within 3 evals, 1.3% false stalls (docs/detectors.md)",
)
def test_detectable_stalls_are_found_within_3_evals() -> None:
    assert forty().recall_within_3 >= 0.8
