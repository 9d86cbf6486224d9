"""Checkpointing around the training loop: save every N steps without waiting,
report each save when it completes, and resume from the latest good checkpoint.

A resumed rank retrains the steps between its checkpoint and where it stopped.
Those steps were already recorded, so the resumed run starts a new timeline (as a
rewind does): every (timeline, step) stays unique and the abandoned steps stay
visible as a branch. So does a run that finds no good checkpoint and starts again
from step 0 after it had recorded steps. Every checkpoint found corrupt (passed over
by a resume or a rewind, or by retention) is reported as a ``corrupt`` event.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from .checkpoint import CheckpointInfo, CheckpointManager, SaveHandle, SaveResult
from .manifest import Skipped

if TYPE_CHECKING:
    from .trainer import Trainer


class Checkpointing:
    """Saves, reports and restores a Trainer's checkpoints (all ranks call every method)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        config = trainer.config
        self.manager = CheckpointManager(trainer.log.layout.checkpoints, keep_last=config.keep_checkpoints)
        self._pending: SaveHandle | None = None
        self._last_saved: tuple[int, int] | None = None  # (timeline, step)

    def after_step(self) -> None:
        """Report a finished save; start one every ``checkpoint_every`` steps."""
        self._report_if_done()
        trainer = self.trainer
        if trainer.step % trainer.config.checkpoint_every == 0 and trainer.step < trainer.config.steps:
            self.save_now()

    def finish(self) -> None:
        """Save the final state and wait for every save to be written and reported."""
        self.save_now()
        self.finish_in_flight()
        self.manager.close()

    def finish_in_flight(self) -> None:
        """Wait for the save in flight, if any, and report it."""
        if self._pending is not None:
            self._report(self._pending.wait())
        self._pending = None

    def save_now(self) -> bool:
        """Start a save of the current step (after reporting the one in flight); False when it is saved."""
        trainer = self.trainer
        if self._last_saved == (trainer.timeline, trainer.step):
            return False
        self.finish_in_flight()
        self._save()
        return True

    def resume(self) -> bool:
        """Load the latest good checkpoint (reporting corrupt ones passed over); False when none, and the run
        starts from step 0 (on a new timeline when it had recorded steps)."""
        trainer = self.trainer
        choice = self.manager.latest_good()
        self._report_corrupt(choice.skipped)
        if choice.checkpoint is not None:
            trainer.load_state_dict(self.manager.load(choice.checkpoint, trainer.core, trainer.optimizer))
        timeline, step = self._where_the_run_left_off()
        if timeline == trainer.timeline and step > trainer.step:  # the steps the dead process took past the save
            trainer.spend(step - trainer.step)
        if step > trainer.step or timeline > trainer.timeline:
            trainer.timeline = max(timeline, trainer.timeline) + 1
        if choice.checkpoint is None:
            return False
        if trainer.rank == 0:
            message = "fell back past corrupt checkpoints" if choice.fell_back else None
            trainer.log.checkpoint(trainer.step, "loaded", path=self._relative(choice.checkpoint.path), message=message)
        return True

    def _where_the_run_left_off(self) -> tuple[int, int]:
        """The highest (timeline, step) any rank recorded before this restart, agreed by all ranks: the newest
        timeline, then the furthest step on it (a rank still on an older timeline says nothing of its steps)."""
        timeline, step = self.trainer.log.left_off or (0, 0)
        newest = torch.tensor([timeline], dtype=torch.int64)
        dist.all_reduce(newest, op=dist.ReduceOp.MAX, group=self.manager.group)
        furthest = torch.tensor([step if timeline == int(newest) else 0], dtype=torch.int64)
        dist.all_reduce(furthest, op=dist.ReduceOp.MAX, group=self.manager.group)
        return int(newest), int(furthest)

    def rewind(self, at_or_before_step: int) -> CheckpointInfo | None:
        """Load the latest good checkpoint at or before a step and continue on a new timeline; None when none."""
        trainer = self.trainer
        highest = trainer.timeline
        choice = self.manager.latest_good(at_or_before_step)
        self._report_corrupt(choice.skipped)
        if choice.checkpoint is None:
            return None
        spent = trainer.spent_tokens, trainer.spent_flops  # the abandoned branch's compute was spent all the same
        trainer.load_state_dict(self.manager.load(choice.checkpoint, trainer.core, trainer.optimizer))
        trainer.spent_tokens, trainer.spent_flops = spent
        trainer.timeline = max(highest, trainer.timeline) + 1
        if trainer.rank == 0:
            trainer.log.checkpoint(
                trainer.step,
                "loaded",
                path=self._relative(choice.checkpoint.path),
                message=f"rewind: continuing on timeline {trainer.timeline}",
            )
        return choice.checkpoint

    def _report_corrupt(self, skipped: tuple[Skipped, ...], step: int | None = None) -> None:
        trainer = self.trainer
        for passed in skipped if trainer.rank == 0 else ():
            trainer.log.checkpoint(
                trainer.step if step is None else step,
                "corrupt",
                path=self._relative(passed.path),
                message=passed.reason,
            )

    def _save(self) -> None:
        trainer = self.trainer
        self._last_saved = (trainer.timeline, trainer.step)
        if trainer.rank == 0:
            trainer.log.checkpoint(trainer.step, "save_started")
        self._pending = self.manager.save(
            trainer.step, trainer.timeline, trainer.core, trainer.optimizer, trainer.state_dict()
        )

    def _report_if_done(self) -> None:
        if self._pending is not None and self._pending.done():
            self._report(self._pending.result())
            self._pending = None

    def _report(self, result: SaveResult) -> None:
        trainer = self.trainer
        if trainer.rank != 0:
            return
        trainer.log.checkpoint(
            result.step,
            result.status,
            path=self._relative(result.path),
            duration_s=result.duration_s,
            bytes=result.bytes,
            message=result.error,
        )
        self._report_corrupt(result.corrupt, result.step)
        for deleted in result.deleted:
            trainer.log.checkpoint(result.step, "deleted", path=self._relative(deleted))

    def _relative(self, path: Path) -> str:
        root = self.trainer.log.layout.root
        try:
            return str(path.relative_to(root))
        except ValueError:
            return str(path)
