"""A PyTorch Lightning ``Callback`` that writes a bedside run.

Every rank writes ``rank_step`` (its step, forward-and-backward and optimizer times from the host clock, and
its own loss as ``local_loss``); the job rank (global rank 0) writes one job-level ``step`` (its loss, the
gradient norm before clipping, which DDP has already averaged across ranks, and the learning rate), ``eval``
at each validation end with the logged ``val*`` metrics, and a ``checkpoint`` record when a save starts.

Control requests go through the kit's ``ControlClient`` at each step boundary (``on_train_batch_end``, every
rank): stop through ``trainer.should_stop``, checkpoint through ``trainer.save_checkpoint``, rewind by loading
the newest checkpoint at or before the step asked (module, optimizers, schedulers and the step count), skip
through a ``SkippingSampler`` over the step batches of the train loader's ``DistributedSampler``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import BatchSampler, DistributedSampler

from ..format import RunEndStatus
from ..kit.actions import Action, ControlClient
from ..kit.skipping import SkippingSampler
from ..writer import RunLogger
from .actions import (
    Interleaved,
    SavedCheckpoints,
    StepBatches,
    StepShareIds,
    continue_on_new_timeline,
    opened,
    refuse,
    rewind_target,
)
from .replicas import CHECKSUM_EVERY, ReplicaSignals
from .stepclock import StepClock

CHECKPOINT_NAME = r"(?:.*-)?step=(\d+)(?:-.*)?\.ckpt"
"""The checkpoint files a rewind can load: Lightning's ``epoch=E-step=N.ckpt`` and the ``step=N.ckpt`` a
checkpoint request saves."""
_NO_SHARDS = "quarantine: a Lightning fit reads no shards that bedside can leave out"


class BedsideCallback(Callback):
    """Writes the telemetry of a ``lightning.pytorch.Trainer`` fit into ``run_dir``, one file per rank.

    The logger opens when the fit is set up (resuming on a new timeline when the fit starts past step 0) and
    closes at the end of the fit, or with status ``failed`` when the fit raises."""

    def __init__(self, run_dir: str | Path, *, name: str | None = None, checksum_every: int = CHECKSUM_EVERY) -> None:
        self.run_dir = Path(run_dir)
        self.name = name
        self.logger: RunLogger | None = None
        self.client: ControlClient | None = None
        self._checkpoints = SavedCheckpoints(CHECKPOINT_NAME)
        self._replicas = ReplicaSignals(checksum_every)
        self._clock = StepClock(self._replicas.grads.run_queue)  # one clock: the hook reads the loop's thread
        self._grad_norm: torch.Tensor | None = None
        self._trainer: Trainer | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.logger = RunLogger(
            self.run_dir,
            name=self.name,
            config={key: str(value) for key, value in pl_module.hparams.items()},
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            local_rank=trainer.local_rank,
            resume=trainer.global_step > 0,
        )
        self._trainer = trainer
        self.client = ControlClient(
            self.logger,
            on_checkpoint=self._checkpoint,
            on_rewind=self._rewind,
            on_skip=refuse("skip: the train loader was not set up yet"),
            handlers={"quarantine": refuse(_NO_SHARDS)},
        )
        if trainer.strategy.model is not None:
            self._replicas.watch(trainer.strategy.model)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._skip_through(trainer, self._controls())

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._clock.start()
        self._replicas.begin(trainer.global_step + 1)

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self._clock.backward_done()
        norms = [p.grad.detach().norm() for p in pl_module.parameters() if p.grad is not None]
        self._grad_norm = torch.linalg.vector_norm(torch.stack(norms)) if norms else None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._clock.optimizer_done()
        logger, step = self._open(), trainer.global_step
        loss = _loss_of(outputs)
        local: dict[str, Any] = {} if loss is None else {"local_loss": loss}
        replicas = self._replicas.metrics(step, pl_module)
        logger.rank_step(
            step, **self._clock.times(self._replicas.local_done, self._replicas.waited_at_ready), **local, **replicas
        )
        if trainer.is_global_zero:
            metrics: dict[str, Any] = {"lr": trainer.optimizers[0].param_groups[0]["lr"]}
            if loss is not None:
                metrics["loss"] = loss
            if self._grad_norm is not None:
                metrics["grad_norm"] = self._grad_norm
            logger.step(step, **metrics)
        self._grad_norm = None
        if not self._controls().at_step_boundary(step):
            trainer.should_stop = True

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        scores = {name: value for name, value in trainer.callback_metrics.items() if name.startswith("val")}
        if scores:
            self._open().eval(trainer.global_step, scores)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.is_global_zero:
            self._open().checkpoint(trainer.global_step, "save_started")

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._controls().close(trainer.global_step)
        self._open().close(RunEndStatus.FINISHED)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self.logger is not None:
            self.logger.close(RunEndStatus.FAILED, repr(exception))

    def _open(self) -> RunLogger:
        return opened(self.logger, "on_fit_start")

    # -- control requests (every rank, the same outcome) ---------------------------------------------
    def _fit(self) -> Trainer:
        return opened(self._trainer, "on_fit_start")

    def _controls(self) -> ControlClient:
        return opened(self.client, "on_fit_start")

    def _folders(self) -> list[Path]:
        """Where the fit's checkpoints are: its checkpoint callbacks' folders, else ``default_root_dir``."""
        trainer = self._fit()
        kept = [Path(str(folder)) for c in trainer.checkpoint_callbacks if (folder := getattr(c, "dirpath", None))]
        return kept or [Path(trainer.default_root_dir) / "checkpoints"]

    def _checkpoint(self, action: Action) -> str:
        trainer = self._fit()
        path = self._folders()[0] / f"step={trainer.global_step}.ckpt"
        trainer.save_checkpoint(path)
        return f"saved {path}"

    def _rewind(self, action: Action) -> str:
        trainer = self._fit()
        saved = self._checkpoints.found(self._folders())
        step, path = rewind_target(action, self._controls(), trainer.global_step, saved)
        checkpoint = trainer.strategy.load_checkpoint(path)
        trainer.strategy.load_model_state_dict(checkpoint)
        trainer.strategy.load_optimizer_state_dict(checkpoint)
        for config, state in zip(trainer.lr_scheduler_configs, checkpoint.get("lr_schedulers", ()), strict=False):
            config.scheduler.load_state_dict(state)
        # the step count goes back; the loader goes on with the batches after those already read
        loop = trainer.fit_loop.epoch_loop
        automatic = trainer.lightning_module.automatic_optimization
        steps = (
            loop.automatic_optimization.optim_progress.optimizer.step.total
            if automatic
            else loop.manual_optimization.optim_step_progress.total
        )
        steps.ready = steps.completed = step
        loop._batches_that_stepped = step
        action.step = step
        self._checkpoints.rewound(step)
        return continue_on_new_timeline(self._open(), step, path)

    def _skip_through(self, trainer: Trainer, client: ControlClient) -> None:
        """Put a ``SkippingSampler`` over the step batches of the train loader, under its own batch sampler: the
        ranks' ``DistributedSampler`` shares dealt out in turn are the global order, a step batch is
        ``world_size`` x ``accumulate_grad_batches`` batches of it, and this rank reads its share of each."""
        loader = trainer.train_dataloader
        batches = getattr(loader, "batch_sampler", None)
        if reason := _cannot_skip(loader, batches, trainer.world_size):
            client.handlers["skip"] = refuse(f"skip: {reason}")
            return
        assert isinstance(batches, BatchSampler)
        sampler, world, rank = batches.sampler, trainer.world_size, trainer.global_rank
        shares = (
            [
                DistributedSampler(
                    sampler.dataset,
                    num_replicas=world,
                    rank=r,
                    shuffle=sampler.shuffle,
                    seed=sampler.seed,
                    drop_last=sampler.drop_last,
                )
                for r in range(world)
            ]
            if isinstance(sampler, DistributedSampler)
            else [sampler]
        )
        size = batches.batch_size * world
        steps = StepBatches(BatchSampler(Interleaved(shares), size, batches.drop_last), trainer.accumulate_grad_batches)
        epochs = [share for share in shares if callable(getattr(share, "set_epoch", None))]
        batches.sampler = StepShareIds(
            SkippingSampler(steps, client), sampler, size=size, rank=rank, world=world, epochs=epochs
        )
        if trainer.fit_loop._data_fetcher is not None:  # its loader iterator, made before this hook, drew already
            iter(trainer.fit_loop._data_fetcher)


def _cannot_skip(loader: Any, batches: Any, world: int) -> str | None:
    """Why a skip cannot go through this train loader's batches (None when it can)."""
    if type(batches) is not BatchSampler:
        return f"the train loader's batch sampler is a {type(batches).__name__}, not a BatchSampler bedside can reach"
    if world > 1 and type(batches.sampler) is not DistributedSampler:
        return f"the ranks read through a {type(batches.sampler).__name__}, not Lightning's DistributedSampler"
    return None


def _loss_of(outputs: Any) -> torch.Tensor | None:
    """The loss ``training_step`` returned, alone or under ``"loss"``, detached (read later by the writer)."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return loss.detach() if isinstance(loss, torch.Tensor) else None
