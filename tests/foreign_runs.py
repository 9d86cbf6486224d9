"""Labeled runs drawn independently of ``bedside simulate``: other noise, other dynamics, frames built directly.

The simulator's runs share its own noise models and schedule; a detector tuned on them may not generalise.
These runs come from a generator of their own, built straight into the frames ``bedside.detectors.detect``
takes, with their faults as ``Label`` objects:

- **loss curves** (``curve_run``): a power law in LR-weighted progress under a linear warmup and step LR
  drops (each drop lowers the loss over some tens of steps), a data-mixture switch (a level shift of a few
  percent: no fault), log-scale noise that is AR(1) (phi 0.8-0.95) over Student-t innovations (2-3 degrees
  of freedom), and optionally MoE-like bursts of genuine one-step bumps (+5-15% on the loss, more on the
  gradient norm: no fault). Labelled spikes are ratios to the trend (2-5x for catastrophic ones), decaying
  back over a few steps, on the loss and, larger, on the gradient norm (a label of each kind);
- **pipeline traces** (``pipeline_run``): synchronous ranks numbered sparsely (0, 4, 8, ...) in pipeline
  stages of different work, each rank's compute time with Student-t jitter, a small AR(1) drift of its own
  and a larger AR(1) common-mode factor; a sick rank (slow from the first step, or from a given step) is labelled ``straggler``, a slower
  stage (every rank of it) is not a fault.

Truth stays honest: ``excursions`` gives each labelled spike's peak ratio to the trend and the largest
ratio anywhere else in the run (noise and genuine bumps); a labelled spike must be the larger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import signal

from bedside.detectors.faults import Label, Window

CLIP = 12.0
"""Student-t innovations beyond this many scale units are clipped (``Noise``)."""
RANK_DRIFT = 0.01
"""Scale of a rank's own slow (AR) drift in a pipeline trace; its step-to-step jitter and the job's common-mode
drift are larger. A rank the noise kept 5% slower than its peers for a whole trace would be a straggler by the
project's own targets, not noise."""
STRAGGLER_FLOOR = 1.05
"""No unlabelled rank's median work over its peers' reaches this (``rank_offsets``)."""
GRAD_POWER = 1.5
"""A spike's ratio on the gradient norm is its ratio on the loss to this power."""
NOISES = ("student_ar", "gaussian_ar", "student")
"""Log-noise models: AR(1) over Student-t innovations, AR(1) over normal ones, Student-t without memory."""


@dataclass(frozen=True)
class Noise:
    """Log-scale noise: Student-t(``df``) innovations (``df`` None: normal) of scale ``scale``, AR(1) ``phi``.

    Innovations are clipped at ``CLIP`` scale units: a training step's loss is bounded, and an unbounded
    t(2) would now and then draw an excursion as large as a catastrophic spike, which is no longer noise.
    """

    scale: float
    df: float | None = 2.5
    phi: float = 0.9

    @classmethod
    def drawn(cls, rng: np.random.Generator, model: str, scale: float) -> Noise:
        """A noise of ``model`` (``NOISES``) with its shape drawn from the ranges the module names."""
        df = None if model == "gaussian_ar" else float(rng.uniform(2.0, 3.0))
        phi = 0.0 if model == "student" else float(rng.uniform(0.8, 0.95))
        return cls(scale, df, phi)

    def draw(self, rng: np.random.Generator, shape: int | tuple[int, ...]) -> np.ndarray:
        """Noise along the first axis of ``shape``; the marginal scale is ``scale`` whatever ``phi``."""
        eps = rng.standard_normal(shape) if self.df is None else rng.standard_t(self.df, shape).clip(-CLIP, CLIP)
        if self.phi:
            eps = signal.lfilter([math.sqrt(1 - self.phi**2)], [1.0, -self.phi], eps, axis=0)
        return self.scale * eps


@dataclass(frozen=True)
class Spike:
    """A labelled spike: ``ratio`` times the loss trend over steps ``first`` to ``last`` (the gradient norm
    ``ratio ** GRAD_POWER``), then an excess that decays by ``decay`` per step."""

    first: int
    ratio: float
    last: int | None = None
    decay: float = 0.3

    @property
    def end(self) -> int:
        return self.first if self.last is None else self.last


@dataclass(frozen=True)
class ForeignRun:
    """One generated run: the keyword arguments of ``detect``, its labels, and each series' noise-free trend."""

    name: str
    frames: dict[str, pd.DataFrame]
    labels: list[Label]
    trends: dict[str, np.ndarray] = field(default_factory=dict)
    affected: dict[str, np.ndarray] = field(default_factory=dict)
    """Per series, the steps a labelled fault moves (its window and the decay after it)."""

    @property
    def steps(self) -> int:
        return int(max(len(frame["step"].unique()) for frame in self.frames.values() if "step" in frame))


