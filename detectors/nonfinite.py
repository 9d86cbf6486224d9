"""Non-finite values (NaN, +-Inf) in the job's loss, gradient norm or learning rate, or in any rank's metrics.

The job-level ``steps`` rows are judged as they arrive (rank 0 writes them), so the
job-level finding never waits for the other ranks. Per-rank rows go through a
``StepAssembler``: a step's non-finite ranks are named once every rank has reported
it, so that the ranks of a finding do not depend on how the rows were batched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .crossrank import CrossRankDetector, StepMatrix
from .finding import Finding, Severity, SuggestedAction, json_number
from .kinds import Family, FindingKind
from .limits import COUNT, ranges
from .telemetry import TelemetryBatch

JOB_METRICS = ("loss", "grad_norm", "lr")
RANK_METRICS = ("step_time", "data_time", "compute_time", "comm_time", "optimizer_time", "local_grad_norm")
JOB = -1
"""The label of job-level values (per-rank values carry their rank)."""
FOLD_STEPS = 64
"""Steps of rows ``_LastFinite`` gathers before it reads them."""
EVIDENCE_RANKS = 8
"""At most this many ranks are detailed in a finding's evidence (all are counted)."""
Decoded = dict[str, float | str | None]
"""A rank's non-finite metrics by name, as strict JSON carries them."""


def nonfinite_mask(values: dict[str, np.ndarray], metrics: tuple[str, ...], measured: np.ndarray) -> np.ndarray:
    """Per step (row) and label (column), bit k set where ``metrics[k]`` is non-finite; ``measured`` (per
    metric) is updated in place.

    The frames carry a metric that was not reported as NaN too, so a NaN only counts once
    the metric has been finite at an earlier step: a metric a trainer never reports stays quiet.
    An infinity always counts.
    """
    grid = np.stack([values[name] for name in metrics])  # metric x step x label
    finite = np.isfinite(grid).any(axis=2)  # metric x step
    before = measured[:, None] | np.logical_or.accumulate(finite, axis=1)
    before = np.concatenate([measured[:, None], before[:, :-1]], axis=1)
    bad = np.isinf(grid) | (np.isnan(grid) & before[:, :, None])
    measured |= finite.any(axis=1)
    bits = np.left_shift(1, np.arange(len(metrics), dtype=np.int64))
    return np.tensordot(bits, bad, axes=1)


class _LastFinite:
    """The last finite value of each metric, and its step, per label (rank, or ``JOB``).

    Rows are read only when asked (``of``) or once ``FOLD_STEPS`` have gathered, then many steps at once: a
    streamed step costs a list append, and a clean run asks for nothing.
    """

    def __init__(self, metrics: tuple[str, ...]) -> None:
        self.metrics = metrics
        self.steps = np.full((0, len(metrics)), -1, dtype=np.int64)
        self.values = np.full((0, len(metrics)), np.nan)
        self._unread: list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]] = []
        self._unread_steps = 0

    def update(self, steps: np.ndarray, labels: np.ndarray, values: dict[str, np.ndarray]) -> None:
        """Take rows of ``values[name][i, j]`` (step ``steps[i]``, label ``labels[j]``), in step order."""
        if len(steps):
            self._unread.append((steps, labels, values))
            self._unread_steps += len(steps)
        if self._unread_steps >= FOLD_STEPS:
            self._read()

    def _read(self) -> None:
        """Fold the unread rows in, consecutive ones over the same labels together."""
        unread, self._unread, self._unread_steps = self._unread, [], 0
        while unread:
            steps, labels, values = unread.pop(0)
            same = [values]
            while unread and np.array_equal(unread[0][1], labels):
                more_steps, _, more = unread.pop(0)
                steps = np.concatenate([steps, more_steps])
                same.append(more)
            if len(same) > 1:
                values = {name: np.concatenate([v[name] for v in same]) for name in self.metrics}
            self._fold(steps, labels, values)

    def _fold(self, steps: np.ndarray, labels: np.ndarray, values: dict[str, np.ndarray]) -> None:
        slots = labels + 1
        self._grow(int(slots.max()) + 1)
        grid = np.stack([values[name] for name in self.metrics], axis=-1)  # step x label x metric
        finite = np.isfinite(grid)
        last = len(steps) - 1 - np.argmax(finite[::-1], axis=0)  # label x metric: its last finite step
        has = finite.any(axis=0)
        newest = np.take_along_axis(grid, last[None], axis=0)[0]
        self.steps[slots] = np.where(has, steps[last], self.steps[slots])
        self.values[slots] = np.where(has, newest, self.values[slots])

    def of(self, label: int, name: str) -> dict[str, float] | None:
        self._read()
        slot, k = label + 1, self.metrics.index(name)
        if slot >= len(self.steps) or self.steps[slot, k] < 0:
            return None
        return {"step": int(self.steps[slot, k]), "value": float(self.values[slot, k])}

    def _grow(self, size: int) -> None:
        if size > len(self.steps):
            more = size - len(self.steps)
            self.steps = np.vstack([self.steps, np.full((more, len(self.metrics)), -1, dtype=np.int64)])
            self.values = np.vstack([self.values, np.full((more, len(self.metrics)), np.nan)])


