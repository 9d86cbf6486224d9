"""Loss and gradient-norm spikes: robust deviation from a baseline that follows the falling trend.

Each value is compared on log scale with a rolling robust line through the recent
accepted points (``trend.RobustTrend``); its robust z is the deviation over the
residuals' MAD sigma. A point at or above ``z_alarm`` (times the tail factor, which
raises the bar when recent residuals are heavier-tailed than normal) opens a finding at
once; consecutive elevated points grow it; it closes when the series stays below
``z_recover`` for ``recover_steps`` points. No point of an episode teaches the baseline,
the spread or the tail factor. A finding alarms (warning, or critical from
``critical_ratio``) only when its peak is also ``min_ratio`` times the trend or more:
smaller ones are real but harmless bumps, reported as info.

After ``diverge_steps`` of an episode, each elevated point tests whether the series is
coming back: the median excess over the trend in the later half of the last
``diverge_steps`` points against the earlier half. Not falling (by two standard errors of
that difference and by a fifth of the excess) is a divergence, as large as the level it settled at (the later
half's median excess): critical from ``min_ratio`` times the trend, info below (a level
shift, such as a data-mixture switch, is no incident). The baseline restarts on the new level, and the
finding stays active until the series returns to the old trend (``recover_steps``
points below the recovery bar: resolved) or a rewind ends it. A spike already on its
way down is no divergence, however long it takes.
Before the trend has its forecast errors (a short run, a run's first ~70 points), a point is
judged against its last points (``RobustTrend.recent_score``) and opens a spike only from
``EARLY_MIN_RATIO`` times them. A loss also diverges by its level: ``critical_ratio`` times the
lowest it reached, whatever the trend (``level.LowestLevel``; ``checks_level``).
For ``settle_steps`` after a restart (a checkpoint loaded) the bar is ``settle_factor``
times higher: a resumed job's small bump is expected, not an incident.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from functools import partialmethod

import numpy as np

from .detector import Detector
from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .level import LowestLevel
from .limits import COUNT, OPTIONAL_COUNT, POSITIVE, Below, Range, ranges
from .telemetry import TelemetryBatch
from .trend import Line, RobustTrend, Score


@dataclass
class _Episode:
    """A spike in progress: where it began, against what baseline and bar, and its peak so far."""

    timeline: int
    start: int
    line: Line
    threshold: float
    tail: float
    sigma: float
    peak_z: float
    peak_value: float
    last_high: int
    excess: deque[float]
    """Log value over the trend of each elevated point, the last ``diverge_steps`` of them."""
    best_step: int | None = None
    """Set when the level check found it (``level.LowestLevel``): where the best level was; the trend is then
    that level, flat."""
    below: int = 0
    diverged_at: int | None = None
    level_ratio: float | None = None
    """Once diverged: where the series settled, as a ratio to the trend (the later half's median excess)."""
    peak_step: int = field(init=False)

    def __post_init__(self) -> None:
        self.peak_step = self.start

    @property
    def baseline(self) -> float:
        return math.exp(self.line.at(self.start))


EARLY_POINTS = 10
EARLY_MIN_RATIO = 1.5
"""Before its forecast errors are known, a spike is judged against the last of at least ``EARLY_POINTS`` points,
and only one ``EARLY_MIN_RATIO`` times them or more opens: in a run's first steps the spread of so few points is a
rough guide, and a loss falling fast from its start must not page."""
QUIET_BLOCK = (64, 8192)
"""Rows scored at once outside an episode: from the first, doubling while none opens one, up to the second."""
DIVERGE_FALL_ERRORS = 2.0
DIVERGE_FALL_SHARE = 0.2
"""A series is coming back when its later half's median excess is below the earlier half's by
``DIVERGE_FALL_ERRORS`` standard errors of that difference (more than noise moves it: for two halves of 25
points, 0.71 sigma) and by ``DIVERGE_FALL_SHARE`` of that excess. The share decides a large excess; the noise a
small one, where a spike decaying slowly falls by less than a sigma in 25 points and is still on its way down."""
MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)
"""A median's standard error over a mean's, for normal noise."""


