"""The fault spec language: ``NAME:key=value,...`` parsed into typed parameters and
step windows (docs/faults.md). The faults themselves are in ``faults.py``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Window:
    """Steps ``first`` to ``last`` inclusive (``None``: to the end), every ``every``-th from ``first``."""

    first: int
    last: int | None = None
    every: int = 1

    def covers(self, step: int) -> bool:
        if step < self.first or (self.last is not None and step > self.last):
            return False
        return self.every == 1 or (step - self.first) % self.every == 0


@dataclass(frozen=True)
class Spec:
    """One parsed spec: the fault's name and its typed parameters."""

    text: str
    name: str
    values: dict[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


TIMING = frozenset({"step", "from", "steps", "every"})
RANKS = frozenset({"rank", "ranks"})
_INT_KEYS = frozenset({"rank", "shard", "step", "from", "steps", "every", "bit", "index", "seed", "code"})
_RANGE_KEYS = frozenset({"ranks", "shards"})
_POSITIVE_KEYS = ("step", "from", "steps", "every")



def parse_parameters(body: str, name: str, keys: frozenset[str]) -> dict[str, Any]:
    """The typed ``key=value`` parameters of a spec's body, checked against the fault's ``keys``."""
    values: dict[str, Any] = {}
    for item in body.split(",") if body.strip() else []:
        key, eq, value = (part.strip() for part in item.partition("="))
        if not (key and eq and value):
            raise ValueError(f"expected key=value, got {item.strip()!r}")
        if key not in keys:
            raise ValueError(f"unknown parameter {key!r} for {name} (known: {', '.join(sorted(keys))})")
        if key in values:
            raise ValueError(f"{key} is given twice")
        values[key] = typed_value(key, value)
    for key in _POSITIVE_KEYS:
        if key in values and values[key] < 1:
            raise ValueError(f"{key} must be >= 1, got {values[key]}")
    return values


def typed_value(key: str, value: str) -> Any:
    if key in _RANGE_KEYS:
        first, dash, last = value.partition("-")
        if not (first.isdigit() and (not dash or last.isdigit())) or (dash and int(first) > int(last)):
            raise ValueError(f"{key} must be N or A-B with A <= B, got {value!r}")
        return (int(first), int(last) if dash else int(first))
    if key in _INT_KEYS:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{key} must be an integer, got {value!r}") from None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    return number


def one_of(spec: Spec, single: str, ranged: str) -> tuple[int, int]:
    """``single=N`` or ``ranged=A-B`` (exactly one), as an inclusive range."""
    if (spec.get(single) is None) == (spec.get(ranged) is None):
        raise ValueError(f"{spec.name} needs {single}= or {ranged}= (one of them)")
    if spec.get(single) is not None:
        if spec.get(single) < 0:
            raise ValueError(f"{single} must be >= 0, got {spec.get(single)}")
        return spec.get(single), spec.get(single)
    return spec.get(ranged)


def window_of(spec: Spec, keys: frozenset[str]) -> Window:
    step, start = spec.get("step"), spec.get("from")
    if (step is None) == (start is None):
        raise ValueError(f"{spec.name} needs {'step= or from= (one of them)' if 'from' in keys else 'step='}")
    if step is not None and spec.get("every") is not None:
        raise ValueError("every= needs from=, not step=")
    first = step if step is not None else start
    steps = spec.get("steps", 1 if step is not None else None)
    return Window(first, None if steps is None else first + steps - 1, spec.get("every", 1))
