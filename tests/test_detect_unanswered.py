"""A control request filed and never answered (its file deleted or hidden from ``control/requests/``, or no loop
reading requests) is a finding once the run went on past it; an answer, however late, clears it; a run that
wrote nothing after the filing is not judged. Runs of several paces: 100 steps a second, one step a second, one
step every 30 s, and a paused run that only writes heartbeats."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bedside.detectors import detect
from bedside.detectors.kinds import Family

T0 = 1_796_000_000.0


def steps(count: int, period_s: float, *, t0: float = T0) -> pd.DataFrame:
    return pd.DataFrame({"step": np.arange(1, count + 1), "time": t0 + period_s * np.arange(1, count + 1)})


def filing(time: float, request_id: str = "req-lost") -> pd.DataFrame:
    return pd.DataFrame({"time": [time], "request_id": [request_id], "action": ["rewind"], "operator": ["ana"]})


def answers(request_id: str, step: int, time: float) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": [step, step],
            "time": [time, time + 0.01],
            "request_id": [request_id] * 2,
            "action": ["rewind"] * 2,
            "status": ["requested", "applied"],
        }
    )


def found(**frames: pd.DataFrame) -> list:
    return [f for f in detect(**frames, only=["unanswered_request"]).findings if f.kind == "unanswered_request"]


@pytest.mark.parametrize("period_s", [0.01, 1.0, 30.0], ids=["100/s", "1/s", "1/30s"])
def test_a_request_no_rank_answered_is_found_once_the_run_went_on(period_s: float) -> None:
    """20 steps after the filing, and at least 30 s (clocks apart by a little cannot decide it), or 120 s."""
    run = steps(4000 if period_s < 1 else 100, period_s)
    filed_at = float(run["time"].iloc[9]) + period_s / 2  # during step 11
    [finding] = found(steps=run, filed=filing(filed_at))
    by_steps = max(10 + 20, int(np.ceil((filed_at - T0 + 30.0) / period_s)))
    want_step = min(by_steps, int(np.ceil((filed_at - T0 + 120.0) / period_s)))
    assert finding.start_step == want_step and finding.active and finding.severity == "warning"
    assert finding.evidence["request_id"] == "req-lost" and finding.subject == "req-lost"
    assert "req-lost (rewind by ana" in finding.summary and "was not applied" in finding.summary
    assert finding.suggested_action.action == "investigate"


def test_an_answered_request_is_no_finding_and_a_late_answer_clears_one() -> None:
    run = steps(200, 1.0)
    filed_at = T0 + 10.5
    assert found(steps=run, filed=filing(filed_at), actions=answers("req-lost", 11, T0 + 11.2)) == []
    late = answers("req-lost", 150, T0 + 150.2)
    detection = detect(steps=run, filed=filing(filed_at), actions=late, only=["unanswered_request"])
    [finding] = detection.findings
    assert not finding.active and finding.summary.endswith("answered later after all")
    [incident] = detection.incidents
    assert incident.resolved and incident.title.startswith(Family.CONTROL.heading)


def test_a_paused_run_that_only_writes_heartbeats_is_judged_by_the_clock() -> None:
    run = steps(50, 1.0)
    beats = pd.DataFrame({"step": 50, "time": T0 + 50 + np.arange(1, 300), "kind": "heartbeat"})
    [finding] = found(steps=run, events=beats, filed=filing(T0 + 60.0))
    assert finding.start_step == 50 and finding.evidence["steps_since"] == 0
    assert "120 s later" in finding.summary
    assert found(steps=run, events=beats[beats["time"] < T0 + 170], filed=filing(T0 + 60.0)) == []


def test_a_run_that_wrote_nothing_after_the_filing_is_not_judged() -> None:
    """It ended or died: bedside action warned when it was filed that no reader polls."""
    assert found(steps=steps(100, 1.0), filed=filing(T0 + 500.0)) == []


def test_a_filing_whose_clock_runs_ahead_of_the_run_s_is_judged_on_the_run_s_clock() -> None:
    """The filer's clock 10 s ahead: its answer seems to come before it was filed, and still counts; a lost one is
    judged 30 s of the run's time after its filing time, not 20 fast steps after."""
    run = steps(10_000, 0.01)
    ahead = T0 + 2.0 + 10.0  # filed at step 200, as the filer's clock says
    assert found(steps=run, filed=filing(ahead), actions=answers("req-lost", 201, T0 + 2.01)) == []
    [finding] = found(steps=run, filed=filing(ahead))
    assert finding.start_step == 4200 and finding.evidence["seconds_since"] == pytest.approx(30, abs=0.02)


def test_two_lost_requests_are_two_findings_in_one_incident() -> None:
    run = steps(200, 1.0)
    filed = pd.concat([filing(T0 + 10.5, "req-a"), filing(T0 + 12.5, "req-b")], ignore_index=True)
    detection = detect(steps=run, filed=filed, only=["unanswered_request"])
    assert sorted(f.subject for f in detection.findings) == ["req-a", "req-b"]
    assert len(detection.incidents) == 1
