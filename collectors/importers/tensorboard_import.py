"""Reading TensorBoard log directories: every run under a log dir, its scalars, per-rank subdirectories as ranks.

A directory holding event files (``*tfevents*``) is a run, named by its path under the log dir. A directory
named like a rank (``rank0``, ``rank_1``, ``rank-02``: ``RANK_DIR``) is that rank of the run its parent
directory is; event files in that parent are the run's job-level writer (``scalars.py`` says where each name
goes). A run's event files are read in name order (TensorBoard names them by creation time). Scalars (``simple_value``
summaries, and the ``scalars`` plugin's tensors, older summaries migrated by TensorBoard's ``data_compat``) are imported;
histograms, images, text and other plugins' data are counted and left out. A tag whose step goes back (a run
restarted from an earlier checkpoint) starts the next timeline of its writer; a tag logged again at a step
it already has keeps the later value.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ImportFormatError, MissingExtraError
from .jsonl_import import Parsed
from .names import NameMap
from .scalar_tensor import NotANumber, shortest, tensor_number
from .scalars import Scalar, Source, add_rows
from .source import FolderScan
from .tfrecord import read_records

RANK_DIR = re.compile(r"^rank[_-]?(\d+)$", re.IGNORECASE)
EVENT_FILE_MARK = "tfevents"
SCALARS_PLUGIN = "scalars"


@dataclass
class TensorboardRun:
    """The event directories of one run: the top one (job level) if any, and one per rank, with the event files
    of each in name order."""

    top: Path | None = None
    ranks: dict[int, Path] = field(default_factory=dict)
    events: dict[Path, list[Path]] = field(default_factory=dict)


def find_tensorboard_runs(logdir: Path) -> dict[str, TensorboardRun]:
    """The runs under ``logdir``, by their path under it (``"."``: ``logdir`` itself), listed by ``FolderScan``
    (bounded in depth and entries); a symbolic link to a directory in it is refused (not followed)."""
    if not logdir.is_dir():
        raise ImportFormatError(f"{logdir}: not a directory (give a TensorBoard log directory)")
    runs: dict[str, TensorboardRun] = {}
    for listing in FolderScan(logdir).walk():
        here = listing.folder
        if listing.links:
            raise ImportFormatError(
                f"{here / listing.links[0]}: a symbolic link to a directory, not followed: refused "
                "(import the directory it points to by its own path)"
            )
        events = [here / name for name in listing.files if EVENT_FILE_MARK in name]
        if not events:
            continue
        rank = RANK_DIR.match(here.name) if here != logdir else None
        run = runs.setdefault((here.parent if rank else here).relative_to(logdir).as_posix(), TensorboardRun())
        run.events[here] = events
        if rank is None:
            run.top = here
        elif int(rank[1]) in run.ranks:
            raise ImportFormatError(f"{here} and {run.ranks[int(rank[1])]} are both rank {int(rank[1])}")
        else:
            run.ranks[int(rank[1])] = here
    if not runs:
        raise ImportFormatError(f"{logdir}: no TensorBoard event files (*tfevents*) in it or below it")
    return runs


def read_tensorboard_run(run: TensorboardRun, names: NameMap) -> Parsed:
    """The scalars of ``run`` as import rows."""
    reader = _Reader(_library())
    speaker = None if run.top else min(run.ranks, default=None)
    sources = [reader.source(run.events[run.top], None, True)] if run.top else []
    sources += [reader.source(run.events[folder], rank, rank == speaker) for rank, folder in sorted(run.ranks.items())]
    parsed = Parsed("tensorboard", warnings=reader.warnings)
    add_rows(parsed, sources, names)
    if not parsed.rows:
        where = run.top or next(iter(run.ranks.values()))
        raise ImportFormatError(f"{where.parent if run.top is None else where}: no scalars in its event files")
    if reader.other:
        parsed.warnings.append(f"{reader.other} non-scalar values (histograms, images, text, ...) not imported")
    return parsed


class _Reader:
    """Reads event files into sources, gathering what was lost or left out."""

    def __init__(self, library: tuple[Any, Callable[[Any], Any], Callable[[bytes], int]]) -> None:
        self.event_from, self.migrate, self.crc = library
        self.warnings: list[str] = []
        self.other = 0

    def source(self, event_files: list[Path], rank: int | None, job: bool) -> Source:
        source = Source(rank, job)
        last: dict[str, int] = {}
        timeline = 0
        for path in event_files:
            framed = read_records(path, self.crc)
            if framed.lost:
                self.warnings.append(framed.lost)
            if framed.damaged:
                failed = "1 record" if framed.damaged == 1 else f"{framed.damaged} records"
                self.warnings.append(f"{path}: {failed} skipped (failed the checksum)")
            for number, data in enumerate(framed.records):
                for tag, step, value, time in self._scalars(data, path, number):
                    if step < last.get(tag, -1):
                        timeline, last = timeline + 1, {}
                    last[tag] = step
                    where = f"{path}, record {number}"
                    source.scalars.append(Scalar(tag, step, value, where, time, timeline))
        return source

    def _scalars(self, data: bytes, path: Path, number: int) -> list[tuple[str, int, float | NotANumber, float]]:
        try:
            event = self.event_from(data)
        except Exception as exc:  # protobuf's DecodeError: an intact record that is no event
            raise ImportFormatError(f"{path}, record {number}: not a TensorBoard event ({exc})") from exc
        found = []
        for value in event.summary.value:
            scalar = self._number(value)
            if scalar is None:
                self.other += 1
            else:
                found.append((value.tag, event.step, scalar, event.wall_time))
        return found

    def _number(self, value: Any) -> float | NotANumber | None:
        """The number a summary value holds (or what it holds instead, ``scalar_tensor.py``); None when it is no
        scalar."""
        if value.WhichOneof("value") == "simple_value":  # what torch's and TF 1's add_scalar write: a float32
            return shortest(np.float32(value.simple_value))
        try:
            migrated = self.migrate(value)  # TensorBoard's data_compat: older summaries into their plugin's form
        except Exception as exc:  # a summary too damaged to migrate: what it was said, not a traceback
            return NotANumber(f"a summary TensorBoard cannot read ({type(exc).__name__})")
        if migrated.metadata.plugin_data.plugin_name != SCALARS_PLUGIN or migrated.tensor.tensor_shape.dim:
            return None
        return tensor_number(migrated.tensor)


def _library() -> tuple[Any, Callable[[Any], Any], Callable[[bytes], int]]:
    """TensorBoard's event parser, summary migration and CRC; a named error when it is not installed."""
    try:
        from tensorboard import data_compat
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    except ImportError as exc:
        raise MissingExtraError(
            f"reading TensorBoard event files needs the tensorboard package ({exc.name} is missing): "
            "pip install 'bedside[tensorboard]'"
        ) from exc
    return event_pb2.Event.FromString, data_compat.migrate_value, masked_crc32c