@dataclass
class _Episode:
    """Consecutive non-finite steps of one stream (the job, or the ranks)."""

    timeline: int
    start: int
    end: int
    ranks: tuple[int, ...]
    onset: dict
    latest: dict
    last_finite: dict
    metrics: set[str]  # every metric found non-finite in the episode, on any of its ranks
    steps: int = 1
    active: bool = True


@dataclass
class _Stream:
    """Job-level or per-rank values, scanned in step order."""

    metrics: tuple[str, ...]
    last: _LastFinite
    measured: np.ndarray
    open: _Episode | None = None

    @classmethod
    def of(cls, metrics: tuple[str, ...]) -> _Stream:
        return cls(metrics, _LastFinite(metrics), np.zeros(len(metrics), bool))


class NonFiniteDetector(CrossRankDetector):
    """NaN or Inf in ``loss``, ``grad_norm``, ``lr`` or any rank's timings and local gradient norm."""

    name = "nonfinite"
    rank_metrics = RANK_METRICS
    kinds = (FindingKind("nonfinite", Family.TRAINING, tolerance=2),)
    limits = ranges(lag=COUNT)

    def __init__(self, *, lag: int = 20) -> None:
        super().__init__()
        self.lag = lag
        self._job = _Stream.of(JOB_METRICS)
        self._ranks = _Stream.of(RANK_METRICS)

    def take(self, batch: TelemetryBatch, matrix: StepMatrix | None) -> list[Finding]:
        return _latest(self._job_rows(batch) + self._released(matrix))

    def _job_rows(self, batch: TelemetryBatch) -> list[Finding]:
        if not len(batch.steps):
            return []
        values = {name: batch.floats("steps", name)[:, None] for name in JOB_METRICS}
        mask = nonfinite_mask(values, JOB_METRICS, self._job.measured)
        timelines, steps = batch.ints("steps", "timeline"), batch.ints("steps", "step")
        return self._scan(self._job, timelines, steps, np.array([JOB]), values, mask)

    def _released(self, matrix: StepMatrix | None) -> list[Finding]:
        if matrix is None:
            return []
        values = {name: matrix.values[name] for name in RANK_METRICS}
        mask = np.where(matrix.present, nonfinite_mask(values, RANK_METRICS, self._ranks.measured), 0)
        return self._scan(self._ranks, matrix.timelines, matrix.steps, matrix.ranks, values, mask)

    def _scan(
        self,
        stream: _Stream,
        timelines: np.ndarray,
        steps: np.ndarray,
        labels: np.ndarray,
        values: dict[str, np.ndarray],
        mask: np.ndarray,
    ) -> list[Finding]:
        """Walk rows in step order: open, grow and close episodes of non-finite steps."""
        changed, done = [], 0
        for i in _rows_to_visit(np.any(mask, axis=1), stream.open is not None):
            where = np.flatnonzero(mask[i])
            if len(where):  # the values before this row are what an episode opening here reports as last finite
                stream.last.update(steps[done:i], labels, {n: v[done:i] for n, v in values.items()})
                done = i
            bad = {int(labels[j]): _decode(stream.metrics, mask[i, j], values, i, j) for j in where[:EVIDENCE_RANKS]}
            bits = int(np.bitwise_or.reduce(mask[i, where])) if len(where) else 0
            names = {name for k, name in enumerate(stream.metrics) if bits >> k & 1}
            changed += self._step(stream, int(timelines[i]), int(steps[i]), labels[where], bad, names)
        stream.last.update(steps[done:], labels, {n: v[done:] for n, v in values.items()})
        return changed

    def _step(
        self, stream: _Stream, timeline: int, step: int, labels: np.ndarray, bad: dict[int, Decoded], names: set[str]
    ) -> list[Finding]:
        """One step of a stream: the ``labels`` with non-finite values (none: a clean step), the first detailed."""
        changed, episode = [], stream.open
        if episode is not None and (not len(labels) or timeline != episode.timeline or step <= episode.end):
            episode.active, stream.open = False, None
            changed.append(self._finding(episode))
        if not len(labels):
            return changed
        seen = _seen(step, len(labels), bad)
        if stream.open is None:
            last = {_key(label): {name: stream.last.of(label, name) for name in per} for label, per in bad.items()}
            ranks = tuple(int(r) for r in labels if r != JOB)
            stream.open = _Episode(timeline, step, step, ranks, seen, seen, last, set(names))
        else:
            stream.open.end, stream.open.latest, stream.open.steps = step, seen, stream.open.steps + 1
            stream.open.metrics |= names
        return changed + [self._finding(stream.open)]

    def _finding(self, episode: _Episode) -> Finding:
        metrics = sorted(episode.metrics)
        where = f"rank{'s' if len(episode.ranks) > 1 else ''} {_listed(episode.ranks)}" if episode.ranks else "the job"
        span = f"step {episode.start}" if episode.end == episode.start else f"steps {episode.start}-{episode.end}"
        latest = episode.latest["count"]
        if episode.ranks and latest != episode.onset["count"]:
            span += f" ({latest} rank{'s' if latest > 1 else ''} at step {episode.latest['step']})"
        evidence = {
            "level": "rank" if episode.ranks else "job",
            "metrics": metrics,
            "onset": episode.onset,
            "latest": episode.latest,
            "nonfinite_steps": episode.steps,
            "last_finite": episode.last_finite,
        }
        return Finding(
            "nonfinite",
            Severity.CRITICAL,
            episode.timeline,
            episode.start,
            episode.end,
            episode.ranks,
            float(episode.steps),
            f"non-finite {', '.join(metrics)} on {where} at {span}",
            evidence,
            self._action(episode.timeline, episode.start),
            episode.active,
            self.name,
        )

    def _action(self, timeline: int, start: int) -> SuggestedAction:
        to_step = self.run.checkpoint_before(timeline, start)
        if to_step is None:
            return SuggestedAction(
                "investigate",
                {},
                f"no good checkpoint before step {start}: find the cause "
                "(data, learning rate, hardware) before going on",
            )
        return SuggestedAction(
            "rewind",
            {"to_step": to_step},
            f"step {to_step} is the newest good checkpoint before the first non-finite step {start}",
        )


