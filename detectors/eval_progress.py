"""What the eval-stall detector keeps of the training steps: the loss, and the progress the learning rate made.

A run's eval curve is a saturating law in the progress its optimiser made, not in the steps or tokens it
spent: under a schedule (a warmup, a cosine decay, a step drop) the loss falls as a power law in the area
under the learning rate, ``S = sum(lr x tokens)``, less an annealing gain while the LR is low (Tissue et
al., 2024, "Scaling law with learning rate annealing"). Forecast in compute, an annealing run slows down
as its LR falls and looks stalled; forecast in ``S``, it does not (the gain only puts the eval below the
forecast). ``S`` is summed per step, in step order, one addition after another, so a run fed in one batch
or in many gives the same numbers; a step without an LR keeps the last LR seen, one without tokens counts
one token (then ``S`` is the sum of the LR). A run that reports no LR has no progress: compute it is.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from .telemetry import TelemetryBatch


@dataclass
class _Timeline:
    steps: list[int] = field(default_factory=list)
    progress: list[float] = field(default_factory=list)
    """``S`` after each step of ``steps`` (NaN before the first LR)."""
    lr: float = math.nan
    """The last LR seen."""
    weighted: bool = False
    """Whether any step of this timeline carried its tokens (then ``S`` is in LR x tokens)."""
    losses: list[tuple[int, float]] = field(default_factory=list)
    """(step, loss) of the finite training losses, in step order."""


class TrainingRecord:
    """Per timeline: the finite training losses by step and the LR-weighted progress after each step."""

    def __init__(self) -> None:
        self._timelines: dict[int, _Timeline] = {}

    def take(self, batch: TelemetryBatch) -> None:
        """Take the step rows of a batch: a step written again (a restart resumed from an earlier checkpoint)
        replaces what followed it; a new timeline starts from its parent's progress before its first step."""
        if not len(batch.steps):
            return
        columns = {name: batch.ints("steps", name) for name in ("timeline", "step")}
        columns |= {name: batch.floats("steps", name) for name in ("loss", "lr", "tokens")}
        timelines = columns["timeline"]
        distinct = np.unique(timelines).tolist()
        for timeline in distinct:
            rows = np.flatnonzero(timelines == timeline) if len(distinct) > 1 else slice(None)
            group = {name: values[rows] for name, values in columns.items()}
            step = group["step"]
            if len(step) > 1 and not (step[1:] > step[:-1]).all():  # a step written twice: the last copy counts
                written = len(step) - 1 - np.unique(step[::-1], return_index=True)[1]
                group = {name: values[np.sort(written)] for name, values in group.items()}
            self._take(self._timeline(timeline, int(group["step"].min())), group)

    def _timeline(self, timeline: int, first_step: int) -> _Timeline:
        if timeline not in self._timelines:
            parents = [t for t in self._timelines if t < timeline]
            new = _Timeline()
            if parents:
                parent = self._timelines[max(parents)]
                i = bisect.bisect_left(parent.steps, first_step)
                new.steps, new.progress = parent.steps[:i], parent.progress[:i]
                new.lr, new.weighted = parent.lr, parent.weighted
            self._timelines[timeline] = new
        return self._timelines[timeline]

    @staticmethod
    def _take(line: _Timeline, group: dict[str, np.ndarray]) -> None:
        step, loss, lr, tokens = (group[name] for name in ("step", "loss", "lr", "tokens"))
        for s, v in zip(step.tolist(), loss.tolist()):
            if line.losses and s <= line.losses[-1][0]:
                del line.losses[bisect.bisect_left(line.losses, (s, -math.inf)) :]
            if math.isfinite(v):
                line.losses.append((s, v))
        if line.steps and step[0] <= line.steps[-1]:
            i = bisect.bisect_left(line.steps, int(step[0]))
            del line.steps[i:], line.progress[i:]
        known = np.isfinite(lr) & (lr >= 0)
        last_known = np.maximum.accumulate(np.where(known, np.arange(len(lr)), -1))
        lr = np.where(last_known >= 0, lr[np.maximum(last_known, 0)], line.lr)  # carried forward
        line.lr = float(lr[-1])
        line.weighted |= bool(np.isfinite(tokens).any())
        weights = np.where(np.isfinite(tokens) & (tokens > 0), tokens, 1.0) * lr
        start = line.progress[-1] if line.progress and math.isfinite(line.progress[-1]) else 0.0
        cumulative = np.cumsum(np.concatenate([[start], np.nan_to_num(weights)]))[1:]
        line.steps.extend(step.tolist())
        line.progress.extend(np.where(np.isfinite(lr), cumulative, np.nan).tolist())

    def progress(self, timeline: int, step: int) -> tuple[float, str] | None:
        """``S`` after the last step at or before ``step``, and its unit (``lr_tokens``: the sum of LR x tokens,
        ``lr_steps``: of the LR); None without an LR there."""
        line = self._timelines.get(timeline)
        if line is None:
            return None
        i = bisect.bisect_right(line.steps, step)
        if not i or not math.isfinite(line.progress[i - 1]) or line.progress[i - 1] <= 0:
            return None
        return line.progress[i - 1], "lr_tokens" if line.weighted else "lr_steps"

    def losses(self, timeline: int, first: int, last: int) -> list[float]:
        """The finite training losses of steps ``first`` to ``last`` on ``timeline``."""
        line = self._timelines.get(timeline)
        if line is None:
            return []
        kept = line.losses
        return [
            v
            for _, v in kept[bisect.bisect_left(kept, (first, -math.inf)) : bisect.bisect_right(kept, (last, math.inf))]
        ]

    def level(self, timeline: int, steps: tuple[int, int, int]) -> float | None:
        """The training loss at eval step ``steps[2]``, log scale, from the steps since ``steps[0]``: the median
        of each of the two eval intervals, taken at its median step, and the line through them carried on to
        the eval (a median over an interval lags a falling loss by half of it). None with under 2 losses in
        either interval."""
        line = self._timelines.get(timeline)
        if line is None:
            return None
        kept, centres, medians = line.losses, [], []
        for first, last in itertools.pairwise(steps):
            part = kept[bisect.bisect_right(kept, (first, math.inf)) : bisect.bisect_right(kept, (last, math.inf))]
            if len(part) < 2:
                return None
            centres.append(float(np.median([s for s, _ in part])))
            medians.append(math.log(max(float(np.median([v for _, v in part])), 1e-300)))
        if centres[1] <= centres[0]:
            return None
        slope = (medians[1] - medians[0]) / (centres[1] - centres[0])
        return medians[1] + slope * (steps[2] - centres[1])
