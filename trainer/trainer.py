"""The training loop: forward, backward, finite check, optimizer step, emit.

Everything around the step (evaluation, the learning-rate schedule) is a small
method or module of its own; the telemetry of the step (phase times, local gradient
norms, parameter checksums, tokens and FLOPs) is the instrumentation kit's
``Monitor``, the same any loop uses; the step itself never waits for the device or
for telemetry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bedside.collectors.kit import ControlState, Monitor, clip_grad_norm, flops_per_token
from bedside.collectors.writer import RunLogger

from .checkpoint import rng_state, set_rng_state
from .checkpointing import Checkpointing
from .config import TrainConfig
from .control import ControlChannel
from .faults import FaultPlan
from .language import MarkovLanguage, ShardedCorpus
from .model import Transformer
from .parallel import wrap
from .sampler import BatchSampler
from .schedule import lr_at


class Trainer:
    """One rank of a data-parallel training run, instrumented through RunLogger."""

    def __init__(
        self, config: TrainConfig, logger: RunLogger, device: torch.device, faults: FaultPlan | None = None
    ) -> None:
        self.config = config
        self.log = logger
        self.device = device
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if config.global_batch % self.world_size:
            raise ValueError(f"global_batch {config.global_batch} is not divisible by {self.world_size} ranks")
        if config.data.heldout_samples < self.world_size:
            raise ValueError(
                f"data.heldout_samples ({config.data.heldout_samples}) must be at least the "
                f"{self.world_size} ranks, or evaluation has nothing to read"
            )
        self.language = MarkovLanguage(
            vocab_size=config.data.vocab_size, branching=config.data.branching, seed=config.data.seed
        )
        self.corpus = ShardedCorpus(
            self.language,
            seq_len=config.model.seq_len,
            num_shards=config.data.num_shards,
            samples_per_shard=config.data.samples_per_shard,
            heldout_samples=config.data.heldout_samples,
            seed=config.data.seed,
        )
        self.sampler = BatchSampler(self.corpus, global_batch_size=config.global_batch, seed=config.seed)
        self.entropy_floor = self.language.entropy_rate()
        torch.manual_seed(config.seed)
        self.faults = faults or FaultPlan.none()
        self.model, self.core = wrap(Transformer(config.model).to(device), config.parallelism, device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.optim.lr, weight_decay=config.optim.weight_decay
        )
        self.monitor = Monitor(
            logger,
            self.model,
            self.optimizer,
            shape=config.model.shape,
            tokens_per_step=config.tokens_per_step,
            peak_flops=config.peak_flops_per_device,
            checksum_every=config.checksum_every,
            on_gradients=self.faults.corrupt_gradients,  # gradient faults enter where a faulty chip's would
            grad_norm=False,  # the clip's norm is recorded with the step
        )
        self.step = 0
        self.control_state = ControlState()
        self.flops_per_step = flops_per_token(config.model.shape) * config.tokens_per_step
        self.spent_tokens = 0
        self.spent_flops = 0.0

    @property
    def timeline(self) -> int:
        """The timeline being trained: the logger's, which every record it writes carries."""
        return self.log.timeline

    @timeline.setter
    def timeline(self, timeline: int) -> None:
        self.log.timeline = timeline

    # -- the loop ---------------------------------------------------------------
    def train(self, *, resume: bool = False) -> None:
        """Run to the configured number of steps (from the latest good checkpoint when
        resuming), evaluating every ``eval_every`` and checkpointing every ``checkpoint_every``;
        control requests (rewind, skip, pause, stop...) are applied at step boundaries."""
        checkpointing = Checkpointing(self)
        control = ControlChannel(self, checkpointing)
        self.faults.saves_finished_by(checkpointing.finish_in_flight)
        if resume:
            if not checkpointing.resume() and self.rank == 0:
                self.log.log(
                    self.step,
                    f"no good checkpoint to resume from: starting from step 0 on timeline {self.timeline}",
                    level="warning",
                )
            control.recover()
        while self.step < self.config.steps and control.at_step_boundary():
            self.train_step()
            if self.step % self.config.eval_every == 0 or self.step == self.config.steps:
                self.evaluate()
            checkpointing.after_step()
        if control.stop_reason is None:
            control.close()
        checkpointing.finish()
        if control.stop_reason is not None:
            self.log.close("aborted", control.stop_reason)

    def state_dict(self) -> dict[str, Any]:
        """Everything besides model and optimizer that a rewind or resume restores (JSON)."""
        return {
            "step": self.step,
            "timeline": self.timeline,
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(),
            "spent_tokens": self.spent_tokens,
            "spent_flops": self.spent_flops,
            "control": self.control_state.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.timeline = state["step"], state["timeline"]
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.spent_tokens, self.spent_flops = state["spent_tokens"], state["spent_flops"]
        # checkpoints written before the control state was saved have none: nothing was handled then
        self.control_state.load_state_dict(state.get("control", ControlState().state_dict()))

    def train_step(self) -> None:
        """One optimizer step on the next global batch."""
        self.step += 1
        with self.monitor.step(self.step) as step:
            batch_index, ids = self.sampler.next_batch()
            inputs, targets = self._batch(self.sampler.rank_slice(ids, self.rank, self.world_size))
            step.compute()
            self.faults.before_compute(self.step)
            step.backward(self.faults.corrupt_loss(self.step, self.core.loss(self.model(inputs), targets)))
            grad_norm = self._optimizer_step()
            self.spend()
            step.record_job(grad_norm=grad_norm, batch=batch_index, shards=self.sampler.shards_of(ids))

    def _optimizer_step(self) -> torch.Tensor:
        """Clip, then step unless the gradient is not finite (the update is skipped and said so).

        Reading the norm's finiteness is the one host read the step needs, as in
        Megatron-LM and AMP's GradScaler: a non-finite update would destroy the weights.
        """
        lr = lr_at(self.step, self.config.optim, self.config.steps) * self.faults.lr_scale(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        grad_norm = clip_grad_norm(self.model.parameters(), self.config.optim.grad_clip)
        if bool(torch.isfinite(grad_norm)):
            self.optimizer.step()
            self.faults.corrupt_parameters(self.step, self.core)
        elif self.rank == 0:
            self.log.log(self.step, f"non-finite gradient norm ({float(grad_norm)}): update skipped", level="error")
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _batch(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        samples = self.faults.corrupt_samples(self.step, ids, self.corpus.train_batch(ids))
        return _inputs_and_targets(samples, self.device)

    # -- telemetry ----------------------------------------------------------------
    def spend(self, steps: int = 1) -> None:
        """Count ``steps`` steps' tokens and FLOPs as spent: every timeline's, abandoned branches included."""
        self.spent_tokens += steps * self.config.tokens_per_step
        self.spent_flops += steps * self.flops_per_step

    # -- evaluation ---------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> None:
        """Held-out loss and next-token accuracy, with the excess over the entropy floor."""
        self.model.eval()
        totals = torch.zeros(3, device=self.device)  # summed loss, correct tokens, tokens
        for ids in self._heldout_slices():
            inputs, targets = _inputs_and_targets(self.corpus.heldout_batch(ids), self.device)
            logits = self.core(inputs)
            totals[0] += self.core.loss(logits, targets) * targets.numel()
            totals[1] += (logits.argmax(-1) == targets).sum()
            totals[2] += targets.numel()
        self.model.train()
        dist.all_reduce(totals)
        if self.rank == 0:
            loss = totals[0] / totals[2]
            self.log.eval(
                self.step,
                {"loss": loss, "accuracy": totals[1] / totals[2], "excess_loss": loss - self.entropy_floor},
                cum_tokens=self.spent_tokens,
                cum_flops=self.spent_flops,
            )

    def _heldout_slices(self) -> list[list[int]]:
        """This rank's share of the held-out samples, in batches of its per-rank batch size."""
        total = min(self.config.eval_batches * self.config.global_batch, self.config.data.heldout_samples)
        total -= total % self.world_size  # equal shares: FSDP's forward is a collective
        mine = list(range(self.rank, total, self.world_size))
        size = self.config.global_batch // self.world_size
        return [mine[start : start + size] for start in range(0, len(mine), size)]


def _inputs_and_targets(samples: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples of ``seq_len + 1`` tokens as inputs and next-token targets."""
    tokens = torch.from_numpy(samples).to(device)
    return tokens[:, :-1], tokens[:, 1:]
