"""Nuisances: what a healthy large run does that must not raise an alarm.

Where they fall is drawn from the run's seed and recorded in run.json
(``config.nuisances``); they are never ground truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import SimulationConfig
from .models import stream
from .traces import Traces

WARMUP_FRACTION, MAX_WARMUP = 0.05, 2000
COMMON_MODE_EVERY = 400  # steps per common-mode slowdown (at least one per run)
COMMON_MODE_STEPS, COMMON_MODE_SLOWDOWN = (5, 30), (1.03, 1.10)
DIURNAL_SWING, DIURNAL_PERIOD_S = (0.01, 0.02), 86400.0
MIXTURE_AT, MIXTURE_SHIFT, MIXTURE_TRANSIENT, MIXTURE_DECAY = 0.6, 0.02, 0.02, 10.0
RESUME_RANGE, DOWNTIME_S, LOAD_S = (0.3, 0.7), 240.0, 20.0
RESUME_BUMP, RESUME_GRAD_BUMP, RESUME_DECAY, RESUME_FIRST_STEP = 0.02, 0.2, 5.0, 2.5
LAST_STAGE_SLOWDOWN = 1.12
JITTER_PROBABILITY, JITTER_SCALE_S, JITTER_TAIL, JITTER_CAP_S = 3e-4, 0.05, 1.5, 10.0
EVAL_S, CHECKPOINT_S = 20.0, 30.0


@dataclass(frozen=True)
class Nuisances:
    """Where this run's nuisances fall. ``Nuisances.off(config)`` has none: constant LR, no stalls."""

    warmup: int
    anneal: bool
    common_mode: tuple[tuple[int, int, float], ...]  # (first, last, slowdown)
    diurnal: tuple[float, float]  # (peak-to-peak swing, phase in radians)
    mixture_switch: int | None
    resume: int | None  # the checkpoint step the job restarts from
    last_stage_slowdown: float
    jitter: np.ndarray  # (n, 3): step, rank, seconds of a one-step data hiccup
    eval_s: dict[int, float]  # eval step -> seconds the job stalls
    checkpoint_s: dict[int, float]  # checkpoint step -> seconds the job stalls

    @classmethod
    def off(cls, config: SimulationConfig) -> Nuisances:
        return cls(
            warmup=0,
            anneal=False,
            common_mode=(),
            diurnal=(0.0, 0.0),
            mixture_switch=None,
            resume=None,
            last_stage_slowdown=1.0,
            jitter=np.zeros((0, 3)),
            eval_s=dict.fromkeys(every(config.eval_every, config.steps), 0.0),
            checkpoint_s=dict.fromkeys(every(config.checkpoint_every, config.steps), 0.0),
        )

    def to_json(self) -> dict[str, Any]:
        """The record of run.json's ``config.nuisances``."""
        return {
            "lr_schedule": {"warmup_steps": self.warmup, "anneal": "cosine" if self.anneal else None},
            "common_mode": [{"first": a, "last": b, "slowdown": round(f, 4)} for a, b, f in self.common_mode],
            "diurnal": {
                "swing": round(self.diurnal[0], 4),
                "phase": round(self.diurnal[1], 4),
                "period_s": DIURNAL_PERIOD_S,
            },
            "mixture_switch": self.mixture_switch
            and {"step": self.mixture_switch, "shift": MIXTURE_SHIFT, "transient": MIXTURE_TRANSIENT},
            "resume": self.resume and {"step": self.resume, "downtime_s": DOWNTIME_S, "load_s": LOAD_S},
            "last_stage_slowdown": self.last_stage_slowdown,
            "jitter": [[int(s), int(r), round(float(t), 4)] for s, r, t in self.jitter],
            "eval_stalls": [[s, round(t, 3)] for s, t in self.eval_s.items()],
            "checkpoint_stalls": [[s, round(t, 3)] for s, t in self.checkpoint_s.items()],
        }


def every(interval: int, steps: int) -> list[int]:
    """Steps ``interval``, ``2 * interval``, ... up to ``steps`` (none for an interval of 0)."""
    return list(range(interval, steps + 1, interval)) if interval else []


