"""A PyTorch Lightning ``Callback`` that writes a bedside run.

Every rank writes ``rank_step`` (its step, forward-and-backward and optimizer times from the host clock, and
its own loss as ``local_loss``); the job rank (global rank 0) writes one job-level ``step`` (its loss, the
gradient norm before clipping, which DDP has already averaged across ranks, and the learning rate), ``eval``
at each validation end with the logged ``val*`` metrics, and a ``checkpoint`` record when a save starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from ..format import RunEndStatus
from ..writer import RunLogger
from .stepclock import StepClock


class BedsideCallback(Callback):
    """Writes the telemetry of a ``lightning.pytorch.Trainer`` fit into ``run_dir``, one file per rank.

    The logger opens when the fit is set up (resuming on a new timeline when the fit starts past step 0) and
    closes at the end of the fit, or with status ``failed`` when the fit raises."""

    def __init__(self, run_dir: str | Path, *, name: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.name = name
        self.logger: RunLogger | None = None
        self._clock = StepClock()
        self._grad_norm: torch.Tensor | None = None

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

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._clock.start()

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
        logger.rank_step(step, **self._clock.times(), **local)
        if trainer.is_global_zero:
            metrics: dict[str, Any] = {"lr": trainer.optimizers[0].param_groups[0]["lr"]}
            if loss is not None:
                metrics["loss"] = loss
            if self._grad_norm is not None:
                metrics["grad_norm"] = self._grad_norm
            logger.step(step, **metrics)
        self._grad_norm = None

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
        self._open().close(RunEndStatus.FINISHED)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self.logger is not None:
            self.logger.close(RunEndStatus.FAILED, repr(exception))

    def _open(self) -> RunLogger:
        if self.logger is None:
            raise RuntimeError("BedsideCallback received a training event before on_fit_start opened its logger")
        return self.logger


def _loss_of(outputs: Any) -> torch.Tensor | None:
    """The loss ``training_step`` returned, alone or under ``"loss"``, detached (read later by the writer)."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return loss.detach() if isinstance(loss, torch.Tensor) else None
