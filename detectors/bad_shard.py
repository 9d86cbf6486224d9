"""Bad data shards: the loss of batches read from one shard is consistently above the trend.

Every step's loss is scored against the robust trend (``trend.RobustTrend``), giving a
z-score clipped at ``clip`` so one huge spike cannot condemn every shard its step read.
Per shard the detector keeps exponentially forgotten sums (horizon ``horizon`` steps) of
the z of the steps that read it, and the same over all steps. A shard is bad when its
steps' mean z exceeds that of the steps that did not read it by ``t_alarm`` standard
errors (Welch's t; comparing with the other steps, not with zero, is what clears the
shards that merely shared steps with the bad one) and at least ``min_batches`` of its
batches were ``high_z`` above the trend. It is suggested for quarantine; the finding
clears after ``clear_after`` normal batches of the shard.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import numpy as np

from .detector import Detector
from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .limits import COUNT, POSITIVE, ranges
from .telemetry import TelemetryBatch
from .trend import RobustTrend


@dataclass
class _Sums:
    """Exponentially forgotten count, sum and sum of squares of z-scores."""

    n: float = 0.0
    total: float = 0.0
    squares: float = 0.0
    step: int = 0

    def add(self, z: float, step: int, decay: float) -> None:
        self.age_to(step, decay)
        self.n += 1.0
        self.total += z
        self.squares += z * z

    def age_to(self, step: int, decay: float) -> None:
        factor = decay ** max(0, step - self.step)
        self.n, self.total, self.squares, self.step = self.n * factor, self.total * factor, self.squares * factor, step

    def moments(self) -> tuple[float, float]:
        mean = self.total / self.n
        return mean, max(self.squares / self.n - mean * mean, 0.0) * self.n / max(self.n - 1.0, 1e-9)

    def minus(self, other: _Sums) -> _Sums:
        return _Sums(self.n - other.n, self.total - other.total, self.squares - other.squares, self.step)


@dataclass
class _Shard:
    """One shard: its forgotten sums and its high batches."""

    sums: _Sums
    high: int = 0
    first_high: int | None = None
    last_high: int | None = None
    normal_since_high: int = 0


class BadShardDetector(Detector):
    """Shards whose batches are consistently worse than the trend."""

    name = "bad_shard"
    kinds = (FindingKind("bad_shard", Family.TRAINING, tolerance=500, cause="data: a bad shard", precedence=20),)
    limits = ranges(
        t_alarm=POSITIVE, min_batches=COUNT, high_z=POSITIVE, clip=POSITIVE, horizon=COUNT, clear_after=COUNT
    )

    def __init__(
        self,
        *,
        t_alarm: float = 5.0,
        min_batches: int = 3,
        high_z: float = 3.0,
        clip: float = 8.0,
        horizon: int = 500,
        clear_after: int = 10,
    ) -> None:
        super().__init__()
        self.t_alarm, self.min_batches, self.high_z, self.clip = t_alarm, min_batches, high_z, clip
        self.decay = 1.0 - 1.0 / horizon
        self.clear_after = clear_after
        self.trend = RobustTrend()
        self._shards: dict[int, _Shard] = {}
        self._all = _Sums()
        self._open: dict[int, Finding] = {}

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        rows = batch.steps
        if rows.empty or "shards" not in rows:
            return []
        out: dict[int, Finding] = {}
        losses = rows["loss"].to_numpy(dtype=float, na_value=np.nan)
        for timeline, step, loss, shards in zip(
            rows["timeline"].to_numpy(int), rows["step"].to_numpy(int), losses, rows["shards"]
        ):
            read = _shard_ids(shards)
            if not read:  # a step that names no shard says nothing of one, and teaches the trend nothing
                continue
            z = self._score(int(timeline), int(step), float(loss))
            if z is None:
                continue
            self._tally(read, int(step), z)
            for shard in read:
                found = self._judge(shard, int(timeline), int(step))
                if found is not None:
                    out[shard] = found
        return list(out.values())

    def _score(self, timeline: int, step: int, loss: float) -> float | None:
        if not (math.isfinite(loss) and loss > 0):
            return None
        self.trend.on_timeline(timeline, step)
        y = math.log(loss)
        score = self.trend.score(step, y)
        if score is None or not score.ready:
            self.trend.admit(step, y, score)
            return None
        if score.z < self.high_z:
            self.trend.admit(step, y, score)
        return float(np.clip(score.z, -self.clip, self.clip))

    def _tally(self, read: list[int], step: int, z: float) -> None:
        self._all.add(z, step, self.decay)
        for shard_id in read:
            shard = self._shards.setdefault(shard_id, _Shard(_Sums(step=step)))
            shard.sums.add(z, step, self.decay)
            if z < self.high_z:
                shard.normal_since_high += 1
                continue
            shard.high += 1
            if shard.first_high is None or shard.normal_since_high >= self.clear_after:
                shard.first_high = step  # onset of this run of high batches, not a stray one long before
            shard.last_high, shard.normal_since_high = step, 0

    def _judge(self, shard_id: int, timeline: int, step: int) -> Finding | None:
        shard = self._shards[shard_id]
        current = self._open.get(shard_id)
        if current is not None and current.active:
            if shard.normal_since_high >= self.clear_after:
                current = replace(current, active=False, evidence={**current.evidence, "cleared_at_step": step})
            elif shard.last_high is not None and shard.last_high > current.end_step:
                t = self._welch_t(shard)
                peak = max(current.score, round(t, 3))
                current = self._finding(shard_id, current.timeline, shard, t, current.start_step, shard.last_high, peak)
            else:
                return None
            self._open[shard_id] = current
            return current
        first, last = shard.first_high, shard.last_high
        if (
            shard.high < self.min_batches
            or first is None
            or last is None
            or (current is not None and last <= current.end_step)
        ):
            return None
        t = self._welch_t(shard)
        if t < self.t_alarm:
            return None
        self._open[shard_id] = self._finding(shard_id, timeline, shard, t, first, last)
        return self._open[shard_id]

    def _welch_t(self, shard: _Shard) -> float:
        others = self._all.minus(shard.sums)
        if shard.sums.n < 2 or others.n < 2:
            return 0.0
        (mean, var), (others_mean, others_var) = shard.sums.moments(), others.moments()
        se = math.sqrt(var / shard.sums.n + others_var / others.n)
        return (mean - others_mean) / se if se > 0 else 0.0

    def _finding(
        self, shard_id: int, timeline: int, shard: _Shard, t: float, first: int, last: int, peak: float | None = None
    ) -> Finding:
        """The finding as of now: every number of its summary and evidence from this moment; ``score`` the
        largest t since the onset (``peak``, the current t when the finding opens)."""
        mean, _ = shard.sums.moments()
        others_mean, _ = self._all.minus(shard.sums).moments()
        peak = round(t, 3) if peak is None else peak
        was = f", peak t = {peak:.1f}" if f"{peak:.1f}" != f"{t:.1f}" else ""
        return Finding(
            kind="bad_shard",
            severity=Severity.WARNING,
            timeline=timeline,
            start_step=first,
            end_step=last,
            ranks=(),
            score=peak,
            summary=(
                f"shard {shard_id}: {shard.high} of its batches sat over {self.high_z:g} sigma above the loss "
                f"trend (mean {mean:+.1f} sigma against {others_mean:+.1f} for other batches, t = {t:.1f}{was})"
            ),
            evidence={
                "shard": shard_id,
                "recent_batches": shard.sums.n,
                "high_batches": shard.high,
                "mean_z": mean,
                "others_mean_z": others_mean,
                "welch_t": t,
                "peak_welch_t": peak,
                "t_alarm": self.t_alarm,
                "high_z": self.high_z,
            },
            suggested_action=SuggestedAction(
                "quarantine",
                {"shard": shard_id},
                "stop reading the shard; rewind past its batches if the loss has not recovered",
            ),
            active=True,
            detector=self.name,
        )


def _shard_ids(value: object) -> list[int]:
    """The shard ids a step read (the ``shards`` field: a JSON list, or one id)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    items = value if isinstance(value, (list, tuple, np.ndarray)) else [value]
    return sorted({int(v) for v in items if isinstance(v, (int, float, np.integer)) and not isinstance(v, bool)})
