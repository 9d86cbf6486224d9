"""A run's report as sections of blocks, built from a ``RunRecord`` with the dashboard's own summaries and
figures, so that the report and the pages tell the same numbers."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from bedside.detectors.incidents import concerns_training, id_ranges

from ..dashboard import curves, figures, rank_view, summaries
from ..dashboard.formats import STATUS_LABELS, age, clock, number
from .blocks import Block, Bullets, Chart, Heading, Paragraph, Report, Section, Table
from .reading import RunRecord
from .timeline import action_rows, events, incident_lines

NO_ACTIONS = "No control request was filed or taken."


def build_report(record: RunRecord) -> Report:
    """The whole report: summary, incidents and their timeline, actions, curves, ranks, checkpoints, goodput."""
    actions = action_rows(record)
    sections = [
        Section("summary", "Run summary", [Table(summary_table(record, actions))]),
        Section("incidents", "Incidents", incident_blocks(record, actions)),
        Section("timeline", "Incident timeline", timeline_blocks(record)),
        Section("actions", "Actions", [Table(actions)] if not actions.empty else [Paragraph(NO_ACTIONS)]),
        Section("eval", "Held-out eval against compute", eval_blocks(record)),
        Section("training", "Loss and gradient norm, every timeline", training_blocks(record)),
        Section("ranks", "Ranks around each straggler incident", rank_blocks(record)),
        Section("checkpoints", "Checkpoint history", checkpoint_blocks(record)),
        Section("goodput", "Goodput ledger", goodput_blocks(record)),
    ]
    return Report(f"{title(record)}: post-mortem", provenance(record), sections)


def title(record: RunRecord) -> str:
    """The run's name from run.json, else its folder's."""
    return str(_first(record["run"], "name") or record.run_dir.name)


def provenance(record: RunRecord) -> str:
    """Where the numbers come from and when they were read."""
    source = "the run's store" if record.source == "store" else f"the raw telemetry ({record.note})"
    return f"Read from {source} at {clock(record.read_at)}."


def summary_table(record: RunRecord, actions: pd.DataFrame) -> pd.DataFrame:
    """The headline numbers as (what, value) rows (``actions``: ``action_rows``)."""
    run, goodput = record["run"], record["goodput"]
    t = summaries.tiles(run, record["progress"], record["good_checkpoint"], record["open_incidents"], record.read_at)
    rows = {
        "run": f"{title(record)} ({_first(run, 'run_id') or 'no run id'})",
        "status": STATUS_LABELS.get(t.status, t.status),
        "steps": "–" if t.step is None else f"{t.step:,} on timeline {t.timeline}",
        "timelines": timelines_text(record["timelines"]),
        "ranks": f"{_first(run, 'world_size') or '–'} on {len(record['hosts'])} host(s)",
        "wall time": wall_time(goodput, _first(record["restarts"], "started_at")),
        "FLOPs spent": number(t.flops, "FLOP") + " (every timeline)",
        "tokens": number(t.tokens),
        "goodput": f"{productive_share(goodput):.1%} of the wall time trained progress the run kept",
        "incidents": incident_count(record["incidents"]),
        "actions": f"{len(actions)} control request(s)",
        "audit trail": trail_text(record),
    }
    return pd.DataFrame({"": list(rows), "value": list(rows.values())})


def wall_time(goodput: pd.DataFrame, started: float | None) -> str:
    """The run's wall time (the goodput view's, first record to last) and when its first step began."""
    spent = age(float(goodput["seconds"].sum())) if not goodput.empty else "–"
    return f"{spent}, the first step at {clock(started)}" if started is not None else spent


def timelines_text(timelines: pd.DataFrame) -> str:
    spans = [f"{t.timeline}: steps {t.first_step}-{t.last_step}" for t in timelines.itertuples()]
    return f"{len(spans)} ({'; '.join(spans)})" if spans else "none"


def productive_share(goodput: pd.DataFrame) -> float:
    """The share of the wall time the ``goodput`` view counts useful (as the goodput chart's title says)."""
    return float(goodput.loc[goodput["useful"].astype(bool), "share"].sum())


def incident_count(incidents: pd.DataFrame) -> str:
    unresolved = int((incidents["status"] != "resolved").sum())
    return f"{len(incidents)} ({unresolved} unresolved)"


def trail_text(record: RunRecord) -> str:
    chain = record.trail
    if chain.broken:
        return f"BROKEN: {chain.broken}"
    return f"{len(chain.entries)} entries, chain intact" if chain.entries else "no entries"


def incident_blocks(record: RunRecord, actions: pd.DataFrame) -> list[Block]:
    incidents = record["incidents"]
    if incidents.empty:
        return [Paragraph(no_incidents(record))]
    blocks: list[Block] = []
    for line, (_, incident) in zip(incident_lines(incidents), incidents.iterrows()):
        blocks += [Heading(line), Bullets(incident_facts(record, incident, actions))]
    return blocks


def no_incidents(record: RunRecord) -> str:
    if record.source != "store":
        return f"Incidents are not known: {record.note}. They live in the store of the process that holds it."
    return "No incidents."


def incident_facts(record: RunRecord, incident: pd.Series, actions: pd.DataFrame) -> list[str]:
    """What the on-call needs of one incident: what, why, what was suggested and done (``actions`` filed for it),
    and how it ended."""
    suggestion = json.loads(incident["suggested_action"])
    args = f" {json.dumps(suggestion['args'], sort_keys=True)}" if suggestion.get("args") else ""
    facts = [f"What: {incident['summary']}", f"Cause: {incident['cause']}"]
    facts.append(f"Suggested: {suggestion['action']}{args}: {suggestion.get('why', '')}")
    facts += [f"Verdict: {verdict}" for verdict in verdicts(record.findings.get(incident["incident_id"]))]
    if pd.notna(incident["acknowledged_by"]):
        facts.append(f"Acknowledged by {incident['acknowledged_by']}: {_text(incident['ack_note'])}")
    mine = actions[actions["incident"] == incident["incident_id"]]
    facts += [f"Action: {a.action} by {a.operator}: {a.reason} ({a.outcome})" for a in mine.itertuples()]
    facts.append(f"Outcome: {outcome(incident)}")
    if concerns_training(incident["kinds"]) and (
        cost := summaries.abandoned_cost(record["abandoned"], incident["timeline"])
    ):
        facts.append(f"Cost: {cost}")
    return facts


def verdicts(findings: pd.DataFrame | None) -> list[str]:
    """The replay verdicts the findings' evidence holds (``verdict``), each once."""
    found = []
    for evidence in [] if findings is None else findings["evidence"]:
        said = json.loads(evidence).get("verdict") if isinstance(evidence, str) else None
        if said and not isinstance(said, dict):
            found.append(str(said))
    return list(dict.fromkeys(found))


def outcome(incident: pd.Series) -> str:
    if pd.notna(incident["resolved_by"]):
        return f"resolved by hand by {incident['resolved_by']}: {_text(incident['resolve_note'])}"
    if incident["status"] == "resolved":
        return f"resolved: {incident['resolution']}"
    return f"{incident['status']} when the report was read"


def timeline_blocks(record: RunRecord) -> list[Block]:
    table = events(record)
    if table.empty:
        return [Paragraph("Nothing happened: no incident, no decision, no action.")]
    return [Table(table)]


def eval_blocks(record: RunRecord) -> list[Block]:
    evals = record["evals"]
    metric = summaries.headline_metric(evals)
    if metric is None:
        return [Paragraph("No held-out evals.")]
    band = summaries.forecast_band(evals, metric)
    marks = summaries.incidents_on_evals(record["incidents"], evals, metric)
    return [Chart(curves.eval_vs_compute(evals, metric, band, marks))]


def training_blocks(record: RunRecord) -> list[Block]:
    steps = record["steps"]
    if steps.empty:
        return [Paragraph("No training steps.")]
    shown = steps[[c for c in steps if c not in ("lr", "tokens_per_s", "step_s")]]
    return [Chart(curves.training_curves(shown, record["incidents"], record["actions"]))]


def rank_blocks(record: RunRecord) -> list[Block]:
    if not record.windows:
        return [Paragraph("No straggler incident.")]
    incidents = record["incidents"].set_index("incident_id")
    lines = dict(zip(incidents.index, incident_lines(record["incidents"])))
    blocks: list[Block] = []
    for window in record.windows:
        flagged = f"flagged: rank {id_ranges(window.flagged)}" if window.flagged else "no rank flagged"
        said = f"Steps {window.first}-{window.last}, {window.phase} time against its peers'; {flagged}."
        heatmap = rank_view.rank_heatmap(
            window.cells, window.rows, window.phase, band=window.band, flagged=window.flagged
        )
        start, end = incidents.loc[window.incident_id, ["start_step", "end_step"]]
        for edge in (start - 0.5, end + 0.5):  # the incident's steps between dashed lines
            heatmap.add_vline(x=float(edge), line_dash="dash", line_color="#111827")
        blocks += [Heading(lines[window.incident_id]), Paragraph(said), Chart(heatmap)]
    return blocks


def checkpoint_blocks(record: RunRecord) -> list[Block]:
    saved = record["checkpoints"]
    if saved.empty:
        return [Paragraph("No checkpoint.")]
    rows = summaries.checkpoint_rows(saved)
    rows["started"] = rows["started"].dt.strftime("%Y-%m-%d %H:%M:%S")
    rows["save_s"] = rows["save_s"].map(lambda s: "" if pd.isna(s) else f"{s:.2f}")
    rows["size_gib"] = rows["size_gib"].map(lambda s: "" if pd.isna(s) else f"{s:.3f}")
    return [Chart(figures.checkpoint_timeline(saved)), Table(as_text(rows))]


def goodput_blocks(record: RunRecord) -> list[Block]:
    goodput = record["goodput"]
    if goodput.empty:
        return [Paragraph("No wall time to account for.")]
    table = pd.DataFrame(
        {
            "category": goodput["category"],
            "useful": goodput["useful"].map({True: "yes", False: "no"}),
            "share": goodput["share"].map(lambda s: f"{s:.1%}"),
            "seconds": goodput["seconds"].map(lambda s: f"{s:,.1f}"),
            "steps": goodput["steps"].fillna(0).astype(int).astype(str),
            "FLOPs": goodput["flops"].map(number),
        }
    )
    costs = (summaries.abandoned_cost(record["abandoned"], t) for t in record["abandoned"]["timeline"])
    lost = [cost for cost in costs if cost]
    return [Chart(figures.goodput_bar(goodput)), Table(table), *([Bullets(lost)] if lost else [])]


def as_text(frame: pd.DataFrame) -> pd.DataFrame:
    """Every cell as text ('' for a missing value)."""
    return frame.astype(object).where(frame.notna(), "").map(str)


def _first(frame: pd.DataFrame, column: str) -> Any:
    value = frame[column].iloc[0] if not frame.empty and column in frame else None
    return None if value is None or pd.isna(value) else value


def _text(value: Any) -> str:
    return "" if value is None or pd.isna(value) else str(value)
