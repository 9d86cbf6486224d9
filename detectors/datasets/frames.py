"""A simulated run as the frames ``bedside.detectors.detect`` takes, with no run directory and no store.

Each frame has the columns, dtypes, units and row order that the service's store feed
(app/service/feed.py) gives for the same run written by ``bedside simulate`` and ingested:
``seq`` numbers the lines of each rank's file, text columns are Python objects (missing:
NaN), rows go by time, then rank, then line. Values keep the generator's full precision,
where the written files round ``rank_step`` timings and local gradient norms to 6
significant digits and record times to the microsecond.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from .schedule import Event

if TYPE_CHECKING:
    from .simulated import SimulatedRun

FRAME_KINDS = {"eval": "evals", "checkpoint": "checkpoints"}
"""Record kinds with a frame of their own; every other event goes to ``events``."""


def run_frames(run: SimulatedRun) -> dict[str, Any]:
    """``detect``'s keyword arguments for ``run``: its five telemetry frames, ``topology`` and ``world_size``."""
    lines = _Lines(run)
    written = list(lines.records())
    return {
        "steps": _steps(run, lines),
        "rank_steps": _rank_steps(run, lines),
        "evals": _evals([w for w in written if w.event.kind == "eval"]),
        "checkpoints": _checkpoints([w for w in written if w.event.kind == "checkpoint"]),
        "events": _events([w for w in written if w.event.kind not in FRAME_KINDS]),
        "topology": _topology(run),
        "world_size": run.config.ranks,
    }


class Written(NamedTuple):
    """A record besides rank_step and step: the ranks that write it, and its ``seq`` in each one's file."""

    ranks: np.ndarray
    event: Event
    seqs: np.ndarray


class _Lines:
    """Where each record falls in its rank's file: rank_info, then per step rank_step (rank 0: step too) and
    the records after it, then the end (as app/simulation writes them)."""

    def __init__(self, run: SimulatedRun) -> None:
        config = run.config
        self.run, self.last = run, config.last_step
        self.rank0 = (np.arange(config.ranks) == 0).astype(np.int64)
        self.hung = np.isin(np.arange(config.ranks), config.hang.ranks if config.hang else ())
        after = np.zeros((config.ranks, self.last), dtype=np.int64)
        for step, events in run.schedule.between.items():
            after[:, step - 1] = np.sum([self.writers(e) for e in events], axis=0)
        self.lines_per_step = 1 + self.rank0[:, None] + after
        self.rank_step_seq = 1 + np.cumsum(self.lines_per_step, axis=1) - self.lines_per_step

    def writers(self, event: Event) -> np.ndarray:
        """1 for each rank that writes ``event``, else 0."""
        if event.who == "rank0":
            return self.rank0
        return (~self.hung if event.who == "peers" else np.ones_like(self.hung)).astype(np.int64)

    def records(self) -> Iterator[Written]:
        """Every record but rank_step and step, in the order each rank writes them."""
        schedule = self.run.schedule
        yield Written(
            np.arange(len(self.rank0)),
            Event(schedule.start, 0, "rank_info", "all"),
            np.zeros(len(self.rank0), dtype=np.int64),
        )
        for step in sorted(schedule.between):
            seq = self.rank_step_seq[:, step - 1] + 1 + self.rank0
            yield from (self._next(event, seq) for event in schedule.between[step])
        seq = self.rank_step_seq[:, -1] + self.lines_per_step[:, -1]
        yield from (self._next(event, seq) for event in schedule.ending)

    def _next(self, event: Event, seq: np.ndarray) -> Written:
        """``event`` on the ranks that write it, at their next line; ``seq`` advances for them."""
        writes = self.writers(event)
        ranks = np.flatnonzero(writes)
        written = Written(ranks, event, seq[ranks])
        seq += writes
        return written


def _steps(run: SimulatedRun, lines: _Lines) -> pd.DataFrame:
    """Rank 0's step records: loss, gradient norm, learning rate, tokens, FLOPs and the shards read."""
    traces, last = run.traces, lines.last
    tokens = traces.tokens[:last]
    shards = [json.dumps(row, separators=(",", ":")) for row in traces.shards[:last].tolist()]
    return pd.DataFrame(
        {
            "timeline": np.zeros(last, dtype=np.int32),
            "step": traces.steps[:last].astype(np.int64),
            "time": run.schedule.step_end,
            "rank": np.zeros(last, dtype=np.int32),
            "seq": lines.rank_step_seq[0] + 1,
            "loss": traces.losses()[:last],
            "grad_norm": traces.grad_norms()[:last],
            "lr": traces.lr[:last],
            "tokens": tokens.astype(float),
            "flops": 6 * run.config.model.params * tokens,
            "shards": _text(shards),
        }
    )


