"""The foreign generator's truth is honest, and the detectors pass its named rows (tests/foreign_benchmark.py;
bench/detect_quality.py --suite foreign runs them at full size)."""

from __future__ import annotations

import numpy as np
import pytest
from foreign_benchmark import NAMED, Scored, scenarios, score
from foreign_runs import NOISES, STRAGGLER_FLOOR, Spike, curve_run, pipeline_run, rank_offsets, standout

SMALL = scenarios(quick=True)


def log_noise(seed: int, model: str, steps: int = 4000) -> np.ndarray:
    """The loss's log ratio to its trend in a clean run."""
    run = curve_run("clean", seed, steps, model=model)
    return np.log(run.frames["steps"]["loss"].to_numpy() / run.trends["loss"])


@pytest.mark.parametrize("model", NOISES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_labelled_fault_stands_out_of_its_runs_unlabelled_excursions(model: str, seed: int) -> None:
    runs = [
        curve_run("moe", seed, 4000, model=model, moe_every=150, spikes=(Spike(1500, 2.0), Spike(3000, 3.0))),
        curve_run("plateau", seed, 400, model=model, spikes=(Spike(220, 2.0, last=222),)),
        pipeline_run("sick", seed, 44, model=model, sick=(9, 1.3, 0)),
        pipeline_run("late", seed, 400, model=model, sick=(3, 1.3, 150)),
    ]
    for run in runs:
        assert standout(run) > 1.0, run.name
    for steps in (44, 400):
        clean = pipeline_run("clean", seed, steps, model=model)
        assert rank_offsets(clean)[1] < STRAGGLER_FLOOR


def test_the_noise_is_heavy_tailed_and_autocorrelated_as_named() -> None:
    for seed in range(3):
        ar, iid = log_noise(seed, "student_ar"), log_noise(seed, "student")
        assert 0.7 < np.corrcoef(ar[:-1], ar[1:])[0, 1] < 0.97
        assert abs(np.corrcoef(iid[:-1], iid[1:])[0, 1]) < 0.1
        robust = 1.4826 * np.median(np.abs(iid - np.median(iid)))
        assert np.mean(np.abs(iid) > 5 * robust) > 0.005  # a normal noise has 6e-7 of its points there


def test_the_runs_are_seeded() -> None:
    a, b, c = (SMALL["moe bursts"](seed, "student_ar") for seed in (3, 3, 4))
    assert a.frames["steps"].equals(b.frames["steps"]) and a.labels == b.labels
    assert not a.frames["steps"]["loss"].equals(c.frames["steps"]["loss"])


@pytest.mark.parametrize("model", NOISES)
@pytest.mark.parametrize("row", sorted(NAMED))
def test_the_named_rows_pass(row: str, model: str) -> None:
    for seed in (0, 1):
        scored: Scored = score(SMALL[row](seed, model), model)
        passed, figure = NAMED[row](scored)
        assert passed, f"{row}, seed {seed}: {figure}"


@pytest.mark.parametrize("model", NOISES)
def test_catastrophic_spikes_among_moe_bursts_are_found_at_their_step(model: str) -> None:
    spikes = (Spike(1500, 2.0), Spike(3000, 5.0))
    scored = score(curve_run("moe", 0, 4000, model=model, moe_every=300, spikes=spikes), model)
    loss = scored.matches[scored.matches["kind"] == "loss_spike"]
    assert loss["found"].all() and (loss["delay"] == 0).all()
