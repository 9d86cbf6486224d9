"""The fault catalog: every fault the trainer and the simulator inject, the spec language that
names them, and the ground truth they leave.

A spec is ``NAME:key=value,...`` (docs/faults.md, docs/simulate.md). Each fault has a type
here: its keys, the ranks it targets, its numeric settings (defaults and ranges), its
word-valued keys, and ``expected_kind``, the finding a detector should report for it, which
its ground-truth record carries and the scoring reads. The trainer and the simulator each
inject their own set (``TRAINER_FAULTS``, ``SIMULATED_FAULTS``): a name both know
(``straggler``, ``bad_shard``, ...) takes the keys its injector implements and expects the
finding its signature gives there. Standard library only: the trainer imports this module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TIMING = frozenset({"step", "from", "steps", "every"})
SPAN = frozenset({"step", "from", "steps"})
ONE_STEP = frozenset({"step"})
ONSET = frozenset({"from", "steps"})
RANKS = frozenset({"rank", "ranks"})
TARGET_KEYS = {"job": frozenset(), "rank": RANKS, "rank_or_zero": RANKS, "node": RANKS | {"host"}}
_INT_KEYS = frozenset({"rank", "shard", "step", "from", "steps", "every", "bit", "index", "seed", "code"})
_RANGE_KEYS = frozenset({"ranks", "shards"})
_POSITIVE_KEYS = ("step", "from", "steps", "every")


@dataclass(frozen=True)
class Window:
    """Steps ``first`` to ``last`` inclusive (``None``: to the end), every ``every``-th from ``first``."""

    first: int
    last: int | None = None
    every: int = 1

    def covers(self, steps: Any) -> Any:
        """Whether ``steps`` (one step, or a numpy array of them) are in the window."""
        inside = (steps >= self.first) & ((steps - self.first) % self.every == 0)
        return inside if self.last is None else inside & (steps <= self.last)


@dataclass(frozen=True)
class Setting:
    """A numeric setting: its default and range, ``low`` excluded and ``high`` included."""

    default: float
    low: float
    high: float = math.inf
    integer: bool = False

    def check(self, key: str, value: float) -> float | int:
        if not self.low < value <= self.high:
            upper = f" and <= {self.high:g}" if math.isfinite(self.high) else ""
            raise ValueError(f"{key} must be > {self.low:g}{upper}, got {value:g}")
        if self.integer and not float(value).is_integer():
            raise ValueError(f"{key} must be a whole number, got {value:g}")
        return int(value) if self.integer else float(value)


@dataclass(frozen=True)
class FaultType:
    """One fault of the language: its keys, targets, settings and the finding it should produce.

    ``targets``: ``job`` (every rank), ``rank`` (``rank=``/``ranks=``), ``rank_or_zero`` (rank 0
    unless given) or ``node`` (ranks or ``host=``). ``extra`` keys are checked by the injector
    itself; ``each_firing`` faults are recorded at every step they fire, not once.
    """

    name: str
    expected_kind: str
    timing: frozenset[str]
    targets: str
    settings: Mapping[str, Setting] = field(default_factory=dict)
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    magnitude: str | None = None
    shards: bool = False
    extra: frozenset[str] = frozenset()
    each_firing: bool = False

    @property
    def keys(self) -> frozenset[str]:
        shards = {"shard", "shards"} if self.shards else set()
        return self.timing | TARGET_KEYS[self.targets] | set(self.settings) | set(self.choices) | shards | self.extra


def _catalog(*types: FaultType) -> dict[str, FaultType]:
    return {t.name: t for t in types}


TRAINER_FAULTS = _catalog(
    FaultType("straggler", "straggler", TIMING, "rank", extra=frozenset({"factor", "delay_ms"})),
    FaultType("hang", "hang", ONE_STEP, "rank"),
    FaultType("crash", "hang", ONE_STEP, "rank", choices={"save": ("lost", "kept")}, extra=frozenset({"code"})),
    FaultType("bad_shard", "loss_spike", SPAN, "job", shards=True, extra=frozenset({"seed"})),
    FaultType("repeat_batch", "eval_stall", SPAN, "job"),
    FaultType("shuffle_targets", "eval_stall", SPAN, "job", extra=frozenset({"seed"})),
    FaultType("lr_blip", "loss_spike", SPAN, "job", extra=frozenset({"factor"})),
    FaultType("nan", "nonfinite", TIMING, "rank", each_firing=True),
    FaultType("inf", "nonfinite", TIMING, "rank", each_firing=True),
    FaultType("grad_bitflip", "sdc", TIMING, "rank", extra=frozenset({"bit", "index", "seed"}), each_firing=True),
    FaultType("param_bitflip", "sdc", TIMING, "rank", extra=frozenset({"bit", "index", "seed"}), each_firing=True),
)
"""The trainer's faults (trainer/faults.py). ``bad_shard`` expects a loss spike: the tiny runs read
most shards every step, so no shard stands out. ``grad_bitflip`` expects ``sdc``: the flipped top
exponent bit makes the rank's local gradient norm an outlier (the sdc detector names the rank), and
the all-reduced norm infinite, which the nonfinite finding reports as well."""

SIMULATED_FAULTS = _catalog(
    FaultType(
        "spike",
        "loss_spike",
        ONE_STEP,
        "job",
        {"sigma": Setting(8.0, 0.0), "lead": Setting(5, 0, integer=True)},
        {"shape": ("single", "grad_leading", "divergent")},
        magnitude="sigma",
    ),
    FaultType("nan", "nonfinite", TIMING, "rank_or_zero"),
    FaultType("inf", "nonfinite", TIMING, "rank_or_zero"),
    FaultType(
        "straggler",
        "straggler",
        TIMING,
        "node",
        {"factor": Setting(2.0, 1.0, 100.0)},
        {"phase": ("compute", "data")},
        magnitude="factor",
    ),
    FaultType(
        "sdc_grad", "sdc", TIMING, "rank", {"scale_log2": Setting(4, 0, 60, integer=True)}, magnitude="scale_log2"
    ),
    FaultType("sdc_quiet", "sdc", TIMING, "rank", {"rel": Setting(0.001, 0.0, 0.5)}, magnitude="rel"),
    FaultType("param_corrupt", "sdc", ONE_STEP, "rank"),
    FaultType("eval_stall", "eval_stall", ONSET, "job"),
    FaultType("hang", "hang", ONE_STEP, "node", {"timeout_s": Setting(600.0, 0.0)}),
    FaultType("bad_shard", "bad_shard", SPAN, "job", {"excess": Setting(1.0, 0.0)}, magnitude="excess", shards=True),
    FaultType(
        "throughput_drop", "throughput_drop", SPAN, "job", {"factor": Setting(0.8, 0.0, 0.99)}, magnitude="factor"
    ),
)
"""The simulator's faults (detectors/datasets/effects.py). A name the trainer knows too differs from the
trainer's only in the facts ``SHARED_FAULT_DIFFERENCES`` (tests/test_scoring.py) allows, each for the reason
given there: one table per injector, since the two share little more than the name and the timing."""


@dataclass(frozen=True)
class Spec:
    """One parsed spec: the fault's name and its typed parameters."""

    text: str
    name: str
    values: dict[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def parse_spec(text: str, catalog: Mapping[str, FaultType]) -> tuple[FaultType, Spec]:
    """The fault type ``text`` names in ``catalog`` and its typed parameters; ValueError otherwise."""
    name, _, body = text.partition(":")
    ftype = catalog.get(name.strip())
    if ftype is None:
        raise ValueError(f"unknown fault {name.strip()!r} (known: {', '.join(sorted(catalog))})")
    return ftype, Spec(text, ftype.name, parse_parameters(body, ftype))


def parse_parameters(body: str, ftype: FaultType) -> dict[str, Any]:
    """The typed ``key=value`` parameters of a spec's body, checked against the fault's keys."""
    values: dict[str, Any] = {}
    keys = ftype.keys
    for item in body.split(",") if body.strip() else []:
        key, eq, value = (part.strip() for part in item.partition("="))
        if not (key and eq and value):
            raise ValueError(f"expected key=value, got {item.strip()!r}")
        if key not in keys:
            raise ValueError(f"unknown parameter {key!r} for {ftype.name} (known: {', '.join(sorted(keys))})")
        if key in values:
            raise ValueError(f"{key} is given twice")
        values[key] = _word(key, value, ftype.choices[key]) if key in ftype.choices else typed_value(key, value)
    for key in _POSITIVE_KEYS:
        if key in values and values[key] < 1:
            raise ValueError(f"{key} must be >= 1, got {values[key]}")
    return values


def _word(key: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{key} must be one of {', '.join(allowed)}, got {value!r}")
    return value


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


def settings_of(spec: Spec, ftype: FaultType) -> dict[str, Any]:
    """The fault's words and numeric settings, defaults filled in and ranges checked; its shard range."""
    words = {key: spec.get(key, allowed[0]) for key, allowed in ftype.choices.items()}
    numbers = {key: setting.check(key, spec.get(key, setting.default)) for key, setting in ftype.settings.items()}
    shards = {"shards": list(one_of(spec, "shard", "shards"))} if ftype.shards else {}
    return {**words, **numbers, **shards}


def one_of(spec: Spec, single: str, ranged: str) -> tuple[int, int]:
    """``single=N`` or ``ranged=A-B`` (exactly one), as an inclusive range."""
    if (spec.get(single) is None) == (spec.get(ranged) is None):
        raise ValueError(f"{spec.name} needs {single}= or {ranged}= (one of them)")
    if spec.get(single) is not None:
        if spec.get(single) < 0:
            raise ValueError(f"{single} must be >= 0, got {spec.get(single)}")
        return spec.get(single), spec.get(single)
    return spec.get(ranged)


def window_of(spec: Spec, ftype: FaultType) -> Window:
    """The steps a spec names: ``step=`` (one, or ``steps=`` from it) or ``from=`` (to the end, or ``steps=``)."""
    if ftype.timing == ONSET and spec.get("from") is None:
        raise ValueError(f"{ftype.name} needs from=")
    step, start = spec.get("step"), spec.get("from")
    if (step is None) == (start is None):
        raise ValueError(f"{spec.name} needs {'step= or from= (one of them)' if 'from' in ftype.timing else 'step='}")
    if step is not None and spec.get("every") is not None:
        raise ValueError("every= needs from=, not step=")
    first = step if step is not None else start
    steps = spec.get("steps", 1 if step is not None else None)
    return Window(first, None if steps is None else first + steps - 1, spec.get("every", 1))


def target_ranks(
    spec: Spec, ftype: FaultType, world_size: int, hosts: Sequence[tuple[int, ...]] = ()
) -> tuple[int, ...]:
    """The ranks a fault hits: every rank for a job-wide fault, a host's ranks (``hosts``) for ``host=``."""
    if ftype.targets == "job":
        return tuple(range(world_size))
    given = [key for key in ("rank", "ranks", "host") if spec.get(key) is not None]
    if "host" in given:
        host = spec.get("host")
        if len(given) > 1:
            raise ValueError("give host= or rank=/ranks=, not both")
        if host >= len(hosts):
            raise ValueError(f"host {host:g} is out of range: hosts are 0 to {len(hosts) - 1}")
        return hosts[int(host)]
    if not given and ftype.targets == "rank_or_zero":
        return (0,)
    if not given and ftype.targets == "node":
        raise ValueError(f"{ftype.name} needs rank=, ranks= or host=")
    first, last = one_of(spec, "rank", "ranks")
    if last >= world_size:
        raise ValueError(f"rank {last} is out of range for world size {world_size}")
    return tuple(range(first, last + 1))


# -- ground truth ---------------------------------------------------------------------


def label_args(
    spec: str, ftype: FaultType, window: Window, settings: Mapping[str, Any], **notes: Any
) -> dict[str, Any]:
    """The ``args`` of a fault's ``fault_injected`` record: spec, window, ``notes``, expected kind, settings."""
    return {
        "spec": spec,
        "first": window.first,
        "last": window.last,
        "every": window.every,
        **notes,
        "expected_kind": ftype.expected_kind,
        **settings,
    }


@dataclass(frozen=True)
class Label:
    """One injected fault as its ground truth tells it: the finding expected, the steps and ranks it covers.

    The steps are the window of its spec on the ``timeline`` it was injected on (a rewind starts a
    new one, and a fault fired again after it is a label of its own); an open-ended window
    (``last`` null) is scored from its first step. A job-wide fault covers every rank
    (``target_ranks``), a fault of one rank or host those ranks.
    """

    fault: str
    expected_kind: str
    window: Window
    ranks: tuple[int, ...]
    spec: str = ""
    magnitude: Any = None
    timeline: int = 0

    @property
    def first(self) -> int:
        return self.window.first

    @property
    def last(self) -> int:
        """The last step a finding is measured against: the window's, or its first when open-ended."""
        return self.window.first if self.window.last is None else self.window.last

    @classmethod
    def from_record(cls, step: int, fault: str, target_ranks: Any, args: Any, timeline: int = 0) -> Label:
        """A label from a ``fault_labels`` row (``target_ranks`` and ``args`` as JSON text or decoded)."""
        a = json.loads(args) if isinstance(args, str) else dict(args)
        ranks = json.loads(target_ranks) if isinstance(target_ranks, str) else (target_ranks or [])
        first = int(a.get("first", step))
        window = Window(first, None if a.get("last") is None else int(a["last"]), int(a.get("every") or 1))
        return cls(
            fault,
            a["expected_kind"],
            window,
            tuple(int(r) for r in ranks),
            a.get("spec", ""),
            a.get("magnitude"),
            int(timeline),
        )
