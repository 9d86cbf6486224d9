"""Bad data shards: the loss of batches read from one shard is consistently above the trend.

Every step's loss is scored against the robust trend (``trend.RobustTrend``), giving a
z-score clipped at ``clip`` so one huge spike cannot condemn every shard its step read.
Per shard the detector keeps exponentially forgotten sums (horizon ``horizon`` steps) of
the z of the steps that read it, and the same over all steps: Welch's t of its steps' mean
z against that of the steps that did not read it is a cheap screen. A shard that passes it
(half of ``t_alarm``) with at least ``min_batches`` batches ``high_z`` above the trend is
judged on its recent batches (``shard_history``): the same contrast, with the batches of
shards already found worse left out on both sides (a bad shard explains them, so a shard
that merely shared them is cleared), its t divided by the spread of the t that the read
pattern gets when moved in time (serial dependence: a shard read over consecutive steps,
autocorrelated noise, a trend lagging a bend). It is bad when that t reaches ``t_alarm``,
and suggested for quarantine; the finding clears after ``clear_after`` normal batches of the
shard, or when a shard found worse explains it.
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
from .shard_history import BatchHistory, Contrast
from .telemetry import TelemetryBatch
from .trend import RobustTrend

SCREEN = 0.5
"""The screen's share of ``t_alarm``: below it (Welch's t on the forgotten sums) a shard is not judged, and an
open finding whose shard a worse one explains is cleared."""
RELEARN_AFTER = 50
"""Steps in a row ``high_z`` above the trend after which it restarts from the steps that follow: the baseline
has lost the curve (a drop it extrapolates past, a level shift), or every batch holds the fault, where no shard
stands out anyway. Without it every later step would read as high, and the shards of that stretch as bad."""
HISTORY_HORIZONS = 4
"""Recent batches kept to judge a shard, in horizons: older ones weigh under e^-4."""


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
        self.trend = RobustTrend(learns_young=False)
        self._high_in_a_row = 0
        self._shards: dict[int, _Shard] = {}
        self._all = _Sums()
        self._history = BatchHistory(HISTORY_HORIZONS * horizon, self.decay)
        self._open: dict[int, Finding] = {}

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        rows = batch.steps
        if rows.empty or "shards" not in rows:
            return []
        out: dict[int, Finding] = {}
        timelines, steps = batch.ints("steps", "timeline"), batch.ints("steps", "step")
        for timeline, step, loss, shards in zip(timelines, steps, batch.floats("steps", "loss"), rows["shards"]):
            read = _shard_ids(shards)
            if not read:  # a step that names no shard says nothing of one, and teaches the trend nothing
                continue
            z = self._score(int(timeline), int(step), float(loss))
            if z is None:
                continue
            self._tally(read, int(step), z)
            self._history.add(z, read)
            for shard in sorted(read, key=lambda s: -self._welch_t(self._shards[s])):  # the worst first
                found = self._judge(shard, int(timeline), int(step))
                if found is not None:
                    out[shard] = found
                    out.update(self._explain_away(shard, int(step)))
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
            self._high_in_a_row = 0
        else:
            self._high_in_a_row += 1
        if self._high_in_a_row >= RELEARN_AFTER:
            self.trend.restart()
            self._high_in_a_row = 0
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
            found = self._follow(shard_id, shard, current, step)
        else:
            found = self._open_new(shard_id, shard, current, timeline)
        if found is not None:
            self._open[shard_id] = found
        return found

    def _open_new(self, shard_id: int, shard: _Shard, current: Finding | None, timeline: int) -> Finding | None:
        first, last = shard.first_high, shard.last_high
        if (
            shard.high < self.min_batches
            or first is None
            or last is None
            or (current is not None and last <= current.end_step)
            or self._welch_t(shard) < SCREEN * self.t_alarm
        ):
            return None
        contrast, worse = self._contrast(shard_id)
        if contrast is None or contrast.t < self.t_alarm:
            return None
        return self._finding(shard_id, timeline, shard, contrast, worse, first, last)

    def _follow(self, shard_id: int, shard: _Shard, current: Finding, step: int) -> Finding | None:
        """An open finding: cleared after normal batches or once shards found worse explain it, else grown."""
        if shard.normal_since_high >= self.clear_after:
            return replace(current, active=False, evidence={**current.evidence, "cleared_at_step": step})
        if shard.last_high is None or shard.last_high <= current.end_step:
            return None
        contrast, worse = self._contrast(shard_id)
        if worse and (contrast is None or contrast.t < SCREEN * self.t_alarm):
            return _explained(current, step, worse)
        if contrast is None:
            return None
        peak = max(current.score, round(contrast.t, 3))
        return self._finding(
            shard_id, current.timeline, shard, contrast, worse, current.start_step, shard.last_high, peak
        )

    def _explain_away(self, shard_id: int, step: int) -> dict[int, Finding]:
        """The open findings that ``shard_id``'s batches explain, cleared: a shard that merely shared them."""
        cleared = {}
        for other, finding in list(self._open.items()):
            if other == shard_id or "explained_by" in finding.evidence or not self._history.shared(other, shard_id):
                continue  # a finding cleared already is explained too: it was this shard's batches
            contrast, worse = self._contrast(other)
            if shard_id in worse and (contrast is None or contrast.t < SCREEN * self.t_alarm):
                cleared[other] = self._open[other] = _explained(finding, step, worse)
        return cleared

    def _contrast(self, shard_id: int) -> tuple[Contrast | None, list[int]]:
        """The shard's recent batches against the others, leaving out those of the open shards that explain it."""
        worse = sorted(
            other
            for other, finding in self._open.items()
            if other != shard_id and finding.active and self._explains(other, shard_id)
        )
        return self._history.contrast(shard_id, worse), worse

    def _explains(self, other: int, shard_id: int) -> bool:
        """Whether ``other`` shared batches with the shard and stands on the rest of its own batches at least as
        well as the shard stands on the rest of its own."""
        if not self._history.shared(other, shard_id):
            return False
        theirs, mine = self._history.contrast(other, (shard_id,)), self._history.contrast(shard_id, (other,))
        return theirs is not None and (mine is None or theirs.t >= mine.t)

    def _welch_t(self, shard: _Shard) -> float:
        others = self._all.minus(shard.sums)
        if shard.sums.n < 2 or others.n < 2:
            return 0.0
        (mean, var), (others_mean, others_var) = shard.sums.moments(), others.moments()
        se = math.sqrt(var / shard.sums.n + others_var / others.n)
        return (mean - others_mean) / se if se > 0 else 0.0

    def _finding(
        self,
        shard_id: int,
        timeline: int,
        shard: _Shard,
        contrast: Contrast,
        worse: list[int],
        first: int,
        last: int,
        peak: float | None = None,
    ) -> Finding:
        """The finding as of now: every number of its summary and evidence from this moment; ``score`` the
        largest t since the onset (``peak``, the current t when the finding opens)."""
        t = contrast.t
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
                f"trend (mean {contrast.mean_z:+.1f} sigma against {contrast.others_mean_z:+.1f} for other "
                f"batches, t = {t:.1f}{was})"
            ),
            evidence={
                "shard": shard_id,
                "recent_batches": contrast.batches,
                "high_batches": shard.high,
                "mean_z": contrast.mean_z,
                "others_mean_z": contrast.others_mean_z,
                "welch_t": contrast.welch_t,
                "serial_factor": contrast.serial_factor,
                "t": t,
                "peak_t": peak,
                "left_out_shards": worse,
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
            subject=f"shard{shard_id}",
        )


def _explained(finding: Finding, step: int, by: list[int]) -> Finding:
    """``finding`` cleared at ``step`` (or when it was), as the batches of the shards ``by`` explain its shard's."""
    return replace(finding, active=False, evidence={"cleared_at_step": step, **finding.evidence, "explained_by": by})


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
