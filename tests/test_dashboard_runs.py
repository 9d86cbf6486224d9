"""The Runs page under AppTest: every run in the directory and their evals side by side."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from dashboard_app import FAULTS, REWIND, assert_rendered, chart, from_store, open_page, table

# -- runs ---------------------------------------------------------------------------------------------------------


def test_the_runs_page_lists_both_runs_and_overlays_their_evals(served: Path) -> None:
    app = open_page("runs")
    assert_rendered(app)
    listed = table(app, "name", "status", "last_step")
    assert sorted(zip(listed["name"], listed["status"], listed["last_step"])) == [
        (FAULTS, "finished", 200),
        (REWIND, "finished", 160),
    ]
    assert sorted(app.multiselect(key="compare").value) == [FAULTS, REWIND]
    overlay = chart(app, "runs_overlay")
    assert sorted(t["name"] for t in overlay["data"]) == [FAULTS, REWIND]
    for line in overlay["data"]:
        evals = from_store(
            served / line["name"], "SELECT cum_flops FROM eval_scores WHERE name = 'excess_loss' ORDER BY cum_flops"
        )
        np.testing.assert_allclose(line["x"], evals["cum_flops"])

    app.multiselect(key="compare").unselect(REWIND).run()
    assert [t["name"] for t in chart(app, "runs_overlay")["data"]] == [FAULTS]
