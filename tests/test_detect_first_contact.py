"""The first minutes of a run a user instruments themselves: a real model's loss falls by two orders of magnitude
over its first hundred steps, bends flat, and then the learning rate blows up. The blow-up must be found however the
fall before it bent (the baseline's line forecasts too low for a hundred steps after the bend, and that bias is
not noise), and nothing before it may page."""

from __future__ import annotations

import first_contact_runs as fc
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bedside.detectors import detect
from bedside.detectors.finding import Severity

BLOW_UP_FACTOR = 100.0
FOUND_WITHIN = 20
"""Steps from the blow-up to the alarm. Measured over 54 runs (seeds 0-5, the three models below, blow-ups at steps
60, 100 and 150): 1-9 steps, none before it; before the baseline learned from the newer half of a young run, seeds
0-2 at step 150 gave no finding at all while the loss rose to 100x its level."""


def mlp_run(seed: int, *, blow_up_at: int | None, steps: int, lr: float, width: int, warmup: int = 0) -> pd.DataFrame:
    """An MLP trained with Adam on fresh random regression batches (a teacher plus noise), the learning rate
    rising linearly over ``warmup`` steps and ``BLOW_UP_FACTOR`` times higher from ``blow_up_at``: the job's loss
    and gradient norm per step."""
    batches = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    teacher = torch.randn(32, 1, generator=batches)
    model = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rows = []
    for step in range(1, steps + 1):
        scale = BLOW_UP_FACTOR if blow_up_at is not None and step >= blow_up_at else min(1.0, step / max(warmup, 1))
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        x = torch.randn(64, 32, generator=batches)
        loss = F.mse_loss(model(x), x @ teacher + 0.35 * torch.randn(64, 1, generator=batches))
        optimizer.zero_grad()
        loss.backward()
        norm = nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        optimizer.step()
        rows.append((step, loss.item(), norm.item()))
    return pd.DataFrame(rows, columns=["step", "loss", "grad_norm"])


MODELS = [(3e-3, 64), (2e-3, 128), (5e-3, 32)]
"""(learning rate, width): the last falls fastest, the second creeps up slowest once blown up (about 1.5x a step)."""


@pytest.mark.parametrize(("lr", "width"), MODELS)
@pytest.mark.parametrize(("seed", "blow_up_at"), [(0, 150), (1, 100), (2, 60)])
def test_a_learning_rate_blow_up_in_the_first_steps_is_found(seed: int, blow_up_at: int, lr: float, width: int) -> None:
    # From step 150 the window of 100 points no longer holds the fall; at 60 the fall has barely bent.
    run = mlp_run(seed, blow_up_at=blow_up_at, steps=blow_up_at + 60, lr=lr, width=width)
    check_found(run, blow_up_at=blow_up_at, fell=30 if blow_up_at >= 100 else 2)


@pytest.mark.parametrize("warmup", [20, 80])
def test_a_blow_up_after_a_linear_warm_up_is_found(warmup: int) -> None:
    # A warm-up holds the fall back: the loss falls slowly, then steeply as the rate comes up, then bends flat.
    run = mlp_run(3, blow_up_at=warmup + 80, steps=warmup + 140, lr=3e-3, width=64, warmup=warmup)
    check_found(run, blow_up_at=warmup + 80, fell=30)


@pytest.mark.parametrize(("lr", "width"), [*MODELS, (1e-2, 64)])
def test_the_first_steep_fall_of_a_clean_run_pages_nobody(lr: float, width: int) -> None:
    run = mlp_run(4, blow_up_at=None, steps=600, lr=lr, width=width)
    findings = detect(steps=run, only=["loss_spike", "grad_spike"]).findings
    assert [f.summary for f in findings if f.severity != Severity.INFO] == []


def check_found(run: pd.DataFrame, *, blow_up_at: int, fell: float) -> None:
    """An alarm within ``FOUND_WITHIN`` steps of the blow-up, critical, and none before it; the loss fell ``fell``
    times or more before it (else the test would mean nothing)."""
    first, settled = run["loss"].iloc[:5].median(), run["loss"].iloc[blow_up_at - 20 : blow_up_at].median()
    assert first / settled > fell, "the loss must fall steeply first for this test to mean anything"
    findings = detect(steps=run, only=["loss_spike", "grad_spike"]).findings
    alarms = [f for f in findings if f.severity != Severity.INFO]
    assert [f.summary for f in alarms if f.start_step < blow_up_at] == []
    found = [f.start_step - blow_up_at for f in alarms if f.severity == Severity.CRITICAL]
    assert found and min(found) <= FOUND_WITHIN, [f.summary for f in findings]


