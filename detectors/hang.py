"""Hangs: a rank (or the whole job) stops producing steps or heartbeats while others go on.

In data time a rank hangs when, ``threshold`` seconds after its last step, another rank
steps (it stopped while the job progresses), or ``threshold`` seconds after its last
record of any kind, another rank still writes (it went silent while its peers, blocked
by a synchronous job in the next collective, keep heartbeating: the culprit). Another
rank's record counts only when it comes within the step-interval threshold of that
rank's own previous one, so a job resuming after a pause everywhere does not accuse the
ranks that resume a moment later. A job whose every rank is silent shows no new rows at
all: ``tick(now)`` sees it in wall time and names the ranks that stopped a step earlier.

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

from .detector import Detector
from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .limits import FRACTION, POSITIVE, ranges
from .telemetry import FrameName, TelemetryBatch

EDGES = np.logspace(-4, 6, 201)
"""Bins of the step-interval histogram: 20 per decade from 0.1 ms to 11.6 days."""
STATE = {"rank": np.int64, "time": float, "pt": float, "ps": np.int64, "ptl": np.int64, "stepped": bool, "end": bool}
"""Per known rank: its last record's time; its last step's time, step, timeline (its first record's
before it has stepped: ``stepped`` False); whether its last record is run_end."""
PAUSES = ("checkpoint", "eval")


def _watermark(rows: Columns) -> float:
    """The time up to which every known rank's records have been read: the earliest latest record of the
    ranks still running (one that wrote run_end has nothing more to read)."""
    last = np.append(rows["rank"][1:] != rows["rank"][:-1], True) & ~rows["end"]
    return float(rows["time"][last].min(initial=np.inf))


def _keys(timelines: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """(timeline, step) as one integer."""
    return np.asarray(timelines, dtype=np.int64) * 2**40 + np.asarray(steps, dtype=np.int64)


def _among(keys: np.ndarray, known: np.ndarray) -> np.ndarray:
    """``np.isin(keys, known)`` for a sorted ``known`` of unique keys: one binary search per key, no sort."""
    if not len(known):
        return np.zeros(len(keys), bool)
    at = np.searchsorted(known, keys)
    return known[np.minimum(at, len(known) - 1)] == keys


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
    last_eval: int = 0

    def learn_pauses(self, batch: TelemetryBatch) -> None:
        """Checkpoint and eval steps of this batch; the eval cadence (smallest gap of the last evals seen)."""
        ck = batch.checkpoints
        if len(ck):
            ck = ck[ck["event"].isin(("save_started", "saved"))]
        for name, frame in (("checkpoint", ck), ("eval", batch.evals)):
            if len(frame):
                keys = _keys(frame["timeline"].to_numpy(int), frame["step"].to_numpy(int))
                self.at[name] = np.union1d(self.at[name], keys)
        recent = self.at["eval"][-8:] % 2**40
        gaps = np.diff(recent)
        if (gaps > 0).any():
            self.eval_every, self.last_eval = int(gaps[gaps > 0].min()), int(recent[-1])

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
        found = {name: _among(keys, self.at[name]) for name in PAUSES}
        if self.eval_every:
            found["eval"] |= (np.asarray(steps) - self.last_eval) % self.eval_every == 0
        return found

    def thresholds(self, pauses: dict[str, np.ndarray], base: float | None = None) -> np.ndarray:
        """Seconds of silence that make a hang after each (timeline, step) whose ``pauses`` are given
        (``base``: ``self.base``, when known)."""
        thr = np.full(len(pauses["eval"]), self.base if base is None else base)
        for name, hit in pauses.items():
            longest = self.longest.get(name)
            thr += hit * (self.first_pause_s if longest is None else self.pause_factor * longest)
        return thr

    def learn(self, pauses: dict[str, np.ndarray], lengths: np.ndarray) -> None:
        """Step intervals that start at steps with these ``pauses``: a pause's to its kind's longest, the rest to
        the histogram."""
        plain = lengths > 0
        for name, hit in pauses.items():
            hit = hit & plain
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


Columns = dict[str, np.ndarray]


class HangDetector(Detector):
    """Ranks that stop stepping, or go silent, while others go on; silent jobs on ``tick``."""

    name = "hang"
    kinds = (FindingKind("hang", Family.PERFORMANCE, tolerance=50, cause="a rank stopped stepping", precedence=30),)
    limits = ranges(
        min_seconds=POSITIVE, factor=POSITIVE, quantile=FRACTION, pause_factor=POSITIVE, first_pause_s=POSITIVE
    )

    def __init__(
        self,
        *,
        min_seconds: float = 60.0,
        factor: float = 5.0,
        quantile: float = 0.99,
        pause_factor: float = 2.0,
        first_pause_s: float = 600.0,
    ) -> None:
        super().__init__()
        self.timing = _Timing(min_seconds, factor, quantile, pause_factor, first_pause_s)
        self._state: Columns = {name: np.zeros(0, dtype) for name, dtype in STATE.items()}
        self._newest = {"any": -np.inf, "step": -np.inf}
        self._held = {"any": np.zeros(0), "step": np.zeros(0)}  # evidence past the watermark of a backlog
        self._open: dict[tuple[int | None, int, int], _Hang] = {}

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        self.timing.learn_pauses(batch)
        new = _records(batch)
        if new is None:
            return []
        rows = _rows(new, self._state)
        seg = _segments(rows)
        pauses = self.timing.pauses(rows["ptl"], rows["ps"])
        self._learn_intervals(seg, {name: hit[seg["first_row"]] for name, hit in pauses.items()})
        base = self.timing.base
        evidence = self._evidence(rows, base)
        thresholds = self.timing.thresholds(pauses, base)
        changed = {id(h): h for h in self._detect(rows, seg, evidence, thresholds) + self._close(rows, seg)}
        last = np.append(rows["rank"][1:] != rows["rank"][:-1], True)
        self._state = {name: rows[name][last] for name in STATE}
        self._newest = {name: max(self._newest[name], times.max(initial=-np.inf)) for name, times in evidence.items()}
        return [self._finding(h) for h in changed.values()]

    def tick(self, now: float) -> list[Finding]:
        """Wall time ``now`` and no new rows: every live rank silent past its threshold is a job hang."""
        live = {name: values[~self._state["end"]] for name, values in self._state.items()}
        if not len(live["rank"]) or self._open:
            return []
        thr = self.timing.thresholds(self.timing.pauses(live["ptl"], live["ps"]))
        if not (now - live["time"] > thr).all():
            return []
        newest = live["ptl"] == live["ptl"].max()
        steps = live["ps"][newest]
        behind = live["rank"][newest][steps < steps.max()].tolist()
        timeline, step = int(live["ptl"].max()), int(steps.min())
        hang = _Hang(
            (),
            timeline,
            step,
            {
                "scope": "job",
                "how": "every live rank silent (wall clock)",
                "last_step": int(steps.max()),
                "silent_s": round(now - float(live["time"].max()), 3),
                "threshold_s": round(float(thr.max()), 3),
                "stopped_first": behind,
                "restart_from_step": self.run.checkpoint_before(timeline, step + 1),
            },
        )
        self._open[(None, timeline, step)] = hang
        return [self._finding(hang)]

    def _learn_intervals(self, seg: Columns, pauses: dict[str, np.ndarray]) -> None:
        """Intervals between each rank's consecutive steps (its last step before this batch included), each
        segment's ``pauses`` given."""
        keep = (
            seg["stepped"]
            & np.isfinite(seg["next_pt"])
            & ((seg["next_ps"] != seg["ps"]) | (seg["next_ptl"] != seg["ptl"]))
        )  # a step written twice counts once
        self.timing.learn({name: hit[keep] for name, hit in pauses.items()}, seg["next_pt"][keep] - seg["pt"][keep])

    def _evidence(self, rows: Columns, base: float) -> dict[str, np.ndarray]:
        """Times at which a rank shows it is going on: any record (``any``), a step (``step``), each within the
        step-interval threshold of its own previous one (so a job resuming after a pause everywhere is not
        evidence against the ranks that resume a moment later)."""
        return {
            "any": rows["time"][rows["real"] & (rows["gap"] <= base)],
            "step": rows["time"][rows["real"] & (rows["step_gap"] <= base)],
        }

    # -- detection -----------------------------------------------------------------------
    def _detect(
        self, rows: Columns, seg: Columns, evidence: dict[str, np.ndarray], thresholds: np.ndarray
    ) -> list[_Hang]:
        """Open a hang for each stretch without steps in which either test fires (``thresholds``: each row's)."""
        times = {
            name: np.sort(np.concatenate([found, self._held[name], [self._newest[name]]]))
            for name, found in evidence.items()
        }
        # Files read unevenly (a backlog): no rank is judged past the time every rank has been read to;
        # the evidence beyond it waits for the next batch.
        mark = np.inf if self.run.caught_up else _watermark(rows)
        self._held = {name: found[found > mark] for name, found in times.items()}
        times = {name: found[found <= mark] for name, found in times.items()}
        stopped = _first_after(times["step"], seg["pt"] + thresholds[seg["first_row"]], seg["until"])
        silent = _first_after(times["any"], rows["time"] + thresholds, rows["next"])
        silent[rows["end"]] = np.inf
        first_silent = (
            np.minimum.reduceat(silent, seg["first_row"]) if np.isfinite(silent).any() else silent[seg["first_row"]]
        )
        opened = []
        for i in np.flatnonzero(np.isfinite(stopped) | np.isfinite(first_silent)):
            key = (int(seg["rank"][i]), int(seg["ptl"][i]), int(seg["ps"][i]))
            if key in self._open:
                continue
            row = seg["first_row"][i] + int(np.argmin(silent[seg["first_row"][i] : seg["last_row"][i] + 1]))
            self._open[key] = self._rank_hang(
                key,
                seg["pt"][i],
                (stopped[i], seg["pt"][i]),
                (first_silent[i], rows["time"][row]),
                float(thresholds[seg["first_row"][i]]),
            )
            opened.append(self._open[key])
        return opened

    def _rank_hang(
        self,
        key: tuple[int, int, int],
        last_step_time: float,
        stop: tuple[float, float],
        silence: tuple[float, float],
        thr: float,
    ) -> _Hang:
        """A rank's hang after a step whose threshold is ``thr``; ``stop`` and ``silence``: (when that test fired
        (inf: never), since when)."""
        rank, timeline, step = key
        stopped = stop[0] <= silence[0]
        detected, since = stop if stopped else silence
        return _Hang(
            (rank,),
            timeline,
            step,
            {
                "scope": "rank",
                "how": "no step while other ranks step" if stopped else "silent while other ranks still write",
                "place": self.run.place_of(rank),
                "last_step": step,
                "last_step_time": float(last_step_time),
                "detected_at": float(detected),
                "silent_s": round(float(detected - since), 3),
                "threshold_s": round(thr, 3),
                "step_interval_threshold_s": round(self.timing.base, 3),
                "restart_from_step": self.run.checkpoint_before(timeline, step + 1),
            },
        )

    def _close(self, rows: Columns, seg: Columns) -> list[_Hang]:
        """Clear hangs whose rank stepped again or ended; a job hang clears at any step."""
        if not self._open:
            return []
        over = np.isfinite(seg["until"]) & np.isin(seg["rank"], [key[0] for key in self._open if key[0] is not None])
        ends = {(int(seg["rank"][i]), int(seg["ptl"][i]), int(seg["ps"][i])): i for i in np.flatnonzero(over)}
        stepped = rows["real"] & rows["progress"]
        closed = []
        for key, hang in list(self._open.items()):
            if key[0] is None and stepped.any():
                first = np.flatnonzero(stepped)[np.argmin(rows["time"][stepped])]
                hang.end_step, cleared = max(hang.step, int(rows["step"][first])), "a rank stepped again"
            elif key in ends:
                i = ends[key]
                resumed = seg["ended_at"][i] != seg["until"][i]
                same = resumed and int(seg["next_ptl"][i]) == key[1]
                hang.end_step = max(hang.step, int(seg["next_ps"][i])) if same else hang.step
                cleared = f"it stepped again (step {int(seg['next_ps'][i])})" if resumed else "it ended (run_end)"
            else:
                continue
            hang.evidence = {**hang.evidence, "cleared": cleared}
            closed.append(self._open.pop(key))
        return closed

    def _finding(self, hang: _Hang) -> Finding:
        ev = hang.evidence
        restart = ev["restart_from_step"]
        args: dict[str, Any] = {"ranks": list(hang.ranks), "restart_from_step": restart}
        verb = "hung" if "cleared" in ev else "hangs"
        if ev["scope"] == "rank":
            host = ev["place"].get("host")
            args.update({"host": host} if host else {})
            summary = (
                f"rank {hang.ranks[0]}{f' (host {host})' if host else ''} {verb} after step {hang.step}: "
                f"{ev['how']} for {ev['silent_s']:g} s (threshold {ev['threshold_s']:g} s)"
            )
        else:
            first = ev["stopped_first"]
            summary = f"the job {verb} after step {hang.step}: {ev['how']} for {ev['silent_s']:g} s" + (
                f"; rank(s) {', '.join(map(str, first))} stopped a step earlier" if first else ""
            )
        summary += f"; cleared: {ev['cleared']}" if "cleared" in ev else ""
        why = "find what it is blocked on (stack dump, dmesg, collective logs)" + (
            f"; if it does not recover, restart from the checkpoint of step {restart}" if restart is not None else ""
        )
        return Finding(
            "hang",
            Severity.CRITICAL,
            hang.timeline,
            hang.step,
            hang.step if hang.end_step is None else hang.end_step,
            hang.ranks,
            float(ev["silent_s"]),
            summary,
            ev,
            SuggestedAction("investigate", args, why),
            hang.end_step is None,
            self.name,
        )


