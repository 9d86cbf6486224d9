"""Importers: a foreign CSV, JSONL or Megatron log file, TensorBoard log dir or W&B export becomes a bedside run.

The accepted shapes are specified in ``docs/import.md``. An import reads and
checks the whole input first (against the ranges the collector accepts: time,
rank, step, placement) and writes nothing when any row is wrong; it writes
``run.json`` and one ``telemetry/rank-NNNNN.jsonl`` per rank (format v1) into a
new folder beside the destination, has the collector ingest it there (into a
store removed again: the run is ingested where it lands), and moves it into
place only when every run is written and no line of it was rejected (``staging.py``: a failed import leaves nothing). Every source is opened as
a regular file only and read within the limits of ``collectors/bounded.py``
(``source.py``). Bedside records copied from JSONL are checked here only in
their envelope: the collector checks the rest, and a record it rejects fails the
import with the collector's reason.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..appendfile import AppendFile
from ..bounded import parse_json
from ..errors import ImportFormatError
from ..format import MAX_RANK, Kind, encode_number
from ..ingest import PassResult
from ..layout import RunLayout
from ..records import Eval, Metrics, RankInfo, RankStep, Record, Step, to_line
from ..runinfo import RankPlacement, RunInfo, write_run_info
from .csv_import import read_csv
from .jsonl_import import EVAL_PREFIX, MAX_IMPORTED_RANK, Number, Parsed, Row, integer, read_jsonl
from .megatron_import import read_megatron
from .names import DEFAULT_NAMES, NameMap
from .source import read_source
from .staging import collect_staged, staged
from .tensorboard_import import find_tensorboard_runs, read_tensorboard_run
from .wandb_import import read_wandb

__all__ = [
    "DEFAULT_NAMES",
    "ImportSummary",
    "import_csv",
    "import_jsonl",
    "import_megatron",
    "import_tensorboard",
    "import_wandb",
    "read_topology",
]

EVAL_FIELDS = ("cum_tokens", "cum_flops")
UNKNOWN_HOST = "unknown"
"""The host of a rank the topology does not place (``rank_info`` requires one); the detectors read it as
no placement and name the rank alone."""
PLACEMENT_NUMBERS = ("rank", "local_rank", "dp", "tp", "pp")
MAX_TOPOLOGY_BYTES = 64 << 20
"""The largest topology file read (64 MiB: a placement is under 100 bytes, so a million ranks fit)."""


@dataclass(frozen=True)
class ImportSummary:
    """What an import wrote."""

    out: Path
    format: str
    records: dict[str, int]
    ranks: int  # ranks with a file: those in the data or the topology (their numbers may be sparse)
    steps: int
    rows: int
    skipped: int = 0
    world_size: int = 1  # the highest rank plus one
    warnings: tuple[str, ...] = ()  # what was readable but not imported, or lost to a damaged file
    ingested: PassResult | None = None  # what the collector ingested into the run's store while checking it


@dataclass
class _Group:
    """The rows of one (timeline, step, rank), merged."""

    where: str
    time: float | None = None
    values: dict[str, Any] = field(default_factory=dict)
    shards: list[int] = field(default_factory=list)


def import_csv(path: Path, out: Path, *, topology: Path | None = None, name: str | None = None) -> ImportSummary:
    """Import a long (step,rank,name,value) or wide (one column per metric) CSV file."""
    return _import(Path(path), Path(out), read_csv, topology, name)


def import_jsonl(path: Path, out: Path, *, topology: Path | None = None, name: str | None = None) -> ImportSummary:
    """Import a JSONL file of wide rows, bedside records (copied), or both."""
    return _import(Path(path), Path(out), read_jsonl, topology, name)


def import_megatron(path: Path, out: Path, *, topology: Path | None = None, name: str | None = None) -> ImportSummary:
    """Import a Megatron-LM / NeMo text log (its iteration and validation lines)."""
    return _import(Path(path), Path(out), read_megatron, topology, name)


def import_tensorboard(
    logdir: Path,
    out: Path,
    *,
    names: Mapping[str, str] | None = None,
    topology: Path | None = None,
    name: str | None = None,
) -> list[ImportSummary]:
    """Import every run under a TensorBoard log dir: one run into ``out``, several each into ``out/<its path>``."""
    runs = find_tensorboard_runs(Path(logdir))
    parsed = {where: read_tensorboard_run(run, NameMap(names)) for where, run in runs.items()}
    return _import_runs(Path(logdir), Path(out), parsed, topology, name)


def import_wandb(
    src: Path,
    out: Path,
    *,
    names: Mapping[str, str] | None = None,
    topology: Path | None = None,
    name: str | None = None,
) -> list[ImportSummary]:
    """Import a W&B export (CSV, JSONL or Parquet history, offline run files): one run into ``out``, several
    each into ``out/<run name>``."""
    return _import_runs(Path(src), Path(out), read_wandb(Path(src), NameMap(names)), topology, name)


def read_topology(path: Path) -> tuple[RankPlacement, ...]:
    """Rank placements from ``{"ranks": [...]}`` or a bare list of placement objects."""
    data = _load_json(Path(path))
    entries = data.get("ranks") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ImportFormatError(f'{path}: expected {{"ranks": [...]}} or a list of rank placements')
    if not entries:
        raise ImportFormatError(f"{path}: lists no ranks")
    placements = tuple(_placement(entry, f"{path}, ranks[{i}]") for i, entry in enumerate(entries))
    ranks = Counter(p.rank for p in placements)
    if twice := sorted(r for r, n in ranks.items() if n > 1):
        raise ImportFormatError(f"{path}: rank {twice[0]} is placed more than once")
    return placements


# -- the pipeline -------------------------------------------------------------
def _import(
    path: Path, out: Path, read: Callable[[Path], Parsed], topology: Path | None, name: str | None
) -> ImportSummary:
    _check_free(out)
    placements = read_topology(topology) if topology else ()
    parsed = read(path)
    with staged([out]) as folders:
        return _write_run(path, (out, folders[out]), parsed, (topology, placements), name)


def _import_runs(
    path: Path, out: Path, runs: Mapping[str, Parsed], topology: Path | None, name: str | None
) -> list[ImportSummary]:
    """Write the runs read from ``path`` (by their name in it, ``"."`` for ``path`` itself), none unless all fit."""
    if name and len(runs) > 1:
        raise ImportFormatError(f"{path}: holds {len(runs)} runs ({', '.join(runs)}); a name names one run")
    named = {where: (out if len(runs) == 1 else path).name if where == "." else where for where in runs}
    targets = {where: out if len(runs) == 1 else out / _folder(named[where]) for where in runs}
    if len(set(targets.values())) < len(targets):
        raise ImportFormatError(f"{path}: two runs would be written into one folder: {', '.join(runs)}")
    for target in targets.values():
        _check_free(target)
    placements = read_topology(topology) if topology else ()
    with staged(list(targets.values())) as folders:
        return [
            _write_run(
                path,
                (targets[w], folders[targets[w]]),
                runs[w],
                (topology, placements),
                name or runs[w].run_name or named[w],
            )
            for w in runs
        ]


def _folder(name: str) -> Path:
    """A run's folder for its name: each ``/``-separated part kept to letters, digits, ``.``, ``-``, ``_``."""
    parts = [re.sub(r"[^\w.-]+", "_", part) for part in name.split("/")]
    return Path(*(part if part.strip(".") else "_" for part in parts))