class SpikeDetector(Detector):
    """Spikes of one job-level step metric (see the module docstring)."""

    kind: str
    metric: str
    label: str
    checks_level = False
    """Whether a level ``critical_ratio`` times the best the run reached is a divergence whatever the trend
    (``level.LowestLevel``): true of a training loss, not of a gradient norm, which rises as a run warms up."""
    limits = ranges(
        z_alarm=POSITIVE,
        z_recover=POSITIVE,
        recover_steps=COUNT,
        diverge_steps=Range(4, integer=True),
        critical_ratio=POSITIVE,
        min_ratio=Range(1, 10),
        window=Range(2, integer=True),
        min_points=Range(2, integer=True),
        settle_steps=OPTIONAL_COUNT,
        settle_factor=POSITIVE,
    )
    orders = (Below("z_recover", "z_alarm"), Below("min_points", "window", or_equal=True))

    def __init__(
        self,
        *,
        z_alarm: float = 4.0,
        z_recover: float = 2.5,
        recover_steps: int = 2,
        diverge_steps: int = 50,
        critical_ratio: float = 4.0,
        min_ratio: float = 1.15,
        window: int = 100,
        min_points: int = 30,
        settle_steps: int = 20,
        settle_factor: float = 2.0,
    ) -> None:
        super().__init__()
        self.z_alarm, self.z_recover, self.recover_steps = z_alarm, z_recover, recover_steps
        self.settle_steps, self.settle_factor = settle_steps, settle_factor
        self.diverge_steps, self.critical_ratio, self.min_ratio = diverge_steps, critical_ratio, min_ratio
        self.trend = RobustTrend(window=window, min_points=min_points)
        self.level = LowestLevel()
        self._episode: _Episode | None = None
        self._diverged: _Episode | None = None  # active until the series is back on its old trend, or a rewind
        self._timeline: int | None = None
        self._block = QUIET_BLOCK[0]

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        rows = batch.steps
        if rows.empty:
            return []
        out: list[Finding] = []
        timelines, steps = batch.ints("steps", "timeline"), batch.ints("steps", "step")
        values = batch.floats("steps", self.metric)
        i = 0
        while i < len(rows):
            quiet = self._admit_quiet(timelines, steps, values, i)
            if quiet:
                i += quiet
                continue
            found = self._observe(int(timelines[i]), int(steps[i]), float(values[i]))
            if found is not None:
                out.append(found)
            i += 1
        return out

    def _admit_quiet(self, timelines: np.ndarray, steps: np.ndarray, values: np.ndarray, start: int) -> int:
        """Outside an episode, admit the rows from ``start`` on that open none, a block at a time
        (``RobustTrend.lookahead``); how many rows that took (0: go point by point)."""
        timeline = int(timelines[start])
        if timeline != self._timeline:
            return 0
        end = min(start + self._block, len(steps))
        same = np.flatnonzero(timelines[start:end] != timeline)
        end = start + int(same[0]) if len(same) else end
        rows = start + np.flatnonzero(np.isfinite(values[start:end]) & (values[start:end] > 0))
        if not len(rows):
            return end - start  # no value to judge: these rows neither open nor close a spike
        if self._episode is not None or self._diverged is not None:
            return 0
        ys = [math.log(v) for v in values[rows].tolist()]
        risen = self.level.first_over(ys, math.log(self.critical_ratio)) if self.checks_level else None
        if risen is not None:  # point by point from the row whose level has risen
            rows, ys, end = rows[:risen], ys[:risen], int(rows[risen])
        ahead = self.trend.lookahead(steps[rows].tolist(), ys) if len(rows) else None
        if ahead is None:
            return 0
        for i in np.flatnonzero(ahead.z >= self.z_alarm * min(1.0, self.settle_factor)).tolist():
            ahead.admit_until(i)
            if ahead.z[i] >= self._threshold(timeline, int(steps[rows[i]]), ahead.score(i)):
                self._extend_level(steps[rows[:i]].tolist(), ys[:i])
                self._block = QUIET_BLOCK[0]
                return int(rows[i]) - start
            ahead.admit_until(i + 1)
        ahead.admit_until(len(rows))
        self._extend_level(steps[rows].tolist(), ys)
        self._block = min(2 * self._block, QUIET_BLOCK[1])
        return end - start

    def _early(self, timeline: int, step: int, y: float) -> Score | None:
        """Before the forecast errors are known (a short run's first ~70 points): the score against the
        last points (``RobustTrend.recent_score``), when it opens a spike (``EARLY_MIN_RATIO`` times them
        and over the bar) or an early spike is in progress; None otherwise, and the point is admitted as usual."""
        early = self.trend.recent_score(step, y, points=EARLY_POINTS)
        if early is None or self._episode is not None:
            return early
        opens = y - early.predicted >= math.log(EARLY_MIN_RATIO) and early.z >= self._threshold(timeline, step, early)
        return early if opens else None

    def _threshold(self, timeline: int, step: int, score: Score) -> float:
        """The z that opens a spike at ``step``: ``z_alarm`` times the tail factor, higher while settling."""
        threshold = self.z_alarm * score.tail
        if self.run.settling(timeline, step, self.settle_steps):
            threshold *= self.settle_factor  # a restart's small bump (cold caches, reloaded optimizer) is not a spike
        return threshold

    def _observe(self, timeline: int, step: int, value: float) -> Finding | None:
        changed = self._switch_timeline(timeline, step)
        if not (math.isfinite(value) and value > 0):
            return changed  # the nonfinite detector reports these; they neither open nor close a spike
        y = math.log(value)
        self._extend_level([step], [y])
        resolved = self._follow_divergence(step, y)
        score = self.trend.score(step, y)
        risen = self._risen(timeline, step, y, score) if resolved is None and changed is None else None
        if risen is not None:
            return risen
        early = None if resolved is not None or (score is not None and score.ready) else self._early(timeline, step, y)
        if early is not None:
            if self._episode is None:
                return self._maybe_open(timeline, step, value, y, early) or changed
            return self._follow(step, value, y, early)
        if resolved is not None or score is None or not score.ready:
            self.trend.admit(step, y, score)
            return resolved or changed
        if self._episode is None:
            return self._maybe_open(timeline, step, value, y, score) or changed
        return self._follow(step, value, y, score)

    def _risen(self, timeline: int, step: int, y: float, score: Score | None) -> Finding | None:
        """A divergence by level (``checks_level``): outside any episode, the level ``critical_ratio`` times the
        best the run reached or more; its noise from the trend, or early in a run from the last points."""
        if not self.checks_level or self._episode is not None or self._diverged is not None:
            return None
        score = score or self.trend.recent_score(step, y, points=EARLY_POINTS)
        if score is None:
            return None
        rise = self.level.rise(math.log(self.critical_ratio))
        if rise is None:
            return None
        line = Line(rise.best, 0.0)
        excess = deque((rise.level - rise.best,), maxlen=self.diverge_steps)
        z = (rise.peak - rise.best) / score.sigma
        ep = _Episode(
            timeline, rise.since, line, self._threshold(timeline, step, score), score.tail, score.sigma, z,
            math.exp(rise.peak), step, excess, best_step=rise.best_step,
        )  # fmt: skip
        ep.peak_step = rise.peak_step
        return self._diverge(ep, step)

    def _extend_level(self, steps: list[int], ys: list[float]) -> None:
        if self.checks_level:
            self.level.extend(steps, ys)

    def _switch_timeline(self, timeline: int, step: int) -> Finding | None:
        """A rewind: the spike or divergence on the abandoned branch ends there."""
        if timeline == self._timeline:
            return None
        self._timeline = timeline
        self.trend.on_timeline(timeline, step)
        self.level.on_timeline(timeline, step)
        episode = self._diverged or self._episode
        self._episode = self._diverged = None
        if episode is None:
            return None
        ended = self._finding(episode, active=True)
        return replace(
            ended,
            active=False,
            evidence={**ended.evidence, "ended_by": f"rewind to step {step} on timeline {timeline}"},
        )

    def _maybe_open(self, timeline: int, step: int, value: float, y: float, score: Score) -> Finding | None:
        threshold = self._threshold(timeline, step, score)
        if score.z < threshold:
            self.trend.admit(step, y, score)
            return None
        self.trend.exceeded(score, threshold)
        excess = deque([y - score.predicted], maxlen=self.diverge_steps)
        self._episode = _Episode(
            timeline, step, score.line, threshold, score.tail, score.sigma, score.z, value, step, excess
        )
        return self._finding(self._episode, active=True)

    def _follow(self, step: int, value: float, y: float, score: Score) -> Finding | None:
        ep = self._episode
        assert ep is not None
        if score.z >= self.z_recover * score.tail:  # episode points teach nothing: no admit
            ep.below, ep.last_high = 0, step
            ep.excess.append(y - score.predicted)
            grew = score.z > ep.peak_z
            if grew:
                ep.peak_z, ep.peak_value, ep.peak_step = score.z, value, step
            if step - ep.start >= self.diverge_steps and not self._coming_back(ep):
                return self._diverge(ep, step)
            return self._finding(ep, active=True) if grew else None
        ep.below += 1
        if ep.below < self.recover_steps:
            return None
        self._episode = None
        return self._finding(ep, active=False, recovered_at=step)

    def _coming_back(self, ep: _Episode) -> bool:
        """Whether the later half of the last ``diverge_steps`` elevated points sits clearly below the earlier."""
        recent = np.fromiter(ep.excess, float)
        half = len(recent) // 2
        before, after = float(np.median(recent[:half])), float(np.median(recent[half:]))
        noise = MEDIAN_EFFICIENCY * ep.sigma * math.sqrt(1 / half + 1 / (len(recent) - half))
        return before - after >= max(DIVERGE_FALL_ERRORS * noise, DIVERGE_FALL_SHARE * before)

    def _diverge(self, ep: _Episode, step: int) -> Finding:
        """Not coming back: critical, and the baseline restarts on the new level (the old line is kept)."""
        self._episode = None
        self.trend.restart()
        ep.diverged_at, ep.below = step, 0
        recent = np.fromiter(ep.excess, float)
        ep.level_ratio = math.exp(float(np.median(recent[len(recent) // 2 :])))
        self._diverged = ep
        return self._finding(ep, active=True)

    def _follow_divergence(self, step: int, y: float) -> Finding | None:
        """A divergence resolves after ``recover_steps`` points back under the recovery bar of its old trend; one
        found by level, once its level is back under the square root of ``critical_ratio`` times the best."""
        ep = self._diverged
        if ep is None:
            return None
        if ep.best_step is not None:
            still = self.level.above(ep.line.level) >= 0.5 * math.log(self.critical_ratio)
        else:
            still = (y - ep.line.at(step)) / ep.sigma >= self.z_recover * ep.tail
        if still:
            ep.below = 0
            return None
        ep.below += 1
        if ep.below < self.recover_steps:
            return None
        self._diverged = None
        self.trend.restart()  # the new level's points are gone with it
        return self._finding(ep, active=False, recovered_at=step)

    def _severity(self, ep: _Episode, ratio: float) -> Severity:
        if ep.level_ratio is not None:  # a divergence is as large as the level it settled at, not its peak
            return Severity.CRITICAL if ep.level_ratio >= self.min_ratio else Severity.INFO
        if ratio < self.min_ratio:
            return Severity.INFO  # statistically clear, practically small: a bump, not an incident
        return Severity.CRITICAL if ratio >= self.critical_ratio else Severity.WARNING

    def _finding(self, ep: _Episode, *, active: bool, recovered_at: int | None = None) -> Finding:
        diverged_at = ep.diverged_at
        ratio = ep.peak_value / ep.baseline
        evidence = {
            "metric": self.metric,
            "onset_step": ep.start,
            "peak_step": ep.peak_step,
            "peak_value": ep.peak_value,
            "baseline_value": ep.baseline,
            "ratio_to_baseline": ratio,
            "peak_z": ep.peak_z,
            "threshold_z": ep.threshold,
            "tail_factor": ep.tail,
            "sigma_log": ep.sigma,
            "last_elevated_step": ep.last_high,
            "min_ratio": self.min_ratio,
        }
        if diverged_at is not None:
            evidence["diverged_at_step"] = diverged_at
            evidence["level_ratio"] = ep.level_ratio
        if ep.best_step is not None:
            evidence["best_level_step"] = ep.best_step
        if recovered_at is not None:
            evidence["recovered_at_step"] = recovered_at
        what = f"{self.label} spiked" if ratio >= self.min_ratio else f"{self.label} bumped (below {self.min_ratio:g}x)"
        if ep.best_step is not None:
            what = (
                f"{self.label} diverged: its median over {self.level.points} points is {ep.level_ratio or math.nan:.3g}x"
                f" the lowest it reached (at step {ep.best_step})"
            )
            if recovered_at is not None:
                what += f", back at step {recovered_at}"
        elif diverged_at is not None:
            level, steps_in = ep.level_ratio or math.nan, diverged_at - ep.start
            what = (
                f"{self.label} diverged: settled at {level:.3g}x the trend, not coming back {steps_in} steps in"
                if level >= self.min_ratio
                else f"{self.label} shifted to a new level, {level:.3g}x the trend (below {self.min_ratio:g}x), "
                f"not coming back {steps_in} steps in"
            )
            if recovered_at is not None:
                what += f", back at step {recovered_at}"
        return Finding(
            kind=self.kind,
            severity=self._severity(ep, ratio),
            timeline=ep.timeline,
            start_step=ep.start,
            end_step=ep.last_high if diverged_at is None else (recovered_at or diverged_at),
            ranks=(),
            score=round(ep.peak_z, 3),
            summary=(
                f"{what} from step {ep.start}: peak {ep.peak_value:.4g} at step {ep.peak_step}, "
                f"{ratio:.2f}x the trend ({ep.peak_z:.1f} robust sigma)"
            ),
            evidence=evidence,
            suggested_action=self._action(ep.timeline, ep.start, active),
            active=active,
            detector=self.name,
        )

    def _action(self, timeline: int, start: int, active: bool) -> SuggestedAction:
        target = self.run.checkpoint_before(timeline, start)
        if not active:
            return SuggestedAction(
                "investigate",
                {"step": start},
                "recovered on its own; if spikes recur, rewind before them and skip their batches",
            )
        if target is None:
            return SuggestedAction("investigate", {"step": start}, "no good checkpoint before the onset to rewind to")
        return SuggestedAction("rewind", {"to_step": target}, f"the newest good checkpoint before step {start}")


class LossSpikeDetector(SpikeDetector):
    """Spikes and divergence of the training loss."""

    name = kind = "loss_spike"
    kinds = (FindingKind("loss_spike", Family.TRAINING, tolerance=5),)
    metric = "loss"
    label = "loss"
    checks_level = True


class GradSpikeDetector(SpikeDetector):
    """Spikes of the global gradient norm (often a few steps ahead of the loss); its noise is wider, and
    a norm 1.5x its trend is still routine, so it alarms from 2x."""

    __init__ = partialmethod(SpikeDetector.__init__, min_ratio=2.0)
    name = kind = "grad_spike"
    kinds = (FindingKind("grad_spike", Family.TRAINING, tolerance=5),)
    metric = "grad_norm"
    label = "gradient norm"
