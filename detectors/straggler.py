"""Stragglers: a rank, or a node, whose own work is persistently slower than its peers'.

In a synchronous job every rank's wall ``step_time`` is the same (the collectives wait
for the slowest rank), so the statistic works from the phases: each rank's work is
``compute_time + data_time`` (``step_time`` only for steps that report neither). Per
step released in order by the ``StepAssembler``:

1. ``d = log(work) - median over ranks``: a whole-job slowdown or a stall on every rank
   moves the median, not ``d``;
2. ``r = d - b``: ``b`` is the rank's own learned offset (its warm-up median, shrunk
   toward its stage's, then a running mean while it is calm), so structural imbalance
   (a pipeline stage that is always slower) does not alarm;
3. ``z = Φ⁻¹(F(r))``: the normal score of ``r`` against a pooled reference of recent
   in-control residuals of all ranks, so in control ``z`` is standard normal whatever the
   noise shape (heavy-tailed, skewed), and bounded (about 3.8);
4. a one-sided CUSUM per rank, ``S = max(0, S + z - k)``, alarms at ``S > h``; the onset
   is the step after ``S`` last was 0.

A rank whose alarm finds most of its pipeline stage with half the evidence (``S > h/2``),
on several hosts, is a stage imbalance; most of its host, a slow node. Ranks slower than their peers over the warm-up are structural: reported as
info, never suggested for eviction. An episode clears when its ranks' mean ``z`` stays
under ``k``: a recovery CUSUM ``R = max(0, R + k - mean z)`` passes ``clear_h``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri

from .crossrank import StepAssembler, StepMatrix
from .detector import Detector
from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .limits import COUNT, NON_NEGATIVE, POSITIVE, Range, ranges
from .robust import Cusum, mad_sigma, row_median
from .telemetry import TelemetryBatch

METRICS = ("step_time", "data_time", "compute_time", "comm_time")
OBS = ("resid", "cost", "compute", "data", "wait", "median", "phased", "count")
"""What a rank sums over its CUSUM run: log residual; seconds of work, compute and data over the step's
median, and of the median comm wait over its own (the peers' wait for it); the median work; steps."""
IQR_TO_SIGMA = 1 / 1.349
KNOTS = 257
"""Knots of the normal-score map."""


@dataclass
class _Episode:
    """Ranks found slow together, from ``start_step`` until they recover."""

    scope: str  # "rank", "host", "pp_stage" (late stage imbalance) or "structural" (from the start)
    ranks: np.ndarray
    timeline: int
    start_step: int
    alarm_step: int
    end_step: int
    host: str | None = None
    stage: int | None = None
    recovery: float = 0.0
    active: bool = True
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
        """Normal scores of ``r`` (NaN stays NaN; beyond the reference's range, its extreme scores)."""
        return np.interp(r, self.knots, self.knot_scores)

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


class StragglerDetector(Detector):
    """Persistently slow ranks and nodes from per-rank phase times (see the module docstring)."""

    name = "straggler"
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
        self._assembler = StepAssembler(METRICS, lag=lag)
        self._reference = _Reference(reference_size, outlier_sigmas)
        self._warm: list[np.ndarray] | None = []
        self._first: tuple[int, int] | None = None
        self._episodes: list[_Episode] = []
        self._b, self._learned = np.zeros(0), np.zeros(0)  # offset, and how many steps it learned from
        self._run_start, self._run_timeline = np.zeros(0, int), np.zeros(0, int)  # where S last left 0
        self._claimed, self._acc = np.zeros(0, bool), np.zeros((len(OBS), 0))  # in an episode; OBS sums
        self._cusum = Cusum(0, k=k, h=np.inf, clip=np.inf)  # h is set when the warm-up has counted the ranks

    # -- streaming -----------------------------------------------------------------------
    def update(self, batch: TelemetryBatch) -> list[Finding]:
        return self._consume(self._assembler.add(batch.rank_steps, self.run))

    def finish(self) -> list[Finding]:
        return self._consume(self._assembler.flush(self.run))

    def _consume(self, matrix: StepMatrix | None) -> list[Finding]:
        changed: dict[int, _Episode] = {}
        if matrix is not None:
            self._grow(int(matrix.ranks.max()) + 1)
            d, obs = self._observations(matrix)
            for i, (timeline, step) in enumerate(zip(matrix.timelines.tolist(), matrix.steps.tolist())):
                for episode in self._step(timeline, step, d[i], obs[i]):
                    changed[id(episode)] = episode
        changed.update({id(e): e for e in self._episodes if e.active})
        self._episodes = [e for e in self._episodes if e.active]
        return [self._finding(e) for e in changed.values()]

    def _grow(self, size: int) -> None:
        """Per-rank state for ranks ``0..size-1``."""
        pad = size - len(self._b)
        if pad <= 0:
            return
        for name in ("_b", "_learned", "_run_start", "_run_timeline", "_claimed", "_acc"):
            values = getattr(self, name)
            setattr(self, name, np.concatenate([values, np.zeros(values.shape[:-1] + (pad,), values.dtype)], axis=-1))
        self._cusum.resize(size)

    def _observations(self, matrix: StepMatrix) -> tuple[np.ndarray, np.ndarray]:
        """``d`` (steps x ranks) and what episodes accumulate (steps x OBS x ranks), full rank width."""
        size = len(self._b)
        full = {}
        for name in METRICS:
            full[name] = np.full((len(matrix), size), np.nan)
            full[name][:, matrix.ranks] = matrix.values[name]
        compute, data = full["compute_time"], full["data_time"]
        phases = np.where(np.isnan(compute) & np.isnan(data), np.nan, np.nan_to_num(compute) + np.nan_to_num(data))
        phased = ~np.isnan(phases).all(axis=1, keepdims=True)
        work = np.where(phased, phases, full["step_time"])
        work[~(work > 0)] = np.nan
        d = np.log(work) - row_median(np.log(work))
        median = row_median(work)
        excess = {
            name: np.nan_to_num(full[f"{name}_time"] - row_median(full[f"{name}_time"]))
            for name in ("compute", "data", "comm")
        }
        valid = ~np.isnan(d)
        columns = {
            "resid": np.zeros_like(d),
            "cost": work - median,
            "compute": excess["compute"],
            "data": excess["data"],
            "wait": -excess["comm"],
            "median": np.broadcast_to(median, d.shape),
            "phased": np.broadcast_to(phased, d.shape),
            "count": np.ones_like(d),
        }
        obs = np.stack([np.where(valid, columns[name], 0.0) for name in OBS], axis=1)
        return d, obs

    # -- one step ------------------------------------------------------------------------
    def _step(self, timeline: int, step: int, d: np.ndarray, obs: np.ndarray) -> list[_Episode]:
        if np.count_nonzero(~np.isnan(d)) < 2:
            return []  # nothing to compare with
        if self._warm is not None:
            self._first = self._first or (timeline, step)
            self._warm.append(d)
            return self._end_warmup(step, self._warm, self._first) if len(self._warm) >= self.warmup_steps else []
        r = d - self._b
        scores = self._reference.scores(r)
        z = np.where(self._learned < self.warmup_steps, np.nan, scores)  # a late rank learns its offset first
        was_zero = self._cusum.s == 0
        alarm = self._cusum.update(z)
        s, free = self._cusum.s, ~self._claimed
        started = was_zero & (s > 0)
        self._run_start[started], self._run_timeline[started] = step, timeline
        obs[OBS.index("resid")] = np.where(np.isnan(r), 0.0, r)
        self._acc[:, (s == 0) & free] = 0.0
        self._acc += np.where((s > 0) | ~free, obs, 0.0)
        self._learn(r, scores, free & (s <= self._cusum.h / 2) & ~np.isnan(r))
        return self._recover(z, step) + self._open(alarm & free, step)

    def _learn(self, r: np.ndarray, z: np.ndarray, calm: np.ndarray) -> None:
        """Offsets follow each calm rank's scores (a running mean, exponential once ``horizon_steps`` long);
        calm residuals refresh the reference."""
        self._b[calm] += self._reference.sigma * z[calm] / np.clip(self._learned[calm], 1, self.horizon_steps)
        self._learned[calm] += 1
        self._reference.add(r[calm])

    def _end_warmup(self, step: int, rows: list[np.ndarray], start: tuple[int, int]) -> list[_Episode]:
        """Offsets and reference from the warm-up; ranks already slower are structural (info)."""
        size = len(self._b)
        warm = np.array([np.pad(row, (0, size - len(row)), constant_values=np.nan) for row in rows])
        self._warm = None
        raw = row_median(warm.T)[:, 0]
        self._reference.reset(_valid(warm - raw))
        se = self._reference.median_se(self.warmup_steps)
        self._b = np.nan_to_num(self._shrink(raw, se))
        self._learned = (~np.isnan(warm)).sum(axis=0).astype(float)
        self._cusum.h = cusum_threshold(self.k, self.false_alarm_steps * max(int((self._learned > 0).sum()), 1))
        self._reference.reset(_valid(warm - self._b))
        floor = max(math.log1p(self.structural_min), 4 * se)
        timeline, first = start
        found = [
            _Episode("structural", ranks, timeline, first, step, step, stage=stage, active=False)
            for stage, ranks in self._by_stage(np.flatnonzero(self._b > floor))
        ]
        for episode in found:
            episode.frozen = self._evidence(episode)
        return found

    def _shrink(self, raw: np.ndarray, se: float) -> np.ndarray:
        """Warm-up medians pulled toward their pipeline stage's median by tau^2 / (tau^2 + se^2).

        ``tau`` is the spread of true offsets (robust spread of the medians less their
        noise ``se``). A median more than 4 se slower than the stage's is kept as it is (a
        structural offset); a fast one is shrunk too: too low an offset would alarm, too
        high one only delays, and the running mean takes a truly fast rank down anyway.
        """
        b = raw.copy()
        for members in self._stages(len(raw)):
            values = raw[members]
            center = np.nanmedian(values) if (~np.isnan(values)).any() else 0.0
            tau2 = max(0.0, float(mad_sigma(values)) ** 2 - se**2)
            dev = values - center
            b[members] = np.where(dev > 4 * se, values, center + dev * tau2 / (tau2 + se**2))
        return b

    def _stages(self, size: int) -> list[np.ndarray]:
        """Ranks ``0..size-1`` grouped by pipeline stage (one group when stages are unknown)."""
        topo = self.run.topology.dropna(subset=["pp"])
        stage = np.full(size, -1)
        known = topo[topo["rank"] < size]
        stage[known["rank"].to_numpy(int)] = known["pp"].to_numpy(int)
        return [stage == s for s in np.unique(stage)]

    def _by_stage(self, ranks: np.ndarray) -> list[tuple[int | None, np.ndarray]]:
        """Structural ranks as whole pipeline stages, and the rest as one group."""
        topo = self.run.topology
        groups, rest = [], set(ranks.tolist())
        for stage, members in topo.dropna(subset=["pp"]).groupby("pp")["rank"]:
            members = set(members.astype(int))
            if members and members <= rest:
                groups.append((int(stage), np.array(sorted(members))))
                rest -= members
        return groups + ([(None, np.array(sorted(rest)))] if rest else [])

    # -- episodes ------------------------------------------------------------------------
    def _open(self, new: np.ndarray, step: int) -> list[_Episode]:
        opened = []
        for rank in np.flatnonzero(new):
            if self._claimed[rank]:
                continue  # taken by a node or stage episode opened this step
            scope, members, host, stage = self._group(int(rank))
            episode = _Episode(
                scope,
                members,
                int(self._run_timeline[members].min()),
                int(self._run_start[members].min()),
                step,
                step,
                host=host,
                stage=stage,
            )
            self._claimed[members] = True
            self._episodes.append(episode)
            opened.append(episode)
        return opened

    def _group(self, rank: int) -> tuple[str, np.ndarray, str | None, int | None]:
        """A slow pipeline stage whose slow ranks span hosts, else a slow node, else the rank alone."""
        topo = self.run.topology
        topo = topo[topo["rank"] < len(self._b)]
        place = self.run.place_of(rank)
        evidence = (self._cusum.s > self._cusum.h / 2) & ~self._claimed
        if "pp" in place and topo["pp"].nunique() > 1:
            members = self._most(topo.loc[topo["pp"] == place["pp"], "rank"], evidence)
            if members is not None and topo.loc[topo["rank"].isin(members), "host"].nunique() != 1:
                return "pp_stage", members, None, int(place["pp"])
        if "host" in place:
            members = self._most(topo.loc[topo["host"] == place["host"], "rank"], evidence)
            if members is not None:
                return "host", members, str(place["host"]), None
        return "rank", np.array([rank]), place.get("host"), None

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
            episode.recovery = max(0.0, episode.recovery + self.k - float(np.nanmean(scores)))
            if episode.recovery > self.clear_h:
                episode.frozen, episode.active = self._evidence(episode), False
                self._claimed[episode.ranks] = False
                self._cusum.reset(episode.ranks)
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
                "warmup_steps": self.warmup_steps,
                "slowdown": max(offsets.values()),
                "offsets": offsets,
            }
        acc = self._acc[:, episode.ranks]
        mean = {name: acc[i] / np.maximum(acc[OBS.index("count")], 1) for i, name in enumerate(OBS)}
        phase = "step" if not mean["phased"].any() else max(("compute", "data"), key=lambda p: mean[p].sum())
        place = {"place": self.run.place_of(int(episode.ranks[0]))} if episode.scope == "rank" else {}
        return {
            "scope": episode.scope,
            "host": episode.host,
            "pp_stage": episode.stage,
            **place,
            "slowdown": round(math.exp(float(mean["resid"].mean())), 4),
            "phase": phase,
            "job_cost_s_per_step": round(float(mean["cost"].max()), 6),
            "peers_wait_s_per_step": round(float(mean["wait"].max()), 6),
            "baseline_work_s": round(float(np.median(mean["median"])), 6),
            "structural_offset": round(math.exp(float(self._b[episode.ranks].mean())), 4),
            "cusum": round(float(self._cusum.s[episode.ranks].max()), 3),
            "threshold": round(self._cusum.h, 3),
            "k": self.k,
            "alarm_step": episode.alarm_step,
        }

    def _finding(self, episode: _Episode) -> Finding:
        evidence = episode.frozen or self._evidence(episode)
        ranks = episode.ranks.tolist()
        structural = episode.scope in ("structural", "pp_stage")
        return Finding(
            "straggler",
            Severity.INFO if structural else Severity.WARNING,
            episode.timeline,
            episode.start_step,
            max(episode.end_step, episode.start_step),
            tuple(ranks),
            float(evidence["slowdown"]),
            _summary(episode, evidence),
            evidence,
            _action(episode, ranks),
            episode.active,
            self.name,
        )


