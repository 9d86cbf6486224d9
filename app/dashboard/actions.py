"""Turning an incident's suggestion into a control request's arguments, and a request's live status in words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from bedside.collectors.control import ACTION_ARGS
from bedside.collectors.layout import RunLayout
from bedside.detectors.incidents import concerns_training

from .formats import age, number

ACTION_LABELS = {
    "rewind": "rewind to a checkpoint",
    "skip": "skip a batch range",
    "quarantine": "quarantine a data shard",
    "pause": "pause",
    "checkpoint": "checkpoint now",
}


def related_incidents(incident_id: str, incidents: pd.DataFrame) -> pd.DataFrame:
    """The incident and those related to it, as a rewind sees them: on its timeline, overlapping its steps, and
    sharing a rank or a cause with it (one sick device's signs, a straggler among them), or job-wide on either
    side (a bad-shard episode, a loss spike) and about the numbers being trained. A job-wide slowdown (a busy
    machine) overlapping a loss spike changes nothing the model learned: a rewind need not go before it."""
    me = incidents[incidents["incident_id"] == incident_id].iloc[0]
    ranks = set(me["ranks"])

    def related(other: pd.Series) -> bool:
        overlaps = other["start_step"] <= me["end_step"] and me["start_step"] <= other["end_step"]
        shared = (
            bool(ranks & set(other["ranks"]))
            or (bool(me["cause"]) and other["cause"] == me["cause"])
            or ((not ranks or not len(other["ranks"])) and concerns_training(other["kinds"]))
        )
        return bool(
            other["incident_id"] == incident_id or (other["timeline"] == me["timeline"] and overlaps and shared)
        )

    return incidents[incidents.apply(related, axis=1)] if not incidents.empty else incidents


def onset(incident_id: str, incidents: pd.DataFrame) -> tuple[int, str]:
    """The earliest start step of the incident and of those related to it, and the incident that starts there."""
    family = related_incidents(incident_id, incidents)
    first = family.loc[family["start_step"].idxmin()]
    return int(first["start_step"]), str(first["incident_id"])


def prefilled_args(
    action: str,
    suggestion: Mapping[str, Any],
    incident: pd.Series,
    checkpoints: pd.DataFrame,
    *,
    before: int | None = None,
) -> dict[str, int]:
    """Arguments for ``action`` from the suggestion when it is the same action, else from the incident.

    A rewind goes strictly before ``before`` (the onset of the incident and its relatives; default the incident's
    start): the suggested step if it is, else the newest checkpoint before it that was saved, not found corrupt
    and is still on disk (0 if none). A skip covers the incident's steps (bedside's trainer reads global batch
    ``i`` at step ``i``).
    """
    start, end = int(incident["start_step"]), int(incident["end_step"])
    limit = start if before is None else before
    if suggestion.get("action") == action:
        given = {name: suggestion.get("args", {}).get(name) for name in ACTION_ARGS[action]}
        if all(value is not None for value in given.values()) and (action != "rewind" or int(given["to_step"]) < limit):
            return {name: int(value) for name, value in given.items()}
    if action == "rewind":
        good = checkpoints[
            checkpoints["state"].isin(["verified", "saved"])
            & ~checkpoints["deleted"].astype(bool)
            & (checkpoints["step"] < limit)
        ]
        return {"to_step": int(good["step"].max()) if not good.empty else 0}
    if action == "skip":
        return {"first_batch": start, "last_batch": end}
    if action == "quarantine":
        return {"shard": 0}
    return {}


def what_is_lost(action: str, args: Mapping[str, int], cost: pd.DataFrame, run: Mapping[str, Any]) -> list[str]:
    """What confirming throws away or changes, line by line: a rewind's discarded steps (wall time, FLOPs) and
    the batches it trains again; a skip's batches and samples; a quarantine's shard. ``run``: the run's
    ``global_batch`` and ``samples_per_shard`` (from its configuration; missing or NaN when unknown)."""
    batch, per_shard = (_known_int(run.get(name)) for name in ("global_batch", "samples_per_shard"))

    def samples(batches: int) -> str:
        return f" ({batches * batch:,} samples)" if batch is not None else ""

    if action == "rewind" and not cost.empty and int(cost["steps"].iloc[0]):
        row = cost.iloc[0]
        lines = [
            f"discards steps {int(row['first_step'])}-{int(row['last_step'])} of the live timeline: "
            f"{int(row['steps'])} steps, {age(row['seconds'])} of training, {number(row['flops'], 'FLOP')}"
        ]
        if pd.notna(row["first_batch"]):
            replayed = int(row["last_batch"]) - int(row["first_batch"]) + 1
            lines.append(
                f"replays global batches {int(row['first_batch'])}-{int(row['last_batch'])}"
                f"{samples(replayed)} on a new timeline"
            )
        return lines
    if action == "rewind":
        return [f"discards nothing: the run has not passed step {args['to_step']}"]
    if action == "skip":
        count = args["last_batch"] - args["first_batch"] + 1
        return [
            f"skips global batches {args['first_batch']}-{args['last_batch']}: {count} batches{samples(count)} "
            f"never trained"
        ]
    if action == "quarantine":
        return [
            f"stops reading data shard {args['shard']}" + (f" ({per_shard:,} samples)" if per_shard is not None else "")
        ]
    return []


def _known_int(value: Any) -> int | None:
    """A configuration number, or None when it is missing or NaN."""
    return None if value is None or pd.isna(value) else int(value)


def request_status(
    request_id: str,
    actions: pd.DataFrame,
    layout: RunLayout,
    *,
    ended: bool = False,
    unanswered: pd.DataFrame | None = None,
) -> str:
    """Where a filed request stands: waiting, taken, applied at step S on timeline T, rejected and why, or not
    applied because the run went on without answering it (``unanswered``: the open ``unanswered_request``
    findings, ``request_id`` and ``summary``); ``ended``: the run has ended, so a request not yet taken never
    will be."""
    lost = unanswered[unanswered["request_id"] == request_id] if unanswered is not None else pd.DataFrame()
    if not lost.empty:
        return f"not applied: {lost['summary'].iloc[0].split(' was not applied: ', 1)[-1]}"
    rows = actions[(actions["request_id"] == request_id) & (actions["status"] != "not answered")]
    if not rows.empty:
        row = rows.iloc[0]
        if row["status"] == "applied":
            return f"applied at step {int(row['step'])} on timeline {int(row['timeline'])}"
        if row["status"] == "rejected":
            return f"rejected by the trainer: {row['message']}"
        return "acknowledged by the trainer, not yet applied"
    if (layout.control_processed / f"{request_id}.json").exists():
        return "taken by the trainer"
    if ended:
        return "not applied: the run has ended (a resumed run would take it)"
    return "filed, waiting for the trainer's next step"
