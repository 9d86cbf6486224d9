"""What detectors read: new telemetry rows as DataFrames, and what is known of the run so far."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from typing import Literal, Required, TypedDict, get_args

import numpy as np
import pandas as pd

STEP_COLUMNS = ("timeline", "step", "time", "rank", "seq", "loss", "grad_norm", "lr", "tokens", "flops", "shards")
RANK_STEP_COLUMNS = (
    "timeline",
    "step",
    "time",
    "rank",
    "seq",
    "step_time",
    "data_time",
    "compute_time",
    "comm_time",
    "optimizer_time",
    "local_grad_norm",
    "cpu_wait_time",
    "param_checksum",
)
EVAL_COLUMNS = ("timeline", "step", "time", "split", "name", "value", "cum_tokens", "cum_flops")
CHECKPOINT_COLUMNS = ("timeline", "step", "time", "rank", "event", "duration_s", "path", "message")
EVENT_COLUMNS = ("timeline", "step", "time", "rank", "kind")
ACTION_COLUMNS = ("timeline", "step", "time", "rank", "request_id", "action", "status")
FILED_COLUMNS = ("time", "request_id", "action", "operator")
TOPOLOGY_COLUMNS = ("rank", "host", "local_rank", "dp", "tp", "pp")
FrameName = Literal["steps", "rank_steps", "evals", "checkpoints", "events", "actions", "filed"]
FRAME_NAMES: tuple[FrameName, ...] = get_args(FrameName)
Rows = slice | np.ndarray  # a frame's rows in a batch: consecutive, or their positions


class Place(TypedDict, total=False):
    """Where a rank runs: its host and mesh coordinates, as far as the run declared them."""

    rank: Required[int]
    host: str
    dp: int
    tp: int
    pp: int


MESH_AXES: tuple[Literal["dp", "tp", "pp"], ...] = ("dp", "tp", "pp")
NO_HOST = frozenset({"", "unknown"})
"""Host names that name no machine (compared stripped and in lower case): ``unknown`` is what an import
without a topology writes. Such a rank has no host: findings name it alone, never "host unknown"."""


def placed(topology: pd.DataFrame) -> pd.DataFrame:
    """``topology`` with the hosts that name no machine (``NO_HOST``) missing, as if never declared."""
    if "host" not in topology or topology.empty:
        return topology
    hosts = topology["host"]
    named = hosts.map(lambda h: isinstance(h, str) and h.strip().lower() not in NO_HOST)
    if bool(named[hosts.notna()].all()):
        return topology
    return topology.assign(host=hosts.where(named, None))


def numbers(column: pd.Series) -> np.ndarray:
    """A column as floats: missing and unparseable values NaN (numeric columns pass straight through)."""
    if column.dtype.kind not in "fiub":
        column = pd.to_numeric(column, errors="coerce")
    return column.to_numpy(dtype=float, na_value=np.nan)


def empty_frame(columns: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype="float64") for name in columns})


@dataclass
class TelemetryBatch:
    """Rows not seen by the detectors before, each frame in the order the ranks wrote them.

    ``steps``: job-level step records; ``rank_steps``: per-rank timings, local gradient
    norms and parameter checksums; ``evals``: one row per (eval, score name);
    ``checkpoints``: checkpoint events; ``events``: heartbeats, run_end and other kinds;
    ``actions``: the loop's answers to control requests (``requested``, ``applied``,
    ``rejected``); ``filed``: control requests filed through bedside (the audit trail), at
    the time they were filed. Missing metrics are NaN; a run from another trainer may have
    any frame empty.
    """

    steps: pd.DataFrame = field(default_factory=lambda: empty_frame(STEP_COLUMNS))
    rank_steps: pd.DataFrame = field(default_factory=lambda: empty_frame(RANK_STEP_COLUMNS))
    evals: pd.DataFrame = field(default_factory=lambda: empty_frame(EVAL_COLUMNS))
    checkpoints: pd.DataFrame = field(default_factory=lambda: empty_frame(CHECKPOINT_COLUMNS))
    events: pd.DataFrame = field(default_factory=lambda: empty_frame(EVENT_COLUMNS))
    actions: pd.DataFrame = field(default_factory=lambda: empty_frame(ACTION_COLUMNS))
    filed: pd.DataFrame = field(default_factory=lambda: empty_frame(FILED_COLUMNS))
    _arrays: dict[tuple[str, str, str], np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)
    _whole: tuple[TelemetryBatch, dict[str, Rows]] | None = field(default=None, init=False, repr=False, compare=False)
    """For a piece of a larger batch (``split``, ``split_by_time``): that batch and each frame's rows in it, so
    a column is converted once for the whole and each piece takes its rows of that array."""

    def floats(self, frame: FrameName, name: str) -> np.ndarray:
        """Column ``name`` of ``frame`` as floats (``numbers``: missing and unparseable values NaN), read-only:
        converted once per batch, however many detectors read it."""
        return self._array(frame, name, "float")

    def ints(self, frame: FrameName, name: str) -> np.ndarray:
        """Column ``name`` of ``frame`` (a key such as ``timeline``, ``step`` or ``rank``) as int64, read-only."""
        return self._array(frame, name, "int")

    def _array(self, frame: FrameName, name: str, kind: Literal["float", "int"]) -> np.ndarray:
        key = (frame, name, kind)
        if key not in self._arrays:
            if self._whole is not None:
                whole, rows = self._whole
                values = whole._array(frame, name, kind)[rows[frame]]
            else:
                column = getattr(self, frame)[name]
                values = numbers(column) if kind == "float" else column.to_numpy(dtype=np.int64)
            values.setflags(write=False)
            self._arrays[key] = values
        return self._arrays[key]

    def __len__(self) -> int:
        return sum(len(f) for f in self.frames())

    def frames(self) -> tuple[pd.DataFrame, ...]:
        """Every frame, in the order of the fields."""
        return tuple(getattr(self, name) for name in FRAME_NAMES)

    def split_by_time(self, parts: int) -> list[TelemetryBatch]:
        """This batch cut at the same ``parts - 1`` times in every frame, as a live feed reads all files up to now."""
        frame_times = {name: self.floats(name, "time") for name in FRAME_NAMES}
        times = np.concatenate(list(frame_times.values()))
        cuts = np.quantile(times, np.linspace(0, 1, parts + 1)[1:-1]) if len(times) else []
        bounds = [-np.inf, *cuts, np.inf]
        return [
            self._piece({name: np.flatnonzero((t > lo) & (t <= hi)) for name, t in frame_times.items()})
            for lo, hi in itertools.pairwise(bounds)
        ]

    def split(self, parts: int) -> list[TelemetryBatch]:
        """This batch cut into ``parts`` consecutive pieces, each frame at its own row counts (a feed whose
        files lag each other), to replay it in chunks."""
        bounds = {name: np.linspace(0, len(getattr(self, name)), parts + 1).astype(int) for name in FRAME_NAMES}
        return [self._piece({name: slice(b[i], b[i + 1]) for name, b in bounds.items()}) for i in range(parts)]

    def _piece(self, rows: dict[str, Rows]) -> TelemetryBatch:
        """The batch of ``rows`` of each frame; an empty frame is shared, not copied (frames are read, never
        written), and the piece's columns are its rows of this batch's arrays."""
        frames = {name: getattr(self, name) for name in FRAME_NAMES}
        piece = TelemetryBatch(**{name: f.iloc[rows[name]] if len(f) else f for name, f in frames.items()})
        piece._whole = (self, rows)
        return piece


def _path(value: object) -> str | None:
    """A checkpoint event's path, None when it has none (NaN from a frame)."""
    return value if isinstance(value, str) and value else None


