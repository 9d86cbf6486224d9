"""The simulator's fault spec language and the faults it parses into.

The language is the trainer's (docs/faults.md): ``NAME:key=value,...``. The key=value
parsing and the step windows are reused from ``trainer/fault_spec.py``, which imports
the standard library only (no torch). Two keys take words instead of numbers
(``shape``, ``phase``); they are taken out before the numeric parse.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bedside.trainer.fault_spec import Spec, Window, one_of, parse_parameters, window_of

from .errors import SimulationError
from .topology import Topology

WINDOW = frozenset({"step", "from", "steps", "every"})
SPAN = frozenset({"step", "from", "steps"})
ONE_STEP = frozenset({"step"})
ONSET = frozenset({"from", "steps"})
TARGET_KEYS = {"job": frozenset(), "rank": frozenset({"rank", "ranks"}),
               "rank_or_zero": frozenset({"rank", "ranks"}), "node": frozenset({"rank", "ranks", "host"})}
SPIKE_DECAY_STEPS = 3.0  # a grad_leading spike decays as exp(-steps after the peak / this)


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
    """One fault of the language: its keys, defaults, targets and the finding it should produce."""

    name: str
    expected_kind: str
    timing: frozenset[str]
    targets: str
    settings: Mapping[str, Setting] = field(default_factory=dict)
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    magnitude: str | None = None
    shards: bool = False

    @property
    def keys(self) -> frozenset[str]:
        shards = {"shard", "shards"} if self.shards else set()
        return self.timing | TARGET_KEYS[self.targets] | set(self.settings) | set(self.choices) | shards


FAULT_TYPES: dict[str, FaultType] = {t.name: t for t in (
    FaultType("spike", "loss_spike", ONE_STEP, "job", {"sigma": Setting(8.0, 0.0), "lead": Setting(5, 0, integer=True)},
              {"shape": ("single", "grad_leading", "divergent")}, magnitude="sigma"),
    FaultType("nan", "nonfinite", WINDOW, "rank_or_zero"),
    FaultType("inf", "nonfinite", WINDOW, "rank_or_zero"),
    FaultType("straggler", "straggler", WINDOW, "node", {"factor": Setting(2.0, 1.0, 100.0)},
              {"phase": ("compute", "data")}, magnitude="factor"),
    FaultType("sdc_grad", "sdc", WINDOW, "rank", {"scale_log2": Setting(4, 0, 60, integer=True)},
              magnitude="scale_log2"),
    FaultType("sdc_quiet", "sdc", WINDOW, "rank", {"rel": Setting(0.001, 0.0, 0.5)}, magnitude="rel"),
    FaultType("param_corrupt", "sdc", ONE_STEP, "rank"),
    FaultType("eval_stall", "eval_stall", ONSET, "job"),
    FaultType("hang", "hang", ONE_STEP, "node", {"timeout_s": Setting(600.0, 0.0)}),
    FaultType("bad_shard", "bad_shard", SPAN, "job", {"excess": Setting(1.0, 0.0)}, magnitude="excess", shards=True),
    FaultType("throughput_drop", "throughput_drop", SPAN, "job", {"factor": Setting(0.8, 0.0, 0.99)},
              magnitude="factor"),
)}


@dataclass(frozen=True)
class Fault:
    """A parsed fault: the steps it covers, the ranks it hits (every rank when job-wide) and its settings."""

    spec: str
    type: FaultType
    window: Window
    ranks: tuple[int, ...]
    settings: dict[str, Any]

    @property
    def name(self) -> str:
        return self.type.name

    @property
    def onset(self) -> int:
        """The step the fault is defined at: a spike's peak, otherwise the window's first step."""
        return self.settings.get("peak", self.window.first)

    def mask(self, steps: np.ndarray) -> np.ndarray:
        """Which of ``steps`` the fault covers."""
        w = self.window
        last = np.iinfo(np.int64).max if w.last is None else w.last
        return (steps >= w.first) & (steps <= last) & ((steps - w.first) % w.every == 0)

    def label(self) -> dict[str, Any]:
        """The ``args`` of the fault's ground-truth record."""
        w = self.window
        magnitude = self.settings[self.type.magnitude] if self.type.magnitude else None
        return {"spec": self.spec, "first": w.first, "last": w.last, "every": w.every, "magnitude": magnitude,
                "expected_kind": self.type.expected_kind, **self.settings}


def parse_faults(texts: tuple[str, ...], topology: Topology, steps: int) -> tuple[Fault, ...]:
    """Every spec parsed, checked against the run and against a hang that would stop it first."""
    faults = tuple(parse_fault(text, topology, steps) for text in texts)
    hangs = [f for f in faults if f.name == "hang"]
    if len(hangs) > 1:
        raise SimulationError(f"bad fault spec {hangs[1].spec!r}: a run hangs once (also {hangs[0].spec!r})")
    if hangs and hangs[0].onset < 2:
        raise SimulationError(f"bad fault spec {hangs[0].spec!r}: a hang needs step >= 2 (one step to compare with)")
    for fault in faults:
        if hangs and fault is not hangs[0] and fault.onset >= hangs[0].onset:
            raise SimulationError(f"bad fault spec {fault.spec!r}: step {fault.onset} is never reached, "
                                  f"the run hangs at step {hangs[0].onset}")
    return faults