@pytest.mark.parametrize("shape", fc.SHAPES)
@pytest.mark.parametrize(("fault", "ratio", "within"), [
    ("blow_up", 30.0, 3), ("blow_up", 3.0, 3), ("spike", 2.0, 0), ("spike", 3.0, 0), ("plateau", 2.0, 0),
    ("nan", 1.0, 0), ("creep", 1.15, 15),
])  # fmt: skip
def test_each_fault_is_found_from_step_20_after_any_initial_descent(
    shape: str, fault: str, ratio: float, within: int
) -> None:
    # Delays count from the step the fault has the loss at 2x (a creep of 1.15x a step gets there in 5 steps and
    # is found by its level, 4x its lowest, up to 13 steps later behind a warm-up). Before: a 2x plateau at step 20 or 50 went unseen
    # in 18 of 32 runs (its early bar was 2x a line that still forecast the fall, and that line's own spread).
    # Not here, measured by the benchmark: a fault while the loss still falls 15% a step (a creep there only
    # holds it flat, found 12-24 steps after it doubled the loss against where the fall would have taken it).
    outcomes = [
        fc.score(fc.Case(shape, scale, drop, "gaussian", 0.03, fault, ratio, onset, seed=onset + int(scale)))
        for scale, drop, onset in ((5.0, 30.0, 20), (40.0, 30.0, 50), (20.0, 3.0, 150), (80.0, 100.0, 500))
    ]
    assert [(o.case.name, o.delay, o.early) for o in outcomes if o.delay is None or o.delay > within or o.early] == []


@pytest.mark.parametrize(("fault", "ratio"), [("spike", 2.0), ("plateau", 2.0)])
def test_a_2x_fault_in_10_percent_noise_is_found_once_a_few_hundred_scores_show_a_light_tail(
    fault: str, ratio: float
) -> None:
    # Under Gaussian log noise of 10%, a 2x step is 6.9 sigma. Until 800 z-scores had shaped the tail factor, the
    # bar stood at 8 sigma whatever the scores showed. From 200 scores on, z-scores over 3 no more often than
    # normal data's (in 99% of normal runs) let the measured factor stand. The other runs keep the early bar.
    outcomes = [
        fc.score(fc.Case(shape, scale, drop, "gaussian", 0.1, fault, ratio, onset, seed=onset + int(scale) + seed))
        for shape in fc.SHAPES
        for scale, drop, onset in ((20.0, 30.0, 400), (80.0, 300.0, 500), (200.0, 3.0, 700))
        for seed in range(2)
    ]
    found = [o.case.name for o in outcomes if o.delay is not None and o.delay <= 0]
    assert len(found) >= 20 and sum(len(o.early) for o in outcomes) <= 1, (found, [o.early for o in outcomes])


def test_a_short_dip_sets_no_lowest_level_the_run_cannot_come_back_to() -> None:
    # The level check holds the loss to the lowest level it held: six easy batches at a fifth of the loss are
    # no level the run must stay within 4x of (the lowest median of 10 would have been, and the loss back at
    # its level would have read as a divergence that never resolves).
    rng = np.random.default_rng(7)
    loss = np.exp(rng.normal(0.0, 0.01, 600))
    loss[300:306] = 0.2
    run = pd.DataFrame({"step": np.arange(1, 601), "loss": loss, "grad_norm": loss})
    findings = detect(steps=run, only=["loss_spike"]).findings
    assert [f.summary for f in findings if f.severity == Severity.CRITICAL] == []


def two_rank_local_norms(seed: int, *, steps: int, corrupt_at: int, lr: float, width: int) -> np.ndarray:
    """Each of two data-parallel ranks' local gradient norm before the all-reduce (an MLP on fresh random batches,
    the averaged gradient applied), with +50 added to one gradient element of rank 1 at ``corrupt_at``."""
    batches = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    teacher = torch.randn(32, 1, generator=batches)
    model = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    norms = np.zeros((steps, 2))
    for step in range(1, steps + 1):
        local = []
        for rank in range(2):
            x = torch.randn(32, 32, generator=batches)
            loss = F.mse_loss(model(x), x @ teacher + 0.35 * torch.randn(32, 1, generator=batches))
            grads = torch.autograd.grad(loss, list(model.parameters()))
            if rank == 1 and step == corrupt_at:
                grads[0].view(-1)[0] += 50.0
            norms[step - 1, rank] = nn.utils.get_total_norm(grads).item()
            local.append(grads)
        for parameter, *pair in zip(model.parameters(), *local):
            parameter.grad = sum(pair) / 2
        optimizer.step()
    return norms


@pytest.mark.parametrize(("lr", "width"), MODELS)
def test_a_corrupt_gradient_on_one_of_two_ranks_names_that_rank(lr: float, width: int) -> None:
    # Rank 1's local norm 20-50x its peer's, whose norms agree within about 30%: before, d (half the log ratio,
    # 2^2.2-2.8) sat under the pooled bar of 2^2.6-3.1 and no sdc finding came.
    norms = two_rank_local_norms(0, steps=280, corrupt_at=250, lr=lr, width=width)
    frame = pd.DataFrame(
        {
            "step": np.repeat(np.arange(1, 281), 2),
            "rank": np.tile([0, 1], 280),
            "local_grad_norm": norms.ravel(),
            "step_time_s": 0.01,
        }
    )
    findings = detect(rank_steps=frame, only=["sdc"]).findings
    assert [(f.start_step, f.ranks) for f in findings] == [(250, (1,))], [f.summary for f in findings]