def _check_free(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ImportFormatError(f"{out}: not a directory; import into a new directory")
    layout = RunLayout(out)
    if layout.run_info.exists() or layout.source_files():
        raise ImportFormatError(f"{out}: already holds a run (run.json or telemetry); import into a new directory")


def _write_run(
    path: Path,
    folders: tuple[Path, Path],
    parsed: Parsed,
    placed: tuple[Path | None, tuple[RankPlacement, ...]],
    name: str | None,
) -> ImportSummary:
    """Write the run ``parsed`` from ``path`` for the folder ``out`` into its staging folder (``folders``: both),
    its ranks placed by the topology (file, placements)."""
    out, staging = folders
    topology, placements = placed
    layout = RunLayout(staging)
    records = _data_records(parsed.rows) + parsed.records
    ranks = sorted({0, *(r.rank for r in records), *(p.rank for p in placements)})
    world_size = 1 + ranks[-1]
    _check_placed(placements, {r.rank for r in records}, topology)
    files = _run_files(layout, records, placements, ranks, world_size)
    write_run_info(
        layout,
        RunInfo(
            name=name or out.name,
            world_size=world_size,
            topology=placements,
            config={"import": {"source": str(path), "format": parsed.format}},
        ),
    )
    for file, items in files.items():
        _write_file(file, items)
    collected, ingested = collect_staged(staging, out)
    summary = _summary(out, parsed, files, len(ranks), world_size)
    return replace(summary, warnings=(*parsed.warnings, *collected), ingested=ingested)


def _data_records(rows: list[Row]) -> list[Record]:
    """The step, rank_step and eval records of the data rows, grouped by (timeline, step, rank)
    (``seq`` 0: a file's records are numbered as it is written)."""
    _check_times(rows)
    groups: dict[tuple[int, int, int | None], _Group] = {}
    for row in rows:
        _merge(groups.setdefault((row.timeline, row.step, row.rank), _Group(row.where)), row)
    clock = {key: float(i) for i, key in enumerate(sorted({(t, s) for t, s, _ in groups}))}
    records: list[Record] = []
    for (timeline, step, rank), group in groups.items():
        time = clock[timeline, step] if group.time is None else group.time
        envelope = {"time": time, "rank": 0 if rank is None else rank, "step": step, "timeline": timeline, "seq": 0}
        records.extend(_job_records(envelope, group) if rank is None else [_rank_step_record(envelope, group)])
    return records


def _check_times(rows: list[Row]) -> None:
    """``time`` is given on every data row or on none (then the clock is synthetic)."""
    missing = [row for row in rows if row.time is None]
    if missing and len(missing) < len(rows):
        raise ImportFormatError(f"{missing[0].where}: time is empty; give time on every row or on none")


def _merge(group: _Group, row: Row) -> None:
    if row.time is not None:
        group.time = row.time if group.time is None else max(group.time, row.time)
    for name, value in row.values.items():
        if name == "shard":
            group.shards.append(value)
        elif name in group.values:
            level = "job level" if row.rank is None else f"rank {row.rank}"
            raise ImportFormatError(
                f"{row.where}: {name} given twice for timeline {row.timeline} step {row.step} "
                f"({level}); first at {group.where}"
            )
        else:
            group.values[name] = value


def _job_records(envelope: dict[str, Any], group: _Group) -> list[Record]:
    metrics = {n: v for n, v in group.values.items() if not n.startswith(EVAL_PREFIX)}
    scores = {n[len(EVAL_PREFIX) :]: v for n, v in group.values.items() if n.startswith(EVAL_PREFIX)}
    records: list[Record] = []
    if metrics or group.shards:
        records.append(Step(**envelope, metrics=_encoded(metrics), shards=list(group.shards) or None))
    if scores:
        records.append(_eval_record(envelope, scores, group.where))
    return records


def _eval_record(envelope: dict[str, Any], scores: dict[str, Any], where: str) -> Eval:
    spent = {name: encode_number(value) for name, value in scores.items() if name in EVAL_FIELDS}
    scores = {name: value for name, value in scores.items() if name not in EVAL_FIELDS}
    if not scores:
        raise ImportFormatError(f"{where}: eval/{' and eval/'.join(spent)} without any eval score at this step")
    return Eval(
        **envelope, metrics=_encoded(scores), cum_tokens=spent.get("cum_tokens"), cum_flops=spent.get("cum_flops")
    )


def _rank_step_record(envelope: dict[str, Any], group: _Group) -> RankStep:
    metrics = {n: v for n, v in group.values.items() if n != "param_checksum"}
    return RankStep(**envelope, metrics=_encoded(metrics), param_checksum=group.values.get("param_checksum"))


def _encoded(metrics: dict[str, Number]) -> Metrics:
    return {name: value if isinstance(value, int) else encode_number(value) for name, value in metrics.items()}


def _run_files(
    layout: RunLayout, records: list[Record], placements: tuple[RankPlacement, ...], ranks: list[int], world_size: int
) -> dict[Path, list[Record]]:
    """The records of every file to write: telemetry per rank, fault_injected into ground_truth/."""
    truth = [r for r in records if r.kind == Kind.FAULT_INJECTED]
    telemetry = [r for r in records if r.kind != Kind.FAULT_INJECTED]
    per_rank = _telemetry_files(telemetry, placements, ranks, world_size)
    files = {layout.rank_file(rank): items for rank, items in per_rank.items()}
    return files | {layout.ground_truth_file(rank): items for rank, items in _by_rank(truth).items()}


def _telemetry_files(
    records: list[Record], placements: tuple[RankPlacement, ...], ranks: list[int], world_size: int
) -> dict[int, list[Record]]:
    """The telemetry of each of ``ranks`` (the ranks of the data and the topology, not every number below the
    world size: a trace may number its ranks 0, 4, 8, ...), led by a rank_info record (unless the input
    brought one)."""
    start = min((r.time for r in records), default=0.0)
    placed = {p.rank: p for p in placements}
    reported = {r.rank for r in records if r.kind == Kind.RANK_INFO}
    infos: list[Record] = [
        _rank_info(rank, placed.get(rank), world_size, start) for rank in ranks if rank not in reported
    ]
    return _by_rank(infos + records)


def _by_rank(records: list[Record]) -> dict[int, list[Record]]:
    """Records per rank: rank_info first, then by (timeline, step), input order within."""
    files: dict[int, list[Record]] = {}
    for record in records:
        files.setdefault(record.rank, []).append(record)
    for items in files.values():
        items.sort(key=lambda r: (r.kind != Kind.RANK_INFO, r.timeline, r.step))
    return files


def _rank_info(rank: int, placement: RankPlacement | None, world_size: int, time: float) -> RankInfo:
    if placement is None:
        return RankInfo(time=time, rank=rank, step=0, timeline=0, seq=0, host=UNKNOWN_HOST, world_size=world_size)
    return RankInfo(
        time=time,
        rank=rank,
        step=0,
        timeline=0,
        seq=0,
        host=placement.host,
        world_size=world_size,
        local_rank=placement.local_rank,
        mesh={"dp": placement.dp, "tp": placement.tp, "pp": placement.pp},
    )


def _write_file(path: Path, records: list[Record]) -> None:
    """Append ``records`` with ``seq`` = line number (the file is new, so from 0)."""
    channel = AppendFile(path)
    try:
        lines = [to_line(replace(r, seq=channel.next_seq + i)) for i, r in enumerate(records)]
        channel.write("".join(lines).encode("utf-8", "replace"))
    finally:
        channel.close()


def _summary(out: Path, parsed: Parsed, files: dict[Path, list[Record]], ranks: int, world_size: int) -> ImportSummary:
    written = [r for records in files.values() for r in records]
    steps = {(r.timeline, r.step) for r in written if r.kind in (Kind.STEP, Kind.RANK_STEP)}
    return ImportSummary(
        out=out,
        format=parsed.format,
        records=dict(Counter(str(r.kind) for r in written)),
        ranks=ranks,
        steps=len(steps),
        rows=len(parsed.rows) + len(parsed.records),
        skipped=parsed.skipped,
        world_size=world_size,
        warnings=tuple(parsed.warnings),
    )


def _check_placed(placements: tuple[RankPlacement, ...], ranks: set[int], topology: Path | None) -> None:
    """A topology, when given, must place every rank the data has (and only those need a place)."""
    unplaced = sorted(ranks - {p.rank for p in placements})
    if placements and unplaced:
        raise ImportFormatError(
            f"{topology}: no placement for rank {unplaced[0]} (the data has ranks {_span(sorted(ranks))})"
        )


def _span(ranks: list[int]) -> str:
    """Rank numbers as a reader checks them: ``0..7`` when they run without gaps, else the first few."""
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}..{ranks[-1]}"
    return ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