def _rows_to_visit(bad: np.ndarray, open_before: bool) -> np.ndarray:
    """Rows that open, grow or close an episode: the non-finite ones and the first clean row after each run."""
    after = np.concatenate(([open_before], bad[:-1]))[: len(bad)] & ~bad
    return np.flatnonzero(bad | after)


def _decode(metrics: tuple[str, ...], bits: int, values: dict[str, np.ndarray], i: int, j: int) -> Decoded:
    return {name: json_number(values[name][i, j]) for k, name in enumerate(metrics) if bits >> k & 1}


def _key(label: int) -> str:
    return "job" if label == JOB else str(label)


def _seen(step: int, count: int, bad: dict[int, Decoded]) -> dict:
    """Evidence of one step: how many ranks (or the job) had non-finite values, and the first few of them."""
    return {"step": step, "count": count, "values": {_key(label): per for label, per in bad.items()}}


def _listed(ranks: tuple[int, ...]) -> str:
    more = len(ranks) - EVIDENCE_RANKS
    return ", ".join(map(str, ranks[:EVIDENCE_RANKS])) + (f" and {more} more" if more > 0 else "")


def _latest(findings: list[Finding]) -> list[Finding]:
    """The newest version of each finding, in order of first appearance."""
    return list({f.finding_id: f for f in findings}.values())
