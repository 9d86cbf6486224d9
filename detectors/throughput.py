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

A drop whose extra seconds per step are mostly its slowest ranks' own work is a straggler's: the straggler
finding names them and carries the job's loss, so it opens no finding here. Each step is also rated at the job's
pace (``rank_work.py``): its duration less the seconds the job waited on its slowest rank's work beyond the pace.
The window's median of that log rate against its median before the onset is the drop's own part; a drop is shown
from the first step at which that is at least ``min_drop`` or more than half the drop's depth at its lowest, and
then states the slowest ranks' share of it. A drop that is never shown was the straggler's; nothing pages for it
here, and nothing adds a second finding to the straggler's incident.

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
from .rank_work import Placement, job_pace, rank_work, wall_time
from .robust import mad_sigma, row_median
from .telemetry import TelemetryBatch

Key = tuple[int, int]
_Rated = tuple[Key, float, str, float, float, float, float]
"""A step's key and log rate, with where its duration came from, the tokens it reported, its seconds, the
median rank's wait for a CPU in it and its log rate at the job's pace."""
_Timing = tuple[float, float, float]
"""A step's seconds (the median rank's ``step_time``), the median rank's wait for a CPU, and the seconds the job
waited on its slowest rank's work beyond the job's pace (``rank_work.job_pace``)."""
SCREEN_FROM = 64
"""Rated steps from which a drain screens them with rolling medians rather than judging each."""
SCREEN_SLACK = 1e-9
"""The screen's margin in log rate: a step this close to a boundary is judged exactly."""
MAX_PENDING = 10_000
"""Step durations kept waiting for their step record once a drain has rated what it could, at most."""
SLOWEST_SAID = 0.1
"""The share of a drop from which its finding says how much of it is the slowest ranks' (less is noise in the
medians)."""


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
    base_paced: float = math.nan  # the median log rate at the job's pace before the onset
    depths: float = 0.0  # the sum over its steps of the window's log drop
    own_depths: float = 0.0  # and of the window's log drop at the job's pace
    shown: bool = False  # the job's own at some step (else its slowest ranks': no finding)
    evidence: dict[str, Any] = field(default_factory=dict)
    active: bool = True


