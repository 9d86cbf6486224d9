"""The demo's scorecard: each injected fault and the finding that caught it, scored by detectors/scoring.py
over the labels and findings of the run's store."""

from __future__ import annotations

import pandas as pd

from bedside.collectors.store import Store
from bedside.detectors.scoring import scorecard

SCORE_MARGIN = 12
"""Steps a finding may start before or after its fault's window and still count as catching it."""


def demo_scorecard(store: Store, margin: int = SCORE_MARGIN) -> pd.DataFrame:
    """Each injected fault of the run and the finding that caught it (step, fault, target_ranks, found_as,
    delay_steps), from the labels and findings in ``store``."""
    return scorecard(store.fetch_named("score_labels"), store.fetch_named("score_findings"), margin)
