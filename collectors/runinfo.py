"""``run.json``: who the run is, how big, where each rank sits, and its config snapshot.

A run.json read from disk is checked field by field: a value of the wrong type or out of range (a
``world_size`` of 3e9 or ``true``, a topology ``dp`` of 3e9, a name or host holding a lone surrogate such as
``"\ud800"``, which no UTF-8 store or terminal can take) is left out and named in ``problems``, so the telemetry is
still ingested; only a file that is not a JSON object is refused whole.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from .atomicjson import write_json_atomic
from .bounded import BoundedInputError, parse_json
from .errors import RunInfoError
from .format import MAX_RANK, SCHEMA_VERSION
from .layout import RunLayout
from .safefile import UnsafeFileError, read_small_file


@dataclass(frozen=True, kw_only=True)
class RankPlacement:
    """Where one rank runs: host, local rank and mesh coordinates."""

    rank: int
    host: str
    local_rank: int = 0
    dp: int = 0
    tp: int = 0
    pp: int = 0

    def __post_init__(self) -> None:
        for name in ("rank", "local_rank", "dp", "tp", "pp"):
            if getattr(self, name) < 0:
                raise RunInfoError(f"rank placement: {name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """The content of ``run.json``."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    name: str
    created: float = field(default_factory=time.time)
    schema_version: int = SCHEMA_VERSION
    world_size: int | None  # None only when read from a run.json whose value was unusable (see problems)
    topology: tuple[RankPlacement, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    problems: tuple[str, ...] = field(default=(), compare=False)  # fields of run.json left out, and why

    def __post_init__(self) -> None:
        if self.world_size is None:
            return
        if self.world_size < 1:
            raise RunInfoError(f"run.json: world_size must be >= 1, got {self.world_size}")
        ranks = [p.rank for p in self.topology]
        if len(set(ranks)) != len(ranks) or any(r >= self.world_size for r in ranks):
            raise RunInfoError(f"run.json: topology ranks must be distinct and < world_size {self.world_size}")

    @property
    def mesh(self) -> dict[str, int] | None:
        """The mesh's shape, each dimension's size as the topology places ranks on it; None without a topology."""
        if not self.topology:
            return None
        return {dim: 1 + max(getattr(p, dim) for p in self.topology) for dim in ("dp", "tp", "pp")}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["problems"]
        data["topology"] = [asdict(p) for p in self.topology]
        if self.topology:
            data["mesh"] = self.mesh
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], defaults: dict[str, Any] | None = None) -> RunInfo:
        """run.json's content checked field by field: a bad value is left out (``defaults`` stand in for
        what is left out) and named in ``problems``."""
        fields, problems = _checked_fields(data)
        world_size = fields.pop("world_size", None)
        topology, misplaced = _checked_topology(data.get("topology", []), world_size)
        return cls(
            **{**(defaults or {}), **fields}, world_size=world_size, topology=topology, problems=(*problems, *misplaced)
        )


def _shown(value: Any) -> str:
    """A JSON value as a problem quotes it (at most 100 characters)."""
    text = json.dumps(value)
    return text if len(text) <= 100 else text[:97] + "..."


MAX_RUN_INFO_BYTES = 64 << 20
"""The largest run.json read: a config snapshot of a few KiB, a topology of a million ranks."""
NOT_UNICODE = "holds a lone surrogate (an escape such as \\ud800 that is no character): it cannot be stored or shown"
"""Why text that JSON can escape but UTF-8 cannot encode is left out (an importer's non-UTF-8 folder name, say)."""