class ThroughputDetector(CrossRankDetector):
    """Sustained drops of tokens per second against a rolling robust baseline (see the module docstring)."""

    name = "throughput_drop"
    rank_metrics = ("step_time", "cpu_wait_time", "compute_time", "data_time")
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
        self._timings: dict[Key, _Timing] = {}
        self._placement = Placement()
        self._released: Key = (-1, -1)
        self._queue: deque[tuple[Key, float, float]] = deque()  # (key, time, tokens) of step records not yet rated
        self._previous: dict[int, tuple[int, float]] = {}  # timeline -> (step, time) of the last step record
        self._tokens = math.nan
        self._seen = 0
        self._history: deque[tuple[Key, float, float]] = deque(maxlen=baseline_steps + window)  # key, log rate, s
        self._waited: deque[float] = deque(maxlen=baseline_steps + window)  # each one's wait for a CPU
        self._paced: deque[float] = deque(maxlen=baseline_steps + window)  # each one's log rate at the job's pace
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
        values = matrix.values
        times = values["step_time"]
        medians = row_median(np.where(times > 0, times, np.nan))[:, 0]
        waits = row_median(values["cpu_wait_time"])[:, 0]
        leads = self._leads(matrix)
        keys = zip(matrix.timelines.tolist(), matrix.steps.tolist())
        for key, median, wait, lead in zip(keys, medians.tolist(), waits.tolist(), leads.tolist()):
            if math.isfinite(median):
                self._timings[key] = (median, wait, lead)
        self._released = max(self._released, (int(matrix.timelines[-1]), int(matrix.steps[-1])))

    def _leads(self, matrix: StepMatrix) -> np.ndarray:
        """Per step, the seconds the job waited on its slowest rank's work beyond the job's pace (0 where unknown)."""
        values, size = matrix.values, int(matrix.ranks.max()) + 1
        present, _ = rank_work(
            values["step_time"], values["compute_time"], values["data_time"], values["cpu_wait_time"]
        )
        work = np.full((len(matrix), size), np.nan)
        work[:, matrix.ranks] = present
        pace = job_pace(work, self._placement.of(self.run.topology, size))
        return np.nan_to_num(np.fmax.reduce(work, axis=1) - pace[:, 0])

    def _drain(self, *, final: bool) -> list[Finding]:
        """Rate the queued step records whose duration is settled, in order; the drops this opens or changes."""
        newest = max((key for key, _, _ in self._queue), default=(-1, -1))
        rated: list[_Rated] = []
        while self._queue:
            key, time, tokens = self._queue[0]
            settled = (
                key in self._timings
                or key <= self._released
                or final
                or (newest[0] > key[0] or newest[1] >= key[1] + self.lag)
            )
            if not settled:
                break
            self._queue.popleft()
            timing = self._timings.pop(key, None)
            timed = self._rate(key, time, tokens, timing)
            if timed is not None:
                rate, seconds = timed
                wait, lead = timing[1:] if timing is not None else (math.nan, 0.0)
                x = math.log(rate)
                paced = x + _paced_gain(seconds, lead) if lead else x
                rated.append((key, x, self._source, self._tokens, seconds, wait, paced))
        last = self._source, self._tokens
        changed = {id(drop): drop for drop in self._observe_all(rated)}
        self._source, self._tokens = last  # as the last step rated left them
        while len(self._timings) > MAX_PENDING:  # rank rows of steps that have no step record
            self._timings.pop(next(iter(self._timings)))
        if self._drop is not None:
            changed[id(self._drop)] = self._drop
            self._drop.evidence = self._evidence(self._drop)
        return [self._finding(d) for d in changed.values() if d.shown]

    def _rate(self, key: Key, time: float, tokens: float, timing: _Timing | None) -> tuple[float, float] | None:
        """Tokens (or steps) per second of the step ``key``, and the seconds it took (``timing``'s, from the
        ranks' rows, else the interval since the previous step record); None when it has no duration."""
        timeline, step = key
        before = self._previous.get(timeline)
        self._previous[timeline] = (step, time)
        self._tokens = tokens if math.isfinite(tokens) else self._tokens
        work = self._tokens if math.isfinite(self._tokens) else 1.0
        if timing is not None:
            self._source = "median rank step_time"
            return work / timing[0], timing[0]
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
        paced = _PacedMedians(list(self._paced), rated, self.window)
        out: list[_Drop] = []
        for i, (rate, now, base) in enumerate(zip(rated, current.tolist(), baseline.tolist())):
            key, x, source, tokens, seconds, wait, x_paced = rate
            self._history.append((key, x, seconds))
            self._waited.append(wait)
            self._paced.append(x_paced)
            drop = self._drop
            if not math.isfinite(base):
                continue
            if drop is None:
                interesting = now <= base + math.log1p(-self.min_drop) + SCREEN_SLACK
            else:
                interesting = now < drop.lowest + SCREEN_SLACK or now > drop.baseline + self._back - SCREEN_SLACK
            if not interesting:
                if drop is not None:
                    self._extend(drop, key, x, seconds, now, paced.at(i))
                continue
            self._source, self._tokens = source, tokens
            if (found := self._judge(key)) is not None:
                out.append(found)
        return out

    def _observe(
        self, key: Key, x: float, source: str, tokens: float, seconds: float, wait: float, paced: float
    ) -> _Drop | None:
        """Add one step's log rate, seconds, wait for a CPU and log rate at the job's pace (its duration's
        source and the tokens it reported, for the evidence); the drop opened or closed by it."""
        self._seen += 1
        if self._seen <= self.warmup_steps:
            return None
        self._history.append((key, x, seconds))
        self._waited.append(wait)
        self._paced.append(paced)
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
            if current < self._drop.lowest:
                self._drop.lowest, self._drop.lowest_step = current, key[1]
            self._extend(self._drop, key, x, seconds, current, self._recent(self._paced))
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

    def _extend(self, drop: _Drop, key: Key, x: float, seconds: float, current: float, paced: float) -> None:
        """The step ``key`` (log rate ``x``, ``seconds`` long, the window's median ``current``, and ``paced`` at
        the job's pace) within the drop: its end, the time it lost, and whether it is the job's own."""
        if key[0] == drop.timeline:
            drop.end_step = max(key[1], drop.start_step)
            drop.lost_s += lost_seconds(x, seconds, current, drop.baseline)
            self._attribute(drop, current, paced)

    def _attribute(self, drop: _Drop, current: float, paced: float) -> None:
        """Count a step's window (its median log rate ``current``, and ``paced`` at the job's pace) in the drop's
        depth and in its own depth; the drop is shown from the first step that is the job's own."""
        drop.depths += drop.baseline - current
        drop.own_depths += drop.base_paced - paced
        drop.shown = drop.shown or self._own(drop, paced)

    def _own(self, drop: _Drop, paced: float) -> bool:
        """Whether the drop is the job's own: at the job's pace (``paced``, the window's median) it is still a drop
        of ``min_drop``, or more than half as deep as the drop at its lowest. Otherwise the job waited mostly on its
        slowest ranks' own work: the straggler finding's, not a second finding."""
        own = drop.base_paced - paced
        depth = drop.baseline - drop.lowest
        return not math.isfinite(own) or own >= -math.log1p(-self.min_drop) or own > depth / 2

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
        drop = _Drop(
            key[0], start, key[1], baseline, key[1], current, key[1], lost, seconds, _median(self._waited, 0, before)
        )
        drop.base_paced = _median(self._paced, 0, before)
        self._attribute(drop, current, self._recent(self._paced))
        return drop

    def _recent(self, values: deque[float]) -> float:
        """The median of the newest ``window`` of ``values``."""
        return _median(values, len(values) - self.window, len(values))

    def _close(self, drop: _Drop) -> _Drop:
        drop.evidence, drop.active = self._evidence(drop), False
        self._drop = None
        return drop

    def _evidence(self, drop: _Drop) -> dict[str, Any]:
        recent = list(self._history)[-self.window :]
        current = float(np.median([v for _, v, _ in recent]))
        unit = "tokens/s" if math.isfinite(self._tokens) else "steps/s"
        step_rise = float(np.median([s for _, _, s in recent])) - drop.base_seconds
        wait_rise = self._recent(self._waited) - drop.base_wait
        own = min(max(drop.own_depths / drop.depths, 0.0), 1.0) if drop.depths > 0 else 1.0
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
            "slowest_share": round(1 - own, 4),
            "own_drop": round(1 - math.exp(own * (drop.lowest - drop.baseline)), 4),
        }

    def _finding(self, drop: _Drop) -> Finding:
        ev = drop.evidence
        summary = _summary(drop.start_step, ev)
        if ev["contended"]:
            why = "the ranks waited for CPUs that other processes held: look at what else runs on the job's hosts"
        elif ev["slowest_share"] >= SLOWEST_SAID:
            why = "part is a straggler's (its finding names the ranks); for the rest, look for a slow data pipeline "
            why += "or network, or a change of the job's configuration"
        else:
            why = "look for stragglers, a slow data pipeline or network, or a change of the job's configuration"
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