def _summary(episode: _Episode, ev: dict[str, Any]) -> str:
    if episode.scope == "structural":
        where = f"pipeline stage {episode.stage}" if episode.stage is not None else f"rank(s) {_list(episode.ranks)}"
        return (
            f"{where} slower than the median rank from the start (up to x{ev['slowdown']}): "
            f"structural imbalance, learned as the baseline"
        )
    slower = f"{(ev['slowdown'] - 1) * 100:.1f}% slower in {ev['phase']} since step {episode.start_step}"
    cost = f"the job loses {ev['job_cost_s_per_step']:.3g} s per step"
    if episode.scope == "pp_stage":
        return f"pipeline stage {episode.stage} (ranks {_list(episode.ranks)}) {slower}: stage imbalance; {cost}"
    if episode.scope == "host":
        return f"host {episode.host}: ranks {_list(episode.ranks)} {slower} (slow node); {cost}"
    place = ev["place"]
    coords = ", ".join(f"{key} {place[key]}" for key in ("host", "dp", "tp", "pp") if key in place)
    return f"rank {episode.ranks[0]}" + (f" ({coords})" if coords else "") + f" {slower}; {cost}"


def _action(episode: _Episode, ranks: list[int]) -> SuggestedAction:
    if episode.scope in ("structural", "pp_stage"):
        return SuggestedAction(
            "investigate",
            {"ranks": ranks},
            "structural imbalance (pipeline stage or data layout), not a sick worker: rebalance, do not evict",
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
