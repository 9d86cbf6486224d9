"""The baseline models: noise families, learning rate, loss, gradient norms, shards and phase times.

Every signal draws from its own seeded stream, so adding a fault or switching the
nuisances off leaves the noise of everything else unchanged.
"""

from __future__ import annotations

import math

import numpy as np

from .config import ModelSettings, SimulationConfig
from .traces import Traces

STREAMS = (
    "loss",
    "grad",
    "local_grad",
    "eval",
    "compute",
    "data",
    "optimizer",
    "comm",
    "chip",
    "shards",
    "checksum",
    "nuisance",
)
STUDENT_DF = 4
LOGNORMAL_SHAPE = 0.5
ANNEAL_GAIN = 0.03  # log-loss gained as the learning rate anneals to its floor
REPLICA_GRAD = 1.4  # one replica's gradient norm over the all-reduced one (a replica's gradient is noisier)
LAST_STAGE_GRAD_WEIGHT = 1.3  # the last stage (output head) holds more of the gradient's squared norm


def stream(seed: int, name: str) -> np.random.Generator:
    """The generator of one signal (``STREAMS``) of a run."""
    return np.random.default_rng([seed, STREAMS.index(name)])


def standard_noise(rng: np.random.Generator, family: str, size: int | tuple[int, ...]) -> np.ndarray:
    """Noise with mean 0 and variance 1: gaussian, Student-t (4 dof, heavy tails) or lognormal (right-skewed)."""
    if family == "student":
        return rng.standard_t(STUDENT_DF, size) / math.sqrt(STUDENT_DF / (STUDENT_DF - 2))
    if family == "lognormal":
        s2 = LOGNORMAL_SHAPE**2
        skewed = np.exp(LOGNORMAL_SHAPE * rng.standard_normal(size))
        return (skewed - math.exp(s2 / 2)) / math.sqrt((math.exp(s2) - 1) * math.exp(s2))
    return rng.standard_normal(size)


def learning_rate(steps: np.ndarray, model: ModelSettings, warmup: int, anneal: bool) -> np.ndarray:
    """Linear warmup over ``warmup`` steps, then (with ``anneal``) cosine down to ``min_lr_ratio`` at the end."""
    lr = np.full(len(steps), model.peak_lr)
    if anneal and len(steps) > warmup + 1:
        progress = np.clip((steps - warmup) / (steps[-1] - warmup), 0.0, 1.0)
        lr *= model.min_lr_ratio + (1 - model.min_lr_ratio) * 0.5 * (1 + np.cos(math.pi * progress))
    if warmup:
        lr = np.where(steps <= warmup, model.peak_lr * steps / warmup, lr)
    return lr


def log_loss_trend(steps: np.ndarray, lr: np.ndarray, model: ModelSettings, warmup: int) -> np.ndarray:
    """log of a saturating power law in the progress made (steps at peak LR), less the anneal gain."""
    progress = np.cumsum(lr) / model.peak_lr
    span = model.loss_start - model.loss_floor
    loss = model.loss_floor + span * (1 + progress / model.loss_scale_steps) ** -model.loss_alpha
    return np.log(loss) - ANNEAL_GAIN * (1 - lr / model.peak_lr) * (steps > warmup)


def log_grad_trend(steps: np.ndarray, model: ModelSettings, warmup: int) -> np.ndarray:
    """log of the all-reduced gradient norm: high early (warmup), decreasing to ``grad_floor``."""
    early = max(5, warmup)
    return np.log(model.grad_floor + 1.5 * np.exp(-steps / early) + 0.4 / np.sqrt(1 + steps / 50))


def stage_grad_share(pp: int) -> np.ndarray:
    """Each stage's share of a replica's gradient norm (the squares add up to one)."""
    weights = np.ones(pp)
    if pp > 1:
        weights[-1] = LAST_STAGE_GRAD_WEIGHT
    return np.sqrt(weights / weights.sum())


def step_shards(config: SimulationConfig, rng: np.random.Generator) -> np.ndarray:
    """(steps, shards_per_step): the distinct shards each step reads; replica d reads column d % k."""
    k = min(config.shards_per_step, config.topology.dp_size)
    return rng.random((config.steps, config.num_shards)).argsort(axis=1)[:, :k]


def phase_times(config: SimulationConfig) -> dict[str, np.ndarray]:
    """(ranks, steps) seconds of data, compute and optimizer, and (steps,) of the collective itself."""
    m, family, shape = config.model, config.noise, (config.ranks, config.steps)
    chip = np.exp(m.chip_spread * stream(config.seed, "chip").standard_normal(config.ranks))[:, None]
    noise = {
        name: standard_noise(stream(config.seed, name), family, shape) for name in ("compute", "data", "optimizer")
    }
    return {
        "compute": m.compute_s * chip * np.exp(m.compute_sigma * noise["compute"]),
        "data": m.data_s * np.exp(m.data_sigma * noise["data"]),
        "optimizer": m.optimizer_s * np.exp(m.optimizer_sigma * noise["optimizer"]),
        "comm": m.comm_s * np.exp(m.comm_sigma * standard_noise(stream(config.seed, "comm"), family, config.steps)),
    }


def build_traces(config: SimulationConfig, warmup: int, anneal: bool) -> Traces:
    """Every signal of a healthy run with this learning-rate schedule, before nuisances and faults."""
    m, seed, family = config.model, config.seed, config.noise
    steps = np.arange(1, config.steps + 1)
    lr = learning_rate(steps, m, warmup, anneal)
    log_loss = log_loss_trend(steps, lr, m, warmup)
    log_grad = log_grad_trend(steps, m, warmup)
    share = stage_grad_share(config.pp)[config.topology.stage()][:, None]
    local_noise = standard_noise(stream(seed, "local_grad"), family, (config.ranks, config.steps))
    times = phase_times(config)
    return Traces(
        steps=steps,
        lr=lr,
        tokens=np.full(config.steps, float(config.topology.dp_size * m.tokens_per_replica)),
        log_loss=log_loss + m.loss_sigma * standard_noise(stream(seed, "loss"), family, config.steps),
        loss_add=np.zeros(config.steps),
        log_grad=log_grad + m.grad_sigma * standard_noise(stream(seed, "grad"), family, config.steps),
        local_grad=np.exp(log_grad)[None, :] * share * REPLICA_GRAD * np.exp(m.local_grad_sigma * local_noise),
        eval_log_loss=log_loss + math.log1p(m.eval_gap),
        eval_noise=m.eval_sigma * standard_noise(stream(seed, "eval"), family, config.steps),
        shards=step_shards(config, stream(seed, "shards")),
        compute=times["compute"],
        data=times["data"],
        optimizer=times["optimizer"],
        comm=times["comm"],
        slowdown=np.ones(config.steps),
    )
