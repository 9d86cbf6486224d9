"""The simulator's faults: specs of ``SIMULATED_FAULTS`` (detectors/faults.py) parsed and checked against a run.

A spike's window spans its lead-in and recovery around its peak, and a run hangs at most once,
before every other fault's onset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..faults import (
    SIMULATED_FAULTS,
    FaultType,
    Label,
    Spec,
    Window,
    label_args,
    parse_spec,
    settings_of,
    target_ranks,
    window_of,
)
from .errors import SimulationError
from .topology import Topology

SPIKE_DECAY_STEPS = 3.0  # a grad_leading spike decays as exp(-steps after the peak / this)


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

    def label(self) -> Label:
        """The fault's ground truth."""
        return Label(self.name, self.type.expected_kind, self.window, self.ranks, self.spec, self.magnitude)

    @property
    def magnitude(self) -> Any:
        return self.settings[self.type.magnitude] if self.type.magnitude else None

    def args(self) -> dict[str, Any]:
        """The ``args`` of the fault's ground-truth record."""
        return label_args(self.spec, self.type, self.window, self.settings, magnitude=self.magnitude)


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
            raise SimulationError(
                f"bad fault spec {fault.spec!r}: step {fault.onset} is never reached, "
                f"the run hangs at step {hangs[0].onset}"
            )
    return faults


def parse_fault(text: str, topology: Topology, steps: int) -> Fault:
    """The fault ``text`` describes; SimulationError naming the spec and the problem otherwise."""
    try:
        ftype, spec = parse_spec(text, SIMULATED_FAULTS)
        settings = {**settings_of(spec, ftype), **_host(spec)}
        window = _window(spec, ftype, settings)
        if window.first > steps:
            raise ValueError(f"step {window.first} is after the run's last step {steps}")
        hosts = [topology.host_ranks(host) for host in range(topology.hosts)] if "host" in settings else []
        return Fault(text, ftype, window, target_ranks(spec, ftype, topology.ranks, hosts), settings)
    except ValueError as exc:
        raise SimulationError(f"bad fault spec {text!r}: {exc}") from None


def _host(spec: Spec) -> dict[str, int]:
    if spec.get("host") is None:
        return {}
    host = spec.get("host")
    if host < 0 or not float(host).is_integer():
        raise ValueError(f"host must be a whole number >= 0, got {host:g}")
    return {"host": int(host)}


def _window(spec: Spec, ftype: FaultType, settings: dict[str, Any]) -> Window:
    """The steps the fault covers; a spike's spans its lead-in and recovery around ``step``."""
    window = window_of(spec, ftype)
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
