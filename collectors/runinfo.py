"""``run.json``: who the run is, how big, where each rank sits, and its config snapshot."""
from __future__ import annotations

import hashlib
import json
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from .atomicjson import write_json_atomic
from .errors import RunInfoError
from .format import SCHEMA_VERSION
from .layout import RunLayout


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
    world_size: int
    topology: tuple[RankPlacement, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
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
        data["topology"] = [asdict(p) for p in self.topology]
        if self.topology:
            data["mesh"] = self.mesh
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunInfo:
        try:
            topology = tuple(RankPlacement(**p) for p in data.get("topology", ()))
            known = {k: data[k] for k in ("run_id", "name", "created", "schema_version", "world_size", "config") if k in data}
            return cls(**known, topology=topology)
        except TypeError as exc:
            raise RunInfoError(f"run.json: {exc}") from exc


def default_placement(rank: int, local_rank: int, dp: int | None = None) -> RankPlacement:
    """This process's placement when nothing better is known: data parallel only."""
    return RankPlacement(rank=rank, host=socket.gethostname(), local_rank=local_rank, dp=rank if dp is None else dp)


def write_run_info(layout: RunLayout, info: RunInfo) -> None:
    """Write ``run.json`` atomically (temporary file, fsync, rename)."""
    write_json_atomic(layout.run_info, info.to_json(), indent=2)


def read_run_info(layout: RunLayout) -> RunInfo | None:
    """``run.json`` of a run, None when it has none; a broken one raises RunInfoError."""
    try:
        text = layout.run_info.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunInfoError(f"{layout.run_info}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise RunInfoError(f"{layout.run_info}: expected a JSON object")
    if "world_size" not in data:
        raise RunInfoError(f"{layout.run_info}: world_size is required")
    return RunInfo.from_json({**_defaults(layout, text), **data})


def _defaults(layout: RunLayout, text: str) -> dict[str, Any]:
    """Stable values for the optional fields a hand-written run.json leaves out."""
    return {
        "run_id": hashlib.sha1(text.encode("utf-8")).hexdigest()[:12],
        "name": layout.root.name,
        "created": layout.run_info.stat().st_mtime,
    }
