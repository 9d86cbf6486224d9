"""Fault injection with ground truth: the faults a frontier run suffers, on demand.

A plan is parsed from specs such as ``straggler:rank=1,factor=2,from=20`` (the
language and the catalog of faults are in detectors/faults.py, every fault's signature in
docs/faults.md). The trainer calls the
plan at fixed points of its step; each hook first checks a per-rank list that is
empty unless a fault targets this rank, so a plan costs nothing where none applies.
Every fault that fires writes a ``fault_injected`` record (the ground truth, routed
by RunLogger to ``RUN/ground_truth/``), written by the lowest rank it targets (rank 0
for job-wide faults): once at onset for a lasting fault, at every occurrence for
one given ``every=`` and at every firing for the one-step events (nan, inf, bit flips).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bedside.collectors.kit.runqueue import RunQueueClock, waited_between
from bedside.collectors.writer import RunLogger
from bedside.detectors.faults import (
    TRAINER_FAULTS,
    FaultType,
    Spec,
    label_args,
    one_of,
    parse_spec,
    target_ranks,
    window_of,
)

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from .config import TrainConfig

CALIBRATION_STEPS = 10  # a factor straggler's reference: the median of its last (at most) this many computes
MIN_CALIBRATION = 3  # ... and it needs at least this many measured steps before it slows down
TRACKED_STEPS = 5  # inside its window, the reference follows the median of its last this many computes
HANG_SLEEP_S = 3600.0


class Recorder:
    """Writes ground truth for the faults this rank records (the lowest rank each targets)."""

    def __init__(self, logger: RunLogger | None, rank: int) -> None:
        self.log, self.rank = logger, rank

    def record(self, fault: Fault, step: int, *, flush: bool = False, **details: Any) -> None:
        if self.log is None or self.rank != fault.targets[0]:
            return
        if not (fault.fault_type.each_firing or fault.window.every > 1):
            if fault.announced:
                return
            fault.announced = True
        args = label_args(
            fault.spec.text,
            fault.fault_type,
            fault.window,
            {**fault.settings, **{k: _json_number(v) for k, v in details.items()}},
        )
        self.log.event("fault_injected", step, fault=fault.name, target_ranks=list(fault.targets), args=args)
        if flush:
            self.log.flush()


@dataclass(frozen=True)
class Context:
    """What faults need from the job besides their spec."""

    world_size: int
    recorder: Recorder
    samples_per_shard: int | None = None
    vocab_size: int | None = None


# -- parsing ------------------------------------------------------------------------


def parse_fault(text: str, context: Context) -> Fault:
    """The fault ``text`` describes; ValueError naming the spec and the problem otherwise."""
    try:
        ftype, spec = parse_spec(text, TRAINER_FAULTS)
        return FAULTS[ftype.name](spec, context)
    except ValueError as exc:
        raise ValueError(f"bad fault spec {text!r}: {exc}") from None


def _json_number(value: Any) -> Any:
    """Floats as JSON can carry them in a record's fields (non-finite ones as their name)."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


# -- the faults -----------------------------------------------------------------------


class Fault:
    """A parsed fault: which steps (``window``), which ranks (``targets``), its settings.

    Its ``fault_type`` (keys, targets, expected finding, how it is recorded) is in the catalog,
    ``TRAINER_FAULTS`` of detectors/faults.py; a job-wide fault is applied by every rank.
    """

    fault_type: ClassVar[FaultType]

    def __init__(self, spec: Spec, context: Context) -> None:
        self.spec, self.recorder = spec, context.recorder
        self.window = window_of(spec, self.fault_type)
        self.targets = target_ranks(spec, self.fault_type, context.world_size)
        self.settings: dict[str, Any] = {}
        self.announced = False

    @property
    def name(self) -> str:
        return self.fault_type.name

    def record(self, step: int, **details: Any) -> None:
        self.recorder.record(self, step, **details)


