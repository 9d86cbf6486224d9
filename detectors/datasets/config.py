"""What to simulate: the run's shape, its schedule, the noise, the nuisances and the faults."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from . import defaults
from .defaults import NOISE_FAMILIES
from .errors import SimulationError
from .faults import Fault, parse_faults
from .topology import Topology

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

MAX_TIME = 1e11


def _check_positive(owner: DataclassInstance) -> None:
    """Every numeric field of a settings dataclass must be > 0."""
    for f in fields(owner):
        value = getattr(owner, f.name)
        if isinstance(value, (int, float)) and not value > 0:
            raise SimulationError(f"{f.name} must be > 0, got {value}")


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """The baseline models' constants (docs/simulate.md): loss, gradient norm, timing, and their noise."""

    loss_start: float = 10.5
    loss_floor: float = 1.9
    loss_alpha: float = 0.5
    loss_scale_steps: float = 10.0
    loss_sigma: float = 0.012
    eval_gap: float = 0.02
    eval_sigma: float = 0.004
    grad_floor: float = 0.25
    grad_sigma: float = 0.06
    local_grad_sigma: float = 0.08
    peak_lr: float = 3e-4
    min_lr_ratio: float = 0.1
    tokens_per_replica: int = 16384
    params: float = 7e9
    compute_s: float = 0.75
    data_s: float = 0.02
    optimizer_s: float = 0.04
    comm_s: float = 0.12
    compute_sigma: float = 0.015
    data_sigma: float = 0.25
    optimizer_sigma: float = 0.03
    comm_sigma: float = 0.05
    chip_spread: float = 0.01

    def __post_init__(self) -> None:
        _check_positive(self)
        if self.loss_floor >= self.loss_start:
            raise SimulationError(f"loss_floor {self.loss_floor} must be below loss_start {self.loss_start}")


@dataclass(frozen=True, kw_only=True)
class SimulationConfig:
    """One simulated run; the same config and seed give the same files, byte for byte.

    ``eval_every`` and ``checkpoint_every`` of 0 mean never. ``inject`` holds fault specs
    (docs/simulate.md); they are parsed and checked against the run into ``faults``.
    """

    ranks: int
    steps: int
    seed: int = defaults.SEED
    ranks_per_host: int = defaults.RANKS_PER_HOST
    pp: int = defaults.PIPELINE_STAGES
    eval_every: int = defaults.EVAL_EVERY
    checkpoint_every: int = defaults.CHECKPOINT_EVERY
    checksum_every: int = defaults.CHECKSUM_EVERY
    heartbeat_every_s: float = 10.0
    num_shards: int = 64
    shards_per_step: int = 4
    noise: str = defaults.NOISE
    nuisances: bool = True
    inject: tuple[str, ...] = ()
    start_time: float = 1_796_000_000.0
    model: ModelSettings = field(default_factory=ModelSettings)
    faults: tuple[Fault, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, low in (
            ("ranks", 1),
            ("steps", 1),
            ("seed", 0),
            ("ranks_per_host", 1),
            ("pp", 1),
            ("eval_every", 0),
            ("checkpoint_every", 0),
            ("checksum_every", 1),
            ("num_shards", 1),
            ("shards_per_step", 1),
        ):
            if getattr(self, name) < low:
                raise SimulationError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.ranks % self.pp:
            raise SimulationError(f"--pp {self.pp} must divide --ranks {self.ranks}")
        if self.shards_per_step > self.num_shards:
            raise SimulationError(f"shards_per_step {self.shards_per_step} exceeds num_shards {self.num_shards}")
        if self.noise not in NOISE_FAMILIES:
            raise SimulationError(f"noise must be one of {', '.join(NOISE_FAMILIES)}, got {self.noise!r}")
        if not (self.heartbeat_every_s > 0 and 0 <= self.start_time < MAX_TIME):
            raise SimulationError("heartbeat_every_s must be > 0 and start_time unix seconds")
        object.__setattr__(self, "inject", tuple(self.inject))
        object.__setattr__(self, "faults", parse_faults(self.inject, self.topology, self.steps))

    @property
    def topology(self) -> Topology:
        return Topology(self.ranks, self.pp, self.ranks_per_host)

    @property
    def hang(self) -> Fault | None:
        return next((f for f in self.faults if f.name == "hang"), None)

    @property
    def last_step(self) -> int:
        """The last step the run completes: the step before a hang, else ``steps``."""
        return self.hang.onset - 1 if self.hang else self.steps

    def to_json(self) -> dict[str, Any]:
        """The config snapshot for run.json (faults as their specs)."""
        data = asdict(self)
        data.pop("faults")
        data["inject"] = list(self.inject)
        return data
