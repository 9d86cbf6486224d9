"""Turning an incident's suggestion into a control request's arguments, and a request's live status in words."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from bedside.collectors.control import ACTION_ARGS
from bedside.collectors.layout import RunLayout

ACTION_LABELS = {
    "rewind": "rewind to a checkpoint", "skip": "skip a batch range", "quarantine": "quarantine a data shard",
    "pause": "pause", "checkpoint": "checkpoint now",
}


def prefilled_args(action: str, suggestion: Mapping[str, Any], incident: pd.Series,
                   checkpoints: pd.DataFrame) -> dict[str, int]:
    """Arguments for ``action`` from the suggestion when it is the same action, else from the incident.

    A rewind goes to the newest good checkpoint before the onset still on disk; a skip covers the
    incident's steps (bedside's trainer reads global batch ``i`` at step ``i``).
    """
    if suggestion.get("action") == action:
        given = {name: suggestion["args"].get(name) for name in ACTION_ARGS[action]}
        if all(value is not None for value in given.values()):
            return {name: int(value) for name, value in given.items()}
    start, end = int(incident["start_step"]), int(incident["end_step"])
    if action == "rewind":
        good = checkpoints[checkpoints["state"].isin(["verified", "saved"]) & ~checkpoints["deleted"].astype(bool)
                           & (checkpoints["step"] < start)]
        return {"to_step": int(good["step"].max()) if not good.empty else 0}
    if action == "skip":
        return {"first_batch": start, "last_batch": end}
    if action == "quarantine":
        return {"shard": 0}
    return {}


def request_status(request_id: str, actions: pd.DataFrame, layout: RunLayout, *, ended: bool = False) -> str:
    """Where a filed request stands: waiting, taken, applied at step S on timeline T, or rejected and why
    (``ended``: the run has ended, so a request not yet taken never will be)."""
    rows = actions[actions["request_id"] == request_id]
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