class Straggler(Fault):
    """This rank's compute slowed by ``factor`` (measured, step by step) or by a fixed ``delay_ms``."""

    fault_type = TRAINER_FAULTS["straggler"]

    def __init__(self, spec: Spec, context: Context) -> None:
        super().__init__(spec, context)
        factor, delay_ms = spec.get("factor"), spec.get("delay_ms")
        if factor is not None and delay_ms is not None:
            raise ValueError("give factor= or delay_ms=, not both")
        if delay_ms is not None and delay_ms <= 0:
            raise ValueError(f"delay_ms must be > 0, got {delay_ms}")
        self.factor = None if delay_ms is not None else spec.get("factor", 2.0)
        if self.factor is not None and self.factor <= 1:
            raise ValueError(f"factor must be > 1, got {self.factor}")
        self.delay_s = None if delay_ms is None else delay_ms / 1000
        self.reference_s: float | None = None
        self.settings = {"factor": self.factor, "delay_ms": delay_ms}
        self._computes: deque[float] = deque(maxlen=CALIBRATION_STEPS)
        self._run_queue = RunQueueClock()
        self._started: float | None = None
        self._ready = 0.0
        self._waits: tuple[float | None, float | None] = (None, None)

    def before_compute(self, step: int) -> None:
        if self.factor is not None:
            self._calibrate(step)
        if self.delay_s is not None and self.window.covers(step):
            self.record(step, delay_s=self.delay_s, reference_compute_s=self.reference_s)
            time.sleep(self.delay_s)
        last = self.window.last
        if self.factor is not None and self.window.first - CALIBRATION_STEPS <= step and (last is None or step < last):
            self._started = time.perf_counter()  # after the sleep: the compute of this step alone
            self._waits = (self._run_queue.read(), None)

    def bucket_ready(self) -> None:
        if self._started is not None:
            self._ready = time.perf_counter()
            self._waits = (self._waits[0], self._run_queue.read())

    def _calibrate(self, step: int) -> None:
        """The delay for ``step``: ``factor - 1`` times the median own work (start of forward, after any delay,
        to the last gradient bucket, less the wait for a CPU in between) of the rank's recent steps, the last
        ``TRACKED_STEPS`` once slowed, so the rank works ``factor`` times what it would now, however many of
        the host's cores other processes take."""
        assert self.factor is not None
        if self._started is not None and self._ready > self._started:
            self._computes.append(self._ready - self._started - (waited_between(*self._waits) or 0.0))
        self._started = None
        if step >= self.window.first and len(self._computes) >= MIN_CALIBRATION:
            recent = list(self._computes)[-TRACKED_STEPS:] if self.delay_s is not None else list(self._computes)
            self.reference_s = median(recent)
            self.delay_s = (self.factor - 1) * self.reference_s


class Hang(Fault):
    """This rank stops stepping at ``step`` and sleeps forever; the process stays alive."""

    fault_type = TRAINER_FAULTS["hang"]

    def before_compute(self, step: int) -> None:
        if step == self.window.first:
            self.recorder.record(self, step, flush=True)
            while True:
                time.sleep(HANG_SLEEP_S)


class Crash(Fault):
    """This rank's process exits at once (``os._exit``) with ``code``; with ``save=kept`` it first lets its
    checkpoint save in flight finish (on rank 0: published), so the crash loses no checkpoint."""

    fault_type = TRAINER_FAULTS["crash"]

    def __init__(self, spec: Spec, context: Context) -> None:
        super().__init__(spec, context)
        self.code = spec.get("code", 1)
        if not 1 <= self.code <= 255:
            raise ValueError(f"code must be in [1, 255], got {self.code}")
        self.save = spec.get("save", "lost")
        self.settings = {"code": self.code, "save": self.save}
        self.finish_saves: Callable[[], object] = lambda: None  # the trainer's, bound by FaultPlan.saves_finished_by

    def before_compute(self, step: int) -> None:
        if step == self.window.first:
            if self.save == "kept":
                self.finish_saves()
            self.recorder.record(self, step, flush=True)
            os._exit(self.code)


class BadShard(Fault):
    """Every sample of the shard(s) replaced by uniform random tokens (seeded by sample id)."""

    fault_type = TRAINER_FAULTS["bad_shard"]

    def __init__(self, spec: Spec, context: Context) -> None:
        super().__init__(spec, context)
        if context.samples_per_shard is None or context.vocab_size is None:
            raise ValueError("bad_shard needs the corpus layout (samples_per_shard= and vocab_size= of parse)")
        self.shards = one_of(spec, "shard", "shards")
        self.samples_per_shard, self.vocab_size = context.samples_per_shard, context.vocab_size
        self.seed = spec.get("seed", 0)
        self.settings = {"shards": list(self.shards), "samples_per_shard": self.samples_per_shard}

    def corrupt(self, step: int, ids: list[int], samples: np.ndarray) -> np.ndarray:
        if not self.window.covers(step):
            return samples
        self.record(step)
        shard = np.asarray(ids, dtype=np.int64) // self.samples_per_shard
        rows = np.flatnonzero((shard >= self.shards[0]) & (shard <= self.shards[1]))
        if not len(rows):
            return samples
        garbage = samples.copy()
        for row in rows:
            generator = np.random.default_rng([self.seed, ids[row]])
            garbage[row] = generator.integers(0, self.vocab_size, size=samples.shape[1])
        return garbage


