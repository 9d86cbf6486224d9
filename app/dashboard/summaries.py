"""What the pages compute from query results: tiles, the eval forecast band and checkpoint advice. Pure
functions of DataFrames, so they are tested without Streamlit."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bedside.detectors.checkpointing import CheckpointAdvice, advise
from bedside.detectors.eval_stall import EvalStallDetector, forecast_evals
from bedside.detectors.incidents import id_ranges

BAND_Z = float(EvalStallDetector.defaults()["band_z"])
MIN_EVALS_FOR_BAND = int(EvalStallDetector.defaults()["min_evals"])
"""The eval_stall detector's band and the evals it needs before it forecasts: the dashboard draws the same."""
PREFERRED_METRICS = ("excess_loss", "loss", "perplexity")


@dataclass(frozen=True)
class Tiles:
    """The Overview's headline numbers (None where the run does not say)."""

    status: str
    step: int | None
    timeline: int | None
    tokens: float | None
    flops: float | None
    tokens_per_s: float | None
    mfu: float | None
    since_checkpoint_s: float | None
    open_incidents: dict[str, int]
    """Unresolved incidents by severity; ``acknowledged`` of them are taken on."""
    acknowledged: int


def tiles(
    run: pd.DataFrame, progress: pd.DataFrame, checkpoint: pd.DataFrame, open_incidents: pd.DataFrame, now: float
) -> Tiles:
    """Headline numbers from the ``run``, ``progress``, ``good_checkpoint`` and ``open_incidents`` queries."""
    r = run.iloc[0] if not run.empty else None
    p = progress.iloc[0] if not progress.empty else None
    world = _value(r, "world_size")
    peak = _value(r, "peak_flops_per_device")
    flops_per_s = _value(p, "flops_per_s")
    mfu = flops_per_s / (world * peak) if flops_per_s and world and peak else None
    last_good = _value(checkpoint.iloc[0] if not checkpoint.empty else None, "checkpoint_time")
    status = _text(r, "status") or "empty"
    if status not in ("live", "stalled"):  # an ended run's work at risk stops growing with its last step
        now = _value(p, "last_step_time") or now
    return Tiles(
        status=status,
        step=_int(_value(p, "step")),
        timeline=_int(_value(p, "timeline")),
        tokens=_value(p, "spent_tokens"),
        flops=_value(p, "spent_flops"),
        tokens_per_s=_value(p, "tokens_per_s"),
        mfu=mfu,
        since_checkpoint_s=now - last_good if last_good else None,
        open_incidents={str(s): int(n) for s, n in zip(open_incidents["severity"], open_incidents["incidents"])},
        acknowledged=int(open_incidents["acknowledged"].sum()),
    )


def headline_metric(evals: pd.DataFrame) -> str | None:
    """The held-out metric to lead with: excess loss (nats above the floor) when there is one, else loss."""
    names = list(dict.fromkeys(evals["name"]))
    return next((m for m in PREFERRED_METRICS if m in names), names[0] if names else None)


def forecast_band(evals: pd.DataFrame, metric: str, points: int = 80) -> pd.DataFrame | None:
    """The detectors' power-law forecast of ``metric`` against compute on the live timeline, with the band the
    eval_stall detector holds evals to (it widens where the forecast extrapolates)."""
    series = evals[(evals["name"] == metric)].dropna(subset=["cum_flops", "value"])
    series = series[(series["cum_flops"] > 0) & (series["value"] > 0)]
    series = series.sort_values(["timeline"]).drop_duplicates("step", keep="last").sort_values("cum_flops")
    if len(series) < MIN_EVALS_FOR_BAND:
        return None
    compute = series["cum_flops"].to_numpy(dtype=float)
    grid = np.geomspace(compute[0], compute[-1] * 1.5, points)
    fitted = forecast_evals(compute, series["value"].to_numpy(dtype=float), grid)
    if fitted is None:
        return None
    low, high = fitted.band(BAND_Z)
    return pd.DataFrame({"cum_flops": grid, "center": fitted.center, "low": low, "high": high})


