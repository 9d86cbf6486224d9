"""The first minutes of a run a user instruments themselves: a real model's loss falls by two orders of magnitude
over its first hundred steps, bends flat, and then the learning rate blows up. The blow-up must be found however the
fall before it bent (the baseline's line forecasts too low for a hundred steps after the bend, and that bias is
not noise), and nothing before it may page. The cases missed today are strict xfails (issue 24)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bedside.detectors import detect
from bedside.detectors.finding import Severity

BLOW_UP_FACTOR = 100.0
FOUND_WITHIN = 20
"""Steps from the blow-up to the alarm. Measured with the spread taken about each half's own median (not in the
tree: it turned a sample run's bad-shard spike into a divergence): 7-16 steps on seeds 0-5 at 150; today seeds 0-2
give no finding at all (the loss reaches 100x its level)."""


def mlp_run(seed: int, *, blow_up_at: int, steps: int, lr: float, width: int) -> pd.DataFrame:
    """An MLP trained with Adam on fresh random regression batches (a teacher plus noise), its learning rate
    ``BLOW_UP_FACTOR`` times higher from ``blow_up_at``: the job's loss and gradient norm per step."""
    batches = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    teacher = torch.randn(32, 1, generator=batches)
    model = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rows = []
    for step in range(1, steps + 1):
        if step == blow_up_at:
            for group in optimizer.param_groups:
                group["lr"] = lr * BLOW_UP_FACTOR
        x = torch.randn(64, 32, generator=batches)
        loss = F.mse_loss(model(x), x @ teacher + 0.35 * torch.randn(64, 1, generator=batches))
        optimizer.zero_grad()
        loss.backward()
        norm = nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        optimizer.step()
        rows.append((step, loss.item(), norm.item()))
    return pd.DataFrame(rows, columns=["step", "loss", "grad_norm"])


KNEE = pytest.mark.xfail(
    strict=True,
    reason="the baseline's sigma, the MAD of the line's forecast errors, takes the line's bias where the fall bends "
    "flat for noise (0.97 on log scale against the loss's 0.18) and the blow-up scores under the bar: issue 24",
)


@pytest.mark.parametrize(
    ("seed", "lr", "width"),
    [
        pytest.param(0, 3e-3, 64, marks=KNEE),
        pytest.param(1, 3e-3, 64, marks=KNEE),
        pytest.param(2, 3e-3, 64, marks=KNEE),
        (3, 3e-3, 128),
        (4, 5e-3, 32),
    ],
)
def test_a_learning_rate_blow_up_just_after_the_first_steep_fall_is_found(seed: int, lr: float, width: int) -> None:
    check_found(mlp_run(seed, blow_up_at=150, steps=210, lr=lr, width=width), blow_up_at=150)


@pytest.mark.xfail(
    strict=True,
    reason="a divergence that creeps (about 1.5x a step, here 0.21 to 38 over 60 steps) is followed by the "
    "baseline, each point a few sigma over the last: it needs a level compared with the best the run reached",
)
def test_a_learning_rate_blow_up_that_creeps_up_is_found() -> None:
    check_found(mlp_run(3, blow_up_at=150, steps=210, lr=2e-3, width=128), blow_up_at=150)


def check_found(run: pd.DataFrame, *, blow_up_at: int) -> None:
    """An alarm within ``FOUND_WITHIN`` steps of the blow-up, critical, and none before it."""
    first, settled = run["loss"].iloc[:5].median(), run["loss"].iloc[blow_up_at - 20 : blow_up_at].median()
    assert first / settled > 30, "the loss must fall steeply first for this test to mean anything"
    findings = detect(steps=run, only=["loss_spike", "grad_spike"]).findings
    alarms = [f for f in findings if f.severity != Severity.INFO]
    assert [f.summary for f in alarms if f.start_step < blow_up_at] == []
    found = [f.start_step - blow_up_at for f in alarms if f.severity == Severity.CRITICAL]
    assert found and min(found) <= FOUND_WITHIN, [f.summary for f in findings]
