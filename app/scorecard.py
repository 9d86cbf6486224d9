"""The demo's scorecard: each injected fault and the finding that caught it, scored by detectors/scoring.py
over the labels and findings of the run's store."""
from __future__ import annotations

from typing import Any

import pandas as pd

from bedside.collectors.store import Store
from bedside.detectors.scoring import scorecard

SCORECARD = "demo_scorecard"
"""The name the demo's summary gives its scorecard."""


def summary_frame(store: Store, name: str, params: dict[str, Any]) -> pd.DataFrame:
    """One entry of the demo's summary: the scorecard for ``SCORECARD`` (``params``: its margin), else the
    named query ``name``."""
    if name != SCORECARD:
        return store.fetch_named(name, params)
    return scorecard(store.fetch_named("score_labels"), store.fetch_named("score_findings"), int(params["margin"]))
