"""checkpoint_corrupt: checkpoints the trainer found corrupt become one finding with their paths and reasons,
critical from the second one, cleared by the next checkpoint saved; the same however the rows are batched."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from telemetry_frames import T0, checkpoint_frame

from bedside.detectors.checkpoint_corrupt import CheckpointCorruptDetector
from bedside.detectors.errors import DetectorConfigError
from bedside.detectors.finding import Severity
from bedside.detectors.telemetry import RunState, TelemetryBatch

REASON = "checkpoints/step-00000020-t0/__0_0.distcp: sha256 1f… does not match the manifest's 9a…"


def events(rows: list[tuple[float, int, str, str | None, str | None]], timeline: int = 0) -> pd.DataFrame:
    """``checkpoints`` rows of rank 0 from (seconds, step, event, path, message)."""
    frame = checkpoint_frame([(0, T0 + t, step, event) for t, step, event, _, _ in rows], timeline=timeline)
    frame["path"] = [path for *_, path, _ in rows]
    frame["message"] = [message for *_, message in rows]
    return frame


RESUME_PAST_TWO = [
    (1.0, 10, "saved", "checkpoints/step-00000010-t0", None),
    (2.0, 20, "saved", "checkpoints/step-00000020-t0", None),
    (3.0, 25, "corrupt", "checkpoints/step-00000020-t0", REASON),
    (3.1, 25, "corrupt", "checkpoints/step-00000010-t0", "checkpoints/step-00000010-t0/manifest.json: missing"),
    (9.0, 40, "saved", "checkpoints/step-00000040-t1", None),
]


def detect(rows: pd.DataFrame, parts: int = 1) -> dict[str, object]:
    """The last state of each finding, the batch fed in ``parts`` consecutive pieces."""
    detector, run = CheckpointCorruptDetector(), RunState()
    detector.bind(run)
    found = {}
    for piece in TelemetryBatch(checkpoints=rows).split(parts):
        run.observe(piece)
        found.update({f.finding_id: f for f in detector.update(piece)})
    return found


def test_one_corrupt_checkpoint_is_a_warning_naming_it_and_why() -> None:
    [finding] = detect(events(RESUME_PAST_TWO[:3])).values()
    assert (finding.kind, finding.severity, finding.active, finding.start_step) == (
        "checkpoint_corrupt",
        Severity.WARNING,
        True,
        25,
    )
    assert finding.evidence["checkpoints"] == [
        {"path": "checkpoints/step-00000020-t0", "step": 20, "timeline": 0, "reason": REASON}
    ]
    assert finding.evidence["newest_good_checkpoint_step"] == 10  # the one found corrupt no longer counts
    assert finding.suggested_action.action == "investigate"


@pytest.mark.parametrize("parts", [1, 2, 5])
def test_a_checkpoint_found_corrupt_is_no_longer_good_for_any_detector(parts: int) -> None:
    """Matched by path: the corrupt events come at step 25, where the trainer was, not at the checkpoints' steps."""
    run = RunState()
    for piece in TelemetryBatch(checkpoints=events(RESUME_PAST_TWO)).split(parts):
        run.observe(piece)
    assert run.good_checkpoints == {0: [40]} and run.checkpoint_before(0, 30) is None
    assert run.checkpoint_before(0, 41) == 40


def test_a_second_one_makes_it_critical_and_the_next_save_clears_it() -> None:
    [finding] = detect(events(RESUME_PAST_TWO)).values()
    assert finding.severity == Severity.CRITICAL and finding.evidence["count"] == 2
    assert not finding.active and finding.evidence["cleared_at_step"] == 40


def test_a_corrupt_checkpoint_after_the_clearing_save_opens_a_new_finding() -> None:
    later = [*RESUME_PAST_TWO, (10.0, 45, "corrupt", "checkpoints/step-00000040-t1", REASON)]
    found = detect(events(later))
    assert sorted(f.start_step for f in found.values()) == [25, 45]
    assert [f.active for f in sorted(found.values(), key=lambda f: f.start_step)] == [False, True]


@pytest.mark.parametrize("parts", [2, 3, 5])
def test_streaming_equals_one_batch(parts: int) -> None:
    assert detect(events(RESUME_PAST_TWO), parts) == detect(events(RESUME_PAST_TWO))


def test_critical_count_must_be_positive() -> None:
    with pytest.raises(DetectorConfigError, match="critical_count = 0 is out of range"):
        CheckpointCorruptDetector(critical_count=0)


SUMMARY = re.compile(
    r"(\d+) checkpoints? failed verification \(latest: ([\w/.-]+)\)(?:; a checkpoint was saved since, at step (\d+))?$"
)


@pytest.mark.parametrize("rows", [3, 4, 5], ids=["one", "two", "cleared"])
def test_the_summary_states_the_evidence(rows: int) -> None:
    [finding] = detect(events(RESUME_PAST_TWO[:rows])).values()
    match = SUMMARY.match(finding.summary)
    assert match, finding.summary
    count, latest, saved = match.groups()
    ev = finding.evidence
    assert int(count) == ev["count"] == len(ev["checkpoints"]) == finding.score
    assert latest == ev["checkpoints"][-1]["path"]
    assert (None if saved is None else int(saved)) == ev.get("cleared_at_step") and finding.active == (saved is None)
