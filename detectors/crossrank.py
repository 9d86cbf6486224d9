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
    """Buffers per-rank rows and releases complete steps, in order, as matrices."""

    def __init__(self, metrics: tuple[str, ...], *, lag: int = 20, with_checksums: bool = False) -> None:
        self.metrics = metrics
        self.lag = lag
        self.with_checksums = with_checksums
        self._pending: list[pd.DataFrame] = []
        self._seen_ranks: set[int] = set()
        self._released: tuple[int, int] = (-1, -1)

    def add(self, rows: pd.DataFrame, world_size: int | None) -> StepMatrix | None:
        """Take new ``rank_steps`` rows; the steps this completes (None when none)."""
        if len(rows):
            columns = ["timeline", "step", "rank", *self.metrics] + (["param_checksum"] if self.with_checksums else [])
            self._pending.append(rows[columns])
            self._seen_ranks.update(int(r) for r in rows["rank"].unique())
        return self._release(world_size, final=False)

    def flush(self, world_size: int | None) -> StepMatrix | None:
        """Release every pending step (the data ended)."""
        return self._release(world_size, final=True)

    def _release(self, world_size: int | None, *, final: bool) -> StepMatrix | None:
        if not self._pending:
            return None
        pending = pd.concat(self._pending, ignore_index=True) if len(self._pending) > 1 else self._pending[0]
        keys = pending[["timeline", "step"]].astype("int64")
        counts = pending.groupby([keys["timeline"], keys["step"]])["rank"].nunique().sort_index()
        ready = self._ready_prefix(counts, world_size or len(self._seen_ranks), final)
        if not ready:
            self._pending = [pending]
            return None
        last = counts.index[ready - 1]
        done = (keys["timeline"] < last[0]) | ((keys["timeline"] == last[0]) & (keys["step"] <= last[1]))
        late = (keys["timeline"] < self._released[0]) | (
            (keys["timeline"] == self._released[0]) & (keys["step"] <= self._released[1]))
        self._pending = [pending[~done]] if (~done).any() else []
        self._released = (int(last[0]), int(last[1]))
        return self._matrix(pending[done & ~late])

    def _ready_prefix(self, counts: pd.Series, world: int, final: bool) -> int:
        """How many of the sorted pending steps can go: a prefix of complete or hopeless ones."""
        if final:
            return len(counts)
        timelines = counts.index.get_level_values(0).to_numpy()
        steps = counts.index.get_level_values(1).to_numpy()
        newest = pd.Series(steps).groupby(timelines).max()
        hopeless = steps <= newest.reindex(timelines).to_numpy() - self.lag
        newer_timeline = timelines < timelines.max()
        ok = (counts.to_numpy() >= world) | hopeless | newer_timeline
        blocked = np.flatnonzero(~ok)
        return int(blocked[0]) if len(blocked) else len(counts)

    def _matrix(self, rows: pd.DataFrame) -> StepMatrix | None:
        if rows.empty:
            return None
        rows = rows.drop_duplicates(["timeline", "step", "rank"], keep="last")
        index = pd.MultiIndex.from_frame(rows[["timeline", "step"]].astype("int64"))
        ranks = np.array(sorted(int(r) for r in rows["rank"].unique()))
        step_index = index.unique().sort_values()
        i = step_index.get_indexer(index)
        j = np.searchsorted(ranks, rows["rank"].to_numpy().astype(int))
        values = {}
        for name in self.metrics:
            grid = np.full((len(step_index), len(ranks)), np.nan)
            grid[i, j] = pd.to_numeric(rows[name], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
            values[name] = grid
        checksums = None
        if self.with_checksums:
            checksums = np.full((len(step_index), len(ranks)), None, dtype=object)
            checksums[i, j] = rows["param_checksum"].to_numpy(dtype=object)
        return StepMatrix(step_index.get_level_values(0).to_numpy(), step_index.get_level_values(1).to_numpy(),
                          ranks, values, checksums)
