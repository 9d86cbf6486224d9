"""Hangs: a rank (or the whole job) stops producing steps or heartbeats while others go on.

In data time a rank hangs when, ``threshold`` seconds after its last step, another rank
steps (it stopped while the job progresses), or ``threshold`` seconds after its last
record of any kind, another rank still writes (it went silent while its peers, blocked
by a synchronous job in the next collective, keep heartbeating: the culprit). A job
whose every rank is silent shows no new rows at all: ``tick(now)`` sees it in wall time.

``threshold = max(min_seconds, factor x the quantile-th step interval seen so far)``,
plus an allowance when the rank's last step is a checkpoint step (``save_started`` or
``saved`` at that step) or an eval step (an eval record there, or one due by the eval
cadence): ``pause_factor`` x the longest such pause seen, ``first_pause_s`` before one
was seen. A rank whose latest record is ``run_end`` is finished, not hung. A hang clears
when its rank steps again (or writes ``run_end``); a job hang when any rank steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .detector import Detector, register
from .errors import DetectorConfigError
from .finding import Finding, Severity, SuggestedAction
from .telemetry import TelemetryBatch

EDGES = np.logspace(-4, 6, 201)
"""Bins of the step-interval histogram: 20 per decade from 0.1 ms to 11.6 days."""
STATE = ("time", "pt", "ps", "ptl", "stepped", "end")
"""Per rank: its last record's time; its last step's time, step, timeline (its first record's before
it has stepped: ``stepped`` False); whether its last record is run_end."""
PAUSES = ("checkpoint", "eval")


def _keys(timelines: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """(timeline, step) as one integer."""
    return np.asarray(timelines, dtype=np.int64) * 2**40 + np.asarray(steps, dtype=np.int64)


@dataclass
class _Timing:
    """What the run's own records teach: a histogram of step intervals, the pause steps, the longest pauses."""

    min_seconds: float
    factor: float
    quantile: float
    pause_factor: float
    first_pause_s: float
    counts: np.ndarray = field(default_factory=lambda: np.zeros(len(EDGES) + 1, dtype=np.int64))
    longest: dict[str, float] = field(default_factory=dict)
    at: dict[str, np.ndarray] = field(default_factory=lambda: {name: np.zeros(0, np.int64) for name in PAUSES})
    eval_every: int | None = None

    def learn_pauses(self, batch: TelemetryBatch) -> None:
        """Checkpoint and eval steps of this batch; the eval cadence (smallest gap of the last evals)."""
        ck = batch.checkpoints[batch.checkpoints["event"].isin(("save_started", "saved"))]
        for name, frame in (("checkpoint", ck), ("eval", batch.evals)):
            if len(frame):
                keys = _keys(frame["timeline"].to_numpy(int), frame["step"].to_numpy(int))
                self.at[name] = np.union1d(self.at[name], keys)
        gaps = np.diff(self.at["eval"][-8:] % 2**40)
        self.eval_every = int(gaps[gaps > 0].min()) if (gaps > 0).any() else self.eval_every

    @property
    def base(self) -> float:
        """``max(min_seconds, factor x quantile)`` of the step intervals (the bin's upper edge)."""
        total = self.counts.sum()
        if not total:
            return self.min_seconds
        upper = np.append(EDGES, np.inf)[int(np.searchsorted(np.cumsum(self.counts), self.quantile * total))]
        return max(self.min_seconds, self.factor * float(upper))

    def pauses(self, timelines: np.ndarray, steps: np.ndarray) -> dict[str, np.ndarray]:
        """Whether each (timeline, step) is a checkpoint step, and an eval step (seen or due)."""
        keys = _keys(timelines, steps)
        found = {name: np.isin(keys, self.at[name]) for name in PAUSES}
        if self.eval_every:
            found["eval"] |= (np.asarray(steps) > 0) & (np.asarray(steps) % self.eval_every == 0)
        return found

    def thresholds(self, timelines: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Seconds of silence that make a hang after each (timeline, step)."""
        thr = np.full(len(steps), self.base)
        for name, hit in self.pauses(timelines, steps).items():
            longest = self.longest.get(name)
            thr += hit * (self.first_pause_s if longest is None else self.pause_factor * longest)
        return thr

    def learn(self, timelines: np.ndarray, steps: np.ndarray, lengths: np.ndarray) -> None:
        """Step intervals that start at ``steps``: a pause's to its kind's longest, the rest to the histogram."""
        plain = lengths > 0
        for name, hit in self.pauses(timelines, steps).items():
            if hit.any():
                self.longest[name] = max(self.longest.get(name, 0.0), float(lengths[hit].max()))
            plain &= ~hit
        self.counts += np.bincount(np.searchsorted(EDGES, lengths[plain]), minlength=len(self.counts))


@dataclass
class _Hang:
    """A hang of ``ranks`` (empty: the whole job) after ``step``; ``end_step`` None while it lasts."""

    ranks: tuple[int, ...]
    timeline: int
    step: int
    evidence: dict[str, Any]
    end_step: int | None = None


@register
class HangDetector(Detector):
    """Ranks that stop stepping, or go silent, while others go on; silent jobs on ``tick``."""

    name = "hang"
    kinds = ("hang",)

    def __init__(self, *, min_seconds: float = 60.0, factor: float = 5.0, quantile: float = 0.99,
                 pause_factor: float = 2.0, first_pause_s: float = 600.0) -> None:
        super().__init__()
        if min(min_seconds, factor, pause_factor, first_pause_s) <= 0 or not 0 < quantile < 1:
            raise DetectorConfigError("hang settings must be positive, and quantile in (0, 1)")
        self.timing = _Timing(min_seconds, factor, quantile, pause_factor, first_pause_s)
        self._state = pd.DataFrame({name: pd.Series(dtype=float) for name in STATE}).rename_axis("rank")
        self._newest = {"any": -np.inf, "step": -np.inf}
        self._open: dict[tuple[int | None, int, int], _Hang] = {}

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        self.timing.learn_pauses(batch)
        rows = self._rows(batch)
        if rows.empty:
            return []
        self._learn_intervals(rows)
        segments = _segments(rows)
        changed = {id(h): h for h in self._detect(rows, segments) + self._close(rows, segments)}
        self._state = rows.groupby("rank").tail(1).set_index("rank")[list(STATE)]
        self._newest = {name: max(self._newest[name], times.max(initial=-np.inf))
                        for name, times in self._evidence(rows).items()}
        return [self._finding(h) for h in changed.values()]

    def tick(self, now: float) -> list[Finding]:
        """Wall time ``now`` and no new rows: every live rank silent past its threshold is a job hang."""
        live = self._state[~self._state["end"].astype(bool)]
        if live.empty or self._open:
            return []
        thr = self.timing.thresholds(live["ptl"].to_numpy(int), live["ps"].to_numpy(int))
        if not (now - live["time"].to_numpy() > thr).all():
            return []
        newest = live[live["ptl"] == live["ptl"].max()]
        behind = [int(r) for r in newest.index[newest["ps"] < newest["ps"].max()]]
        timeline, step = int(newest["ptl"].max()), int(newest["ps"].min())
        hang = _Hang((), timeline, step, {
            "scope": "job", "how": "every live rank silent (wall clock)", "last_step": int(newest["ps"].max()),
            "silent_s": round(now - float(live["time"].max()), 3), "threshold_s": round(float(thr.max()), 3),
            "stopped_first": behind, "restart_from_step": self.run.checkpoint_before(timeline, step + 1)})
        self._open[(None, timeline, step)] = hang
        return [self._finding(hang)]

    # -- rows ----------------------------------------------------------------------------
    def _rows(self, batch: TelemetryBatch) -> pd.DataFrame:
        """One row per known rank for its state, then every record of the batch; by rank, then time.

        ``pt``, ``ps``, ``ptl``: the rank's last step (time, step, timeline) at each row (a rank
        that has not stepped yet: its first record); ``next``: the rank's next record's time;
        ``gap``, ``step_gap``: seconds since the rank's previous record, and (steps) its previous step.
        """
        sources = ((batch.steps, True, False), (batch.rank_steps, True, False), (batch.checkpoints, False, False),
                   (batch.events, False, batch.events["kind"].eq("run_end").to_numpy()))
        parts = [frame[["rank", "time", "step", "timeline"]].assign(progress=progress, end=end)
                 for frame, progress, end in sources if len(frame)]
        if not parts:
            return pd.DataFrame()
        new = pd.concat(parts, ignore_index=True).astype({"rank": int, "time": float, "step": int, "timeline": int})
        state = self._state.reset_index().assign(progress=False, real=False)
        rows = pd.concat([state, new.assign(real=True)], ignore_index=True)
        rows = rows.sort_values(["rank", "real", "time"], kind="stable").reset_index(drop=True)
        starts = rows["progress"] | (rows["real"] & rows["rank"].ne(rows["rank"].shift()))
        for column, source in (("pt", "time"), ("ps", "step"), ("ptl", "timeline"), ("stepped", "progress")):
            rows[column] = rows[source].where(starts, rows[column])
        rows[["pt", "ps", "ptl", "stepped"]] = rows.groupby("rank")[["pt", "ps", "ptl", "stepped"]].ffill()
        rows[["end", "stepped"]] = rows[["end", "stepped"]].astype(bool)
        same = rows["rank"].eq(rows["rank"].shift())
        rows["next"] = rows["time"].shift(-1).where(rows["rank"].eq(rows["rank"].shift(-1)), np.inf)
        rows["gap"] = (rows["time"] - rows["time"].shift()).where(same, np.inf)
        rows["step_gap"] = (rows["time"] - rows["pt"].shift()).where(same & rows["progress"], np.inf)
        return rows

    def _evidence(self, rows: pd.DataFrame) -> dict[str, np.ndarray]:
        """Times at which a rank shows it is going on: any record (``any``), a step (``step``), each within the
        step-interval threshold of its own previous one (so a job resuming after a pause everywhere is not
        evidence against the ranks that resume a moment later)."""
        real = rows[rows["real"]]
        base = self.timing.base
        return {"any": real.loc[real["gap"] <= base, "time"].to_numpy(),
                "step": real.loc[real["step_gap"] <= base, "time"].to_numpy()}

    def _learn_intervals(self, rows: pd.DataFrame) -> None:
        """Intervals between each rank's consecutive steps (its step before this batch included)."""
        steps = rows[rows["progress"] | ~rows["real"]].drop_duplicates(["rank", "ptl", "ps"])
        same = (steps["rank"].eq(steps["rank"].shift()) & steps["stepped"].shift(fill_value=False)).to_numpy()
        before = steps.shift()
        self.timing.learn(before["ptl"].to_numpy()[same].astype(int), before["ps"].to_numpy()[same].astype(int),
                          (steps["pt"] - before["pt"]).to_numpy()[same])

    # -- detection -----------------------------------------------------------------------
    def _detect(self, rows: pd.DataFrame, segments: pd.DataFrame) -> list[_Hang]:
        """Open a hang for each stretch without steps in which either test fires."""
        times = {name: np.sort(np.append(found, self._newest[name])) for name, found in self._evidence(rows).items()}
        stopped = self._first_after(times["step"], segments, "pt", "until")
        alive = rows[~rows["end"]]
        silent = pd.Series(self._first_after(times["any"], alive, "time", "next"), index=alive.index).dropna()
        first_silent = silent.groupby(alive.loc[silent.index, "segment"]).idxmin()
        opened = []
        for segment in sorted(set(first_silent.index) | set(segments.index[~np.isnan(stopped)])):
            seg = segments.loc[segment]
            key = (int(seg["rank"]), int(seg["ptl"]), int(seg["ps"]))
            row = first_silent.get(segment)
            silence = (silent[row], rows.at[row, "time"]) if row is not None else (np.inf, np.nan)
            stop = np.nan_to_num(stopped[segments.index.get_loc(segment)], nan=np.inf)
            if key not in self._open:
                self._open[key] = self._rank_hang(key, seg["pt"], silence, (stop, seg["pt"]))
                opened.append(self._open[key])
        return opened

    def _first_after(self, times: np.ndarray, gaps: pd.DataFrame, start: str, until: str) -> np.ndarray:
        """Per gap: the first of ``times`` past the gap's threshold and before it ends (NaN: none)."""
        thr = self.timing.thresholds(gaps["ptl"].to_numpy(int), gaps["ps"].to_numpy(int))
        first = np.append(times, np.inf)[np.searchsorted(times, gaps[start].to_numpy() + thr, side="right")]
        return np.where(first < gaps[until].to_numpy(), first, np.nan)

    def _rank_hang(self, key: tuple[int, int, int], last_step_time: float, silence: tuple[float, float],
                   stop: tuple[float, float]) -> _Hang:
        """A rank's hang; ``silence`` and ``stop``: (when that test fired (inf: never), since when)."""
        rank, timeline, step = key
        detected, since = stop if stop[0] <= silence[0] else silence
        thr = float(self.timing.thresholds(np.array([timeline]), np.array([step]))[0])
        return _Hang((rank,), timeline, step, {
            "scope": "rank", "how": "no step while other ranks step" if stop[0] <= silence[0]
            else "silent while other ranks still write", "place": self.run.place_of(rank), "last_step": step,
            "last_step_time": float(last_step_time), "detected_at": float(detected),
            "silent_s": round(float(detected - since), 3),
            "threshold_s": round(thr, 3), "step_interval_threshold_s": round(self.timing.base, 3),
            "restart_from_step": self.run.checkpoint_before(timeline, step + 1)})

    def _close(self, rows: pd.DataFrame, segments: pd.DataFrame) -> list[_Hang]:
        """Clear hangs whose rank stepped again or ended; a job hang clears at any step."""
        ends = segments[np.isfinite(segments["until"])].drop_duplicates(["rank", "ptl", "ps"], keep="last")
        ends = ends.astype({"rank": int, "ptl": int, "ps": int}).set_index(["rank", "ptl", "ps"])
        steps = rows[rows["real"] & rows["progress"]]
        closed = []
        for key, hang in list(self._open.items()):
            if key[0] is None and len(steps):
                first = steps.loc[steps["time"].idxmin()]
                hang.end_step, cleared = max(hang.step, int(first["step"])), "a rank stepped again"
            elif key in ends.index:
                seg = ends.loc[key]
                resumed = seg["ended_at"] != seg["until"]
                same = resumed and int(seg["next_tl"]) == key[1]
                hang.end_step = max(hang.step, int(seg["next_step"])) if same else hang.step
                cleared = f"it stepped again (step {int(seg['next_step'])})" if resumed else "it ended (run_end)"
            else:
                continue
            hang.evidence = {**hang.evidence, "cleared": cleared}
            closed.append(self._open.pop(key))
        return closed

    def _finding(self, hang: _Hang) -> Finding:
        ev = hang.evidence
        restart = ev["restart_from_step"]
        args: dict[str, Any] = {"ranks": list(hang.ranks), "restart_from_step": restart}
        if ev["scope"] == "rank":
            host = self.run.host_of(hang.ranks[0])
            args.update({"host": host} if host else {})
            summary = (f"rank {hang.ranks[0]}{f' (host {host})' if host else ''} hangs after step {hang.step}: "
                       f"{ev['how']} for {ev['silent_s']:g} s (threshold {ev['threshold_s']:g} s)")
        else:
            first = ev["stopped_first"]
            summary = (f"the job hangs after step {hang.step}: {ev['how']} for {ev['silent_s']:g} s"
                       + (f"; rank(s) {', '.join(map(str, first))} stopped a step earlier" if first else ""))
        why = "find what it is blocked on (stack dump, dmesg, collective logs)" + (
            f"; if it does not recover, restart from the checkpoint of step {restart}" if restart is not None else "")
        return Finding("hang", Severity.CRITICAL, hang.timeline, hang.step,
                       hang.step if hang.end_step is None else hang.end_step, hang.ranks, float(ev["silent_s"]),
                       summary, ev, SuggestedAction("investigate", args, why), hang.end_step is None, self.name)


def _segments(rows: pd.DataFrame) -> pd.DataFrame:
    """Each rank's stretches from one step to the next (``until``: the next step, its run_end, or inf).

    Adds each row's ``segment`` number to ``rows``.
    """
    rows["segment"] = (rows["pt"].ne(rows["pt"].shift()) | rows["rank"].ne(rows["rank"].shift())).cumsum()
    grouped = rows.groupby("segment")
    seg = grouped[["rank", "pt", "ps", "ptl"]].first()
    seg["ended_at"] = rows["time"].where(rows["end"]).groupby(rows["segment"]).min()
    following = seg.shift(-1)
    same = following["rank"].eq(seg["rank"])
    seg["next_step"], seg["next_tl"] = following["ps"].where(same), following["ptl"].where(same)
    seg["until"] = np.fmin(following["pt"].where(same, np.inf), seg["ended_at"].fillna(np.inf))
    return seg
