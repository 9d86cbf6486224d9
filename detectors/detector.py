"""The detector interface and the registry of detectors by name."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, TypeVar

from .errors import DetectorConfigError
from .finding import Finding
from .telemetry import RunState, TelemetryBatch


class Detector(ABC):
    """A streaming detector: settings in ``__init__``, state between ``update`` calls.

    ``update`` takes the rows that arrived since the last call and returns the findings
    it opened or changed (a changed finding keeps its ``finding_id``). Feeding a run in
    one batch or in many gives the same findings. ``finish`` closes what the end of the
    data settles (a run that ended); ``tick`` lets time pass without data (a live hang).
    """

    name: ClassVar[str]

    def __init__(self) -> None:
        self.run = RunState()

    def bind(self, run: RunState) -> None:
        """Share the runner's knowledge of the run (topology, checkpoints)."""
        self.run = run

    @abstractmethod
    def update(self, batch: TelemetryBatch) -> list[Finding]:
        """Take new rows; the findings opened or changed."""

    def finish(self) -> list[Finding]:
        """The data ended: findings that this settles."""
        return []

    def tick(self, now: float) -> list[Finding]:
        """Wall-clock time ``now`` passed with no new rows (live runs only)."""
        return []


D = TypeVar("D", bound=type[Detector])
REGISTRY: dict[str, type[Detector]] = {}


def register(cls: D) -> D:
    """Class decorator: make a detector available by its ``name``."""
    if cls.name in REGISTRY:
        raise DetectorConfigError(f"two detectors are named {cls.name!r}")
    REGISTRY[cls.name] = cls
    return cls


def build_detectors(settings: dict[str, dict] | None = None,
                    only: list[str] | None = None) -> list[Detector]:
    """One instance of every registered detector (or those in ``only``), with ``settings`` by name."""
    settings = settings or {}
    unknown = sorted((set(settings) | set(only or ())) - set(REGISTRY))
    if unknown:
        raise DetectorConfigError(f"unknown detector {', '.join(unknown)} (known: {', '.join(sorted(REGISTRY))})")
    built = []
    for name in sorted(REGISTRY):
        if only is None or name in only:
            built.append(_construct(REGISTRY[name], settings.get(name, {})))
    return built


def _construct(cls: type[Detector], options: dict) -> Detector:
    try:
        return cls(**options)
    except TypeError as exc:
        raise DetectorConfigError(f"bad settings for detector {cls.name!r}: {exc}") from exc