def excursions(run: ForeignRun, metric: str) -> tuple[list[float], float]:
    """Each labelled spike's peak ratio of ``metric`` to its trend, and the largest ratio on unaffected steps."""
    ratio = run.frames["steps"][metric].to_numpy() / run.trends[metric]
    steps = run.frames["steps"]["step"].to_numpy()
    kind = "loss_spike" if metric == "loss" else "grad_spike"
    peaks = [float(ratio[label.window.covers(steps)].max()) for label in run.labels if label.expected_kind == kind]
    return peaks, float(ratio[~np.isin(steps, run.affected[metric])].max())


def spike_label(spike: Spike, kind: str) -> Label:
    """The spike's label for ``kind``, its magnitude the ratio to the trend on that kind's metric."""
    ratio = spike.ratio ** (GRAD_POWER if kind == "grad_spike" else 1.0)
    return Label("spike", kind, Window(spike.first, spike.end), (), f"foreign spike x{ratio:.3g}", round(ratio, 1))


def loss_trend(steps: int, *, warmup: int, drops: tuple[int, ...], switch: tuple[int, float] | None) -> np.ndarray:
    """A power law in LR-weighted progress under warmup and LR drops (x0.3 each), with a mixture switch."""
    t = np.arange(1, steps + 1)
    lr = np.minimum(1.0, t / max(warmup, 1)) * 0.3 ** np.searchsorted(np.asarray(drops), t, side="right")
    progress = np.cumsum(lr)
    log_trend = np.log(2.0 + 9.0 * (1.0 + progress / 20.0) ** -0.5)
    bonus = signal.lfilter([1 / 30], [1.0, -(1 - 1 / 30)], 0.08 * (1.0 - lr / lr.max()) * (t > warmup))
    log_trend -= bonus  # an LR drop lowers the loss over some tens of steps
    if switch is not None:
        log_trend[switch[0] :] += math.log(switch[1])
    return np.exp(log_trend)


def bumps(rng: np.random.Generator, steps: int, every: int) -> np.ndarray:
    """Step indices of MoE-like bursts: a burst about every ``every`` steps, each of 2-8 bumps within 60 steps."""
    centres = np.flatnonzero(rng.random(steps) < 1 / every)
    out = [c + rng.integers(0, 60, rng.integers(2, 9)) for c in centres]
    return np.unique(np.concatenate(out)) if out else np.array([], dtype=int)


