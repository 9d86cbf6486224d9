"""Throughput drops: tokens per second sustained below the run's own recent baseline.

Each step's rate is its ``tokens`` (the job-level step record) over its duration: the
median ``step_time`` over ranks when the ranks report it, else the wall interval since
the previous step record (steps per second when no tokens are reported). On log scale,
the median of the last ``window`` steps is compared with the median of the
``baseline_steps`` before them: medians, so that a checkpoint or eval stall (one slow
step now and then) moves neither; a slow swing (diurnal, 1-2%) moves both. A drop opens
a finding when it is at least ``min_drop`` and ``z`` standard errors of the difference
of the two medians; the baseline is then frozen until the rate is back within
``min_drop / 2`` of it. The first ``warmup_steps`` (compilation, allocator and loader
warm-up) are not a baseline.

A drop whose extra seconds per step are mostly the ranks' wait for a CPU (``cpu_wait_time``,
the median rank's, over the window against the baseline) is the environment: other processes
took the hosts' cores. It is said so, as info, and never pages.

A drop is judged by its practical size too: the wall time it has cost (each step's
duration less the time the baseline rate would have taken for its work, summed from
the onset). It pages (warning) once that reaches ``min_lost_s``; until then it is
info, so that a toy job whose 2 ms steps became 8 ms while another process took the
cores (a second lost in 150 steps) pages nobody, while a real job's drop of the same
share reaches the bar within minutes.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .crossrank import CrossRankDetector, StepMatrix
from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .limits import COUNT, FRACTION, NON_NEGATIVE, OPTIONAL_COUNT, POSITIVE, ranges
from .rank_work import wall_time
from .robust import mad_sigma, row_median
from .telemetry import TelemetryBatch

Key = tuple[int, int]
_Rated = tuple[Key, float, str, float, float, float]
"""A step's key and log rate, with where its duration came from, the tokens it reported, its seconds and the
median rank's wait for a CPU in it."""
SCREEN_FROM = 64
"""Rated steps from which a drain screens them with rolling medians rather than judging each."""
SCREEN_SLACK = 1e-9
"""The screen's margin in log rate: a step this close to a boundary is judged exactly."""
MAX_PENDING = 10_000
"""Step durations kept waiting for their step record, at most."""


@dataclass
class _Drop:
    """A drop in progress: its onset and the baseline it is measured against (frozen)."""

    timeline: int
    start_step: int
    alarm_step: int
    baseline: float
    end_step: int
    lowest: float  # the lowest log rate (median of the window) since the onset
    lowest_step: int  # the step at which it was seen
    lost_s: float = 0.0  # wall time lost against the baseline rate since the onset
    base_seconds: float = math.nan  # the median step's seconds before the onset
    base_wait: float = math.nan  # the median rank's wait for a CPU per step before the onset
    evidence: dict[str, Any] = field(default_factory=dict)
    active: bool = True


