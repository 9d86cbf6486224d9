"""Writing a simulated run directory in telemetry format v1: run.json, one file per rank, ground truth.

rank_step and heartbeat lines, the bulk of a large run, are formatted from templates
(``tests/test_records.py`` checks that they are those records' lines); every other record
is built strictly as its record dataclass (``strict_record``: a field that does not fit the
kind is an error, not a generic event) and written by ``to_line``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bedside.collectors.format import Kind, encode_number
from bedside.collectors.layout import RunLayout
from bedside.collectors.records import strict_record, to_line
from bedside.collectors.runinfo import RunInfo, write_run_info
from bedside.detectors.datasets.checksums import Checksums
from bedside.detectors.datasets.schedule import Event, Schedule
from bedside.detectors.datasets.topology import Topology
from bedside.detectors.datasets.traces import Timing

RANK_STEP = (
    '{"kind":"rank_step","time":%.6f,"rank":%d,"step":%d,"timeline":0,"seq":%d,"metrics":{'
    '"step_time":%.6g,"data_time":%.6g,"compute_time":%.6g,"comm_time":%.6g,"optimizer_time":%.6g,'
    '"local_grad_norm":%s}%s}\n'
)
HEARTBEAT = '{"kind":"heartbeat","time":%.6f,"rank":%d,"step":%d,"timeline":0,"seq":%d}\n'
CHECKSUM = ',"param_checksum":"%016x"'
PID_BASE, PID_RESTART = 40000, 1000


@dataclass(frozen=True)
class RunFiles:
    """Everything a simulated run writes, ready to serialize."""

    info: RunInfo
    topology: Topology
    timing: Timing
    local_grad: np.ndarray
    checksums: ChecksumFields
    schedule: Schedule
    steps: list[dict[str, Any]]  # rank 0's step record fields, by step
    labels: list[dict[str, Any]]  # fault_injected records: step, time and fields
    hung: frozenset[int]


class RankLines:
    """The lines of one rank's file, numbered by ``seq`` as they are added."""

    def __init__(self, rank: int) -> None:
        self.rank, self.seq = rank, 0
        self.parts: list[str] = []

    def line(self, template: str, time: float, step: int, *values: Any) -> None:
        self.parts.append(template % (time, self.rank, step, self.seq, *values))
        self.seq += 1

    def record(self, kind: str, time: float, step: int, fields: dict[str, Any]) -> None:
        """A record of ``kind`` with these fields (``metrics`` among them, if any); ValueError when they do
        not fit the kind's record."""
        given = {name: value for name, value in fields.items() if name != "metrics"}
        record = strict_record(
            kind, given, fields.get("metrics"), time=time, rank=self.rank, step=step, timeline=0, seq=self.seq
        )
        self.parts.append(to_line(record))
        self.seq += 1

    def text(self) -> str:
        return "".join(self.parts)


def write_run(out: Path, files: RunFiles) -> None:
    """Write run.json, the ground truth and every rank's telemetry file into ``out``."""
    layout = RunLayout(out)
    layout.telemetry.mkdir(parents=True, exist_ok=True)
    write_run_info(layout, files.info)
    write_ground_truth(layout, files.labels)
    for rank in range(files.topology.ranks):
        layout.rank_file(rank).write_text(rank_text(rank, files), encoding="utf-8")


def write_ground_truth(layout: RunLayout, labels: list[dict[str, Any]]) -> None:
    """``ground_truth/rank-00000.jsonl``: one fault_injected record per fault (none: no file)."""
    if not labels:
        return
    layout.ground_truth.mkdir(parents=True, exist_ok=True)
    lines = RankLines(0)
    for label in labels:
        lines.record(
            Kind.FAULT_INJECTED,
            label["time"],
            label["step"],
            {k: v for k, v in label.items() if k not in ("time", "step")},
        )
    layout.ground_truth_file(0).write_text(lines.text(), encoding="utf-8")


def rank_text(rank: int, files: RunFiles) -> str:
    """One rank's file: rank_info, then per step rank_step (rank 0: step too) and what follows it, then the end."""
    lines, schedule, timing = RankLines(rank), files.schedule, files.timing
    lines.record(Kind.RANK_INFO, schedule.start, 0, rank_info(rank, files.topology, restarts=0))
    last = len(schedule.step_end)
    rows = zip(
        schedule.step_end.tolist(),
        range(1, last + 1),
        timing.step_time[:last].tolist(),
        *(phase[rank, :last].tolist() for phase in (timing.data, timing.compute, timing.comm, timing.optimizer)),
        number_texts(files.local_grad[rank, :last]),
        files.checksums.fields(rank),
    )
    restarts = 0
    for end, step, *values in rows:
        lines.line(RANK_STEP, end, step, *values)
        if rank == 0:
            lines.record(Kind.STEP, end, step, files.steps[step - 1])
        for event in schedule.between.get(step, ()):
            restarts += event.kind == Kind.RANK_INFO
            write_event(lines, event, files, restarts)
    for event in schedule.ending:
        write_event(lines, event, files, restarts)
    return lines.text()


def write_event(lines: RankLines, event: Event, files: RunFiles, restarts: int) -> None:
    """Add ``event`` to the rank's lines when it is for that rank."""
    rank = lines.rank
    if (event.who == "rank0" and rank != 0) or (event.who == "peers" and rank in files.hung):
        return
    if event.kind == Kind.HEARTBEAT:
        lines.line(HEARTBEAT, event.time, event.step)
    elif event.kind == Kind.RANK_INFO:
        lines.record(Kind.RANK_INFO, event.time, event.step, rank_info(rank, files.topology, restarts))
    else:
        lines.record(event.kind, event.time, event.step, event.fields)


def rank_info(rank: int, topology: Topology, restarts: int) -> dict[str, Any]:
    place = topology.placement(rank)
    return {
        "host": place.host,
        "local_rank": place.local_rank,
        "world_size": topology.ranks,
        "pid": PID_BASE + PID_RESTART * restarts + place.local_rank,
        "mesh": {"dp": place.dp, "tp": place.tp, "pp": place.pp},
    }


class ChecksumFields:
    """For steps 1..steps of each rank: the checksum field to append to its rank_step record, or ``""``.

    The replicas of a stage that never diverged share one list.
    """

    def __init__(self, checksums: Checksums, steps: int) -> None:
        self.checksums, self.steps = checksums, steps
        self._replicas = [self._fields(row.tolist()) for row in checksums.base]

    def fields(self, rank: int) -> list[str]:
        if rank in self.checksums.corruptions:
            return self._fields(self.checksums.digests(rank))
        return self._replicas[self.checksums.stage[rank]]

    def _fields(self, digests: list[int]) -> list[str]:
        out = [""] * self.steps
        for step, digest in zip(self.checksums.checked.tolist(), digests):
            out[step - 1] = CHECKSUM % digest
        return out


def number_texts(values: np.ndarray) -> list[str]:
    """Metric values as JSON text: ``%.6g``, and non-finite ones as the format's strings."""
    if np.isfinite(values).all():
        return ["%.6g" % v for v in values.tolist()]
    return ["%.6g" % v if math.isfinite(v) else f'"{encode_number(v)}"' for v in values.tolist()]
