"""A Hugging Face ``transformers.TrainerCallback`` that writes a bedside run.

Every rank writes ``rank_step`` (its step time, forward-and-backward time and optimizer time, read from the
host clock between ``on_step_begin``, ``on_pre_optimizer_step`` and ``on_step_end``); the job rank writes the
job-level ``step`` from ``on_log`` (the Trainer's loss averaged over ranks, the grad norm before clipping, the
learning rate, the tokens of the step from ``num_input_tokens_seen``), ``eval`` from ``on_evaluate`` with the
Trainer's cumulative tokens and FLOPs, and a ``checkpoint`` record from ``on_save``.

Control requests go through the kit's ``ControlClient`` at each step boundary (``on_step_end``, every rank):
stop and checkpoint through ``TrainerControl``; rewind (the newest ``checkpoint-N`` under ``output_dir`` at or
before the step asked: model, optimizer and scheduler; it needs the ``Trainer`` itself:
``BedsideCallback(run_dir, trainer=trainer)``) and skip (a ``SkippingSampler`` over the step batches of the
Trainer's batch sampler)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accelerate.data_loader import BatchSamplerShard
from torch.utils.data import BatchSampler
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME

from ..control_inbox import Rejected
from ..format import RunEndStatus
from ..kit.actions import Action, ControlClient
from ..kit.skipping import SkippingSampler
from ..writer import RunLogger
from .actions import (
    SavedCheckpoints,
    StepBatches,
    StepShare,
    StepShareIds,
    continue_on_new_timeline,
    opened,
    refuse,
    rewind_target,
)
from .replicas import CHECKSUM_EVERY, ReplicaSignals
from .stepclock import StepClock

_STEP_METRICS = {"loss": "loss", "grad_norm": "grad_norm", "learning_rate": "lr", "epoch": "epoch"}
"""The Trainer's training-log keys and the names bedside records them under."""
_EVAL_BOOKKEEPING = ("runtime", "samples_per_second", "steps_per_second", "epoch", "num_input_tokens_seen")
"""Keys of the Trainer's evaluation metrics that say how the evaluation ran, not how good the model is."""
_NEEDS_TRAINER = "{} needs the Trainer: make the callback with BedsideCallback(run_dir, trainer=trainer)"
_NO_SHARDS = "quarantine: a transformers Trainer reads no shards that bedside can leave out"