class ThroughputDetector(CrossRankDetector):
    """Sustained drops of tokens per second against a rolling robust baseline (see the module docstring)."""

    name = "throughput_drop"
    rank_metrics = ("step_time", "cpu_wait_time")
    kinds = (
        FindingKind("throughput_drop", Family.PERFORMANCE, tolerance=200, cause="throughput", precedence=90, lead=50),
    )
    limits = ranges(
        window=COUNT,
        baseline_steps=COUNT,
        min_drop=FRACTION,
        z=POSITIVE,
        warmup_steps=OPTIONAL_COUNT,
        lag=COUNT,
        min_lost_s=NON_NEGATIVE,
    )

    def __init__(
        self,
        *,
        window: int = 50,
        baseline_steps: int = 500,
        min_drop: float = 0.10,
        z: float = 4.0,
        warmup_steps: int = 100,
        lag: int = 20,
        min_lost_s: float = 60.0,
    ) -> None:
        super().__init__()
        self.window, self.baseline_steps, self.min_drop, self.z = window, baseline_steps, min_drop, z
        self.warmup_steps, self.lag, self.min_lost_s = warmup_steps, lag, min_lost_s
        self._durations: dict[Key, float] = {}
        self._waits: dict[Key, float] = {}  # the median rank's wait for a CPU, by step
        self._released: Key = (-1, -1)
        self._queue: deque[tuple[Key, float, float]] = deque()  # (key, time, tokens) of step records not yet rated
        self._previous: dict[int, tuple[int, float]] = {}  # timeline -> (step, time) of the last step record
        self._tokens = math.nan
        self._seen = 0
        self._history: deque[tuple[Key, float, float]] = deque(maxlen=baseline_steps + window)  # key, log rate, s
        self._waited: deque[float] = deque(maxlen=baseline_steps + window)  # each one's wait for a CPU
        self._drop: _Drop | None = None
        self._source = "median rank step_time"

    def take(self, batch: TelemetryBatch, matrix: StepMatrix | None) -> list[Finding]:
        self._take_durations(matrix)
        columns = (
            batch.ints("steps", "timeline"),
            batch.ints("steps", "step"),
            batch.floats("steps", "time"),
            batch.floats("steps", "tokens"),
        )
        timelines, steps, times, tokens = (column.tolist() for column in columns)
        self._queue.extend(((tl, s), t, n) for tl, s, t, n in zip(timelines, steps, times, tokens))
        return self._drain(final=False)

    def settle(self, matrix: StepMatrix | None) -> list[Finding]:
        self._take_durations(matrix)
        return self._drain(final=True)

    def _take_durations(self, matrix: StepMatrix | None) -> None:
        if matrix is None:
            return
        times = matrix.values["step_time"]
        medians = row_median(np.where(times > 0, times, np.nan))[:, 0]
        waits = row_median(matrix.values["cpu_wait_time"])[:, 0]
        keys = zip(matrix.timelines.tolist(), matrix.steps.tolist())
        for key, median, wait in zip(keys, medians.tolist(), waits.tolist()):
            if math.isfinite(median):
                self._durations[key] = median
                self._waits[key] = wait
        while len(self._durations) > MAX_PENDING:  # rank rows of steps that have no step record
            oldest = next(iter(self._durations))
            self._durations.pop(oldest)
            self._waits.pop(oldest, None)
        self._released = max(self._released, (int(matrix.timelines[-1]), int(matrix.steps[-1])))

    def _drain(self, *, final: bool) -> list[Finding]:
        """Rate the queued step records whose duration is settled, in order; the drops this opens or changes."""
        newest = max((key for key, _, _ in self._queue), default=(-1, -1))
        rated: list[_Rated] = []
        while self._queue:
            key, time, tokens = self._queue[0]
            settled = (
                key in self._durations
                or key <= self._released
                or final
                or (newest[0] > key[0] or newest[1] >= key[1] + self.lag)
            )
            if not settled:
                break
            self._queue.popleft()
            wait = self._waits.pop(key, math.nan)
            timed = self._rate(key, time, tokens)
            if timed is not None:
                rate, seconds = timed
                rated.append((key, math.log(rate), self._source, self._tokens, seconds, wait))
        last = self._source, self._tokens
        changed = {id(drop): drop for drop in self._observe_all(rated)}
        self._source, self._tokens = last  # as the last step rated left them
        if self._drop is not None:
            changed[id(self._drop)] = self._drop
            self._drop.evidence = self._evidence(self._drop)
        return [self._finding(d) for d in changed.values()]

    def _rate(self, key: Key, time: float, tokens: float) -> tuple[float, float] | None:
        """Tokens (or steps) per second of the step ``key``, and the seconds it took; None when it has no
        duration."""
        timeline, step = key
        before = self._previous.get(timeline)
        self._previous[timeline] = (step, time)
        self._tokens = tokens if math.isfinite(tokens) else self._tokens
        work = self._tokens if math.isfinite(self._tokens) else 1.0
        if key in self._durations:
            self._source = "median rank step_time"
            seconds = self._durations.pop(key)
            return work / seconds, seconds
        if before is None or step <= before[0] or time <= before[1]:
            return None
        self._source = "interval between step records"
        return work * (step - before[0]) / (time - before[1]), time - before[1]

    # -- the statistic -------------------------------------------------------------------
    def _observe_all(self, rated: list[_Rated]) -> list[_Drop]:
        """Add the rated steps in order; the drops they open or close.

        A long run of them is screened at once: the rolling medians of the window and of the
        baseline before it (pandas' rolling kernels) show which steps might open, deepen or
        close a drop, and only those are judged, exactly as one at a time (``_judge``).
        """
        if len(rated) < SCREEN_FROM:
            return [drop for rate in rated if (drop := self._observe(*rate)) is not None]
        warm = max(0, self.warmup_steps - self._seen)
        self._seen += len(rated)
        rated = rated[warm:]
        if not rated:
            return []
        known = [x for _, x, _ in self._history]
        values = pd.Series(known + [x for _, x, *_ in rated])
        current = values.rolling(self.window).median().to_numpy()[len(known) :]
        older = values.rolling(self.baseline_steps, min_periods=2 * self.window).median()
        baseline = older.shift(self.window).to_numpy()[len(known) :]
        out: list[_Drop] = []
        for (key, x, source, tokens, seconds, wait), now, base in zip(rated, current.tolist(), baseline.tolist()):
            self._history.append((key, x, seconds))
            self._waited.append(wait)
            drop = self._drop
            if not math.isfinite(base):
                continue
            if drop is None:
                interesting = now <= base + math.log1p(-self.min_drop) + SCREEN_SLACK
            else:
                interesting = now < drop.lowest + SCREEN_SLACK or now > drop.baseline + self._back - SCREEN_SLACK
            if not interesting:
                if drop is not None:
                    self._extend(drop, key, x, seconds, now)
                continue
            self._source, self._tokens = source, tokens
            if (found := self._judge(key)) is not None:
                out.append(found)
        return out

    def _observe(self, key: Key, x: float, source: str, tokens: float, seconds: float, wait: float) -> _Drop | None:
        """Add one step's log rate, seconds and wait for a CPU (its duration's source and the tokens it reported,
        for the evidence); the drop opened or closed by it."""
        self._seen += 1
        if self._seen <= self.warmup_steps:
            return None
        self._history.append((key, x, seconds))
        self._waited.append(wait)
        self._source, self._tokens = source, tokens
        return self._judge(key)

    @property
    def _back(self) -> float:
        """The log rate over the baseline from which a drop is over (within ``min_drop / 2``)."""
        return math.log1p(-self.min_drop / 2)

    def _judge(self, key: Key) -> _Drop | None:
        """The drop that the history, up to the step ``key``, opens or closes."""
        values = np.array([v for _, v, _ in self._history])
        if len(values) < 3 * self.window:
            return None
        current = float(np.median(values[-self.window :]))
        if self._drop is not None:
            _, x, seconds = self._history[-1]
            self._extend(self._drop, key, x, seconds, current)
            if current < self._drop.lowest:
                self._drop.lowest, self._drop.lowest_step = current, key[1]
            if current > self._drop.baseline + self._back:
                return self._close(self._drop)
            return None
        older = values[: -self.window]
        baseline = float(np.median(older))
        se = 1.2533 * float(mad_sigma(older)) * math.sqrt(1 / self.window + 1 / len(older))
        if current <= baseline + math.log1p(-self.min_drop) and baseline - current >= self.z * se:
            self._drop = self._open(key, values, baseline)
            return self._drop
        return None

    @staticmethod
    def _extend(drop: _Drop, key: Key, x: float, seconds: float, current: float) -> None:
        """The step ``key`` (log rate ``x``, ``seconds`` long, the window's median ``current``) within the drop:
        its end, and the time it lost."""
        if key[0] == drop.timeline:
            drop.end_step = max(key[1], drop.start_step)
            drop.lost_s += lost_seconds(x, seconds, current, drop.baseline)

    def _open(self, key: Key, values: np.ndarray, baseline: float) -> _Drop:
        """The drop's onset: the recent step from which the count of steps below the half-drop level, less
        the count above it, is largest (a sign CUSUM read backwards)."""
        recent = values[-self.window :]
        signs = np.where(recent < baseline + math.log1p(-self.min_drop / 2), 1, -1)
        first = int(np.argmax(np.cumsum(signs[::-1])[::-1]))
        since = [entry for entry in list(self._history)[-self.window + first :] if entry[0][0] == key[0]]
        start = since[0][0][1] if since else key[1]
        current = float(np.median(recent))
        lost = sum(lost_seconds(x, seconds, current, baseline) for _, x, seconds in since)
        before = len(self._history) - self.window
        seconds = float(np.median([s for _, _, s in list(self._history)[:before]]))
        return _Drop(
            key[0], start, key[1], baseline, key[1], current, key[1], lost, seconds, _median(self._waited, 0, before)
        )

    def _close(self, drop: _Drop) -> _Drop:
        drop.evidence, drop.active = self._evidence(drop), False
        self._drop = None
        return drop

    def _evidence(self, drop: _Drop) -> dict[str, Any]:
        recent = list(self._history)[-self.window :]
        current = float(np.median([v for _, v, _ in recent]))
        unit = "tokens/s" if math.isfinite(self._tokens) else "steps/s"
        step_rise = float(np.median([s for _, _, s in recent])) - drop.base_seconds
        wait_rise = _median(self._waited, len(self._waited) - self.window, len(self._waited)) - drop.base_wait
        return {
            "baseline_per_s": round(math.exp(drop.baseline), 6),
            "current_per_s": round(math.exp(current), 6),
            "drop": round(1 - math.exp(current - drop.baseline), 4),
            "largest_drop": round(1 - math.exp(drop.lowest - drop.baseline), 4),
            "lowest_per_s": round(math.exp(drop.lowest), 6),
            "lowest_step": drop.lowest_step,
            "unit": unit,
            "min_drop": self.min_drop,
            "z": self.z,
            "window_steps": self.window,
            "baseline_steps": self.baseline_steps,
            "alarm_step": drop.alarm_step,
            "duration_from": self._source,
            "lost_s": round(drop.lost_s, 3),
            "min_lost_s": self.min_lost_s,
            "step_rise_s": round(step_rise, 6) if math.isfinite(step_rise) else None,
            "cpu_wait_rise_s": round(wait_rise, 6) if math.isfinite(wait_rise) else None,
            "contended": bool(step_rise > 0 and wait_rise >= step_rise / 2),
        }

    def _finding(self, drop: _Drop) -> Finding:
        ev = drop.evidence
        summary = _summary(drop.start_step, ev)
        why = (
            "the ranks waited for CPUs that other processes held: look at what else runs on the job's hosts"
            if ev["contended"]
            else "look for stragglers, a slow data pipeline or network, or a change of the job's configuration"
        )
        pages = drop.lost_s >= self.min_lost_s and not ev["contended"]
        return Finding(
            "throughput_drop",
            Severity.WARNING if pages else Severity.INFO,
            drop.timeline,
            drop.start_step,
            max(drop.end_step, drop.start_step),
            (),
            float(ev["largest_drop"]),
            summary,
            ev,
            SuggestedAction("investigate", {}, why),
            drop.active,
            self.name,
        )


