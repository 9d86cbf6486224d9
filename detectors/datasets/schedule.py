"""When things happen: the end of every step, and the records written between steps and at the end."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .config import SimulationConfig
from .nuisances import DOWNTIME_S, LOAD_S, Nuisances

STARTUP_S = 30.0  # from rank_info to the start of step 1
RUN_END_S = 1.0  # from the last step (and what follows it) to run_end
CHECKPOINT_BYTES_PER_PARAM = 14  # bf16 weights, fp32 master weights and two Adam moments


@dataclass(frozen=True)
class Event:
    """A record written between steps, by ``who``: ``all`` ranks, ``rank0``, or the ``peers`` of a hung rank."""

    time: float
    step: int
    kind: str
    who: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Schedule:
    """The run's clock: rank_info at ``start``, each completed step's end, what comes between and after.

    ``idle_from`` is when the last step and the records following it are done.
    """

    start: float
    step_end: np.ndarray
    idle_from: float
    between: dict[int, list[Event]]
    ending: list[Event]


def build_schedule(
    config: SimulationConfig,
    nuisances: Nuisances,
    step_time: np.ndarray,
    evals: dict[int, dict[str, Any]],
    logs: dict[int, dict[str, Any]],
) -> Schedule:
    """Step ends from the step times and the stalls between steps (evals, checkpoints, a restart)."""
    last = config.last_step
    marked = set(nuisances.eval_s) | set(nuisances.checkpoint_s) | set(logs)
    plans = {s: _between(s, config, nuisances, evals.get(s), logs.get(s)) for s in sorted(marked) if s <= last}
    gaps = np.zeros(last)
    for step, (_, gap) in plans.items():
        gaps[step - 1] = gap
    ends = config.start_time + STARTUP_S + np.cumsum(step_time[:last] + np.concatenate(([0.0], gaps[:-1])))
    between = {s: [replace(e, time=float(ends[s - 1]) + e.time) for e in events] for s, (events, _) in plans.items()}
    idle_from = float(ends[-1] + gaps[-1])
    return Schedule(config.start_time, ends, idle_from, between, _ending(config, idle_from))


def _between(
    step: int, config: SimulationConfig, nuisances: Nuisances, eval_fields: dict | None, log_fields: dict | None
) -> tuple[list[Event], float]:
    """The records after ``step``, timed from its end, and how long the job stalls before the next step."""
    events = [Event(0.0, step, "log", "rank0", log_fields)] if log_fields else []
    clock = 0.0
    if eval_fields is not None:
        clock += nuisances.eval_s[step]
        events.append(Event(clock, step, "eval", "rank0", eval_fields))
    if step in nuisances.checkpoint_s:
        events.append(_checkpoint(clock, step, "save_started", config))
        clock += nuisances.checkpoint_s[step]
        events.append(_checkpoint(clock, step, "saved", config, nuisances.checkpoint_s[step]))
    beats = np.arange(config.heartbeat_every_s, clock, config.heartbeat_every_s)
    events += [Event(float(t), step, "heartbeat", "all") for t in beats]
    if step == nuisances.resume:
        clock += DOWNTIME_S
        events.append(Event(clock, step, "rank_info", "all"))
        clock += LOAD_S
        events.append(_checkpoint(clock, step, "loaded", config, LOAD_S))
    return sorted(events, key=lambda e: e.time), clock


def _checkpoint(time: float, step: int, event: str, config: SimulationConfig, duration_s: float | None = None) -> Event:
    fields: dict[str, Any] = {"event": event, "path": f"checkpoints/step-{step:08d}"}
    if duration_s is not None:
        fields["metrics"] = {
            "duration_s": round(duration_s, 6),
            "bytes": CHECKPOINT_BYTES_PER_PARAM * config.model.params,
        }
    return Event(time, step, "checkpoint", "rank0", fields)


def _ending(config: SimulationConfig, after_last: float) -> list[Event]:
    """run_end on every rank; after a hang, the peers' heartbeats until the collective times out, then failure."""
    last, hang = config.last_step, config.hang
    if hang is None:
        return [Event(after_last + RUN_END_S, last, "run_end", "all", {"status": "finished"})]
    timeout = hang.settings["timeout_s"]
    beats = np.arange(config.heartbeat_every_s, timeout, config.heartbeat_every_s)
    message = f"collective timed out after {timeout:g} s waiting for step {hang.onset}"
    return [Event(after_last + float(t), last, "heartbeat", "peers") for t in beats] + [
        Event(after_last + timeout, last, "run_end", "peers", {"status": "failed", "message": message})
    ]