def incidents_on_evals(incidents: pd.DataFrame, evals: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Where each incident's onset falls on the eval-versus-compute curve of its timeline (interpolated by step).

    Columns ``cum_flops``, ``value``, ``severity``, ``label``; an incident before the first eval of its
    timeline is left out.
    """
    series = evals[evals["name"] == metric].dropna(subset=["cum_flops", "value"])
    placed = []
    for incident in incidents.itertuples():
        curve = (
            series[series["timeline"] <= incident.timeline]
            .sort_values("timeline")
            .drop_duplicates("step", keep="last")
            .sort_values("step")
        )
        if curve.empty or incident.start_step < curve["step"].iloc[0]:
            continue
        steps = curve["step"].to_numpy(dtype=float)
        placed.append(
            {
                "cum_flops": float(np.interp(incident.start_step, steps, curve["cum_flops"].to_numpy(dtype=float))),
                "value": float(np.interp(incident.start_step, steps, curve["value"].to_numpy(dtype=float))),
                "severity": incident.severity,
                "label": f"{incident.title} (step {incident.start_step})",
            }
        )
    return pd.DataFrame(placed, columns=["cum_flops", "value", "severity", "label"])


def checkpoint_advice(checkpoints: pd.DataFrame, restarts: pd.DataFrame) -> CheckpointAdvice | None:
    """Young/Daly advice from the measured save durations, the interval between saves and the restarts seen."""
    saved = checkpoints.dropna(subset=["duration_s"])
    span = restarts.iloc[0] if not restarts.empty else None
    if saved.empty or span is None or pd.isna(span["started_at"]) or pd.isna(span["last_at"]):
        return None
    elapsed = float(span["last_at"] - span["started_at"])
    if elapsed <= 0:
        return None
    starts = saved.sort_values("started_at")["started_at"].to_numpy(dtype=float)
    interval = float(np.median(np.diff(starts))) if len(starts) > 1 else None
    return advise(float(saved["duration_s"].median()), elapsed, int(span["restarts"]), interval)


def checkpoint_rows(checkpoints: pd.DataFrame) -> pd.DataFrame:
    """The checkpoints table as the on-call reads it, newest first: wall-clock start, save seconds, size in GiB
    and the full path last (the ``checkpoints`` query's rows)."""
    table = checkpoints.sort_values("started_at", ascending=False)
    return pd.DataFrame(
        {
            "started": pd.to_datetime(table["started_at"], unit="s", utc=True),
            "timeline": table["timeline"],
            "step": table["step"],
            "state": table["state"],
            "save_s": table["duration_s"],
            "size_gib": table["bytes"] / 2**30,
            "loaded": table["loaded"],
            "deleted": table["deleted"],
            "path": table["path"],
        }
    ).reset_index(drop=True)


def incident_name(incident_id: str, ranks: Iterable[int]) -> str:
    """An incident's id as the on-call reads it: its ranks as ranges (``straggler@0:500/r768-1023``), not the
    id's first eight ranks and a ``+``. The id itself is unchanged: alerts, links and acknowledgements carry it."""
    ranks = list(ranks)
    head, sep, place = incident_id.partition("/r")
    if not sep or not ranks:
        return incident_id
    subject = place.partition("/")[2]
    return f"{head}/r{id_ranges(ranks, runs=4, sep=',', more='+{}')}" + (f"/{subject}" if subject else "")


def incident_rows(incidents: pd.DataFrame) -> pd.DataFrame:
    """The incidents table in the ``incidents`` query's triage order: the onset in UTC (the step the fault began
    at, not when the detectors saw it; ``onset_s`` to tell its age from), steps and ranks as ranges."""
    onset = incidents["onset_at"].astype(float).fillna(incidents["opened_at"].astype(float))
    return pd.DataFrame(
        {
            "severity": incidents["severity"],
            "status": incidents["status"],
            "incident": [incident_name(i, r) for i, r in zip(incidents["incident_id"], incidents["ranks"])],
            "title": incidents["title"],
            "onset": pd.to_datetime(onset, unit="s", utc=True),
            "onset_s": onset,
            "steps": incidents["start_step"].astype(str) + "-" + incidents["end_step"].astype(str),
            "timeline": incidents["timeline"],
            "ranks": [id_ranges(r) if len(r) else "all (job)" for r in incidents["ranks"]],
            "findings": incidents["findings"],
            "id": incidents["incident_id"],
        }
    ).reset_index(drop=True)


def data_read(window: pd.DataFrame, start: int, end: int) -> pd.DataFrame:
    """Each data shard read in an incident's window (the ``window_data`` query): in how many of the incident's
    steps and of the other steps around it, most over-read during the incident first (a bad shard's sign)."""
    inside = window["step"].between(start, end)
    per_step = window.assign(inside=inside).explode("shards").dropna(subset=["shards"])
    counts = per_step.groupby(["shards", "inside"]).size().unstack(fill_value=0)
    table = pd.DataFrame(
        {
            "shard": counts.index.astype(int),
            "incident_steps": counts.get(True, pd.Series(0, index=counts.index)).to_numpy(dtype=int),
            "other_steps": counts.get(False, pd.Series(0, index=counts.index)).to_numpy(dtype=int),
        }
    )
    steps_in, steps_out = max(int(inside.sum()), 1), max(int((~inside).sum()), 1)
    table["share_incident"] = table["incident_steps"] / steps_in
    table["share_other"] = table["other_steps"] / steps_out
    lift = table["share_incident"] - table["share_other"]
    return table.assign(lift=lift).sort_values(["lift", "shard"], ascending=[False, True]).drop(columns="lift")


def batch_span(window: pd.DataFrame, start: int, end: int) -> str:
    """The global batches the incident's steps read, as ranges ("batches 79-93"), or '' when the run reports none."""
    batches = window.loc[window["step"].between(start, end), "batch"].dropna()
    return f"batches {id_ranges(batches.astype(int))}" if not batches.empty else ""


def _value(row: pd.Series | None, name: str) -> float | None:
    if row is None or name not in row or pd.isna(row[name]):
        return None
    return float(row[name])


def _text(row: pd.Series | None, name: str) -> str | None:
    if row is None or name not in row or pd.isna(row[name]):
        return None
    return str(row[name])


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def abandoned_cost(abandoned: pd.DataFrame, timeline: int) -> str | None:
    """What the rewind that abandoned ``timeline`` cost, in words (the ``abandoned`` query); None while it is not
    abandoned."""
    rows = abandoned[abandoned["timeline"] == timeline]
    if rows.empty:
        return None
    r = rows.iloc[0]
    flops = f", {r['flops']:.3g} FLOP" if r["flops"] else ""
    return (
        f"Timeline {timeline} was abandoned from step {int(r['from_step'])}: {int(r['steps'])} steps trained past it "
        f"({int(r['from_step'])}-{int(r['last_step'])}) bought nothing, {r['seconds']:,.1f} s of wall time{flops}."
    )