def draw_nuisances(config: SimulationConfig) -> Nuisances:
    """This run's nuisances, drawn in a fixed order from its own stream (faults change no draw)."""
    if not config.nuisances:
        return Nuisances.off(config)
    rng, steps = stream(config.seed, "nuisance"), config.steps
    evals, checkpoints = every(config.eval_every, steps), every(config.checkpoint_every, steps)
    return Nuisances(
        warmup=min(MAX_WARMUP, int(steps * WARMUP_FRACTION)),
        anneal=True,
        common_mode=_common_mode(rng, steps),
        diurnal=(float(rng.uniform(*DIURNAL_SWING)), float(rng.uniform(0, 2 * math.pi))),
        mixture_switch=round(steps * MIXTURE_AT) if steps >= 20 else None,
        resume=_resume_step(rng.random(), checkpoints, config),
        last_stage_slowdown=LAST_STAGE_SLOWDOWN if config.pp > 1 else 1.0,
        jitter=_jitter(rng, config),
        eval_s={s: float(EVAL_S * np.exp(0.1 * rng.standard_normal())) for s in evals},
        checkpoint_s={s: float(CHECKPOINT_S * np.exp(0.2 * rng.standard_normal())) for s in checkpoints},
    )


def _common_mode(rng: np.random.Generator, steps: int) -> tuple[tuple[int, int, float], ...]:
    windows = []
    for _ in range(max(1, steps // COMMON_MODE_EVERY)):
        first = int(rng.integers(1, steps + 1))
        length = int(rng.integers(COMMON_MODE_STEPS[0], COMMON_MODE_STEPS[1] + 1))
        windows.append((first, min(steps, first + length - 1), float(rng.uniform(*COMMON_MODE_SLOWDOWN))))
    return tuple(windows)


def _resume_step(draw: float, checkpoints: list[int], config: SimulationConfig) -> int | None:
    """A checkpoint step in the middle of the run that the job restarts from (None when there is none)."""
    low, high = (config.steps * f for f in RESUME_RANGE)
    candidates = [s for s in checkpoints if low <= s <= high and s < config.last_step]
    return candidates[int(draw * len(candidates))] if candidates else None


def _jitter(rng: np.random.Generator, config: SimulationConfig) -> np.ndarray:
    """Rare one-step hiccups of one rank's data loading, Pareto-tailed: (step, rank, seconds), by rank."""
    cells = config.ranks * config.steps
    count = int(rng.binomial(cells, JITTER_PROBABILITY))
    where = np.sort(rng.integers(0, cells, count))
    seconds = np.minimum(JITTER_SCALE_S * (1 + rng.pareto(JITTER_TAIL, count)), JITTER_CAP_S)
    return np.column_stack([where % config.steps + 1, where // config.steps, seconds])


def apply_nuisances(nuisances: Nuisances, traces: Traces, config: SimulationConfig) -> None:
    """Change the healthy run's signals by every nuisance (the LR schedule is in the baseline already)."""
    _slow_down(nuisances, traces, config)
    jitter = nuisances.jitter
    np.add.at(traces.data, (jitter[:, 1].astype(int), jitter[:, 0].astype(int) - 1), jitter[:, 2])
    if nuisances.last_stage_slowdown != 1.0:
        traces.compute[config.topology.stage() == config.pp - 1] *= nuisances.last_stage_slowdown
    if nuisances.mixture_switch:
        after = traces.steps - nuisances.mixture_switch
        traces.log_loss += (after >= 0) * (MIXTURE_SHIFT + MIXTURE_TRANSIENT * np.exp(-after.clip(0) / MIXTURE_DECAY))
    if nuisances.resume:
        _resume(nuisances.resume, traces)


def _slow_down(nuisances: Nuisances, traces: Traces, config: SimulationConfig) -> None:
    """Common-mode slowdowns and the diurnal swing, on every rank at once."""
    for first, last, factor in nuisances.common_mode:
        traces.slowdown[first - 1 : last] *= factor
    swing, phase = nuisances.diurnal
    m = config.model
    nominal = traces.steps * (m.data_s + m.compute_s + m.optimizer_s + m.comm_s)
    traces.slowdown *= 1 + swing / 2 * np.sin(2 * math.pi * nominal / DIURNAL_PERIOD_S + phase)


def _resume(step: int, traces: Traces) -> None:
    """After a restart from the checkpoint of ``step``: a slow first step and a small, decaying loss bump."""
    after = traces.steps - step - 1
    decay = (after >= 0) * np.exp(-after.clip(0) / RESUME_DECAY)
    traces.log_loss += RESUME_BUMP * decay
    grad = np.log1p(RESUME_GRAD_BUMP * decay)
    traces.log_grad += grad
    traces.local_grad *= np.exp(grad)[None, :]
    if step < len(traces.steps):
        traces.compute[:, step] *= RESUME_FIRST_STEP
