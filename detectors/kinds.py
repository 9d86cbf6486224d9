"""What a detector declares of each kind of finding it emits: its incident family, the cause it points to,
and how far from a fault the benchmark lets it date a finding."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Family(StrEnum):
    """Findings that can share a cause: numerics and data, speed, learning itself, the way back, and the
    operators' requests to the run."""

    TRAINING = "training"
    PERFORMANCE = "performance"
    LEARNING = "learning"
    CHECKPOINTS = "checkpoints"
    CONTROL = "control"

    @property
    def heading(self) -> str:
        """How an incident of this family is titled."""
        return {
            "training": "Training instability",
            "performance": "Slow or stuck ranks",
            "learning": "Not learning",
            "checkpoints": "Checkpoints lost",
            "control": "Control requests not applied",
        }[self.value]


@dataclass(frozen=True)
class FindingKind:
    """One kind of finding, as the detector that emits it declares it.

    ``cause``: what an incident holding this kind is put down to ("" when the kind alone
    explains nothing, as a spike); ``{ranks}`` is filled with the ranks its findings name.
    Among the causes of one incident, the lowest ``precedence`` wins. ``tolerance`` and
    ``lead``: steps after a fault's window, and before its onset, within which the
    benchmark counts a finding of this kind as finding the fault.
    """

    name: str
    family: Family
    tolerance: int
    cause: str = ""
    precedence: int = 100
    lead: int = 2
