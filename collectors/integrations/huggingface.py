"""A Hugging Face ``transformers.TrainerCallback`` that writes a bedside run.

Every rank writes ``rank_step`` (its step time, forward-and-backward time and optimizer time, read from the
host clock between ``on_step_begin``, ``on_pre_optimizer_step`` and ``on_step_end``); the job rank writes the
job-level ``step`` from ``on_log`` (the Trainer's loss averaged over ranks, the grad norm before clipping, the
learning rate, the tokens of the step from ``num_input_tokens_seen``), ``eval`` from ``on_evaluate`` with the
Trainer's cumulative tokens and FLOPs, and a ``checkpoint`` record from ``on_save``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ..format import RunEndStatus
from ..writer import RunLogger
from .stepclock import StepClock

_STEP_METRICS = {"loss": "loss", "grad_norm": "grad_norm", "learning_rate": "lr", "epoch": "epoch"}
"""The Trainer's training-log keys and the names bedside records them under."""
_EVAL_BOOKKEEPING = ("runtime", "samples_per_second", "steps_per_second", "epoch", "num_input_tokens_seen")
"""Keys of the Trainer's evaluation metrics that say how the evaluation ran, not how good the model is."""


class BedsideCallback(TrainerCallback):
    """Writes the telemetry of a ``transformers.Trainer`` run into ``run_dir``, one file per rank.

    Set ``logging_steps=1`` for a ``step`` record per step (the Trainer logs every ``logging_steps``), and
    ``include_num_input_tokens_seen=True`` for tokens. The logger opens at ``on_train_begin`` (resuming
    on a new timeline when the Trainer resumes from a checkpoint) and closes at ``on_train_end``."""

    def __init__(self, run_dir: str | Path, *, name: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.name = name
        self.logger: RunLogger | None = None
        self._clock = StepClock()
        self._tokens_seen = 0

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

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._clock.start()

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._clock.backward_done()

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._clock.optimizer_done()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._open().rank_step(state.global_step, **self._clock.times())

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
            path = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
            self._open().checkpoint(state.global_step, "saved", path=str(path))

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        self._open().close(RunEndStatus.FINISHED)

    def _open(self) -> RunLogger:
        if self.logger is None:
            raise RuntimeError("BedsideCallback received a training event before on_train_begin opened its logger")
        return self.logger


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainingArguments as JSON values: anything else (enums, paths) as its text."""
    plain = (str, int, float, bool, type(None))
    return {key: value if isinstance(value, plain) else str(value) for key, value in config.items()}
