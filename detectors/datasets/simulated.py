"""``simulate``: a seeded synthetic run of a synchronous data x pipeline parallel job, with its ground truth.

As ruptures' ``pw_constant`` returns a signal and its breakpoints, ``simulate`` returns every
signal of the run, when each record falls, and the labels of its faults. The same config,
seed included, gives the same run; ``bedside simulate`` writes it as a run directory
(app/simulation/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..faults import Label
from .checksums import Checksums
from .config import SimulationConfig
from .effects import apply_fault
from .faults import Fault
from .frames import run_frames
from .models import build_traces
from .nuisances import Nuisances, apply_nuisances, draw_nuisances
from .reports import eval_fields, nonfinite_logs
from .schedule import Schedule, build_schedule
from .traces import Timing, Traces, compose_timing


@dataclass(frozen=True)
class SimulatedRun:
    """One simulated run: its signals (``traces``, ``timing``, ``checksums``), its clock and its faults."""

    config: SimulationConfig
    nuisances: Nuisances
    traces: Traces
    timing: Timing
    checksums: Checksums
    schedule: Schedule

    @property
    def faults(self) -> list[Fault]:
        """The injected faults by first step."""
        return sorted(self.config.faults, key=lambda f: f.window.first)

    @property
    def labels(self) -> list[Label]:
        """The ground truth: one label per fault, by first step."""
        return [fault.label() for fault in self.faults]

    @property
    def step_start(self) -> np.ndarray:
        """When each completed step started (unix seconds)."""
        return self.schedule.step_end - self.timing.step_time[: self.config.last_step]

    def frames(self) -> dict[str, Any]:
        """The run's telemetry as ``bedside.detectors.detect`` takes it: ``detect(**run.frames())``.

        The frames are those the service's store feed gives once the run is written and ingested
        (detectors/datasets/frames.py).
        """
        return run_frames(self)

    def onset_time(self, fault: Fault) -> float:
        """When ``fault``'s first step started; for a step never started (a hang's), when the run went idle."""
        first = fault.window.first
        return float(self.step_start[first - 1]) if first <= len(self.step_start) else self.schedule.idle_from


def simulate(config: SimulationConfig) -> SimulatedRun:
    """The run ``config`` describes: a healthy baseline, then its nuisances, then its faults."""
    nuisances = draw_nuisances(config)
    traces = build_traces(config, nuisances.warmup, nuisances.anneal)
    apply_nuisances(nuisances, traces, config)
    for fault in config.faults:
        apply_fault(fault, traces, config)
    timing = compose_timing(traces.data, traces.compute, traces.optimizer, traces.comm, traces.slowdown)
    schedule = build_schedule(
        config, nuisances, timing.step_time, eval_fields(config, traces, nuisances), nonfinite_logs(traces)
    )
    return SimulatedRun(config, nuisances, traces, timing, Checksums(config, traces.corruptions), schedule)