def curve_run(
    name: str,
    seed: int,
    steps: int,
    *,
    model: str = "student_ar",
    scale: float | None = None,
    spikes: tuple[Spike, ...] = (),
    moe_every: int | None = None,
) -> ForeignRun:
    """A job-level run: loss and gradient norm with warmup, LR drops, a mixture switch, noise, bumps, spikes."""
    rng = np.random.default_rng(seed)
    warmup = int(min(500, steps // 10))
    drops = tuple(int(f * steps) for f in sorted(rng.uniform(0.55, 0.9, 2))) if steps >= 2000 else ()
    switch = (int(rng.uniform(0.3, 0.5) * steps), float(rng.choice([0.95, 1.05]))) if steps >= 1000 else None
    trends = {"loss": loss_trend(steps, warmup=warmup, drops=drops, switch=switch)}
    trends["grad_norm"] = 0.8 * (1 + 4 * np.exp(-np.arange(steps) / max(warmup / 3, 1))) * trends["loss"] ** 0.5
    noise = Noise.drawn(rng, model, float(rng.uniform(0.004, 0.012)) if scale is None else scale)
    log_factor = {
        "loss": noise.draw(rng, steps),
        "grad_norm": Noise(4 * noise.scale, noise.df, noise.phi).draw(rng, steps),
    }
    if moe_every:
        hit = bumps(rng, steps, moe_every)
        hit = hit[hit < steps]
        size = rng.uniform(1.05, 1.15, len(hit))
        log_factor["loss"][hit] += np.log(size)
        log_factor["grad_norm"][hit] += np.log(size) * 3
    affected: dict[str, list[int]] = {"loss": [], "grad_norm": []}
    for spike in spikes:
        for metric, power in (("loss", 1.0), ("grad_norm", GRAD_POWER)):
            excess = np.zeros(steps)
            excess[spike.first - 1 : spike.end] = power * math.log(spike.ratio)
            tail = excess[spike.end - 1] * spike.decay ** np.arange(1, 11)
            excess[spike.end : spike.end + 10] = tail[: max(0, steps - spike.end)]
            moved = excess > 0.01
            log_factor[metric][moved] = excess[moved]  # a spike's size is its ratio to the trend, noise aside
            affected[metric] += list(np.flatnonzero(moved) + 1)
    step = np.arange(1, steps + 1)
    wall = np.cumsum(2.0 * np.exp(Noise(0.02, noise.df, 0.5).draw(rng, steps)))
    frame = pd.DataFrame({"step": step, "time": wall, "tokens": 1_048_576.0})
    frame = frame.assign(**{m: trends[m] * np.exp(log_factor[m]) for m in trends})
    labels = [spike_label(s, kind) for s in spikes for kind in ("loss_spike", "grad_spike")]
    return ForeignRun(
        name, {"steps": frame}, labels, trends, {m: np.asarray(v, dtype=int) for m, v in affected.items()}
    )


def pipeline_run(
    name: str,
    seed: int,
    steps: int,
    *,
    model: str = "student_ar",
    stages: int = 4,
    per_stage: int = 4,
    stage_work: tuple[float, ...] = (19.0, 20.0, 19.5, 20.5),
    sick: tuple[int, float, int] | None = None,
    last_stage: float = 1.0,
    scale: float = 0.03,
) -> ForeignRun:
    """A synchronous pipeline trace in seconds; ``sick``: (rank index, factor, from step), labelled ``straggler``.

    Ranks are numbered 0, 4, 8, ... (stage-major); ``last_stage`` multiplies every rank of the last stage.
    """
    rng = np.random.default_rng(seed)
    ranks = stages * per_stage
    base = np.repeat(np.asarray(stage_work[:stages], dtype=float), per_stage)
    base[-per_stage:] *= last_stage
    noise = Noise.drawn(rng, model, scale)
    jitter = Noise(scale, noise.df, 0.0).draw(rng, (steps, ranks))
    drift = Noise(RANK_DRIFT, noise.df, noise.phi).draw(rng, (steps, ranks))
    common = Noise(scale / 2, noise.df, noise.phi).draw(rng, (steps, 1))
    compute = base * np.exp(jitter + drift + common)
    labels = []
    if sick is not None:
        index, factor, first = sick
        compute[first:, index] *= factor
        labels.append(Label("straggler", "straggler", Window(first), (4 * index,), "foreign sick rank", factor))
    data = 0.3 * np.exp(Noise(0.2, noise.df, 0.0).draw(rng, (steps, ranks)))
    work = compute + data
    wall = work.max(axis=1) + 1.5
    comm = wall[:, None] - work - 0.2
    rank_ids = 4 * np.arange(ranks)
    frame = pd.DataFrame(
        {
            "step": np.repeat(np.arange(steps), ranks),
            "rank": np.tile(rank_ids, steps),
            "time": np.repeat(1.8e9 + np.cumsum(wall), ranks),
            "step_time": np.repeat(wall, ranks),
            "data_time": data.ravel(),
            "compute_time": compute.ravel(),
            "comm_time": comm.ravel(),
            "optimizer_time": 0.2,
        }
    )
    topology = pd.DataFrame(
        {
            "rank": rank_ids,
            "host": [f"node-{i // 4:02d}" for i in range(ranks)],
            "dp": np.tile(np.arange(per_stage), stages),
            "tp": 0,
            "pp": np.repeat(np.arange(stages), per_stage),
        }
    )
    return ForeignRun(name, {"rank_steps": frame, "topology": topology}, labels)


def rank_offsets(run: ForeignRun) -> tuple[list[float], float]:
    """Each labelled rank's median work over its stage peers' (from the label's first step), and the largest
    such ratio of an unlabelled rank over the whole trace: a rank the noise kept slow for a whole trace."""
    frame, topology = run.frames["rank_steps"], run.frames["topology"].set_index("rank")
    work = frame.assign(work=frame["compute_time"] + frame["data_time"]).pivot(index="step", columns="rank")["work"]
    stage = topology.loc[work.columns, "pp"].to_numpy()
    peers = np.column_stack(
        [work.loc[:, (stage == stage[i]) & (work.columns != r)].median(axis=1) for i, r in enumerate(work.columns)]
    )
    ratio = pd.DataFrame(work.to_numpy() / peers, index=work.index, columns=work.columns)
    labelled = {rank: label.first for label in run.labels for rank in label.ranks}
    peaks = [float(ratio.loc[first:, rank].median()) for rank, first in labelled.items()]
    rest = [float(ratio[rank].median()) for rank in ratio.columns if rank not in labelled]
    return peaks, max(rest)


def standout(run: ForeignRun) -> float | None:
    """The smallest ratio of a labelled fault's size to the largest unlabelled excursion of its series (a
    spike's ratio to the trend, a sick rank's to its peers): above 1 when the truth is honest; None unlabelled."""
    checks = [excursions(run, m) for m in ("loss", "grad_norm")] if "steps" in run.frames else []
    checks += [rank_offsets(run)] if run.labels and "rank_steps" in run.frames else []
    ratios = [min(peaks) / rest for peaks, rest in checks if peaks]
    return min(ratios) if ratios else None
