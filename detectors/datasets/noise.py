"""The noise families a generated run's metrics can be drawn from: the one name list the CLI needs at start-up."""

from __future__ import annotations

NOISE_FAMILIES = ("gaussian", "student", "lognormal")
