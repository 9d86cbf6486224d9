"""Loss and gradient-norm spikes: robust deviation from a baseline that follows the falling trend.

Each value is compared on log scale with a rolling robust line through the recent
accepted points (``trend.RobustTrend``); its robust z is the deviation over the
residuals' MAD sigma. A point at or above ``z_alarm`` (times the tail factor, which
raises the bar when recent residuals are heavier-tailed than normal) opens a finding at
once; consecutive elevated points grow it; it closes when the series stays below
``z_recover`` for ``recover_steps`` points. One that stays elevated for
``diverge_steps`` is a divergence: critical, the baseline restarts on the new level.
For ``settle_steps`` after a restart (a checkpoint loaded) the bar is ``settle_factor``
times higher: a resumed job's small bump is expected, not an incident.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .detector import Detector
from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .limits import COUNT, OPTIONAL_COUNT, POSITIVE, Below, Range, ranges
from .telemetry import TelemetryBatch
from .trend import RobustTrend, Score


@dataclass
class _Episode:
    """A spike in progress: where it began, against what baseline and bar, and its peak so far."""

    timeline: int
    start: int
    baseline: float
    threshold: float
    tail: float
    sigma: float
    peak_z: float
    peak_value: float
    last_high: int
    below: int = 0

    def __post_init__(self) -> None:
        self.peak_step = self.start


class SpikeDetector(Detector):
    """Spikes of one job-level step metric (see the module docstring)."""

    kind: str
    metric: str
    label: str
    limits = ranges(
        z_alarm=POSITIVE,
        z_recover=POSITIVE,
        recover_steps=COUNT,
        diverge_steps=COUNT,
        critical_ratio=POSITIVE,
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
        window: int = 100,
        min_points: int = 30,
        settle_steps: int = 20,
        settle_factor: float = 2.0,
    ) -> None:
        super().__init__()
        self.z_alarm, self.z_recover, self.recover_steps = z_alarm, z_recover, recover_steps
        self.settle_steps, self.settle_factor = settle_steps, settle_factor
        self.diverge_steps, self.critical_ratio = diverge_steps, critical_ratio
        self.trend = RobustTrend(window=window, min_points=min_points)
        self._episode: _Episode | None = None
        self._diverged: Finding | None = None  # active until a rewind leaves its timeline
        self._timeline: int | None = None

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        rows = batch.steps
        if rows.empty:
            return []
        out: list[Finding] = []
        values = rows[self.metric].to_numpy(dtype=float, na_value=np.nan)
        for timeline, step, value in zip(rows["timeline"].to_numpy(int), rows["step"].to_numpy(int), values):
            found = self._observe(int(timeline), int(step), float(value))
            if found is not None:
                out.append(found)
        return out

    def _observe(self, timeline: int, step: int, value: float) -> Finding | None:
        changed = self._switch_timeline(timeline, step)
        if not (math.isfinite(value) and value > 0):
            return changed  # the nonfinite detector reports these; they neither open nor close a spike
        y = math.log(value)
        score = self.trend.score(step, y, learn_tail=self._episode is None)
        if score is None or not score.ready:
            self.trend.admit(step, y, score)
            return changed
        if self._episode is None:
            return self._maybe_open(timeline, step, value, y, score) or changed
        return self._follow(step, value, y, score)

    def _switch_timeline(self, timeline: int, step: int) -> Finding | None:
        """A rewind: the spike or divergence on the abandoned branch ends there."""
        if timeline == self._timeline:
            return None
        self._timeline = timeline
        self.trend.on_timeline(timeline, step)
        episode, self._episode = self._episode, None
        ended = self._diverged or (self._finding(episode, active=True) if episode else None)
        self._diverged = None
        if ended is None:
            return None
        return replace(
            ended,
            active=False,
            evidence={**ended.evidence, "ended_by": f"rewind to step {step} on timeline {timeline}"},
        )

    def _maybe_open(self, timeline: int, step: int, value: float, y: float, score: Score) -> Finding | None:
        threshold = self.z_alarm * score.tail
        if self.run.settling(timeline, step, self.settle_steps):
            threshold *= self.settle_factor  # a restart's small bump (cold caches, reloaded optimizer) is not a spike
        if score.z < threshold:
            self.trend.admit(step, y, score)
            return None
        self._episode = _Episode(
            timeline, step, math.exp(score.predicted), threshold, score.tail, score.sigma, score.z, value, step
        )
        return self._finding(self._episode, active=True)

    def _follow(self, step: int, value: float, y: float, score: Score) -> Finding | None:
        ep = self._episode
        assert ep is not None
        if score.z >= self.z_recover * score.tail:
            ep.below, ep.last_high = 0, step
            grew = score.z > ep.peak_z
            if grew:
                ep.peak_z, ep.peak_value, ep.peak_step = score.z, value, step
            if step - ep.start >= self.diverge_steps:
                return self._diverge(ep, step)
            return self._finding(ep, active=True) if grew else None
        ep.below += 1
        self.trend.admit(step, y, None)
        if ep.below < self.recover_steps:
            return None
        self._episode = None
        return self._finding(ep, active=False, recovered_at=step)

    def _diverge(self, ep: _Episode, step: int) -> Finding:
        """No recovery within ``diverge_steps``: critical, and the baseline restarts on the new level."""
        self._episode = None
        self.trend.restart()
        self._diverged = self._finding(ep, active=True, diverged_at=step)
        return self._diverged

    def _finding(
        self, ep: _Episode, *, active: bool, diverged_at: int | None = None, recovered_at: int | None = None
    ) -> Finding:
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
        }
        if diverged_at is not None:
            evidence["diverged_at_step"] = diverged_at
        if recovered_at is not None:
            evidence["recovered_at_step"] = recovered_at
        what = (
            f"{self.label} diverged: no recovery in {diverged_at - ep.start} steps"
            if diverged_at is not None
            else f"{self.label} spiked"
        )
        return Finding(
            kind=self.kind,
            severity=Severity.CRITICAL if diverged_at is not None or ratio >= self.critical_ratio else Severity.WARNING,
            timeline=ep.timeline,
            start_step=ep.start,
            end_step=diverged_at or ep.last_high,
            ranks=(),
            score=round(ep.peak_z, 3),
            summary=(
                f"{what} from step {ep.start}: peak {ep.peak_value:.4g} at step {ep.peak_step}, "
                f"{ratio:.2f}x the trend ({ep.peak_z:.1f} robust sigma)"
            ),
            evidence=evidence,
            suggested_action=self._action(ep.timeline, ep.start, active, diverged_at is not None),
            active=active,
            detector=self.name,
        )

    def _action(self, timeline: int, start: int, active: bool, diverged: bool) -> SuggestedAction:
        target = self.run.checkpoint_before(timeline, start)
        if not active and not diverged:
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


class GradSpikeDetector(SpikeDetector):
    """Spikes of the global gradient norm (often a few steps ahead of the loss)."""

    name = kind = "grad_spike"
    kinds = (FindingKind("grad_spike", Family.TRAINING, tolerance=5),)
    metric = "grad_norm"
    label = "gradient norm"
