"""Cross-rank comparisons need every rank's row of a step: assemble them into step x rank matrices.

Per-rank files are ingested at their own pace, so a step's rows arrive in pieces. A
``StepAssembler`` holds them until the step is complete (every rank of the world has
reported it) or hopeless (the newest step on its timeline is ``lag`` steps further: a
rank has stopped), and releases steps strictly in (timeline, step) order, so that
feeding a run in one batch or in many releases the same steps in the same order.

A ``CrossRankDetector`` reads released steps. Alone it keeps its own assembler; under a
``DetectorRunner`` one ``SharedSteps`` assembles each batch once, over every metric the
cross-rank detectors read, and hands the same matrix to each of them.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .detector import Detector
from .finding import Finding
from .telemetry import RunState, TelemetryBatch

KEY_BITS = {"timeline": 19, "step": 24, "rank": 20}
"""Bits of the one-integer sort key of a row; a batch with a larger value is sorted by three keys instead."""


@dataclass(frozen=True)
class StepMatrix:
    """Released steps: ``values[name][i, j]`` is metric ``name`` of step ``i`` on rank ``ranks[j]`` (NaN: missing);
    ``present[i, j]``: that rank reported that step at all. Not to be written: one step's values are views of the
    batch's read-only columns."""

    timelines: np.ndarray
    steps: np.ndarray
    ranks: np.ndarray
    values: dict[str, np.ndarray]
    present: np.ndarray
    checksums: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.steps)


class StepAssembler:
    """Buffers per-rank rows and releases complete steps, in order, as matrices.

    Numpy throughout, and no sort a batch already in order does not need: at 1,024 ranks
    and one step per call the cost is about a tenth of a millisecond.
    """

    def __init__(self, metrics: tuple[str, ...], *, lag: int = 20, with_checksums: bool = False) -> None:
        self.metrics = metrics
        self.lag = lag
        self.with_checksums = with_checksums
        self._pending: dict[str, np.ndarray] | None = None
        self._ranks_seen: set[int] = set()
        self._released: tuple[int, int] = (-1, -1)

    def add(self, batch: TelemetryBatch, run: RunState) -> StepMatrix | None:
        """Take the batch's new ``rank_steps`` rows; the steps this completes (None when none).

        A step some rank never reported is given up only while ``run.caught_up``: with a
        backlog, that rank's rows may simply not have been read yet.
        """
        if len(batch.rank_steps):
            self._append(self._columns(batch), count_ranks=run.world_size is None)
        return self._release(run.world_size, final=False, give_up=run.caught_up)

    def flush(self, run: RunState) -> StepMatrix | None:
        """Release every pending step (the data ended)."""
        return self._release(run.world_size, final=True, give_up=True)

    def _columns(self, batch: TelemetryBatch) -> dict[str, np.ndarray]:
        columns = {name: batch.ints("rank_steps", name) for name in ("timeline", "step", "rank")}
        for name in self.metrics:
            columns[name] = batch.floats("rank_steps", name)
        if self.with_checksums:
            columns["param_checksum"] = batch.rank_steps["param_checksum"].to_numpy(dtype=object)
        return columns

    def _append(self, columns: dict[str, np.ndarray], *, count_ranks: bool) -> None:
        if count_ranks:  # the world is as large as the ranks seen (what a run that declares no world size has)
            self._ranks_seen.update(np.unique(columns["rank"]).tolist())
        if self._pending is None:
            self._pending = columns
        else:
            self._pending = {name: np.concatenate([self._pending[name], columns[name]]) for name in columns}

    def _release(self, world_size: int | None, *, final: bool, give_up: bool) -> StepMatrix | None:
        pending = self._pending
        if pending is None:
            return None
        timeline, step, rank = pending["timeline"], pending["step"], pending["rank"]
        order = _row_order(timeline, step, rank)
        kept = order[_run_ends(timeline[order], step[order], rank[order])]  # the newest row of each, sorted
        t, s = timeline[kept], step[kept]
        ends = np.flatnonzero(_run_ends(t, s))
        counts = np.diff(ends, prepend=-1)
        steps_t, steps_s = t[ends], s[ends]
        ready = (
            len(counts)
            if final
            else self._ready_prefix(steps_t, steps_s, counts, world_size or len(self._ranks_seen), give_up)
        )
        if not ready:
            return None
        last = (int(steps_t[ready - 1]), int(steps_s[ready - 1]))
        done = (timeline < last[0]) | ((timeline == last[0]) & (step <= last[1]))
        late = (timeline < self._released[0]) | ((timeline == self._released[0]) & (step <= self._released[1]))
        self._pending = None if done.all() else {name: column[~done] for name, column in pending.items()}
        self._released = last
        take = kept[done[kept] & ~late[kept]]
        whole = len(take) == len(rank) and bool((take == np.arange(len(take))).all())  # the rows as they are
        return self._matrix(pending if whole else {name: column[take] for name, column in pending.items()})

    def _ready_prefix(
        self, timelines: np.ndarray, steps: np.ndarray, counts: np.ndarray, world: int, give_up: bool
    ) -> int:
        """How many of the sorted pending steps can go: a prefix of complete or hopeless ones."""
        ends = _run_ends(timelines)
        newest = np.repeat(steps[ends], np.diff(np.flatnonzero(ends), prepend=-1))  # sorted: a timeline's last
        ok = (counts >= world) | (give_up & (steps <= newest - self.lag)) | (timelines < timelines[-1])
        blocked = np.flatnonzero(~ok)
        return int(blocked[0]) if len(blocked) else len(counts)

    def _matrix(self, rows: dict[str, np.ndarray]) -> StepMatrix | None:
        """The released rows (sorted by timeline, step and rank; one per rank and step) as matrices."""
        if not len(rows["rank"]):
            return None
        step_ends = _run_ends(rows["timeline"], rows["step"])
        i = np.concatenate([[0], np.cumsum(step_ends[:-1])])
        one_step = bool(step_ends[-1]) and not step_ends[:-1].any()
        ranks = rows["rank"] if one_step else np.unique(rows["rank"])  # one step's ranks: sorted, each once
        j = np.arange(len(ranks)) if one_step else np.searchsorted(ranks, rows["rank"])
        shape = (int(step_ends.sum()), len(ranks))
        names = self.metrics + (("param_checksum",) if self.with_checksums else ())
        if one_step:  # one row per rank, in order: the columns are the matrix's one row (read-only views)
            grids = {name: rows[name][None, :] for name in names}
            present = np.ones(shape, bool)
        else:
            grids = {}
            for name in names:
                grids[name] = np.full(shape, None if name == "param_checksum" else np.nan, dtype=rows[name].dtype)
                grids[name][i, j] = rows[name]
            present = np.zeros(shape, bool)
            present[i, j] = True
        checksums = grids.pop("param_checksum", None)
        values = grids
        return StepMatrix(rows["timeline"][step_ends], rows["step"][step_ends], ranks, values, present, checksums)