def _rank_steps(run: SimulatedRun, lines: _Lines) -> pd.DataFrame:
    """Every rank's rank_step records, step by step: timings, local gradient norm, checksum when checked."""
    timing, ranks, last = run.timing, run.config.ranks, lines.last
    checksums = np.full((ranks, last), np.nan, dtype=object)
    checked = run.checksums.checked[run.checksums.checked <= last]
    for rank in range(ranks):
        digests = run.checksums.digests(rank)[: len(checked)]
        checksums[rank, checked - 1] = ["%016x" % d for d in digests]
    matrix = {
        "seq": lines.rank_step_seq,
        "data_time": timing.data,
        "compute_time": timing.compute,
        "comm_time": timing.comm,
        "optimizer_time": timing.optimizer,
        "local_grad_norm": run.traces.local_grad,
        "param_checksum": checksums,
    }
    by_step = {name: values[:, :last].T.ravel() for name, values in matrix.items()}
    return pd.DataFrame(
        {
            "timeline": np.zeros(ranks * last, dtype=np.int32),
            "step": np.repeat(np.arange(1, last + 1, dtype=np.int64), ranks),
            "time": np.repeat(run.schedule.step_end, ranks),
            "rank": np.tile(np.arange(ranks, dtype=np.int32), last),
            "seq": by_step["seq"],
            "step_time": np.repeat(timing.step_time[:last], ranks),
            **{
                name: by_step[name]
                for name in ("data_time", "compute_time", "comm_time", "optimizer_time", "local_grad_norm")
            },
            "cpu_wait_time": np.nan,  # a simulated rank has a CPU of its own
            "param_checksum": _text(by_step["param_checksum"]),
        }
    )


def _evals(written: list[Written]) -> pd.DataFrame:
    """One row per eval and score name (names sorted, as the store unnests them)."""
    rows = [
        (e.step, e.time, e.fields["split"], name, value, e.fields["cum_tokens"], e.fields["cum_flops"])
        for _, e, _ in written
        for name, value in sorted(e.fields["metrics"].items())
    ]
    frame = pd.DataFrame(rows, columns=["step", "time", "split", "name", "value", "cum_tokens", "cum_flops"])
    return _ordered(
        frame.assign(timeline=np.int32(0)),
        ["time"],
        {
            "timeline": np.int32,
            "step": np.int64,
            "time": float,
            "split": object,
            "name": object,
            "value": float,
            "cum_tokens": float,
            "cum_flops": float,
        },
    )


def _checkpoints(written: list[Written]) -> pd.DataFrame:
    """The checkpoint records: save_started, saved and loaded, with their duration where they have one."""
    rows = [
        (
            e.step,
            e.time,
            int(rank),
            int(seq),
            e.fields["event"],
            e.fields.get("metrics", {}).get("duration_s"),
            e.fields.get("path"),
            e.fields.get("message"),
        )
        for ranks, e, seqs in written
        for rank, seq in zip(ranks, seqs)
    ]
    frame = pd.DataFrame(rows, columns=["step", "time", "rank", "seq", "event", "duration_s", "path", "message"])
    return _ordered(
        frame.assign(timeline=np.int32(0)),
        ["time", "rank", "seq"],
        {
            "timeline": np.int32,
            "step": np.int64,
            "time": float,
            "rank": np.int32,
            "event": object,
            "duration_s": float,
            "path": object,
            "message": object,
        },
    )


def _events(written: list[Written]) -> pd.DataFrame:
    """rank_info, heartbeat, log and run_end records of every rank that writes them."""
    parts = [
        pd.DataFrame({"step": e.step, "time": e.time, "rank": ranks, "seq": seqs, "kind": e.kind})
        for ranks, e, seqs in written
    ]
    frame = pd.concat(parts, ignore_index=True)
    return _ordered(
        frame.assign(timeline=np.int32(0)),
        ["time", "rank", "seq"],
        {"timeline": np.int32, "step": np.int64, "time": float, "rank": np.int32, "kind": object},
    )


def _ordered(frame: pd.DataFrame, by: list[str], dtypes: dict[str, Any]) -> pd.DataFrame:
    """``frame``'s rows by ``by`` (stable), with exactly the columns of ``dtypes``, as those dtypes."""
    out = frame.sort_values(by, kind="stable", ignore_index=True)
    return pd.DataFrame(
        {
            name: _text(out[name]) if dtype is object else pd.Series(out[name].to_numpy(), dtype=dtype)
            for name, dtype in dtypes.items()
        }
    )


def _text(values: Any) -> pd.Series:
    """A text column as the store feed gives it: Python strings, missing ones NaN (all None when none is set)."""
    column = pd.Series(np.asarray(values, dtype=object), dtype=object)
    missing = column.isna().to_numpy()
    column[missing] = np.nan if not missing.all() else None
    return column


def _topology(run: SimulatedRun) -> pd.DataFrame:
    """Each rank's host and mesh coordinates, as the store's ranks view has them."""
    places = [run.config.topology.placement(rank) for rank in range(run.config.ranks)]
    frame = pd.DataFrame({"host": [p.host for p in places]})
    for name in ("rank", "local_rank", "dp", "tp", "pp"):
        frame[name] = np.array([getattr(p, name) for p in places], dtype=np.int32)
    return frame[["rank", "host", "local_rank", "dp", "tp", "pp"]]