class BedsideCallback(TrainerCallback):
    """Writes the telemetry of a ``transformers.Trainer`` run into ``run_dir``, one file per rank.

    Set ``logging_steps=1`` for a ``step`` record per step (the Trainer logs every ``logging_steps``), and
    ``include_num_input_tokens_seen=True`` for tokens. The logger opens at ``on_train_begin`` (resuming
    on a new timeline when the Trainer resumes from a checkpoint) and closes at ``on_train_end``.

    ``trainer``: the ``Trainer`` this callback is added to (``trainer.add_callback(...)``); with it, each rank's
    ``rank_step`` also carries its ``local_grad_norm`` (a DDP comm hook on ``trainer.model_wrapped``) and every
    ``checksum_every`` steps its ``param_checksum``; without it, rewind requests are rejected with the reason."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        name: str | None = None,
        trainer: Trainer | None = None,
        checksum_every: int = CHECKSUM_EVERY,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.name = name
        self.trainer = trainer
        self.logger: RunLogger | None = None
        self.client: ControlClient | None = None
        self._checkpoints = SavedCheckpoints(r"checkpoint-(\d+)")
        self._replicas = ReplicaSignals(checksum_every)
        self._clock = StepClock(self._replicas.grads.run_queue)  # one clock: the hook reads the loop's thread
        self._tokens_seen = 0
        self._control = TrainerControl()
        self._saving: list[Action] = []

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self.logger = RunLogger(
            self.run_dir,
            name=self.name,
            config=_json_config(args.to_dict()),
            rank=args.process_index,
            world_size=args.world_size,
            local_rank=max(args.local_process_index, 0),
            resume=state.global_step > 0,
        )
        self._tokens_seen = state.num_input_tokens_seen
        self.client = ControlClient(
            self.logger,
            on_checkpoint=self._checkpoint,
            on_rewind=self._rewind if self.trainer is not None else refuse(_NEEDS_TRAINER.format("rewind")),
            handlers={"quarantine": refuse(_NO_SHARDS)},
        )
        self._skip_through(kw.get("train_dataloader"), args, self.client)
        if self.trainer is not None:
            self._replicas.watch(self.trainer.model_wrapped)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._clock.start()
        self._replicas.begin(state.global_step + 1)

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._clock.backward_done()

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._clock.optimizer_done()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        replicas = (
            self._replicas.metrics(state.global_step, self.trainer.model_wrapped) if self.trainer is not None else {}
        )
        self._open().rank_step(
            state.global_step,
            **self._clock.times(self._replicas.local_done, self._replicas.waited_at_ready),
            **replicas,
        )
        self._control = control  # the handlers set its flags
        if not self._controls().at_step_boundary(state.global_step):
            control.should_training_stop = True

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        metrics = {ours: logs[theirs] for theirs, ours in _STEP_METRICS.items() if _is_number(logs.get(theirs))}
        if state.num_input_tokens_seen > self._tokens_seen:
            metrics["tokens"] = state.num_input_tokens_seen - self._tokens_seen
            self._tokens_seen = state.num_input_tokens_seen
        self._open().step(state.global_step, **metrics)

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: Mapping[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        if not state.is_world_process_zero or not metrics:
            return
        scores = {
            key.removeprefix("eval_"): value
            for key, value in metrics.items()
            if _is_number(value) and key.removeprefix("eval_") not in _EVAL_BOOKKEEPING
        }
        if scores:
            self._open().eval(
                state.global_step,
                scores,
                cum_tokens=state.num_input_tokens_seen or None,
                cum_flops=state.total_flos or None,
            )

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if state.is_world_process_zero:
            self._open().checkpoint(state.global_step, "saved", path=str(_checkpoint_of(args, state.global_step)))
        for action in self._saving:
            action.step = state.global_step
            action.applied(f"saved {_checkpoint_of(args, state.global_step)}")
        self._saving = []

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._controls().close(state.global_step)
        self._open().close(RunEndStatus.FINISHED)

    # -- control requests (every rank, the same outcome) ---------------------------------------------
    def _checkpoint(self, action: Action) -> None:
        """The Trainer saves after this step's callbacks; the request is answered when it has saved."""
        self._control.should_save = True
        action.defer()
        self._saving.append(action)

    def _rewind(self, action: Action) -> str:
        trainer = self.trainer
        assert trainer is not None  # the handler is only set with a trainer
        state, control = trainer.state, self._control
        saved = self._checkpoints.found([Path(str(trainer.args.output_dir))])
        step, path = rewind_target(action, self._controls(), state.global_step, saved)
        if not (path / OPTIMIZER_NAME).is_file() or not (path / SCHEDULER_NAME).is_file():
            raise Rejected(f"{path.name} holds no optimizer or scheduler state (saved with save_only_model?)")
        trainer._load_from_checkpoint(str(path))
        trainer._load_optimizer_and_scheduler(str(path))
        # the Trainer goes on from the step restored: nothing of the abandoned step is logged, evaluated or saved
        state.global_step = trainer._globalstep_last_logged = step
        trainer._tr_loss.zero_()
        control.should_log = control.should_evaluate = control.should_save = False
        control.should_training_stop = step >= state.max_steps
        action.step = step
        self._checkpoints.rewound(step)
        return continue_on_new_timeline(self._open(), step, path)

    def _skip_through(self, loader: Any, args: TrainingArguments, client: ControlClient) -> None:
        """Put a ``SkippingSampler`` over the step batches: under accelerate's ``BatchSamplerShard`` (more than one
        process: every rank reads the same micro-batches and keeps its own), or, on one process, under the loader's
        own ``BatchSampler``. A step batch is ``world_size`` x ``gradient_accumulation_steps`` micro-batches."""
        batches = getattr(loader, "batch_sampler", None)
        per_step = args.world_size * args.gradient_accumulation_steps
        if isinstance(batches, BatchSamplerShard):
            inner = batches.batch_sampler
            steps = SkippingSampler(StepBatches(inner, per_step), client)
            batches.batch_sampler = StepShare(steps, inner, size=inner.batch_size)
        elif type(batches) is BatchSampler and args.world_size == 1:
            sampler, size = batches.sampler, batches.batch_size
            steps = SkippingSampler(StepBatches(BatchSampler(sampler, size, batches.drop_last), per_step), client)
            epochs = [sampler] if callable(getattr(sampler, "set_epoch", None)) else []
            batches.sampler = StepShareIds(steps, sampler, size=size, epochs=epochs)
        else:
            client.handlers["skip"] = refuse(
                "skip needs the Trainer's batches drawn through a BatchSampler (a map-style dataset); this Trainer's"
                f" loader draws them through {type(batches).__name__}"
            )

    def _controls(self) -> ControlClient:
        return opened(self.client, "on_train_begin")

    def _open(self) -> RunLogger:
        return opened(self.logger, "on_train_begin")


def _checkpoint_of(args: TrainingArguments, step: int) -> Path:
    return Path(str(args.output_dir)) / f"checkpoint-{step}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainingArguments as JSON values: anything else (enums, paths) as its text."""
    plain = (str, int, float, bool, type(None))
    return {key: value if isinstance(value, plain) else str(value) for key, value in config.items()}
