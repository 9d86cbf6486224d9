"""Training configuration as data: keyword-only dataclasses validated on creation,
and named presets as plain functions. The config snapshot is the first thing a
run records (run.json)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .model_config import ModelConfig, tiny_model_config

PARALLELISMS = ("ddp", "fsdp")


def _require_positive(config: Any, prefix: str, names: tuple[str, ...]) -> None:
    """ValueError naming the first of ``names`` whose value is below 1."""
    for name in names:
        if getattr(config, name) < 1:
            raise ValueError(f"{prefix}{name} must be >= 1, got {getattr(config, name)}")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """The synthetic language and its corpus."""

    vocab_size: int = 64
    branching: int = 6
    num_shards: int = 16
    samples_per_shard: int = 256
    heldout_samples: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        _require_positive(
            self, "data.", ("vocab_size", "branching", "num_shards", "samples_per_shard", "heldout_samples")
        )
        if self.branching > self.vocab_size:
            raise ValueError(f"data.branching ({self.branching}) cannot exceed vocab_size ({self.vocab_size})")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW with linear warmup, cosine decay to ``min_lr_ratio * lr``, and gradient clipping."""

    lr: float = 3e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.grad_clip <= 0:
            raise ValueError("optim.lr and optim.grad_clip must be > 0")
        if self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("optim.warmup_steps must be >= 0 and optim.min_lr_ratio in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a training run needs, snapshotted into run.json."""

    preset: str
    model: ModelConfig
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    steps: int = 300
    global_batch: int = 32
    parallelism: str = "ddp"
    eval_every: int = 50
    eval_batches: int = 2
    checksum_every: int = 10
    checkpoint_every: int = 50
    keep_checkpoints: int = 3
    peak_flops_per_device: float = 1e12
    seed: int = 0

    def __post_init__(self) -> None:
        if self.parallelism not in PARALLELISMS:
            raise ValueError(f"parallelism must be one of {', '.join(PARALLELISMS)}, got {self.parallelism!r}")
        _require_positive(
            self,
            "",
            (
                "steps",
                "global_batch",
                "eval_every",
                "eval_batches",
                "checksum_every",
                "checkpoint_every",
                "keep_checkpoints",
            ),
        )
        if self.model.vocab_size != self.data.vocab_size:
            raise ValueError(f"model.vocab_size ({self.model.vocab_size}) != data.vocab_size ({self.data.vocab_size})")

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.model.seq_len

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def tiny_cpu() -> TrainConfig:
    """2-4 ranks on 2 CPU cores: a visibly falling loss in about a minute."""
    data = DataConfig()
    return TrainConfig(preset="tiny_cpu", model=tiny_model_config(vocab_size=data.vocab_size, seq_len=64), data=data)


PRESETS: dict[str, Callable[[], TrainConfig]] = {"tiny_cpu": tiny_cpu}


def preset(name: str, **overrides: Any) -> TrainConfig:
    """The named preset with top-level fields replaced (``steps=50``, ``parallelism="fsdp"``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return replace(PRESETS[name](), **{k: v for k, v in overrides.items() if v is not None})