def _add_steps(steps_by_timeline: dict[int, list[int]], rows: pd.DataFrame) -> None:
    """Insert the (timeline, step) of ``rows`` into sorted per-timeline lists, once each."""
    for timeline, step in zip(rows["timeline"].astype(int), rows["step"].astype(int)):
        steps = steps_by_timeline.setdefault(timeline, [])
        if step not in steps:
            bisect.insort(steps, step)


@dataclass
class RunState:
    """What the runner knows of the run, shared by every detector: topology, checkpoints and restarts."""

    world_size: int | None = None
    topology: pd.DataFrame = field(default_factory=lambda: empty_frame(TOPOLOGY_COLUMNS))
    good_checkpoints: dict[int, list[int]] = field(default_factory=dict)
    restarts: dict[int, list[int]] = field(default_factory=dict)
    caught_up: bool = True  # ingestion has read every file to its end (no backlog)
    corrupt_paths: set[str] = field(default_factory=set)  # checkpoints a ``corrupt`` event named
    newest_timeline: int | None = None  # the newest timeline any step or rank step was on
    _good_paths: dict[str, tuple[int, int]] = field(default_factory=dict, init=False, repr=False)  # path -> place

    def __setattr__(self, name: str, value: object) -> None:
        """A topology is kept ``placed``: a host that names no machine is no host, whoever sets it."""
        if name == "topology" and isinstance(value, pd.DataFrame):
            value = placed(value)
        super().__setattr__(name, value)

    def observe(self, batch: TelemetryBatch) -> None:
        """Take the newest timeline, the checkpoints saved or verified, less those found corrupt (by path), and
        the restarts, from ``batch``."""
        seen = [int(t.max()) for f in ("steps", "rank_steps") if len(t := batch.ints(f, "timeline"))]
        if seen:
            self.newest_timeline = max(seen + ([] if self.newest_timeline is None else [self.newest_timeline]))
        ck, ev = batch.checkpoints, batch.events
        if not ck.empty:
            for row in ck.itertuples(index=False):
                if row.event in ("saved", "verified"):
                    self._good(int(row.timeline), int(row.step), _path(row.path))
                elif row.event == "corrupt" and (path := _path(row.path)) is not None:
                    self._corrupt(path)
            _add_steps(self.restarts, ck[ck["event"] == "loaded"])
        if not ev.empty:
            _add_steps(self.restarts, ev[(ev["kind"] == "rank_info") & (ev["step"] > 0)])

    def _good(self, timeline: int, step: int, path: str | None) -> None:
        if path in self.corrupt_paths:
            return
        if path is not None:
            self._good_paths[path] = (timeline, step)
        steps = self.good_checkpoints.setdefault(timeline, [])
        if step not in steps:
            bisect.insort(steps, step)

    def _corrupt(self, path: str) -> None:
        """Drop the checkpoint at ``path`` from the good ones (its step stays when another good path has it).

        Matched by path only: a trainer reports ``corrupt`` at the step it is at, not the checkpoint's."""
        self.corrupt_paths.add(path)
        place = self._good_paths.pop(path, None)
        if place is not None and place not in self._good_paths.values():
            self.good_checkpoints[place[0]].remove(place[1])
            if not self.good_checkpoints[place[0]]:
                del self.good_checkpoints[place[0]]

    def checkpoint_before(self, timeline: int, step: int) -> int | None:
        """The newest good checkpoint strictly before ``step`` (on ``timeline`` or, failing that, any)."""
        candidates = self.good_checkpoints.get(timeline) or sorted(
            {s for steps in self.good_checkpoints.values() for s in steps}
        )
        i = bisect.bisect_left(candidates, step)
        return candidates[i - 1] if i else None

    def settling(self, timeline: int, step: int, steps: int) -> bool:
        """Whether ``step`` is within ``steps`` after a restart (a checkpoint loaded, processes started)."""
        restarts = self.restarts.get(timeline, ())
        i = bisect.bisect_right(restarts, step)
        return bool(i) and step - restarts[i - 1] < steps

    def place_of(self, rank: int) -> Place:
        """The rank's host and mesh coordinates, as far as the run declared them."""
        row = self.topology[self.topology["rank"] == rank]
        if row.empty:
            return {"rank": rank}
        place: Place = {"rank": rank}
        host = row["host"].iloc[0]
        if not pd.isna(host):
            place["host"] = host
        for name in MESH_AXES:
            value = row[name].iloc[0]
            if not pd.isna(value):
                place[name] = int(value)
        return place