# -- topology -----------------------------------------------------------------
def _load_json(path: Path) -> Any:
    """The JSON of a topology file (a regular file, at most ``MAX_TOPOLOGY_BYTES``, bounded as ``parse_json``)."""
    return parse_json(read_source(path, MAX_TOPOLOGY_BYTES), str(path))


def _placement(entry: Any, where: str) -> RankPlacement:
    if not isinstance(entry, dict):
        raise ImportFormatError(f'{where}: expected an object like {{"rank": 0, "host": "node-a"}}')
    if unknown := sorted(set(entry) - {"host", *PLACEMENT_NUMBERS}):
        raise ImportFormatError(f"{where}: unknown field {unknown[0]} (known: host, {', '.join(PLACEMENT_NUMBERS)})")
    if not isinstance(entry.get("host"), str) or not entry["host"].strip():
        raise ImportFormatError(f"{where}: host must be a non-empty string")
    numbers = {  # as the collector holds them: a rank whose world size fits, coordinates up to MAX_RANK
        name: integer(entry.get(name), where, name, maximum=MAX_IMPORTED_RANK if name == "rank" else MAX_RANK)
        for name in PLACEMENT_NUMBERS
        if name == "rank" or name in entry
    }
    return RankPlacement(host=entry["host"], **numbers)
