"""Format-v1 records, one dataclass per kind: what every writer builds and ``to_line`` writes.

The fields and their meaning are those of ``docs/telemetry-format.md`` and
``telemetry.schema.json`` (``tests/test_records.py`` keeps the three in step). A record
holds values in their JSON form already (numbers as ``encode_number`` gives them); a
field that is None is left out of the line. Records are not checked here: the
collector checks every line, whoever wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

from .format import ENVELOPE_FIELDS, Kind, encode_line

Number = int | float | str | None
"""A metric value as a line carries it: a number, null, or "NaN", "Infinity", "-Infinity"."""
Metrics = dict[str, Number]


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """The fields every record carries besides its ``kind`` (which its class gives)."""

    time: float
    rank: int
    step: int
    timeline: int
    seq: int
    metrics: Metrics | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RankInfo(Envelope):
    """Where a rank runs; written once by each rank when it starts."""

    kind: ClassVar[Kind] = Kind.RANK_INFO
    host: str
    local_rank: int | None = None
    world_size: int | None = None
    pid: int | None = None
    mesh: dict[str, int] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Step(Envelope):
    """Job-level metrics of one optimizer step, and the data shards it read."""

    kind: ClassVar[Kind] = Kind.STEP
    metrics: Metrics
    shards: list[int | str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RankStep(Envelope):
    """One rank's metrics of one step and, now and then, the digest of its parameters."""

    kind: ClassVar[Kind] = Kind.RANK_STEP
    metrics: Metrics
    param_checksum: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Eval(Envelope):
    """Held-out scores with the cumulative compute spent so far."""

    kind: ClassVar[Kind] = Kind.EVAL
    metrics: Metrics
    split: str = "heldout"
    cum_tokens: Number = None
    cum_flops: Number = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint(Envelope):
    """A checkpoint lifecycle event (``CHECKPOINT_EVENTS``)."""

    kind: ClassVar[Kind] = Kind.CHECKPOINT
    event: str
    path: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Action(Envelope):
    """An operator action on the run and what became of it (``ACTION_STATUSES``)."""

    kind: ClassVar[Kind] = Kind.ACTION
    action: str
    status: str
    request_id: str
    operator: str | None = None
    reason: str | None = None
    message: str | None = None
    args: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat(Envelope):
    """Proof of life between steps; ``control``: a control reader polls the run's requests."""

    kind: ClassVar[Kind] = Kind.HEARTBEAT
    control: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Log(Envelope):
    """A human-readable line of the run's event log."""

    kind: ClassVar[Kind] = Kind.LOG
    level: str | None = None
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnd(Envelope):
    """A rank's end (``RunEndStatus``)."""

    kind: ClassVar[Kind] = Kind.RUN_END
    status: str
    message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultInjected(Envelope):
    """Ground truth of an injected fault (written to ``ground_truth/``)."""

    kind: ClassVar[Kind] = Kind.FAULT_INJECTED
    fault: str
    target_ranks: list[int] | None = None
    args: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Event(Envelope):
    """A record of a kind v1 does not define, or whose fields do not fit its kind's: kept as given."""

    kind: str
    fields: dict[str, Any]


Record = RankInfo | Step | RankStep | Eval | Checkpoint | Action | Heartbeat | Log | RunEnd | FaultInjected | Event

KIND_RECORDS: dict[str, type[Record]] = {
    cls.kind: cls for cls in (RankInfo, Step, RankStep, Eval, Checkpoint, Action, Heartbeat, Log, RunEnd, FaultInjected)
}
"""The record class of each kind of format v1."""


def kind_fields(cls: type[Record]) -> tuple[str, ...]:
    """The fields of a record class beyond the envelope and ``metrics``, in line order."""
    return tuple(f.name for f in fields(cls) if f.name not in ENVELOPE_FIELDS and f.name != "metrics")


def required_fields(cls: type[Record]) -> frozenset[str]:
    """The fields a record class cannot do without (those without a default)."""
    return frozenset(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)


_OWN = {cls: kind_fields(cls) for cls in KIND_RECORDS.values()}
_FIELDS = {cls: frozenset(f.name for f in fields(cls)) for cls in KIND_RECORDS.values()}
_REQUIRED = {cls: required_fields(cls) for cls in KIND_RECORDS.values()}


def build_record(kind: str, given: Mapping[str, Any], metrics: Metrics | None = None, **envelope: Any) -> Record:
    """The record of ``kind`` with the ``given`` fields: its kind's class when they fit it
    (none unknown, none required missing), else an ``Event`` holding them as given, as foreign
    input (importers, ``RunLogger.event``) may have it."""
    cls = KIND_RECORDS.get(kind)
    values = {**envelope, **given} if metrics is None else {**envelope, "metrics": metrics, **given}
    if cls is not None and values.keys() <= _FIELDS[cls] and _REQUIRED[cls] <= values.keys():
        return cls(**values)
    return Event(kind=str(kind), fields=dict(given), metrics=metrics, **envelope)


def strict_record(kind: str, given: Mapping[str, Any], metrics: Metrics | None = None, **envelope: Any) -> Record:
    """The record of ``kind`` with the ``given`` fields, for our own writers: ValueError when the kind
    is not of v1 or the fields do not fit its class (where ``build_record`` makes an ``Event``)."""
    record = build_record(kind, given, metrics, **envelope)
    if type(record) is not Event:
        return record
    cls = KIND_RECORDS.get(kind)
    if cls is None:
        raise ValueError(f"{kind!r} is no record kind of format v1")
    names = {*envelope, *given, *(["metrics"] if metrics is not None else [])}
    unknown, missing = sorted(names - _FIELDS[cls]), sorted(_REQUIRED[cls] - names)
    raise ValueError(f"fields do not fit a {kind} record: unknown {unknown}, missing {missing}")


def to_dict(record: Record) -> dict[str, Any]:
    """The JSON object of ``record``: the envelope, ``metrics`` when set, then the fields that are set."""
    line: dict[str, Any] = {
        "kind": str(record.kind),
        "time": record.time,
        "rank": record.rank,
        "step": record.step,
        "timeline": record.timeline,
        "seq": record.seq,
    }
    if record.metrics is not None:
        line["metrics"] = record.metrics
    if type(record) is Event:
        line.update((name, value) for name, value in record.fields.items() if value is not None)
        return line
    for name in _OWN[type(record)]:
        value = getattr(record, name)
        if value is not None:
            line[name] = value
    return line


def to_line(record: Record) -> str:
    """``record`` as one telemetry line (compact JSON, newline-terminated)."""
    return encode_line(to_dict(record))