class RepeatBatch(Fault):
    """A data-pipeline bug: every batch is the first one this rank saw in the window."""

    fault_type = TRAINER_FAULTS["repeat_batch"]
    _batch: np.ndarray | None = None

    def corrupt(self, step: int, ids: list[int], samples: np.ndarray) -> np.ndarray:
        if not self.window.covers(step):
            return samples
        self.record(step)
        if self._batch is None:
            self._batch = samples.copy()
        return self._batch.copy()


class ShuffleTargets(Fault):
    """A data-pipeline bug: each sample's tokens in a random order (seeded by step)."""

    fault_type = TRAINER_FAULTS["shuffle_targets"]

    def corrupt(self, step: int, ids: list[int], samples: np.ndarray) -> np.ndarray:
        if not self.window.covers(step):
            return samples
        self.record(step)
        return np.random.default_rng([self.spec.get("seed", 0), step, *ids[:1]]).permuted(samples, axis=1)


class LrBlip(Fault):
    """The learning rate multiplied by ``factor`` on the window's steps."""

    fault_type = TRAINER_FAULTS["lr_blip"]

    def __init__(self, spec: Spec, context: Context) -> None:
        super().__init__(spec, context)
        self.factor = spec.get("factor", 10.0)
        if self.factor <= 0:
            raise ValueError(f"factor must be > 0, got {self.factor}")
        self.settings = {"factor": self.factor}

    def scale(self, step: int) -> float:
        if not self.window.covers(step):
            return 1.0
        self.record(step)
        return self.factor


class NonFinite(Fault):
    """This rank's loss multiplied by NaN (or Inf) on the window's steps."""

    fault_type = TRAINER_FAULTS["nan"]
    value = math.nan

    def corrupt(self, step: int, loss: Tensor) -> Tensor:
        if not self.window.covers(step):
            return loss
        self.record(step)
        return loss * self.value


class Infinite(NonFinite):
    fault_type, value = TRAINER_FAULTS["inf"], math.inf


class _Bitflip(Fault):
    """One bit of one element of a flat tensor flipped: the settings and the choice of element."""

    default_bit: ClassVar[int]

    def __init__(self, spec: Spec, context: Context) -> None:
        super().__init__(spec, context)
        self.bit, self.index, self.seed = spec.get("bit", self.default_bit), spec.get("index"), spec.get("seed", 0)
        if not 0 <= self.bit <= 31:
            raise ValueError(f"bit must be in [0, 31] (a float32's bits), got {self.bit}")
        if self.index is not None and self.index < 0:
            raise ValueError(f"index must be >= 0, got {self.index}")
        self.settings = {"bit": self.bit}

    def element(self, step: int, size: int) -> int:
        """The flat index to corrupt: ``index=`` or a seeded draw per step."""
        index = int(np.random.default_rng([self.seed, step]).integers(size)) if self.index is None else self.index
        if index >= size:
            raise ValueError(f"{self.spec.text!r}: index {index} is out of range for {size} elements")
        return index


class GradBitflip(_Bitflip):
    """One bit of one element of this rank's gradient bucket flipped before the all-reduce."""

    fault_type, default_bit = TRAINER_FAULTS["grad_bitflip"], 30

    def corrupt(self, step: int, flat_grads: Tensor) -> None:
        if self.window.covers(step):
            index = self.element(step, flat_grads.numel())
            before, after = flip_bit(flat_grads, index, self.bit)
            self.record(step, index=index, before=before, after=after)


class ParamBitflip(_Bitflip):
    """One bit of one element of this replica's parameters flipped after the optimizer step
    (under FSDP, of this rank's own shards: ``index`` counts local elements)."""

    fault_type, default_bit = TRAINER_FAULTS["param_bitflip"], 22

    def corrupt(self, step: int, module: torch.nn.Module) -> None:
        if not self.window.covers(step):
            return
        from bedside.collectors.kit.grads import local

        named = [(name, local(p)) for name, p in module.named_parameters()]
        index = self.element(step, sum(p.numel() for _, p in named))
        for name, param in named:
            if index < param.numel():
                before, after = flip_bit(param.detach().view(-1), index, self.bit)
                self.record(step, param=name, index=index, before=before, after=after)
                return
            index -= param.numel()