class _PacedMedians:
    """The window's rolling medians of the log rates at the job's pace over a drain's ``rated`` steps (``known``:
    those before them), worked out at first use: only a drop needs them."""

    def __init__(self, known: list[float], rated: list[_Rated], window: int) -> None:
        self._known, self._rated, self._window = known, rated, window
        self._medians: list[float] | None = None

    def at(self, i: int) -> float:
        """The median of the window that ends at ``rated[i]``."""
        if self._medians is None:
            values = pd.Series(self._known + [rate[-1] for rate in self._rated])
            self._medians = values.rolling(self._window).median().to_numpy()[len(self._known) :].tolist()
        return self._medians[i]


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
    if ev["slowest_share"] >= SLOWEST_SAID:
        cost += (
            f"; {ev['slowest_share'] * 100:.0f}% of it is its slowest ranks' work beyond the job's pace (a"
            f" straggler: see its finding); the job's own drop is {ev['own_drop'] * 100:.1f}%"
        )
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


def _paced_gain(seconds: float, lead: float) -> float:
    """How much higher a step's log rate would have been at the job's pace: had it not waited ``lead`` seconds
    on its slowest rank's work beyond the job's pace (0 where that is no part of the step:
    ranks that do not wait for each other)."""
    return -math.log1p(-lead / seconds) if 0 < lead < seconds else 0.0
