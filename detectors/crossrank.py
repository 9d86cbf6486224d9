"""Cross-rank comparisons need every rank's row of a step: assemble them into step x rank matrices.

Per-rank files are ingested at their own pace, so a step's rows arrive in pieces. A
``StepAssembler`` holds them until the step is complete (every rank of the world has
reported it) or hopeless (the newest step on its timeline is ``lag`` steps further: a
rank has stopped), and releases steps strictly in (timeline, step) order, so that
feeding a run in one batch or in many releases the same steps in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .telemetry import RunState, numbers


@dataclass(frozen=True)
class StepMatrix:
    """Released steps: ``values[name][i, j]`` is metric ``name`` of step ``i`` on rank ``ranks[j]`` (NaN: missing)."""

    timelines: np.ndarray
    steps: np.ndarray
    ranks: np.ndarray
    values: dict[str, np.ndarray]
    checksums: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.steps)


class StepAssembler:
    """Buffers per-rank rows and releases complete steps, in order, as matrices.

    Numpy throughout (one lexsort per call): at 1,024 ranks and one step per call the
    cost is a fraction of a millisecond.
    """

    def __init__(self, metrics: tuple[str, ...], *, lag: int = 20, with_checksums: bool = False) -> None:
        self.metrics = metrics
        self.lag = lag
        self.with_checksums = with_checksums
        self._pending: dict[str, np.ndarray] | None = None
        self._ranks_seen = np.empty(0, dtype=np.int64)
        self._released: tuple[int, int] = (-1, -1)

    def add(self, rows: pd.DataFrame, run: RunState) -> StepMatrix | None:
        """Take new ``rank_steps`` rows; the steps this completes (None when none).

        A step some rank never reported is given up only while ``run.caught_up``: with a
        backlog, that rank's rows may simply not have been read yet.
        """
        if len(rows):
            self._append(self._columns(rows))
        return self._release(run.world_size, final=False, give_up=run.caught_up)

    def flush(self, run: RunState) -> StepMatrix | None:
        """Release every pending step (the data ended)."""
        return self._release(run.world_size, final=True, give_up=True)

    def _columns(self, rows: pd.DataFrame) -> dict[str, np.ndarray]:
        columns = {name: rows[name].to_numpy(dtype=np.int64) for name in ("timeline", "step", "rank")}
        for name in self.metrics:
            columns[name] = numbers(rows[name])
        if self.with_checksums:
            columns["param_checksum"] = rows["param_checksum"].to_numpy(dtype=object)
        return columns

    def _append(self, columns: dict[str, np.ndarray]) -> None:
        self._ranks_seen = np.union1d(self._ranks_seen, columns["rank"])
        if self._pending is None:
            self._pending = columns
        else:
            self._pending = {name: np.concatenate([self._pending[name], columns[name]]) for name in columns}

    def _release(self, world_size: int | None, *, final: bool, give_up: bool) -> StepMatrix | None:
        pending = self._pending
        if pending is None:
            return None
        timeline, step, rank = pending["timeline"], pending["step"], pending["rank"]
        order = np.lexsort((np.arange(len(rank)), rank, step, timeline))
        last_of_pair = _run_ends(timeline[order], step[order], rank[order])
        kept = order[last_of_pair]  # the newest row of each (timeline, step, rank)
        t, s = timeline[kept], step[kept]
        step_ends = _run_ends(t, s)
        starts = np.concatenate([[0], np.flatnonzero(step_ends)[:-1] + 1])
        counts = np.flatnonzero(step_ends) + 1 - starts
        steps_t, steps_s = t[step_ends], s[step_ends]
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
        self._pending = {name: column[~done] for name, column in pending.items()} if (~done).any() else None
        self._released = last
        take = kept[done[kept] & ~late[kept]]
        return self._matrix({name: column[take] for name, column in pending.items()})

    def _ready_prefix(
        self, timelines: np.ndarray, steps: np.ndarray, counts: np.ndarray, world: int, give_up: bool
    ) -> int:
        """How many of the sorted pending steps can go: a prefix of complete or hopeless ones."""
        newest = np.zeros(len(steps), dtype=np.int64)
        for timeline in np.unique(timelines):
            mine = timelines == timeline
            newest[mine] = steps[mine].max()
        ok = (counts >= world) | (give_up & (steps <= newest - self.lag)) | (timelines < timelines.max())
        blocked = np.flatnonzero(~ok)
        return int(blocked[0]) if len(blocked) else len(counts)

    def _matrix(self, rows: dict[str, np.ndarray]) -> StepMatrix | None:
        if not len(rows["rank"]):
            return None
        step_ends = _run_ends(rows["timeline"], rows["step"])
        i = np.concatenate([[0], np.cumsum(step_ends[:-1])])
        ranks = np.unique(rows["rank"])
        j = np.searchsorted(ranks, rows["rank"])
        shape = (int(step_ends.sum()), len(ranks))
        values = {}
        for name in self.metrics:
            grid = np.full(shape, np.nan)
            grid[i, j] = rows[name]
            values[name] = grid
        checksums = None
        if self.with_checksums:
            checksums = np.full(shape, None, dtype=object)
            checksums[i, j] = rows["param_checksum"]
        return StepMatrix(rows["timeline"][step_ends], rows["step"][step_ends], ranks, values, checksums)


def _run_ends(*keys: np.ndarray) -> np.ndarray:
    """True at the last element of each run of equal keys (the arrays are sorted by them)."""
    ends = np.zeros(len(keys[0]), dtype=bool)
    if len(ends):
        ends[-1] = True
        for key in keys:
            ends[:-1] |= key[1:] != key[:-1]
    return ends