def flip_bit(flat: Tensor, index: int, bit: int) -> tuple[float, float]:
    """Flip ``bit`` (0 = least significant) of ``flat[index]`` in place, outside autograd; the value before and
    after. torch is imported here, where a fault first touches a tensor: a launcher parses and checks a plan
    without it."""
    import torch

    width = flat.element_size() * 8
    if bit >= width:
        raise ValueError(f"bit {bit} does not exist in a {flat.dtype} element")
    ints = flat.detach().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()])
    before = float(flat[index])
    with torch.no_grad():
        ints[index] ^= (1 << bit) if bit < width - 1 else -(1 << bit)  # the sign bit as the signed int
    return before, float(flat[index])


FAULTS: dict[str, type[Fault]] = {
    kind.fault_type.name: kind
    for kind in (
        Straggler,
        Hang,
        Crash,
        BadShard,
        RepeatBatch,
        ShuffleTargets,
        LrBlip,
        NonFinite,
        Infinite,
        GradBitflip,
        ParamBitflip,
    )
}


# -- the plan -------------------------------------------------------------------------


class FaultPlan:
    """The faults of a run as this rank applies them, behind the trainer's six hooks."""

    def __init__(self, faults: Sequence[Fault] = (), *, rank: int = 0) -> None:
        self.faults = tuple(faults)
        mine = [fault for fault in self.faults if rank in fault.targets]
        self._compute = [f for f in mine if isinstance(f, (Straggler, Hang, Crash))]
        self._timers = [f for f in self._compute if isinstance(f, Straggler) and f.delay_s is None]
        self._samples = [f for f in mine if isinstance(f, (BadShard, RepeatBatch, ShuffleTargets))]
        self._loss = [f for f in mine if isinstance(f, NonFinite)]
        self._grads = [f for f in mine if isinstance(f, GradBitflip)]
        self._params = [f for f in mine if isinstance(f, ParamBitflip)]
        self._lr = [f for f in mine if isinstance(f, LrBlip)]
        self._grad_step = -1

    @classmethod
    def none(cls) -> FaultPlan:
        return cls()

    @classmethod
    def parse(
        cls,
        specs: Sequence[str],
        *,
        rank: int,
        world_size: int,
        logger: RunLogger | None,
        samples_per_shard: int | None = None,
        vocab_size: int | None = None,
    ) -> FaultPlan:
        """This rank's plan from ``specs``; ``bad_shard`` needs the corpus layout given here."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is out of range for world size {world_size}")
        context = Context(world_size, Recorder(logger, rank), samples_per_shard, vocab_size)
        return cls([parse_fault(text, context) for text in specs], rank=rank)

    def saves_finished_by(self, finish: Callable[[], object]) -> None:
        """How a ``save=kept`` crash finishes this rank's checkpoint save in flight before it exits."""
        for fault in self._compute:
            if isinstance(fault, Crash):
                fault.finish_saves = finish

    def before_compute(self, step: int) -> None:
        """Before forward: stragglers sleep, hangs never return, crashes exit."""
        for fault in self._compute:
            fault.before_compute(step)

    def corrupt_samples(self, step: int, ids: list[int], samples: np.ndarray) -> np.ndarray:
        """This rank's samples, or a corrupted copy (the input is never changed)."""
        for fault in self._samples:
            samples = fault.corrupt(step, ids, samples)
        return samples

    def corrupt_loss(self, step: int, loss: Tensor) -> Tensor:
        for fault in self._loss:
            loss = fault.corrupt(step, loss)
        return loss

    def corrupt_gradients(self, step: int, flat_grads: Tensor) -> None:
        """Called per DDP bucket before its all-reduce (per FSDP group before its reduce-scatter);
        bit flips hit the step's first bucket only."""
        for timer in self._timers:
            timer.bucket_ready()
        if not self._grads or step == self._grad_step:
            return
        self._grad_step = step
        for fault in self._grads:
            fault.corrupt(step, flat_grads)

    def lr_scale(self, step: int) -> float:
        scale = 1.0
        for fault in self._lr:
            scale *= fault.scale(step)
        return scale

    def corrupt_parameters(self, step: int, module: torch.nn.Module) -> None:
        """After a (finite) optimizer step: flips in this replica's parameters."""
        for fault in self._params:
            fault.corrupt(step, module)


def fault_plan(
    specs: list[str], config: TrainConfig, *, rank: int, world_size: int, logger: RunLogger | None = None
) -> FaultPlan:
    """This rank's fault plan for a run of ``config``, with the corpus layout that bad_shard needs."""
    return FaultPlan.parse(
        specs,
        rank=rank,
        world_size=world_size,
        logger=logger,
        samples_per_shard=config.data.samples_per_shard,
        vocab_size=config.data.vocab_size,
    )
