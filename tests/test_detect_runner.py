"""Detection over real stores and the real CLI: the runner, the store feed, the findings and incidents
tables, replays in a new object or process, acknowledgements, streaming against batch, incident grouping,
``bedside detect`` and detection inside ``bedside collect --follow``."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bedside.app.service.detection import StoreDetection, detect_store
from bedside.app.service.schema import SCHEMAS
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store
from bedside.detectors.faults import Label
from bedside.detectors.finding import FINDING_KINDS, JSON_KEYS, Finding, Severity
from bedside.detectors.incidents import IncidentBook
from bedside.detectors.registry import build_detectors, detector_names
from bedside.detectors.runner import DetectorRunner
from bedside.detectors.scoring import FINDING_COLUMNS, Margin, match
from bedside.detectors.telemetry import STEP_COLUMNS, RunState, TelemetryBatch

SAMPLE_RUN = Path(__file__).resolve().parents[1] / "sample_runs" / "tiny-faults"
JOB_LEVEL = ("bad_shard", "eval_stall", "grad_spike", "loss_spike", "nonfinite")
"""Detectors of job-level series (nonfinite also per rank), as opposed to those comparing ranks step by step."""
SCORED_FAULTS = ("bad_shard", "nan", "grad_bitflip")
"""The sample run's faults that must be found within their own steps, whatever else is found: the bad shards'
loss spike (the run reads 15 of 16 shards per step, so not the shard itself), the NaN loss, and the bit flip's
outlier gradient norm on its rank."""


def labelled_faults() -> list[Label]:
    """The ground truth of the sample run's ``SCORED_FAULTS``, read from its files."""
    records = [
        json.loads(line)
        for path in sorted((SAMPLE_RUN / "ground_truth").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return [
        Label.from_record(r["step"], r["fault"], r["target_ranks"], r["args"])
        for r in records
        if r["kind"] == "fault_injected" and r["fault"] in SCORED_FAULTS
    ]


def missed_faults(found: list[tuple[str, int]], kinds: tuple[str, ...] = FINDING_KINDS) -> list[Label]:
    """The labelled faults of an expected kind in ``kinds`` that no finding (``found``: kind, start) matches
    within their own steps."""
    findings = pd.DataFrame(
        [(f"{kind}-{i}", kind, "warning", 0, start, ()) for i, (kind, start) in enumerate(found)],
        columns=list(FINDING_COLUMNS),
    )
    labels = [label for label in labelled_faults() if label.expected_kind in kinds]
    return [label for label, hit in zip(labels, match(findings, labels, Margin(0, 0))["found"]) if not hit]


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    """A private copy of the recorded 2-rank run with faults (no store yet)."""
    return Path(shutil.copytree(SAMPLE_RUN, tmp_path / "tiny-faults"))


def detect_in_store(
    run: Path, *, detectors: list[str] | None = None, batch_bytes: int | None = None, store: Store | None = None
) -> list[Finding]:
    """Ingest ``run`` into its store and detect; with ``batch_bytes``, update after every ingest pass."""
    own = store is None
    store = store or Store.open(RunLayout(run).store, schemas=SCHEMAS)
    chosen = None if detectors is None else build_detectors(only=detectors)
    try:
        if batch_bytes is None:
            Collector(run, store).ingest_available()
            return detect_store(store, chosen)
        detection = StoreDetection(store, chosen)
        passes = []
        Collector(run, store, batch_bytes=batch_bytes).ingest_available(
            on_pass=lambda result: passes.append(detection.update(caught_up=not result.backlog))
        )
        assert len(passes) > 10
        detection.finish()
        return detection.runner.ordered()
    finally:
        if own:
            store.close()


def query(run: Path, sql: str) -> pd.DataFrame:
    with Store.open(RunLayout(run).store, read_only=True, schemas=SCHEMAS) as store:
        return store.cursor().execute(sql).df()


# -- findings and incidents in the store ----------------------------------------------------------------------


def test_detection_fills_the_findings_and_incidents_views(sample: Path) -> None:
    found = detect_in_store(sample)
    assert len(labelled_faults()) == len(SCORED_FAULTS) and not missed_faults([(f.kind, f.start_step) for f in found])
    assert all(f.kind in FINDING_KINDS for f in found)
    assert set(query(sample, "SELECT fault FROM fault_labels")["fault"]) >= set(SCORED_FAULTS)

    rows = query(sample, "SELECT * FROM findings ORDER BY finding_id")
    assert sorted(rows["finding_id"]) == sorted(f.finding_id for f in found)
    by_id = {f.finding_id: f for f in found}
    for row in rows.itertuples():
        finding = by_id[row.finding_id]
        assert (row.kind, row.severity, row.start_step, row.end_step, bool(row.active)) == (
            finding.kind,
            finding.severity.value,
            finding.start_step,
            finding.end_step,
            finding.active,
        )
        assert json.loads(row.evidence) == finding.to_json()["evidence"]
        assert json.loads(row.suggested_action) == finding.to_json()["suggested_action"]

    incidents = query(sample, "SELECT * FROM incidents")
    assert set(rows["incident_id"]) == set(incidents["incident_id"])
    assert set(incidents["status"]) <= {"open", "resolved"}
    counts = rows.groupby("incident_id").size()
    for row in incidents.itertuples():
        assert row.findings == counts[row.incident_id]
        assert row.incident_id in set(rows["finding_id"])  # named after its first finding
        assert (row.status == "resolved") == (not rows[rows["incident_id"] == row.incident_id]["active"].any())
        if row.status == "resolved":
            assert row.resolution == "every finding cleared"
        else:
            assert pd.isna(row.resolution)


def test_a_replay_in_a_new_object_keeps_first_seen_and_incident_ids(sample: Path) -> None:
    first = detect_in_store(sample)
    before = query(sample, "SELECT finding_id, incident_id, first_seen, updated_at FROM findings")
    incidents_before = query(sample, "SELECT incident_id, opened_at, findings FROM incidents")
    time.sleep(0.01)
    again = detect_in_store(sample)  # a new Store, Collector and StoreDetection: replays from the first row
    assert [f.to_json() for f in again] == [f.to_json() for f in first]
    after = query(sample, "SELECT finding_id, incident_id, first_seen, updated_at FROM findings")
    merged = before.merge(after, on="finding_id", suffixes=("_before", "_after"), validate="one_to_one")
    assert len(merged) == len(before) == len(after)
    assert (merged["incident_id_before"] == merged["incident_id_after"]).all()
    assert (merged["first_seen_before"] == merged["first_seen_after"]).all()
    assert (merged["updated_at_after"] > merged["updated_at_before"]).all()
    incidents_after = query(sample, "SELECT incident_id, opened_at, findings FROM incidents")
    pd.testing.assert_frame_equal(
        incidents_before.sort_values("incident_id").reset_index(drop=True),
        incidents_after.sort_values("incident_id").reset_index(drop=True),
    )


def test_an_acknowledged_incident_stays_acknowledged_after_a_rerun(sample: Path) -> None:
    detect_in_store(sample)
    with Store.open(RunLayout(sample).store, schemas=SCHEMAS) as store:
        [[incident_id]] = (
            store.connection().execute("SELECT incident_id FROM incident_rows ORDER BY start_step LIMIT 1").fetchall()
        )
        store.connection().execute(
            "UPDATE incident_rows SET acknowledged_by = ?, acknowledged_at = ?, ack_note = ? WHERE incident_id = ?",
            ["alice", 1_796_000_000.0, "looking at shard 3", incident_id],
        )
        detect_in_store(sample, store=store)
        rows = (
            store.cursor()
            .execute(
                "SELECT status, resolved_at, acknowledged_by, ack_note FROM incidents WHERE incident_id = ?",
                [incident_id],
            )
            .fetchall()
        )
    [(status, resolved_at, who, note)] = rows
    assert (who, note) == ("alice", "looking at shard 3")
    assert status == ("resolved" if resolved_at is not None else "acknowledged")


def test_streaming_equals_batch_for_the_job_level_detectors(tmp_path: Path) -> None:
    names = [n for n in detector_names() if n in JOB_LEVEL]
    assert len(names) == len(JOB_LEVEL)
    streamed = shutil.copytree(SAMPLE_RUN, tmp_path / "streamed")
    batched = shutil.copytree(SAMPLE_RUN, tmp_path / "batched")
    stream = detect_in_store(streamed, detectors=names, batch_bytes=4096)
    batch = detect_in_store(batched, detectors=names)
    assert not missed_faults([(f.kind, f.start_step) for f in batch], kinds=JOB_LEVEL)
    assert [f.to_json() for f in stream] == [f.to_json() for f in batch]
    assert [f.active for f in stream] == [f.active for f in batch]
    columns = "finding_id, incident_id, kind, severity, start_step, end_step, ranks, score, evidence, active"
    pd.testing.assert_frame_equal(
        query(streamed, f"SELECT {columns} FROM findings ORDER BY finding_id"),
        query(batched, f"SELECT {columns} FROM findings ORDER BY finding_id"),
    )


def test_streaming_equals_batch_for_every_detector(tmp_path: Path) -> None:
    streamed = shutil.copytree(SAMPLE_RUN, tmp_path / "streamed")
    batched = shutil.copytree(SAMPLE_RUN, tmp_path / "batched")
    stream = detect_in_store(streamed, batch_bytes=4096)
    batch = detect_in_store(batched)
    streamed_json = {f.finding_id: (f.detector, f.to_json()) for f in stream}
    batched_json = {f.finding_id: (f.detector, f.to_json()) for f in batch}
    differ = sorted(
        {
            streamed_json.get(k, batched_json.get(k))[0]
            for k in streamed_json.keys() | batched_json.keys()
            if streamed_json.get(k) != batched_json.get(k)
        }
    )
    assert not differ, f"streaming differs from batch in: {', '.join(differ)}"


def test_a_replay_fed_in_small_slices_equals_one_batch(tmp_path: Path) -> None:
    """A restarted owner replays the whole store; in slices of a few KiB per file it finds the same."""
    sliced = shutil.copytree(SAMPLE_RUN, tmp_path / "sliced")
    batched = shutil.copytree(SAMPLE_RUN, tmp_path / "batched")
    with Store.open(RunLayout(sliced).store, schemas=SCHEMAS) as store:
        Collector(sliced, store).ingest_available()
        detection = StoreDetection(store)
        detection.feed.batch_bytes = 8192  # a few KiB of each file per slice: dozens of slices
        detection.update()
        detection.finish()
        slices = [f.to_json() for f in detection.runner.ordered()]
    assert slices == [f.to_json() for f in detect_in_store(batched)]


# -- incidents ------------------------------------------------------------------------------------------------


def training_run(n: int = 800) -> pd.DataFrame:
    """Job-level steps of a falling loss and gradient norm with 2% gaussian noise."""
    rng = np.random.default_rng(3)
    step = np.arange(1, n + 1)
    return pd.DataFrame(
        {
            "timeline": 0,
            "step": step,
            "time": 1_796_000_000.0 + step,
            "rank": 0,
            "seq": step,
            "loss": (1.5 + 8.0 * (step + 10.0) ** -0.5) * np.exp(0.02 * rng.standard_normal(n)),
            "grad_norm": (0.3 + 3.0 * (step + 50.0) ** -0.4) * np.exp(0.02 * rng.standard_normal(n)),
            "lr": 3e-4,
            "tokens": 65_536.0,
            "flops": 1e15,
            "shards": None,
        }
    )[list(STEP_COLUMNS)]


def test_a_grad_spike_the_loss_spike_it_leads_and_the_nans_after_are_one_incident() -> None:
    frame = training_run()
    frame.loc[frame["step"].between(600, 604), "grad_norm"] *= 4.0
    frame.loc[frame["step"].between(603, 605), "loss"] *= 2.0
    frame.loc[frame["step"] == 607, ["loss", "grad_norm"]] = np.nan
    runner = DetectorRunner(build_detectors(only=["grad_spike", "loss_spike", "nonfinite"]), RunState(world_size=1))
    book = IncidentBook()
    book.add(runner.update(TelemetryBatch(steps=frame)))
    book.add(runner.finish())
    found = {f.kind: f for f in runner.ordered()}
    assert set(found) == {"grad_spike", "loss_spike", "nonfinite"}
    assert (found["grad_spike"].start_step, found["loss_spike"].start_step) == (600, 603)
    [incident_id] = {book.incident_of(f) for f in found.values()}
    incident = book.describe(incident_id)
    assert incident_id == found["grad_spike"].finding_id
    assert set(incident.kinds) == set(found) and incident.title.startswith("Training instability")
    assert "gradient norm led the loss by 3 steps" in incident.cause
    assert incident.severity == Severity.CRITICAL and (incident.start_step, incident.end_step) == (600, 607)


def finding(
    kind: str,
    start: int,
    end: int,
    *,
    ranks: tuple[int, ...] = (),
    active: bool = True,
    severity: str = "warning",
    score: float = 5.0,
    host: str | None = None,
    timeline: int = 0,
) -> Finding:
    return Finding(
        kind=kind,
        severity=severity,
        timeline=timeline,
        start_step=start,
        end_step=end,
        ranks=ranks,
        score=score,
        summary=f"{kind} from step {start}",
        evidence={"host": host} if host else {},
        active=active,
    )


def test_a_second_slow_host_later_opens_its_own_incident_and_the_same_host_joins_its_own() -> None:
    book = IncidentBook()
    first = finding("straggler", 100, 400, ranks=tuple(range(8)), host="node-0037")
    later = finding("straggler", 380, 420, ranks=tuple(range(8, 16)), host="node-0012")
    again = finding("straggler", 390, 400, ranks=(3,), host="node-0037")
    book.add([first, later, again])
    assert book.incident_of(later) == later.finding_id != book.incident_of(first)
    assert book.incident_of(again) == first.finding_id
    assert book.describe(later.finding_id).start_step == 380 and book.describe(first.finding_id).findings[1] == again


def test_slow_ranks_of_two_hosts_that_slowed_together_are_one_incident() -> None:
    book = IncidentBook()
    half = finding("straggler", 60, 200, ranks=(20, 21, 22, 23), host="node-2")
    whole = finding("straggler", 62, 200, ranks=tuple(range(24, 32)), host="node-3")
    book.add([half, whole])
    assert book.incident_of(half) == book.incident_of(whole)


def test_a_nan_on_another_rank_is_the_same_trouble_spreading() -> None:
    book = IncidentBook()
    first, later = finding("nonfinite", 100, 100, ranks=(1,)), finding("nonfinite", 120, 120, ranks=(5,))
    book.add([first, later])
    assert book.incident_of(later) == book.incident_of(first)


def test_a_rewind_resolves_the_incidents_about_training_on_the_branch_it_left() -> None:
    book = IncidentBook()
    spike = finding("grad_spike", 500, 560, severity="critical")  # its detector never cleared it
    slow = finding("straggler", 300, 560, ranks=(2,), host="node-1")
    cleared = finding("loss_spike", 100, 110, active=False)
    book.add([spike, slow, cleared])
    assert not book.describe(spike.finding_id).resolved and book.went_on(0) == []
    [resolved] = book.went_on(1)
    assert resolved.incident_id == spike.finding_id and resolved.resolved
    assert resolved.resolution == "timeline 0 was abandoned: the run went on from a rewind (timeline 1)"
    assert not book.describe(slow.finding_id).resolved  # a slow host is still slow on the new timeline
    assert book.describe(cleared.finding_id).resolution == "every finding cleared"
    assert book.went_on(1) == [] and book.went_on(2) == []  # each incident is resolved once
    [new] = book.add([finding("grad_spike", 500, 505, timeline=2)])
    assert not new.resolved and new.resolution is None


def test_a_straggler_and_a_loss_spike_at_the_same_steps_are_different_incidents() -> None:
    book = IncidentBook()
    slow, spike = finding("straggler", 100, 140, ranks=(1,)), finding("loss_spike", 110, 115)
    book.add([slow, spike])
    assert book.incident_of(slow) != book.incident_of(spike)
    assert book.describe(book.incident_of(slow)).cause == "slow worker(s)"
    assert book.describe(book.incident_of(spike)).cause == "unexplained by data or hardware signals so far"
    assert book.describe(book.incident_of(slow)).title == "Slow or stuck ranks: straggler"


def test_incidents_keep_their_members_and_resolve_when_every_finding_clears() -> None:
    book = IncidentBook()
    spike, nan = finding("loss_spike", 200, 205), finding("nonfinite", 220, 220, severity="critical")
    far = finding("loss_spike", 260, 262)  # more than `gap` (25) steps after the incident's window
    book.add([spike, nan, far])
    assert book.incident_of(spike) == book.incident_of(nan) != book.incident_of(far)
    grown = Finding(**{**spike.__dict__, "end_step": 250, "active": False})  # same finding_id, grown and cleared
    [incident] = book.add([grown])
    assert incident.incident_id == spike.finding_id and not incident.resolved  # nan still active
    assert book.incident_of(far) == far.finding_id  # assigned once, never moved by the growth
    [incident] = book.add([Finding(**{**nan.__dict__, "active": False})])
    assert incident.resolved and incident.findings == (grown, Finding(**{**nan.__dict__, "active": False}))
    remembered = IncidentBook({spike.finding_id: "incident-7"})
    assert remembered.add([spike])[0].incident_id == "incident-7"


def test_an_incident_is_named_after_its_earliest_finding_however_they_were_batched() -> None:
    early, late = finding("loss_spike", 80, 130), finding("grad_spike", 93, 95)
    streamed, batched = IncidentBook(), IncidentBook()
    streamed.add([early])
    streamed.add([late])
    batched.add([late, early])  # one batch comes in detector order (grad_spike before loss_spike)
    for book in (streamed, batched):
        assert book.incident_of(late) == book.incident_of(early) == early.finding_id


# -- the CLI --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def detected(tmp_path_factory, bedside) -> tuple[Path, subprocess.CompletedProcess]:
    """A copy of the sample run after ``bedside detect`` (in its own process), and that command's result."""
    run = Path(shutil.copytree(SAMPLE_RUN, tmp_path_factory.mktemp("cli") / "tiny-faults"))
    result = bedside("detect", run)
    assert result.returncode == 0, result.stderr
    return run, result


def parse_json_lines(out: str) -> list[dict]:
    lines = [json.loads(line) for line in out.splitlines()]
    for line in lines:
        assert tuple(line) == JSON_KEYS
        assert line["kind"] in FINDING_KINDS
    return lines


def test_detect_prints_a_table_and_keeps_the_findings(detected) -> None:
    run, result = detected
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["kind", "severity", "timeline", "steps", "ranks", "score", "action", "summary"]
    cells = [row.split() for row in rows]
    assert not missed_faults([(c[0], int(c[3].split("-")[0])) for c in cells])
    assert all(c[0] in FINDING_KINDS and c[1] in ("info", "warning", "critical") for c in cells)
    count = len(query(run, "SELECT * FROM findings"))
    assert len(rows) == count and result.stderr.strip().endswith(f"{count} findings")


def test_detect_json_in_a_new_process_replays_the_same_findings(detected, bedside) -> None:
    run, _ = detected
    before = query(run, "SELECT finding_id, incident_id, first_seen FROM findings ORDER BY finding_id")
    result = bedside("detect", run, "--json")
    assert result.returncode == 0, result.stderr
    found = parse_json_lines(result.stdout)
    assert not missed_faults([(f["kind"], f["start_step"]) for f in found])
    assert [f["start_step"] for f in found] == sorted(f["start_step"] for f in found)  # oldest first
    spike = next(f for f in found if f["kind"] == "loss_spike")
    assert spike["evidence"]["onset_step"] == spike["start_step"] <= spike["evidence"]["peak_step"]
    after = query(run, "SELECT finding_id, incident_id, first_seen FROM findings ORDER BY finding_id")
    pd.testing.assert_frame_equal(before, after)
    assert len(after) == len(found)


def test_detect_since_keeps_findings_that_reach_the_step(detected, bedside) -> None:
    run, _ = detected
    everything = parse_json_lines(bedside("detect", run, "--json").stdout)
    since_step = sorted(f["end_step"] for f in everything)[len(everything) // 2]
    result = bedside("detect", run, "--json", "--since", str(since_step))
    assert result.returncode == 0, result.stderr
    since = parse_json_lines(result.stdout)
    assert since == [f for f in everything if f["end_step"] >= since_step]
    assert 0 < len(since) < len(everything)


@pytest.mark.parametrize("where", ("missing", "empty"))
def test_detect_on_a_path_that_is_not_a_run_is_one_error_line(tmp_path: Path, bedside, where: str) -> None:
    path = tmp_path / "nothing-here"
    if where == "empty":
        path.mkdir()
    result = bedside("detect", path)
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("bedside: error:") and str(path) in line
    assert not (path / "bedside.duckdb").exists()


def test_detect_on_a_held_store_prints_findings_and_saves_nothing(sample: Path, bedside) -> None:
    with Store.open(RunLayout(sample).store, schemas=SCHEMAS) as held:
        result = bedside("detect", sample, "--json")
        saved = held.cursor().execute("SELECT count(*) FROM finding_rows").fetchall()[0][0]
    assert result.returncode == 0, result.stderr
    assert not missed_faults([(f["kind"], f["start_step"]) for f in parse_json_lines(result.stdout)])
    assert "held by another process" in result.stderr and "not saved" in result.stderr
    assert saved == 0


def test_collect_follow_detects_as_it_ingests(sample: Path, detected, bedside) -> None:
    result = bedside("collect", sample, "--follow", "--until-finished", "--rescan-every", "0.2")
    assert result.returncode == 0, result.stderr
    printed = [line for line in result.stderr.splitlines() if line.startswith("[")]
    for label in labelled_faults():
        assert any(f"] {label.expected_kind} (" in line for line in printed), label
    assert all(" (open): " in line or " (cleared): " in line for line in printed)
    columns = "finding_id, incident_id, severity, start_step, end_step, active"
    followed = query(sample, f"SELECT {columns} FROM findings ORDER BY finding_id")
    assert not missed_faults([(k.split("@")[0], s) for k, s in zip(followed["finding_id"], followed["start_step"])])
    batch_run, _ = detected  # the same run, detected in batch mode by `bedside detect`
    pd.testing.assert_frame_equal(followed, query(batch_run, f"SELECT {columns} FROM findings ORDER BY finding_id"))


def test_collect_follow_no_detect_leaves_no_findings(sample: Path, bedside) -> None:
    result = bedside("collect", sample, "--follow", "--until-finished", "--rescan-every", "0.2", "--no-detect")
    assert result.returncode == 0, result.stderr
    assert not [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert query(sample, "SELECT count(*) AS n FROM findings")["n"][0] == 0
    assert query(sample, "SELECT count(*) AS n FROM incidents")["n"][0] == 0
    assert query(sample, "SELECT count(*) AS n FROM step_metrics")["n"][0] > 0  # ingested all the same