def lost_seconds(x: float, seconds: float, current: float, baseline: float) -> float:
    """What a step lost (its log rate ``x``, ``seconds`` long): its work's time at the window's median log rate
    ``current`` less its time at the ``baseline``. Medians, as the drop itself: a checkpoint pause inside a
    drop is no time the drop lost."""
    work = seconds * math.exp(x)
    return work * (math.exp(-current) - math.exp(-baseline))


def _summary(start_step: int, ev: dict[str, Any]) -> str:
    """The drop at its deepest, with the rates of that moment; the rate now too when it has moved since."""
    unit, baseline = ev["unit"], ev["baseline_per_s"]
    peak = (
        f"throughput down {ev['largest_drop'] * 100:.1f}% from its baseline since step {start_step}"
        f" ({ev['lowest_per_s']:.4g} vs {baseline:.4g} {unit} at step {ev['lowest_step']})"
    )
    cost = f"; {wall_time(ev['lost_s'])} of wall time lost"
    if ev["contended"]:
        cost += (
            f"; the median rank's wait for a CPU rose {ev['cpu_wait_rise_s'] * 1e3:.3g} ms of the"
            f" {ev['step_rise_s'] * 1e3:.3g} ms a step: other processes took the cores (the environment, not the job)"
        )
    elif ev["lost_s"] < ev["min_lost_s"]:
        cost += f" (it pages from {wall_time(ev['min_lost_s'])})"
    if f"{ev['drop'] * 100:.1f}" == f"{ev['largest_drop'] * 100:.1f}":
        return peak + cost
    now = ev["drop"]
    rate = f"now {ev['current_per_s']:.4g} {unit}, {abs(now) * 100:.1f}% {'below' if now >= 0 else 'above'} it"
    return f"{peak}; {rate}{cost}"


def _median(values: deque[float], start: int, stop: int) -> float:
    """The median of the finite ``values[start:stop]`` (NaN when none is)."""
    chosen = np.array(list(values)[max(start, 0) : stop], dtype=float)
    chosen = chosen[np.isfinite(chosen)]
    return float(np.median(chosen)) if len(chosen) else math.nan
