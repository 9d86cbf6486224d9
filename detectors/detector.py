"""The detector interface: what every detector declares (name, kinds, settings' ranges) and does."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from .errors import DetectorConfigError
from .finding import Finding
from .kinds import FindingKind
from .limits import Below, Range
from .telemetry import RunState, TelemetryBatch


class Detector(ABC):
    """A streaming detector: settings in ``__init__``, state between ``update`` calls.

    A concrete detector declares its ``name`` (a detector that emits one kind is named
    after it), the ``kinds`` of finding it emits and the ``limits`` of every keyword
    setting of its ``__init__`` (and the ``orders`` between them); the settings are checked against them before
    ``__init__`` runs (``DetectorConfigError`` otherwise). ``update`` takes the rows that
    arrived since the last call and returns the findings it opened or changed (a changed
    finding keeps its ``finding_id``). Feeding a run in one batch or in many gives the
    same findings. ``finish`` closes what the end of the data settles (a run that ended);
    ``tick`` lets time pass without data (a live hang).
    """

    name: ClassVar[str]
    kinds: ClassVar[tuple[FindingKind, ...]]
    limits: ClassVar[Mapping[str, Range]]
    orders: ClassVar[tuple[Below, ...]] = ()
    """Pairs of settings that only work in one order (a recovery bar below the alarm bar)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A detector that names itself must declare what the contract needs, or its module fails to load with
        an error that says what is missing."""
        super().__init_subclass__(**kwargs)
        if "name" not in vars(cls):
            return  # a base that concrete detectors specialise
        kinds = getattr(cls, "kinds", ())
        if not kinds or not all(isinstance(kind, FindingKind) for kind in kinds):
            raise DetectorConfigError(
                f"detector {cls.name!r} must declare kinds: the FindingKind of each finding it emits"
            )
        settings = [p.name for p in list(inspect.signature(cls.__init__).parameters.values())[1:]]
        limits = getattr(cls, "limits", None)
        if limits is None or set(limits) != set(settings):
            declared = sorted(limits or ())
            raise DetectorConfigError(
                f"detector {cls.name!r} must declare the range of each setting in limits: "
                f"its settings are {sorted(settings)}, its limits {declared}"
            )

    def __new__(cls, *args: Any, **settings: Any) -> Self:
        chosen = cls.settings(*args, **settings)
        for setting, value in chosen.items():
            cls.limits[setting].check(cls.name, setting, value)
        for order in cls.orders:
            order.check(cls.name, chosen)
        return super().__new__(cls)

    def __init__(self) -> None:
        self.run = RunState()

    @classmethod
    def settings(cls, *args: Any, **settings: Any) -> dict[str, Any]:
        """Every setting the constructor would take from these arguments, defaults filled in."""
        try:
            bound = inspect.signature(cls.__init__).bind(None, *args, **settings)
        except TypeError as exc:
            raise DetectorConfigError(f"bad settings for detector {cls.name!r}: {exc}") from exc
        bound.apply_defaults()
        return dict(list(bound.arguments.items())[1:])  # less ``self``

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each setting's default value."""
        return cls.settings()

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
