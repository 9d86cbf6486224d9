"""Stragglers: a rank, or a node, whose own work is persistently slower than its peers'.

In a synchronous job every rank's wall ``step_time`` is the same (the collectives wait
for the slowest rank), so the statistic works from the phases: each rank's work is
``compute_time + data_time`` (``step_time`` only for steps that report neither), less
``cpu_wait_time`` where the rank reports it: the time its thread waited for a CPU that
other processes of its host held is the host's, not the rank's (``rank_work.py``, which the
throughput detector reads too).

**Peers first.** A rank's peers are the ranks that share its position, the ranks doing
the same work: the same pipeline stage (and the same TP index when each such slot
holds two or more ranks), from the run's topology; every rank when the run declares
no stages. At the end of the warm-up each rank's median offset over the job splits in
two: its position's (the lower median of the position's ranks) and its own deviation
from its peers. A position slower than the job is **structural** (a property of every
rank in it: info, never an eviction); a rank far off its own peers is a **sick
worker**, slow from the first step or not. Without declared stages, two or more ranks
slower together by about the same factor are taken for an undeclared position.

**Own history second.** Per step released in order by the ``StepAssembler``:

1. ``r = log(work) - b - c``: ``b`` is the rank's learned offset (its position's, plus its own
   deviation shrunk toward 0, then a running mean while it is calm), ``c`` the step's common level,
   the median of ``log(work) - b`` over the ranks in control (in no episode; with the rank itself for
   one that is): a whole-job slowdown moves ``c``, not ``r``, and a slow host moves neither;
2. ``z = Φ⁻¹(F(r))``: the normal score of ``r`` against a pooled reference of recent
   in-control residuals of all ranks, standard normal in control whatever the noise shape;
3. a one-sided CUSUM per rank, ``S = max(0, S + z - k)``, alarms at ``S > h``; the onset
   is the step after ``S`` last was 0.

A rank whose alarm finds most of its pipeline stage with evidence (``S > h/2``, or scores
summed since its onset ``TOGETHER_SIGMAS`` out), most of it on each of several hosts, is a
stage imbalance; most of its host, a slow node. An episode clears
when its ranks' mean ``z`` stays under ``k``: a recovery CUSUM ``R = max(0, R + k - mean z)``
passes ``clear_h``. The warm-up is adaptive: a run that ends before ``warmup_steps`` (an
imported trace of tens of steps) gets the peer verdict from the steps it has, with the
standard error of each offset in the evidence. When the work of the job's fast ranks (its
lower quartile) rose during an episode at least as much as the rank's own excess, the
machine is contended: said so, as info, rather than blamed on the rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import bdtrc, ndtr, ndtri

from .crossrank import CrossRankDetector, StepMatrix
from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .limits import COUNT, NON_NEGATIVE, POSITIVE, Range, ranges
from .rank_work import FAST_QUANTILE, Placement, Positions, job_pace, rank_work, wall_time
from .robust import Cusum, mad_sigma, median, row_median, row_quantile
from .telemetry import TelemetryBatch

METRICS = ("step_time", "data_time", "compute_time", "comm_time", "cpu_wait_time")
OBS = ("resid", "cost", "compute", "data", "wait", "median", "phased", "count", "peer", "level", "cpu_wait", "step")
"""What a rank sums over its CUSUM run: log residual; seconds of work over the job's pace (``job_pace``, at least
0: what the job waits for it), of compute and data over the step's median, and of the median comm wait over its
own (the peers' wait for it); the median work; steps; log of its work over the median of its peers' (itself left
out); log of the job's level (its fast ranks' work); seconds it waited for a CPU over the step's median wait; the
step's seconds (the median rank's ``step_time``)."""
IQR_TO_SIGMA = 1 / 1.349
KNOTS = 257
"""Knots of the normal-score map."""
SCORE_LIMIT = 4.0
"""The largest score a residual beyond the reference gets: one step far out cannot raise an alarm alone."""
MIN_VERDICT_STEPS = 8
"""A run shorter than the warm-up gets a verdict from this many steps on."""
ONSET_WINDOW = 64
"""Steps of each rank's scores kept to place an episode's onset."""
RECENT_STEPS = 8
"""The newest scores of a CUSUM run that estimate the shift it found."""
TOGETHER_SIGMAS = 3.0
"""How far the scores of a rank of an alarming rank's host or stage, summed since its onset, must be out (in sigma of
that sum) to count it in: one healthy rank in 740 is."""


@dataclass
class _Episode:
    """Ranks found slow together, from ``start_step`` until they recover."""

    scope: str  # "rank", "host", "pp_stage" (late stage imbalance) or "structural" (a slow position)
    ranks: np.ndarray
    timeline: int
    start_step: int
    alarm_step: int
    end_step: int
    host: str | None = None
    stage: int | None = None
    level_start: float = 0.0  # the job's log median work before the episode
    peers: int = 0
    recovery: float = 0.0
    recovery_start: int = 0  # the step after the recovery CUSUM last was 0
    recovered_step: int | None = None  # that step, once the episode cleared
    active: bool = True
    verdict: dict[str, Any] = field(default_factory=dict)  # what the warm-up held, for a rank slow from the start
    frozen: dict[str, Any] = field(default_factory=dict)


class _Reference:
    """Pooled recent in-control residuals: their spread, and the normal-score map they define.

    The map is piecewise linear through the reference's quantiles at ``KNOTS`` equally spaced
    normal scores (out to the score of its extreme ranks), so a score costs one ``np.interp``.
    """

    def __init__(self, size: int, outlier_sigmas: float) -> None:
        self.ring = np.empty(size)
        self.outlier_sigmas = outlier_sigmas
        self.reset(np.zeros(1))

    def reset(self, values: np.ndarray) -> None:
        """Start again from ``values`` (the warm-up's residuals)."""
        self.filled = self.pos = 0
        self._sort(np.sort(values))
        self.add(values)
        self._sort(np.sort(self.ring[: self.filled]))

    def add(self, values: np.ndarray) -> None:
        """Take residuals (outliers beyond ``outlier_sigmas`` kept out); re-sort once half of it is new."""
        values = values[np.abs(values - self.center) <= self.outlier_sigmas * self.sigma][-len(self.ring) :]
        self.ring[(self.pos + np.arange(len(values))) % len(self.ring)] = values
        self.pos = (self.pos + len(values)) % len(self.ring)
        self.filled = min(len(self.ring), self.filled + len(values))
        self.fresh += len(values)
        if self.fresh * 2 >= len(self.ring):
            self._sort(np.sort(self.ring[: self.filled]))

    def median_se(self, count: int) -> float:
        """Standard error of a median of ``count`` residuals: 1 / (2 f(0) sqrt(count)), f from the middle 20%."""
        return self.middle / (0.4 * math.sqrt(count))

    def scores(self, r: np.ndarray) -> np.ndarray:
        """Normal scores of ``r`` (NaN stays NaN). Beyond the reference's range a score goes on growing by one per
        ``sigma`` from its extreme score, up to ``SCORE_LIMIT``: a rank twice as slow as anything the reference
        holds is not scored as its slowest step was."""
        inside = np.interp(r, self.knots, self.knot_scores)
        above = self.knot_scores[-1] + (r - self.knots[-1]) / self.sigma
        below = self.knot_scores[0] + (r - self.knots[0]) / self.sigma
        beyond = np.where(r > self.knots[-1], np.minimum(above, SCORE_LIMIT), np.maximum(below, -SCORE_LIMIT))
        return np.where((r > self.knots[-1]) | (r < self.knots[0]), beyond, inside)

    def _sort(self, values: np.ndarray) -> None:
        values = values if len(values) else np.zeros(1)
        n, self.fresh = len(values), 0
        z_max = float(ndtri(1 - 1 / (2 * n + 2)))
        z = np.linspace(-z_max, z_max, KNOTS)
        knots = np.interp(ndtr(z) * n - 0.5, np.arange(n), values)
        self.knots, inverse = np.unique(knots, return_inverse=True)  # tied knots: their mean score
        self.knot_scores = np.bincount(inverse, z) / np.bincount(inverse)
        self.center = float(np.interp(0.5 * (n - 1), np.arange(n), values))
        q = np.interp(np.array([0.25, 0.4, 0.6, 0.75]) * (n - 1), np.arange(n), values)
        self.sigma = max(float(q[3] - q[0]) * IQR_TO_SIGMA, 1e-9)
        self.middle = max(float(q[2] - q[1]), 1e-12)


def others_median(values: np.ndarray) -> np.ndarray:
    """For each value, the median of the other values of its row (NaNs ignored; NaN with no other)."""
    ordered = np.sort(values, axis=1)
    count = (~np.isnan(values)).sum(axis=1, keepdims=True)
    rows = np.arange(len(values))[:, None]
    half = count // 2

    def at(i: np.ndarray) -> np.ndarray:
        return ordered[rows, np.clip(i, 0, values.shape[1] - 1)]

    lo, mid, hi = at(half - 1), at(half), at(half + 1)
    even = np.where(values <= lo, mid, lo)  # leaving out one of the lower half moves the median up
    odd = np.where(values < mid, 0.5 * (mid + hi), np.where(values > mid, 0.5 * (lo + mid), 0.5 * (lo + hi)))
    result = np.where(count % 2 == 0, even, odd)
    return np.where((count >= 2) & ~np.isnan(values), result, np.nan)


class StragglerDetector(CrossRankDetector):
    """Persistently slow ranks and nodes from per-rank phase times (see the module docstring)."""

    name = "straggler"
    rank_metrics = METRICS
    kinds = (
        FindingKind("straggler", Family.PERFORMANCE, tolerance=1000, cause="slow worker(s)", precedence=40, lead=100),
    )
    limits = ranges(
        k=POSITIVE,
        false_alarm_steps=Range(1),
        clear_h=POSITIVE,
        warmup_steps=COUNT,
        horizon_steps=COUNT,
        reference_size=Range(8, integer=True),
        outlier_sigmas=POSITIVE,
        group_fraction=Range(0, 1, low_open=True),
        structural_min=NON_NEGATIVE,
        lag=COUNT,
    )

    def __init__(
        self,
        *,
        k: float = 0.25,
        false_alarm_steps: float = 1e6,
        clear_h: float = 8.0,
        warmup_steps: int = 100,
        horizon_steps: int = 2000,
        reference_size: int = 8192,
        outlier_sigmas: float = 20.0,
        group_fraction: float = 0.5,
        structural_min: float = 0.05,
        lag: int = 20,
    ) -> None:
        super().__init__()
        self.k, self.false_alarm_steps, self.clear_h = k, false_alarm_steps, clear_h
        self.warmup_steps, self.horizon_steps = warmup_steps, horizon_steps
        self.group_fraction, self.structural_min = group_fraction, structural_min
        self.lag = lag
        self._reference = _Reference(reference_size, outlier_sigmas)
        self._warm: list[tuple[np.ndarray, np.ndarray]] | None = []
        self._first: tuple[int, int] | None = None
        self._last_step = 0
        self._episodes: list[_Episode] = []
        self._b, self._learned = np.zeros(0), np.zeros(0)  # offset, and how many steps it learned from
        self._run_start, self._run_timeline = np.zeros(0, int), np.zeros(0, int)  # where S last left 0
        self._level_start = np.zeros(0)  # the job's level (log work of its fast ranks) where S last left 0
        self._claimed, self._acc = np.zeros(0, bool), np.zeros((len(OBS), 0))  # in an episode; OBS sums
        self._level, self._level_n = 0.0, 0  # running mean of the job's level
        self._cusum = Cusum(0, k=k, h=np.inf, clip=np.inf)  # h is set when the warm-up has counted the ranks
        self._rise = Cusum(0, k=k, h=np.inf, clip=np.inf)  # a claimed rank's further slowdown, over its episode's level
        self._slow_sum, self._slow_n = np.zeros(0), np.zeros(0)  # its residuals since the episode's alarm
        self._rise_start = np.zeros(0, int)  # where its rise CUSUM last left 0
        self._rise_sum, self._rise_n = np.zeros(0), np.zeros(0)  # its residuals since then
        self._scores = np.zeros((ONSET_WINDOW, 0))  # a ring of the newest scores (the rise's for a claimed rank)
        self._scored = np.full((ONSET_WINDOW, 2), -1)  # the (timeline, step) of each of its rows
        self._row = 0
        self._placement = Placement()
        self._z_scale = 1.0

    # -- streaming -----------------------------------------------------------------------
    def take(self, batch: TelemetryBatch, matrix: StepMatrix | None) -> list[Finding]:
        return self._consume(matrix)

    def settle(self, matrix: StepMatrix | None) -> list[Finding]:
        return self._consume(matrix, final=True)

    def _consume(self, matrix: StepMatrix | None, *, final: bool = False) -> list[Finding]:
        changed: dict[int, _Episode] = {}
        if matrix is not None:
            self._grow(int(matrix.ranks.max()) + 1)
            log_work, obs = self._observations(matrix)
            for i, (timeline, step) in enumerate(zip(matrix.timelines.tolist(), matrix.steps.tolist())):
                for episode in self._step(timeline, step, log_work[i], obs[i]):
                    changed[id(episode)] = episode
        if final and self._warm is not None and len(self._warm) >= MIN_VERDICT_STEPS and self._first:
            changed.update({id(e): e for e in self._end_warmup(self._last_step, self._first)})  # a short run
        changed.update({id(e): e for e in self._episodes if e.active})
        self._episodes = [e for e in self._episodes if e.active]
        return [self._finding(e) for e in changed.values()]

    def _grow(self, size: int) -> None:
        """Per-rank state for ranks ``0..size-1``."""
        pad = size - len(self._b)
        if pad <= 0:
            return
        for name in (
            "_b",
            "_learned",
            "_run_start",
            "_run_timeline",
            "_level_start",
            "_claimed",
            "_acc",
            "_slow_sum",
            "_slow_n",
            "_rise_start",
            "_rise_sum",
            "_rise_n",
            "_scores",
        ):
            values = getattr(self, name)
            setattr(self, name, np.concatenate([values, np.zeros(values.shape[:-1] + (pad,), values.dtype)], axis=-1))
        self._cusum.resize(size)
        self._rise.resize(size)

    def _positions(self) -> Positions:
        """The positions of ranks ``0..size-1``."""
        return self._placement.of(self.run.topology, len(self._b))

    def _observations(self, matrix: StepMatrix) -> tuple[np.ndarray, np.ndarray]:
        """Log work (steps x ranks) and what episodes accumulate (steps x OBS x ranks), full rank width."""
        size = len(self._b)
        full = {}
        for name in METRICS:
            full[name] = np.full((len(matrix), size), np.nan)
            full[name][:, matrix.ranks] = matrix.values[name]
        work, phased = rank_work(full["step_time"], full["compute_time"], full["data_time"], full["cpu_wait_time"])
        log_work = np.log(work)
        median = row_median(work)
        fast = row_quantile(work, FAST_QUANTILE)
        excess = {
            name: np.nan_to_num(full[f"{name}_time"] - row_median(full[f"{name}_time"]))
            for name in ("compute", "data", "comm", "cpu_wait")
        }
        valid = ~np.isnan(log_work)
        columns = {
            "resid": np.zeros_like(log_work),
            "cost": np.maximum(work - job_pace(work, self._positions()), 0.0),
            "compute": excess["compute"],
            "data": excess["data"],
            "wait": -excess["comm"],
            "cpu_wait": excess["cpu_wait"],
            "step": np.broadcast_to(np.nan_to_num(row_median(full["step_time"])), log_work.shape),
            "median": np.broadcast_to(median, log_work.shape),
            "phased": np.broadcast_to(phased, log_work.shape),
            "count": np.ones_like(log_work),
            **dict(zip(("peer", "level"), map(np.nan_to_num, self._peer_ratios(log_work, np.log(fast))))),
        }
        obs = np.stack([np.where(valid, columns[name], 0.0) for name in OBS], axis=1)
        return log_work, obs

    def _peer_ratios(self, log_work: np.ndarray, log_fast: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Log of each rank's work over the median of its peers' (the other ranks of its position; the other
        ranks of the job for a rank alone in its position), and the job's level: ``log_fast``, the log work of its
        fast ranks; of the other rank when there are two (either would move with the slow one)."""
        groups = self._positions().groups
        whole = len(groups) == 1 and len(groups[0][1]) == log_work.shape[1]
        job_wide = whole or log_work.shape[1] <= 2 or any(len(members) < 2 for _, members in groups)
        others = others_median(log_work) if job_wide else np.full_like(log_work, np.nan)
        ratio = log_work - others
        for _, members in groups if not whole else ():
            if len(members) >= 2:
                own = log_work[:, members] - others_median(log_work[:, members])
                ratio[:, members] = np.where(np.isnan(own), ratio[:, members], own)
        return ratio, others if log_work.shape[1] <= 2 else np.broadcast_to(log_fast, log_work.shape)

    # -- one step ------------------------------------------------------------------------
    def _step(self, timeline: int, step: int, log_work: np.ndarray, obs: np.ndarray) -> list[_Episode]:
        if np.count_nonzero(~np.isnan(log_work)) < 2:
            return []  # nothing to compare with
        self._last_step = step
        if self._warm is not None:
            self._first = self._first or (timeline, step)
            self._warm.append((log_work, obs))
            return self._end_warmup(step, self._first) if len(self._warm) >= self.warmup_steps else []
        r = self._residuals(log_work)
        scores = self._reference.scores(r)
        z = np.where(
            self._learned < self.warmup_steps, np.nan, scores * self._z_scale
        )  # a late rank learns its offset first
        was_zero = self._cusum.s == 0
        alarm = self._cusum.update(z)
        rise = self._rise_scores(r)
        self._remember(timeline, step, np.where(self._claimed, rise, z))
        s, free = self._cusum.s, ~self._claimed
        started = was_zero & (s > 0)
        self._run_start[started], self._run_timeline[started] = step, timeline
        self._level_start[started] = self._level
        obs[OBS.index("resid")] = np.where(np.isnan(r), 0.0, r)
        self._acc[:, (s == 0) & free] = 0.0
        self._acc += np.where((s > 0) | ~free, obs, 0.0)
        seen = ~np.isnan(r)
        controls = np.count_nonzero(free & seen)
        calm = free & (s <= self._cusum.h / 2) & seen & (controls >= 2)  # one alone: its r is 0 by construction
        self._learn(r, scores, calm, refresh=bool(2 * controls > np.count_nonzero(seen)))
        self._follow_level(obs)
        risen = self._rose(rise, r, step, timeline)
        return self._recover(z, step) + self._open(alarm & free, step) + risen

    def _residuals(self, log_work: np.ndarray) -> np.ndarray:
        """``r = log work - b - c``, ``c`` the step's common level: the median of ``log work - b`` over the ranks in
        control (offset learned, in no episode), with the rank itself for one out of control. A slow host's ranks do
        not move it, nor do a slow position's: ``b`` holds the position's offset."""
        return in_control_residuals(log_work - self._b, ~self._claimed & (self._learned >= self.warmup_steps))

    def _learn(self, r: np.ndarray, z: np.ndarray, calm: np.ndarray, *, refresh: bool) -> None:
        """Offsets follow each calm rank's scores (a running mean, exponential once ``horizon_steps`` long); calm
        residuals refresh the reference while most ranks are in control (a median of fewer ranks than the reference
        was made of leaves narrower residuals: of two, half the variance)."""
        self._b[calm] += self._reference.sigma * z[calm] / np.clip(self._learned[calm], 1, self.horizon_steps)
        self._learned[calm] += 1
        if refresh:
            self._reference.add(r[calm])

    def _remember(self, timeline: int, step: int, z: np.ndarray) -> None:
        self._scores[self._row], self._scored[self._row] = z, (timeline, step)
        self._row = (self._row + 1) % ONSET_WINDOW

    def _onset(self, ranks: np.ndarray, timeline: int, start: int) -> int:
        """Where the shift a CUSUM run found began: the step from which the ranks' scores, less half the shift
        (their mean over the run's newest ``RECENT_STEPS``, or ``k`` when that is larger), sum highest. ``start``,
        where the run left 0, when nothing later does better: a large shift is placed where it began, not where
        a small drift before it first lifted the sum."""
        scores, steps = self._kept_since(timeline, start)
        if not len(steps):
            return start
        block = scores[:, ranks]
        counts = (~np.isnan(block)).sum(axis=1)
        z = np.where(counts > 0, np.nansum(block, axis=1) / np.maximum(counts, 1), np.nan)
        recent = _valid(z[:RECENT_STEPS])
        half = max(self.k, float(recent.mean()) / 2) if len(recent) else self.k
        gains = np.cumsum(np.nan_to_num(z - half))
        best = int(np.argmax(gains))
        older = best == len(z) - 1 and steps[-1] > start  # the run began before the scores kept
        return int(steps[best]) if gains[best] > 0 and not older else start

    def _kept_since(self, timeline: int, start: int) -> tuple[np.ndarray, np.ndarray]:
        """The kept scores of ``timeline`` from step ``start`` on (rows newest first, every rank), and their steps."""
        newest = (self._row - 1 - np.arange(ONSET_WINDOW)) % ONSET_WINDOW
        timelines, steps = self._scored[newest].T
        inside = np.cumprod((timelines == timeline) & (steps >= start)).astype(bool)
        return self._scores[newest[inside]], steps[inside]

    def _shifted_with(self, rank: int) -> np.ndarray:
        """Ranks whose scores since ``rank``'s onset sum to ``TOGETHER_SIGMAS`` times the root of their count or
        more: the same shift from the same step, tested at that one step."""
        timeline = int(self._run_timeline[rank])
        scores, _ = self._kept_since(timeline, self._onset(np.array([rank]), timeline, int(self._run_start[rank])))
        counts = (~np.isnan(scores)).sum(axis=0)
        return (counts > 0) & (np.nansum(scores, axis=0) >= TOGETHER_SIGMAS * np.sqrt(np.maximum(counts, 1)))

    def _rise_scores(self, r: np.ndarray) -> np.ndarray:
        """Scores of the claimed ranks' residuals against their level since the episode's alarm (NaN until it is
        learned from ``MIN_VERDICT_STEPS`` steps, and for every other rank)."""
        known = np.flatnonzero(self._claimed & (self._slow_n >= MIN_VERDICT_STEPS))
        z = np.full(len(r), np.nan)
        if not len(known):
            return z
        z[known] = self._reference.scores(r[known] - self._slow_sum[known] / self._slow_n[known]) * self._z_scale
        return z

    def _rose(self, z: np.ndarray, r: np.ndarray, step: int, timeline: int) -> list[_Episode]:
        """A rank already in an episode of its own that slows down further, against its level since the episode's
        alarm (learned from ``MIN_VERDICT_STEPS`` steps on, and while calm), by at least as much again as that
        level's excess: the episode ends where the rise began and a new one starts there, so that the escalation
        has its own onset."""
        if not self._claimed.any():  # no episode: nothing can rise, and every rise statistic rests at zero
            self._rise.s[:], self._rise_sum[:], self._rise_n[:] = 0.0, 0.0, 0
            return []
        level_known = ~np.isnan(z)
        was_zero = self._rise.s == 0
        alarm = self._rise.update(z) & level_known
        self._rise.reset(~level_known)
        rising = self._rise.s > 0
        self._rise_start[was_zero & rising] = step
        self._rise_sum[~rising], self._rise_n[~rising] = 0.0, 0
        counted = rising & ~np.isnan(r)
        self._rise_sum[counted] += r[counted]
        self._rise_n[counted] += 1
        level = self._slow_sum / np.maximum(self._slow_n, 1)
        grown = self._rise_sum / np.maximum(self._rise_n, 1) - level >= np.maximum(
            level, math.log1p(self.structural_min)
        )
        alarm &= grown  # an escalation at least doubles the episode's excess: drift within it is not one
        calm = self._claimed & ~np.isnan(r) & (self._rise.s <= self._cusum.h / 2)
        self._slow_sum[calm] += r[calm]
        self._slow_n[calm] += 1
        changed: list[_Episode] = []
        for episode in [e for e in self._episodes if e.active and e.scope == "rank" and alarm[e.ranks].all()]:
            onset = self._onset(episode.ranks, timeline, int(self._rise_start[episode.ranks].min()))
            episode.end_step = max(onset - 1, episode.start_step)
            episode.frozen, episode.active = self._evidence(episode), False
            risen = _Episode(
                "rank",
                episode.ranks,
                episode.timeline,
                onset,
                step,
                step,
                host=episode.host,
                level_start=self._level,
                peers=episode.peers,
            )
            self._acc[:, episode.ranks] = 0.0
            self._slow_sum[episode.ranks], self._slow_n[episode.ranks] = 0.0, 0
            self._rise.reset(episode.ranks)
            self._episodes.append(risen)
            changed += [episode, risen]
        return changed

    def _follow_level(self, obs: np.ndarray) -> None:
        """The job's level (log work of its fast ranks), a running mean like the offsets'."""
        counted = obs[OBS.index("count")] > 0
        if counted.any():
            level = float(obs[OBS.index("level")][counted][0])
            self._level_n = min(self._level_n + 1, self.horizon_steps)
            self._level += (level - self._level) / self._level_n

    # -- the warm-up's verdict -------------------------------------------------------------
    def _end_warmup(self, step: int, start: tuple[int, int]) -> list[_Episode]:
        """Offsets and reference from the warm-up; slow positions are structural (info), ranks far off their
        peers are sick workers (an episode open from the first step)."""
        assert self._warm is not None
        size = len(self._b)
        log_work = np.array([np.pad(x, (0, size - len(x)), constant_values=np.nan) for x, _ in self._warm])
        warm = log_work - row_median(log_work)  # d: each rank's log work over the step's median rank's
        sums = np.sum([np.pad(obs, ((0, 0), (0, size - obs.shape[1]))) for _, obs in self._warm], axis=0)
        levels = [obs[OBS.index("level")][obs[OBS.index("count")] > 0][0] for _, obs in self._warm]
        above = np.sum([np.pad(obs[OBS.index("peer")] > 0, (0, size - obs.shape[1])) for _, obs in self._warm], 0)
        self._warm = None
        raw = row_median(warm.T)[:, 0]
        resid = warm - others_median(warm.T).T  # each step against the rank's other steps: no pile at 0
        self._reference.reset(_valid(resid))
        steps = len(warm)
        independence = _independence(resid)
        self._z_scale = math.sqrt(independence)  # a CUSUM over autocorrelated scores grows (1 + rho) / (1 - rho) faster
        se = self._reference.median_se(max(1, round(steps * independence)))
        places = self._positions()
        position = _position_offsets(raw, places)
        dev = raw - position
        offset_se = max(se, _spread(dev))
        floor = max(math.log1p(self.structural_min), _verdict_sigmas(dev) * offset_se)
        slow = (np.nan_to_num(dev) > floor) & _mostly_above(above, (~np.isnan(warm)).sum(axis=0))
        verdicts = self._slow_ranks(slow, dev, places)
        sick = np.zeros_like(slow)
        for scope, members, _ in verdicts:
            sick[members] = scope != "structural"
        self._b = np.nan_to_num(np.where(sick, position, position + self._shrink(dev, places, se)))
        self._learned = (~np.isnan(warm)).sum(axis=0).astype(float)
        self._cusum.h = cusum_threshold(self.k, self.false_alarm_steps * max(int((self._learned > 0).sum()), 1))
        self._rise.h = self._cusum.h
        in_control = np.array([in_control_residuals(own, ~sick) for own in log_work - self._b])
        self._reference.reset(_valid(in_control[:, ~sick]))
        self._level_n = steps
        self._level = float(np.median(levels))
        timeline, first = start
        verdict = {"steps_seen": steps, "offset_se": round(offset_se, 4)}
        found = [
            _Episode("structural", members, timeline, first, step, step, stage=stage, active=False, verdict=verdict)
            for stage, members in self._slow_positions(position, places, floor)
        ]
        for scope, members, host in verdicts:
            if scope == "structural":
                found.append(_Episode(scope, members, timeline, first, step, step, active=False, verdict=verdict))
                continue
            episode = _Episode(scope, members, timeline, first, step, step, host=host, level_start=self._level)
            episode.peers, episode.verdict = self._peer_count(members, places), verdict
            self._claimed[members] = True
            self._acc[:, members] = sums[:, members]
            self._acc[OBS.index("resid"), members] = np.nansum(in_control[:, members], axis=0)
            self._slow_sum[members] = self._acc[OBS.index("resid"), members]
            self._slow_n[members] = (~np.isnan(warm[:, members])).sum(axis=0)
            self._episodes.append(episode)
            found.append(episode)
        for episode in found:
            if not episode.active:
                episode.frozen = self._evidence(episode)
        return found

    def _shrink(self, dev: np.ndarray, places: Positions, se: float) -> np.ndarray:
        """Deviations from the position pulled toward 0 by tau^2 / (tau^2 + se^2).

        ``tau`` is the spread of true deviations (robust spread of the position's deviations
        less their noise ``se``). One more than 4 se slower is kept as it is (a real offset,
        under the floor of a finding); a fast one is shrunk too: too low an offset would
        alarm, too high one only delays, and the running mean takes a truly fast rank down.
        """
        b = dev.copy()
        for _, members in places.groups:
            values = dev[members]
            tau2 = max(0.0, float(mad_sigma(values)) ** 2 - se**2) if (~np.isnan(values)).any() else 0.0
            b[members] = np.where(values > 4 * se, values, values * tau2 / (tau2 + se**2))
        return b

    def _slow_positions(
        self, position: np.ndarray, places: Positions, floor: float
    ) -> list[tuple[int | None, np.ndarray]]:
        """Declared positions slower than the job as a whole: (pipeline stage, ranks present)."""
        found = []
        for label, members in places.groups:
            members = members[~np.isnan(position[members])]
            if places.declared and len(members) and position[members[0]] > floor:
                found.append((places.stage[label], members))
        return found

    def _slow_ranks(
        self, slow: np.ndarray, dev: np.ndarray, places: Positions
    ) -> list[tuple[str, np.ndarray, str | None]]:
        """Ranks far off their peers from the start: (scope, ranks, host) by host for a declared position;
        without declared positions, two or more whose excess is within 50% of each other's are one position."""
        ranks = np.flatnonzero(slow)
        found: list[tuple[str, np.ndarray, str | None]] = []
        rest = set(ranks.tolist())
        if not places.declared:
            for cluster in _clusters(ranks, dev):
                if len(cluster) >= 2:
                    found.append(("structural", cluster, None))
                    rest -= set(cluster.tolist())
        topo = self.run.topology
        for host, members in topo.dropna(subset=["host"]).groupby("host")["rank"]:
            members = members.to_numpy(int)
            hit = np.array(sorted(rest & set(members.tolist())), dtype=int)
            if len(members) >= 2 and len(hit) >= 2 and len(hit) >= self.group_fraction * len(members):
                found.append(("host", hit, str(host)))
                rest -= set(hit.tolist())
        return found + [("rank", np.array([r]), self.run.place_of(r).get("host")) for r in sorted(rest)]

    def _peer_count(self, ranks: np.ndarray, places: Positions) -> int:
        """How many ranks the first of ``ranks`` is compared with (its position's others, else the job's)."""
        label = places.label[ranks[0]] if ranks[0] < len(places.label) else -1
        same = np.count_nonzero((places.label == label) & (self._learned > 0)) - 1
        return int(same) if same >= 1 else int(np.count_nonzero(self._learned > 0)) - 1

    # -- episodes ------------------------------------------------------------------------
    def _open(self, new: np.ndarray, step: int) -> list[_Episode]:
        opened = []
        for rank in np.flatnonzero(new):
            if self._claimed[rank]:
                continue  # taken by a node or stage episode opened this step
            scope, members, host, stage = self._group(int(rank))
            timeline = int(self._run_timeline[members].min())
            episode = _Episode(
                scope,
                members,
                timeline,
                self._onset(members, timeline, int(self._run_start[members].min())),
                step,
                step,
                host=host,
                stage=stage,
                level_start=float(self._level_start[members].mean()),
                peers=self._peer_count(members, self._positions()),
            )
            self._claimed[members] = True
            self._slow_sum[members], self._slow_n[members] = 0.0, 0
            self._episodes.append(episode)
            opened.append(episode)
        return opened

    def _group(self, rank: int) -> tuple[str, np.ndarray, str | None, int | None]:
        """A slow pipeline stage whose slow ranks are most of its ranks on two hosts or more, else a slow node, else
        the rank alone. A rank counts in with half the evidence (``S > h/2``) or with scores that moved with the
        alarming rank's since its onset: a rank whose CUSUM had a head start from noise alarms steps before its
        host's others reach ``h/2``."""
        topo = self.run.topology
        topo = topo[topo["rank"] < len(self._b)]
        place = self.run.place_of(rank)
        evidence = ((self._cusum.s > self._cusum.h / 2) | self._shifted_with(rank)) & ~self._claimed
        if "pp" in place and topo["pp"].nunique() > 1:
            stage = topo[topo["pp"] == place["pp"]]
            members = self._most(stage["rank"], evidence)
            if members is not None and self._spans_hosts(stage, members):
                return "pp_stage", members, None, int(place["pp"])
        if "host" in place:
            members = self._most(topo.loc[topo["host"] == place["host"], "rank"], evidence)
            if members is not None:
                return "host", members, str(place["host"]), None
        return "rank", np.array([rank]), place.get("host"), None

    def _spans_hosts(self, stage: pd.DataFrame, members: np.ndarray) -> bool:
        """Whether ``members`` are at least ``group_fraction`` of the stage's ranks on each of two hosts or more (or
        the hosts are unknown): one slow host, with a rank of another one counted in by chance, is a slow node."""
        placed = stage.dropna(subset=["host"])
        share = placed["rank"].isin(members).groupby(placed["host"]).mean()
        return placed.empty or int((share >= self.group_fraction).sum()) >= 2

    def _most(self, ranks: pd.Series, evidence: np.ndarray) -> np.ndarray | None:
        """The ranks with evidence, when they are at least ``group_fraction`` of two or more ranks."""
        ranks = ranks.to_numpy(dtype=int)
        hit = ranks[evidence[ranks]]
        return hit if len(ranks) >= 2 and len(hit) >= 2 and len(hit) >= self.group_fraction * len(ranks) else None

    def _recover(self, z: np.ndarray, step: int) -> list[_Episode]:
        """Advance each open episode; those whose ranks' scores stay under ``k`` clear."""
        cleared = []
        for episode in (e for e in self._episodes if e.active):
            episode.end_step = step
            scores = z[episode.ranks]
            if np.isnan(scores).all():
                continue
            if episode.recovery == 0:
                episode.recovery_start = step
            episode.recovery = max(0.0, episode.recovery + self.k - float(np.nanmean(scores)))
            if episode.recovery > self.clear_h:
                episode.recovered_step = episode.recovery_start
                episode.frozen, episode.active = self._evidence(episode), False
                self._claimed[episode.ranks] = False
                self._cusum.reset(episode.ranks)
                self._rise.reset(episode.ranks)
                self._acc[:, episode.ranks] = 0.0
                cleared.append(episode)
        return cleared

    # -- findings ------------------------------------------------------------------------
    def _evidence(self, episode: _Episode) -> dict[str, Any]:
        if episode.scope == "structural":
            offsets = {str(r): round(math.exp(self._b[r]), 4) for r in episode.ranks.tolist()}
            return {
                "scope": "structural",
                "pp_stage": episode.stage,
                "declared": episode.stage is not None,
                **episode.verdict,
                "slowdown": max(offsets.values()),
                "offsets": offsets,
            }
        acc = self._acc[:, episode.ranks]
        mean = {name: acc[i] / np.maximum(acc[OBS.index("count")], 1) for i, name in enumerate(OBS)}
        phase = "step" if not mean["phased"].any() else max(("compute", "data"), key=lambda p: mean[p].sum())
        place = {"place": self.run.place_of(int(episode.ranks[0]))} if episode.scope == "rank" else {}
        slowdown = math.exp(float(mean["resid"].mean()))
        job = math.exp(float(mean["level"].mean()) - episode.level_start)
        verdict = episode.verdict
        spread = 2 * verdict.get("offset_se", 0.0)
        peer = float(mean["peer"].mean())
        cpu_wait = float(mean["cpu_wait"].max())
        return {
            "scope": episode.scope,
            "host": episode.host,
            "pp_stage": episode.stage,
            **place,
            "slowdown": round(slowdown, 4),
            "peer_ratio": round(math.exp(peer), 4),
            "peers": episode.peers,
            "from_start": bool(verdict),
            **(
                {**verdict, "peer_ratio_95": [round(math.exp(peer + s * spread), 4) for s in (-1, 1)]}
                if verdict
                else {}
            ),
            "job_slowdown": round(job, 4),
            "contended": episode.scope != "pp_stage" and job - 1 >= max(slowdown - 1, self.structural_min),
            "phase": phase,
            **_job_loss(acc, mean),
            "cpu_wait_s_per_step": round(cpu_wait, 6),
            "peers_wait_s_per_step": round(float(mean["wait"].max()), 6),
            "baseline_work_s": round(float(np.median(mean["median"])), 6),
            "structural_offset": round(math.exp(float(self._b[episode.ranks].mean())), 4),
            "cusum": round(float(self._cusum.s[episode.ranks].max()), 3),
            "score_scale": round(self._z_scale, 4),
            "threshold": round(self._cusum.h, 3),
            "k": self.k,
            "alarm_step": episode.alarm_step,
            "recovered_step": episode.recovered_step,
        }

    def _finding(self, episode: _Episode) -> Finding:
        evidence = episode.frozen or self._evidence(episode)
        ranks = episode.ranks.tolist()
        quiet = episode.scope in ("structural", "pp_stage") or evidence.get("contended", False)
        return Finding(
            "straggler",
            Severity.INFO if quiet else Severity.WARNING,
            episode.timeline,
            episode.start_step,
            max(episode.end_step, episode.start_step),
            tuple(ranks),
            float(evidence["slowdown"]),
            _summary(episode, evidence),
            evidence,
            _action(episode, ranks, evidence),
            episode.active,
            self.name,
        )


def _job_loss(acc: np.ndarray, mean: dict[str, np.ndarray]) -> dict[str, Any]:
    """What the episode costs the job, from its slowest rank: seconds per step of its work over the job's pace
    (the synchronous job waits that long), that share of the step's seconds (of the job's throughput), and the
    wall time lost since the onset."""
    worst = int(np.argmax(mean["cost"]))
    cost, step = float(mean["cost"][worst]), float(mean["step"][worst])
    return {
        "job_cost_s_per_step": round(cost, 6),
        "throughput_lost": round(cost / step, 4) if step > 0 else None,
        "lost_s": round(float(acc[OBS.index("cost"), worst]), 3),
    }


def _mostly_above(above: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Ranks slower than the median of their peers on so many of their ``steps`` that a healthy rank (above
    on half of them) would be there in under 1% of runs of this many ranks (a sign test)."""
    ranks = max(int((steps > 0).sum()), 1)
    return (steps > 0) & (bdtrc(np.maximum(above - 1, 0), steps, 0.5) <= 0.01 / ranks)


def _verdict_sigmas(dev: np.ndarray) -> float:
    """How far out of its peers a warm-up offset must be: 4 sigma, or the normal quantile that leaves 1% of
    runs with a false verdict among this many ranks when that is further."""
    return max(4.0, float(ndtri(1 - 0.01 / max(int((~np.isnan(dev)).sum()), 1))))


def _spread(dev: np.ndarray) -> float:
    """The spread of healthy ranks' warm-up offsets as measured across ranks (eight or more): whatever the
    noise's tail or correlation, what a median of these steps varies by."""
    values = _valid(dev)
    return float(mad_sigma(values)) if len(values) >= 8 else 0.0


def in_control_residuals(own: np.ndarray, control: np.ndarray) -> np.ndarray:
    """``own`` less the median of its ``control`` values (of every value when none is); a value out of control less
    the median of the control values and itself: its residual as it was measured, spread and all, when every value
    was in control."""
    seen = ~np.isnan(own)
    control = control & seen if (control & seen).any() else seen
    out = np.flatnonzero(seen & ~control)
    if not len(out):
        return own - median(own[control])
    ordered = np.sort(own[control])
    count = len(ordered)
    residuals = own - 0.5 * (ordered[(count - 1) // 2] + ordered[count // 2])
    bound = np.concatenate(([-np.inf], ordered, [np.inf]))  # bound[i + 1] is ordered[i]
    half = count // 2
    if count % 2:  # one more value makes an even count: the mean of the two middle ones
        level = 0.5 * (
            np.clip(own[out], bound[half], bound[half + 1]) + np.clip(own[out], bound[half + 1], bound[half + 2])
        )
    else:
        level = np.clip(own[out], bound[half], bound[half + 1])
    residuals[out] = own[out] - level
    return residuals


def _independence(resid: np.ndarray) -> float:
    """``(1 - rho) / (1 + rho)``: the share of a rank's steps that count as independent, ``rho`` the pooled
    lag-1 autocorrelation of the residuals (0 or less: every step counts)."""
    a, b = resid[1:], resid[:-1]
    ok = ~np.isnan(a) & ~np.isnan(b)
    if ok.sum() < 8:
        return 1.0
    a, b = a[ok], b[ok]
    rho = float(np.clip(np.sum(a * b) / max(math.sqrt(np.sum(a * a) * np.sum(b * b)), 1e-300), 0.0, 0.95))
    return (1 - rho) / (1 + rho)


def _clusters(ranks: np.ndarray, dev: np.ndarray) -> list[np.ndarray]:
    """``ranks`` by offset, cut where one is more than 1.5 times the smallest of its group."""
    ranks = ranks[np.argsort(dev[ranks], kind="stable")]
    groups: list[list[int]] = []
    for rank in ranks.tolist():
        if groups and dev[rank] <= 1.5 * dev[groups[-1][0]]:
            groups[-1].append(rank)
        else:
            groups.append([rank])
    return [np.array(sorted(g)) for g in groups]


def _position_offsets(raw: np.ndarray, places: Positions) -> np.ndarray:
    """Each rank's position offset: the lower median of its position's warm-up offsets (one sick rank of two
    leaves the position at its healthy peer's)."""
    position = np.full_like(raw, np.nan)
    for _, members in places.groups:
        values = np.sort(_valid(raw[members]))
        if len(values):
            position[members] = values[(len(values) - 1) // 2]
    return np.where(np.isnan(raw), np.nan, position)


def _summary(episode: _Episode, ev: dict[str, Any]) -> str:
    if episode.scope == "structural":
        where = f"pipeline stage {episode.stage}" if episode.stage is not None else f"ranks {_list(episode.ranks)}"
        how = "" if episode.stage is not None else " together (no stages declared: read as one position)"
        return (
            f"{where} x{ev['slowdown']:.2f} the median rank's work from the start{how}, over {ev['steps_seen']} "
            f"steps: structural imbalance of a position, learned as the baseline"
        )
    cost = _cost(ev)
    if episode.scope == "pp_stage":
        return (
            f"pipeline stage {episode.stage} (ranks {_list(episode.ranks)}) x{ev['slowdown']:.2f} its own "
            f"baseline in {ev['phase']} since step {episode.start_step}: stage imbalance; {cost}"
        )
    who = f"host {episode.host}: ranks {_list(episode.ranks)}" if episode.scope == "host" else _rank(episode, ev)
    peers = f"x{ev['peer_ratio']:.2f} the work of its {_peers(ev['peers'])}, mostly {ev['phase']}"
    if ev["from_start"]:
        low, high = ev["peer_ratio_95"]
        since = f"from the first step ({ev['steps_seen']} steps seen, x{low:.2f} to x{high:.2f} at 95%)"
    else:
        since = f"since step {episode.start_step} (x{ev['slowdown']:.2f} its own baseline)"
    if ev["contended"]:
        return (
            f"the whole machine is contended: even its fastest ranks' work is up x{ev['job_slowdown']:.2f} since "
            f"step {episode.start_step}, every rank together; {who} {peers}, not blamed on this evidence"
        )
    node = " (slow node)" if episode.scope == "host" else ""
    back = f", back to its baseline from step {ev['recovered_step']}" if ev.get("recovered_step") is not None else ""
    return f"{who} {peers}, {since}{node}{back}; {cost}"


def _cost(ev: dict[str, Any]) -> str:
    """The job's loss: seconds per step, with the share of its throughput and the wall time lost since the onset."""
    share = f", {ev['throughput_lost'] * 100:.1f}% of its throughput" if ev["throughput_lost"] is not None else ""
    return (
        f"the job loses {ev['job_cost_s_per_step']:.3g} s per step{share} ({wall_time(ev['lost_s'])} of wall time lost)"
    )


def _peers(count: int) -> str:
    return "peer" if count == 1 else f"{count} peers (median)"


def _rank(episode: _Episode, ev: dict[str, Any]) -> str:
    place = ev["place"]
    coords = ", ".join(f"{key} {place[key]}" for key in ("host", "dp", "tp", "pp") if key in place)
    return f"rank {episode.ranks[0]}" + (f" ({coords})" if coords else "")


def _action(episode: _Episode, ranks: list[int], ev: dict[str, Any]) -> SuggestedAction:
    if episode.scope in ("structural", "pp_stage"):
        return SuggestedAction(
            "investigate",
            {"ranks": ranks},
            "structural imbalance (pipeline stage or data layout), not a sick worker: rebalance, do not evict",
        )
    if ev.get("contended"):
        return SuggestedAction(
            "investigate",
            {"ranks": ranks},
            "every rank slowed together (a contended machine): look at the machine's load, do not evict",
        )
    if episode.scope == "host":
        return SuggestedAction(
            "evict",
            {"host": episode.host, "ranks": ranks},
            f"most ranks of host {episode.host} are slow together: a sick node",
        )
    args = {"ranks": ranks, **({"host": episode.host} if episode.host else {})}
    return SuggestedAction("evict", args, f"rank {ranks[0]} is persistently slower than its peers: a sick worker")


def _list(ranks: np.ndarray) -> str:
    ranks = ranks.tolist()
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def cusum_threshold(k: float, arl: float) -> float:
    """The ``h`` whose in-control average run length is ``arl`` steps for N(0, 1) scores (Siegmund's
    approximation ``ARL0 = (exp(2k(h + 1.166)) - 2k(h + 1.166) - 1) / 2k^2``, its linear term dropped)."""
    return max(math.log(2 * k * k * arl + 1) / (2 * k) - 1.166, 1.0)


def _valid(values: np.ndarray) -> np.ndarray:
    return values[~np.isnan(values)]