def parse_fault(text: str, topology: Topology, steps: int) -> Fault:
    """The fault ``text`` describes; SimulationError naming the spec and the problem otherwise."""
    try:
        name, _, body = text.partition(":")
        ftype = FAULT_TYPES.get(name.strip())
        if ftype is None:
            raise ValueError(f"unknown fault {name.strip()!r} (known: {', '.join(sorted(FAULT_TYPES))})")
        body, words = take_choices(body, ftype.choices)
        spec = Spec(text, ftype.name, parse_parameters(body, ftype.name, ftype.keys))
        settings = {**words, **_numbers(spec, ftype), **_shards(spec, ftype), **_host(spec)}
        window = _window(spec, ftype, settings)
        if window.first > steps:
            raise ValueError(f"step {window.first} is after the run's last step {steps}")
        return Fault(text, ftype, window, _targets(spec, ftype, topology), settings)
    except ValueError as exc:
        raise SimulationError(f"bad fault spec {text!r}: {exc}") from None


def take_choices(body: str, choices: Mapping[str, tuple[str, ...]]) -> tuple[str, dict[str, str]]:
    """Split the word-valued keys out of a spec's body: (the rest of the body, each word or its default)."""
    rest, words = [], {}
    for item in body.split(",") if body.strip() else []:
        key, _, value = (part.strip() for part in item.partition("="))
        if key not in choices:
            rest.append(item)
        elif key in words:
            raise ValueError(f"{key} is given twice")
        elif value not in choices[key]:
            raise ValueError(f"{key} must be one of {', '.join(choices[key])}, got {value!r}")
        else:
            words[key] = value
    return ",".join(rest), {key: words.get(key, allowed[0]) for key, allowed in choices.items()}


def _numbers(spec: Spec, ftype: FaultType) -> dict[str, float | int]:
    return {key: setting.check(key, spec.get(key, setting.default)) for key, setting in ftype.settings.items()}


def _shards(spec: Spec, ftype: FaultType) -> dict[str, list[int]]:
    return {"shards": list(one_of(spec, "shard", "shards"))} if ftype.shards else {}


def _host(spec: Spec) -> dict[str, int]:
    if spec.get("host") is None:
        return {}
    host = spec.get("host")
    if host < 0 or not float(host).is_integer():
        raise ValueError(f"host must be a whole number >= 0, got {host:g}")
    return {"host": int(host)}


def _window(spec: Spec, ftype: FaultType, settings: dict[str, Any]) -> Window:
    """The steps the fault covers; a spike's spans its lead-in and recovery around ``step``."""
    if ftype.timing == ONSET and spec.get("from") is None:
        raise ValueError(f"{ftype.name} needs from=")
    window = window_of(spec, ftype.timing)
    if ftype.name != "spike":
        return window
    peak, shape = window.first, settings["shape"]
    settings["peak"] = peak
    if shape == "divergent":
        return Window(peak)
    if shape == "single":
        return window
    if peak - settings["lead"] < 1:
        raise ValueError(f"a grad_leading spike at step {peak} needs lead < {peak}, got {settings['lead']}")
    recovery = math.ceil(SPIKE_DECAY_STEPS * math.log(2 * settings["sigma"])) if settings["sigma"] > 0.5 else 0
    return Window(peak - settings["lead"], peak + recovery)


def _targets(spec: Spec, ftype: FaultType, topology: Topology) -> tuple[int, ...]:
    """The ranks the fault hits: every rank for a job-wide fault, a host's ranks for ``host=``."""
    if ftype.targets == "job":
        return tuple(range(topology.ranks))
    given = [key for key in ("rank", "ranks", "host") if spec.get(key) is not None]
    if "host" in given:
        if len(given) > 1:
            raise ValueError("give host= or rank=/ranks=, not both")
        if spec.get("host") >= topology.hosts:
            raise ValueError(f"host {spec.get('host'):g} is out of range: hosts are 0 to {topology.hosts - 1}")
        return topology.host_ranks(int(spec.get("host")))
    if not given and ftype.targets == "rank_or_zero":
        return (0,)
    if not given and ftype.targets == "node":
        raise ValueError(f"{ftype.name} needs rank=, ranks= or host=")
    first, last = one_of(spec, "rank", "ranks")
    if last >= topology.ranks:
        raise ValueError(f"rank {last} is out of range for world size {topology.ranks}")
    return tuple(range(first, last + 1))
