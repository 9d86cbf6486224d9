"""The trainer's control actions: rewind, skip, quarantine, checkpoint and stop, applied to a Trainer.

The kit's ``ControlClient`` (``bedside.collectors.kit.actions``) reads the run's requests, hands
every rank the same ones at the same step and acknowledges each in telemetry; this module is its
handlers for the trainer. The ids handled and the pause are trainer state (``Trainer.control_state``),
saved in every checkpoint and kept across a rewind. Format: docs/telemetry-format.md, "Control requests".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bedside.collectors.kit import Action, ControlClient, Rejected, int_arg

from .manifest import CheckpointError

if TYPE_CHECKING:
    from .checkpointing import Checkpointing
    from .trainer import Trainer


class ControlChannel:
    """Applies control requests to a Trainer at step boundaries (every rank calls ``at_step_boundary``)."""

    def __init__(self, trainer: Trainer, checkpointing: Checkpointing) -> None:
        self.trainer, self.checkpointing = trainer, checkpointing
        self.client = ControlClient(
            trainer.log,
            state=trainer.control_state,
            on_rewind=self._rewind,
            on_skip=self._skip,
            on_quarantine=self._quarantine,
            on_checkpoint=self._checkpoint,
            on_stop=self._stop,
        )

    @property
    def stop_reason(self) -> str | None:
        return self.client.stop_reason

    def at_step_boundary(self) -> bool:
        """Apply what was requested (waiting while paused); False once the run must stop."""
        return self.client.at_step_boundary(self.trainer.step)

    def recover(self) -> None:
        """After a restart: retake, at the next boundary, what the restored state lacks."""
        self.client.recover(self.trainer.step)

    def close(self) -> None:
        """At the end of the run: reject what is still filed, so that every request gets an answer."""
        self.client.close(self.trainer.step)

    # -- the actions (every rank, same outcome) ---------------------------------------
    def _rewind(self, action: Action) -> str:
        to_step = int_arg(action, "to_step")
        trainer, sampler = self.trainer, self.trainer.sampler
        if to_step > trainer.step:
            raise Rejected(f"cannot rewind forward: to_step {to_step} is after the current step {trainer.step}")
        # the operators' edits and the control state outlive a rewind: the checkpoint loaded predates them
        skips, shards, control = sampler.skip_ranges, sampler.quarantined_shards, trainer.control_state.state_dict()
        before = (trainer.timeline, trainer.step)
        try:
            loaded = self.checkpointing.rewind(to_step)
        except CheckpointError as error:
            raise Rejected(f"the checkpoint could not be loaded: {error}") from None
        if loaded is None:
            raise Rejected(f"no checkpoint at or before step {to_step}")
        trainer.control_state.load_state_dict(control)
        for first, last in skips:
            sampler.skip(first, last)
        for shard in shards:
            sampler.quarantine(shard)
        action.step = trainer.step
        return (
            f"rewound from step {before[1]} of timeline {before[0]} to the checkpoint of step {trainer.step} "
            f"({loaded.path.name}); continuing on timeline {trainer.timeline}"
        )

    def _skip(self, action: Action) -> str:
        first, last = int_arg(action, "first_batch"), int_arg(action, "last_batch")
        try:
            self.trainer.sampler.skip(first, last)
        except ValueError as error:
            raise Rejected(str(error)) from None
        return f"batches {first} to {last} will not be trained (next batch {self.trainer.sampler.cursor})"

    def _quarantine(self, action: Action) -> str:
        shard = int_arg(action, "shard")
        try:
            self.trainer.sampler.quarantine(shard)
        except ValueError as error:
            raise Rejected(str(error)) from None
        return f"shard {shard} quarantined"

    def _checkpoint(self, action: Action) -> str:
        if not self.checkpointing.save_now():
            raise Rejected(f"step {self.trainer.step} of timeline {self.trainer.timeline} is already saved")
        return f"checkpoint of step {self.trainer.step} started"

    def _stop(self, action: Action) -> str:
        return f"stopping after step {self.trainer.step}: a final checkpoint, then run_end aborted"