def _first_after(times: np.ndarray, due: np.ndarray, until: np.ndarray) -> np.ndarray:
    """Per gap: the first of the sorted ``times`` past the gap's ``due`` time and before it ends (inf: none)."""
    first = np.append(times, np.inf)[np.searchsorted(times, due, side="right")]
    return np.where(first < until, first, np.inf)


def _records(batch: TelemetryBatch) -> Columns | None:
    """Every record of the batch as columns: ``rank``, ``time``, ``step``, ``timeline``, ``progress`` (a step
    record), ``end`` (run_end); None when there is none."""
    sources: tuple[tuple[FrameName, bool], ...] = (
        ("steps", True),
        ("rank_steps", True),
        ("checkpoints", False),
        ("events", False),
    )
    parts = [
        {
            "rank": batch.ints(name, "rank"),
            "time": batch.floats(name, "time"),
            "step": batch.ints(name, "step"),
            "timeline": batch.ints(name, "timeline"),
            "progress": np.full(len(f), progress),
            "end": f["kind"].eq("run_end").to_numpy(bool) if name == "events" else np.zeros(len(f), bool),
        }
        for name, progress in sources
        if len(f := getattr(batch, name))
    ]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]} if parts else None


def _rows(new: Columns, state: Columns) -> Columns:
    """One row per known rank standing for its state, then the new records; by rank, then time.

    Adds ``pt``, ``ps``, ``ptl``, ``stepped``: the rank's last step (time, step, timeline; its first
    record before it has stepped, ``stepped`` False) at each row; ``next``: the rank's next record's
    time; ``gap``, ``step_gap``: seconds since its previous record, and (step rows) since its previous step.
    """
    n = len(state["rank"])
    real = np.concatenate((np.zeros(n, bool), np.ones(len(new["rank"]), bool)))
    rows = {
        "rank": np.concatenate((state["rank"], new["rank"])),
        "time": np.concatenate((state["time"], new["time"])),
        "step": np.concatenate((state["ps"], new["step"])),
        "timeline": np.concatenate((state["ptl"], new["timeline"])),
        "progress": np.concatenate((np.zeros(n, bool), new["progress"])),
        "end": np.concatenate((state["end"], new["end"])),
        "real": real,
        "pt": np.concatenate((state["pt"], new["time"])),
        "stepped": np.concatenate((state["stepped"], new["progress"])),
    }
    order = np.lexsort((rows["time"], rows["real"], rows["rank"]))
    rows = {name: values[order] for name, values in rows.items()}
    first = np.concatenate(([True], rows["rank"][1:] != rows["rank"][:-1]))
    known = ~rows["real"] | rows["progress"] | first  # rows that set the last step; the others inherit it
    source = np.maximum.accumulate(np.where(known, np.arange(len(first)), 0))
    for name, column in (("pt", "pt"), ("ps", "step"), ("ptl", "timeline"), ("stepped", "stepped")):
        rows[name] = rows[column][source]
    before = np.concatenate(([np.nan], rows["time"][:-1]))
    rows["next"] = np.where(np.append(~first[1:], False), np.append(rows["time"][1:], np.inf), np.inf)
    rows["gap"] = np.where(first, np.inf, rows["time"] - before)
    rows["step_gap"] = np.where(
        first | ~rows["progress"], np.inf, rows["time"] - np.concatenate(([np.nan], rows["pt"][:-1]))
    )
    return rows


def _segments(rows: Columns) -> Columns:
    """Each rank's stretches from one step to the next: where they start and end in ``rows``, their step,
    ``until`` (the next step's time, or the rank's run_end, or inf) and the next step."""
    first = np.concatenate(([True], (rows["rank"][1:] != rows["rank"][:-1]) | (rows["pt"][1:] != rows["pt"][:-1])))
    start = np.flatnonzero(first)
    seg = {name: rows[name][start] for name in ("rank", "pt", "ps", "ptl", "stepped")}
    seg["first_row"], seg["last_row"] = start, np.append(start[1:], len(first)) - 1
    seg["ended_at"] = np.minimum.reduceat(np.where(rows["end"], rows["time"], np.inf), start)
    same = np.append(seg["rank"][1:] == seg["rank"][:-1], False)
    for name in ("pt", "ps", "ptl"):
        following = np.concatenate((seg[name][1:], seg[name][:1]))
        seg[f"next_{name}"] = np.where(same, following, np.inf if name == "pt" else -1)
    seg["until"] = np.minimum(seg["next_pt"], seg["ended_at"])
    return seg
