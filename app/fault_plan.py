"""The demo's fault plan: one of each kind of incident, placed at fixed fractions of the run.

Nothing is injected in the first 40%: the detectors learn the run's own noise, trend and
per-rank speeds there first, so that each fault is found as a change at its own step.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_STEPS = 40


@dataclass(frozen=True)
class DemoFaults:
    """Where the demo injects each fault (steps), scaled to the run's length."""

    steps: int
    straggler_rank: int = 1
    crash_rank: int | None = None

    def __post_init__(self) -> None:
        if self.steps < MIN_STEPS:
            raise ValueError(f"the demo needs at least {MIN_STEPS} steps, got {self.steps}")

    def at(self, fraction: float) -> int:
        return max(1, int(self.steps * fraction))

    @property
    def straggler_window(self) -> tuple[int, int]:
        return self.at(0.55), self.at(0.70)

    @property
    def bad_shard_step(self) -> int:
        return self.at(0.40)

    @property
    def grad_flip_step(self) -> int:
        return self.at(0.78)

    @property
    def param_flip_step(self) -> int:
        return self.at(0.85)

    @property
    def nan_step(self) -> int:
        return self.at(0.94)

    def specs(self) -> list[str]:
        """The ``--inject`` specs of the plan (docs/faults.md)."""
        first, last = self.straggler_window
        plan = [
            f"straggler:rank={self.straggler_rank},factor=2.0,from={first},steps={last - first + 1}",
            f"bad_shard:shards=0-3,from={self.bad_shard_step},steps={max(2, self.steps // 20)}",
            f"grad_bitflip:rank=1,step={self.grad_flip_step}",
            f"param_bitflip:rank=0,step={self.param_flip_step}",
            f"nan:rank=0,step={self.nan_step}",
        ]
        if self.crash_rank is not None:
            plan.append(f"crash:rank={self.crash_rank},step={self.at(0.5)},code=3")
        return plan