class CrossRankDetector(Detector):
    """A detector of released steps: it declares the per-rank ``rank_metrics`` it reads (and whether
    ``checksums``), takes each batch with the steps it completes (``take``) and the last steps at the end of the
    data (``settle``)."""

    rank_metrics: ClassVar[tuple[str, ...]]
    checksums: ClassVar[bool] = False
    lag: int

    @abstractmethod
    def take(self, batch: TelemetryBatch, matrix: StepMatrix | None) -> list[Finding]:
        """New rows, and the steps across ranks that they complete (None when none)."""

    def settle(self, matrix: StepMatrix | None) -> list[Finding]:
        """The data ended: the steps still pending, released; what that settles."""
        return self.take(TelemetryBatch(), matrix)

    def update(self, batch: TelemetryBatch) -> list[Finding]:
        return self.take(batch, self._own_assembler().add(batch, self.run))

    def finish(self) -> list[Finding]:
        return self.settle(self._own_assembler().flush(self.run))

    def _own_assembler(self) -> StepAssembler:
        """The assembler of a detector fed alone (made at first use: under a runner it never is)."""
        if not hasattr(self, "_assembler"):
            self._assembler = StepAssembler(self.rank_metrics, lag=self.lag, with_checksums=self.checksums)
        return self._assembler


class SharedSteps:
    """One assembler per ``lag`` over every metric the cross-rank ``detectors`` read, each batch assembled once."""

    def __init__(self, detectors: Iterable[CrossRankDetector]) -> None:
        by_lag: dict[int, list[CrossRankDetector]] = {}
        for detector in detectors:
            by_lag.setdefault(detector.lag, []).append(detector)
        self._groups = [
            (
                StepAssembler(
                    tuple(dict.fromkeys(m for d in group for m in d.rank_metrics)),
                    lag=lag,
                    with_checksums=any(d.checksums for d in group),
                ),
                group,
            )
            for lag, group in by_lag.items()
        ]

    def take(self, batch: TelemetryBatch, run: RunState) -> dict[CrossRankDetector, list[Finding]]:
        """Assemble ``batch`` once per lag; each cross-rank detector's findings from it."""
        found: dict[CrossRankDetector, list[Finding]] = {}
        for assembler, group in self._groups:
            matrix = assembler.add(batch, run)
            found.update((detector, detector.take(batch, matrix)) for detector in group)
        return found

    def settle(self, run: RunState) -> dict[CrossRankDetector, list[Finding]]:
        """The data ended: every pending step released once; what that settles for each cross-rank detector."""
        found: dict[CrossRankDetector, list[Finding]] = {}
        for assembler, group in self._groups:
            matrix = assembler.flush(run)
            found.update((detector, detector.settle(matrix)) for detector in group)
        return found


def _row_order(timeline: np.ndarray, step: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The stable order of rows by (timeline, step, rank), with no sort for rows already in it."""
    keys = (timeline, step, rank)
    if all(k.min() >= 0 and int(k.max()) < 2**bits for k, bits in zip(keys, KEY_BITS.values())):
        key = (timeline << (KEY_BITS["step"] + KEY_BITS["rank"])) | (step << KEY_BITS["rank"]) | rank
        return np.arange(len(key)) if bool((key[1:] >= key[:-1]).all()) else np.argsort(key, kind="stable")
    return np.lexsort((np.arange(len(rank)), rank, step, timeline))


def _run_ends(*keys: np.ndarray) -> np.ndarray:
    """True at the last element of each run of equal keys (the arrays are sorted by them)."""
    ends = np.zeros(len(keys[0]), dtype=bool)
    if len(ends):
        ends[-1] = True
        for key in keys:
            ends[:-1] |= key[1:] != key[:-1]
    return ends
