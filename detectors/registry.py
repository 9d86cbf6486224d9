"""Every detector bedside ships, found by looking: each module of this package is imported once, and each
concrete ``Detector`` subclass defined there is registered by its ``name``. Adding a detector is adding its
file; nothing has to be imported first."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings
from functools import cache
from types import MappingProxyType
from typing import Any

from .detector import Detector
from .errors import DetectorConfigError
from .kinds import FindingKind

PACKAGE = __name__.rpartition(".")[0]
RENAMED = MappingProxyType({"throughput": "throughput_drop"})
"""Old detector names still accepted in settings and ``only`` (with a warning), and their names now."""


@cache
def detector_classes() -> MappingProxyType[str, type[Detector]]:
    """Every detector class by name, sorted by name."""
    found: dict[str, type[Detector]] = {}
    package = importlib.import_module(PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg:
            continue
        module = importlib.import_module(f"{PACKAGE}.{info.name}")
        for cls in vars(module).values():
            if not _is_detector(cls) or cls.__module__ != module.__name__:
                continue
            if cls.name in found:
                raise DetectorConfigError(f"two detectors are named {cls.name!r}")
            found[cls.name] = cls
    return MappingProxyType(dict(sorted(found.items())))


def _is_detector(cls: object) -> bool:
    return inspect.isclass(cls) and issubclass(cls, Detector) and not inspect.isabstract(cls) and "name" in vars(cls)


def detector_names() -> tuple[str, ...]:
    """The registered detectors' names, sorted."""
    return tuple(detector_classes())


@cache
def finding_kinds() -> MappingProxyType[str, FindingKind]:
    """Every kind of finding the registered detectors declare, by name (in detector order)."""
    kinds: dict[str, FindingKind] = {}
    for name, cls in detector_classes().items():
        for kind in cls.kinds:
            if kind.name in kinds:
                raise DetectorConfigError(f"detector {name!r} declares kind {kind.name!r}, declared already")
            kinds[kind.name] = kind
    return MappingProxyType(kinds)


def build_detectors(settings: dict[str, dict[str, Any]] | None = None, only: list[str] | None = None) -> list[Detector]:
    """One instance of every registered detector (or those in ``only``), with ``settings`` by name."""
    settings = {_current(name): value for name, value in (settings or {}).items()}
    wanted = None if only is None else {_current(name) for name in only}
    classes = detector_classes()
    unknown = sorted((set(settings) | (wanted or set())) - set(classes))
    if unknown:
        raise DetectorConfigError(f"unknown detector {', '.join(unknown)} (known: {', '.join(classes)})")
    return [cls(**settings.get(name, {})) for name, cls in classes.items() if wanted is None or name in wanted]


def _current(name: str) -> str:
    """The detector's name now; an old name is taken with a warning."""
    if name not in RENAMED:
        return name
    warnings.warn(
        f"detector {name!r} is now named {RENAMED[name]!r}; the old name will stop working", FutureWarning, stacklevel=3
    )
    return RENAMED[name]