def _encodable(value: Any) -> bool:
    """Whether every string of a JSON value, keys included, encodes as UTF-8 (JSON's ``\\ud800`` escapes do not)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _integer(value: Any, low: int) -> int | None:
    """``value`` as an int when it is an integral JSON number from ``low`` to MAX_RANK (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if low <= value <= MAX_RANK else None


def _checked_fields(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """run.json's top-level fields that have the documented type and range, and a problem for each other."""
    fields: dict[str, Any] = {}
    problems = [] if "world_size" in data else ["world_size is required: ranks are not checked against it"]
    for name in ("run_id", "name"):
        if name in data and isinstance(data[name], str) and data[name] and _encodable(data[name]):
            fields[name] = data[name]
        elif name in data and isinstance(data[name], str) and data[name]:
            problems.append(f"{name} {NOT_UNICODE}, got {_shown(data[name])}: ignored")
        elif name in data:
            problems.append(f"{name} must be a non-empty string, got {_shown(data[name])}: ignored")
    for name, low in (("world_size", 1), ("schema_version", 1)):
        if name in data and _integer(data[name], low) is not None:
            fields[name] = _integer(data[name], low)
        elif name in data:
            problems.append(f"{name} must be an integer from {low} to {MAX_RANK}, got {_shown(data[name])}: ignored")
    created = data.get("created")
    if isinstance(created, int | float) and not isinstance(created, bool) and math.isfinite(created) and created >= 0:
        fields["created"] = float(created)
    elif "created" in data:
        problems.append(f"created must be a number of unix seconds, got {_shown(created)}: ignored")
    if isinstance(data.get("config", {}), dict) and _encodable(data.get("config", {})):
        fields["config"] = data.get("config", {})
    elif isinstance(data["config"], dict):
        problems.append(f"config {NOT_UNICODE} in a key or a value: ignored")
    else:
        problems.append(f"config must be an object, got {_shown(data['config'])}: ignored")
    return fields, problems


def _checked_topology(entries: Any, world_size: int | None) -> tuple[tuple[RankPlacement, ...], list[str]]:
    """The placements of run.json's topology that are whole and valid, and a problem for each other."""
    if not isinstance(entries, list):
        return (), [f"topology must be a list of placements, got {_shown(entries)}: ignored"]
    placements: list[RankPlacement] = []
    problems = []
    for index, entry in enumerate(entries):
        problem = _placement_problem(entry, world_size, {p.rank for p in placements})
        if problem:
            problems.append(f"topology[{index}]{problem}: the placement of this entry is ignored")
        else:
            placements.append(
                RankPlacement(
                    rank=int(entry["rank"]),
                    host=entry["host"],
                    **{k: int(entry.get(k, 0)) for k in ("local_rank", "dp", "tp", "pp")},
                )
            )
    return tuple(placements), problems


def _placement_problem(entry: Any, world_size: int | None, placed: set[int]) -> str | None:
    """What is wrong with one topology entry (``.field ...``, after its index), or None."""
    if not isinstance(entry, dict):
        return f" must be an object, got {_shown(entry)}"
    if not isinstance(entry.get("host"), str):
        return f".host must be a string, got {_shown(entry.get('host'))}"
    if not _encodable(entry["host"]):
        return f".host {NOT_UNICODE}, got {_shown(entry['host'])}"
    for name in ("rank", "local_rank", "dp", "tp", "pp"):
        if (name == "rank" or name in entry) and _integer(entry.get(name), 0) is None:
            return f".{name} must be an integer from 0 to {MAX_RANK}, got {_shown(entry.get(name))}"
    rank = int(entry["rank"])
    if world_size is not None and rank >= world_size:
        return f".rank {rank} is not below world_size {world_size}"
    if rank in placed:
        return f".rank {rank} is placed twice"
    return None


def default_placement(rank: int, local_rank: int, dp: int | None = None) -> RankPlacement:
    """This process's placement when nothing better is known: data parallel only."""
    return RankPlacement(rank=rank, host=socket.gethostname(), local_rank=local_rank, dp=rank if dp is None else dp)


def write_run_info(layout: RunLayout, info: RunInfo) -> None:
    """Write ``run.json`` atomically (temporary file, fsync, rename)."""
    write_json_atomic(layout.run_info, info.to_json(), indent=2)


def read_run_info(layout: RunLayout) -> RunInfo | None:
    """``run.json`` of a run, None when it has none; a broken one raises RunInfoError."""
    try:
        raw = read_small_file(layout.run_info, MAX_RUN_INFO_BYTES)
    except UnsafeFileError as exc:
        if not os.path.lexists(layout.run_info):
            return None
        raise RunInfoError(f"{layout.run_info}: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunInfoError(f"{layout.run_info}: not UTF-8 (byte {exc.start})") from None
    try:
        data = parse_json(text, str(layout.run_info), allow_nan=True, overflow_to_inf=True)
    except BoundedInputError as exc:
        raise RunInfoError(str(exc)) from None
    if not isinstance(data, dict):
        raise RunInfoError(f"{layout.run_info}: expected a JSON object")
    return RunInfo.from_json(data, _defaults(layout, text))


def _readable(name: str) -> str:
    """A file name that is not UTF-8 (its bytes escaped as surrogates) with each such byte as U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _defaults(layout: RunLayout, text: str) -> dict[str, Any]:
    """Stable values for the optional fields a hand-written run.json leaves out."""
    return {
        "run_id": hashlib.sha1(text.encode("utf-8")).hexdigest()[:12],
        "name": layout.root.name if _encodable(layout.root.name) else _readable(layout.root.name),
        "created": layout.run_info.stat().st_mtime,
    }
