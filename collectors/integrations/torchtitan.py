"""A torchtitan metrics logger that writes a bedside run.

torchtitan's ``MetricsProcessor`` hands every ``log_freq`` steps one dict to its logger, ``log(metrics, step)``,
on the one rank that logs, and calls ``close()`` at the end. ``TorchtitanLogger`` has that interface: set it as
the processor's ``logger`` (or return it from the function that builds the loggers). Training metrics become the
job-level ``step`` under bedside's names (``_STEP_NAMES``; others keep torchtitan's names), validation
metrics (``validation_metrics/...``) an ``eval`` with the tokens seen so far. It imports nothing of torchtitan."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..format import RunEndStatus
from ..writer import RunLogger

_STEP_NAMES = {
    "loss_metrics/global_avg_loss": "loss",
    "loss_metrics/global_max_loss": "loss_max",
    "grad_norm": "grad_norm",
    "lr": "lr",
    "throughput(tps)": "tokens_per_s_per_device",
    "tflops": "tflops",
    "mfu(%)": "mfu_pct",
    "time_metrics/end_to_end(s)": "step_time_mean",
    "time_metrics/data_loading(s)": "data_time_mean",
    "time_metrics/data_loading(%)": "data_time_pct",
}
"""torchtitan's training metric names and the names bedside records them under."""
_TOKENS_SEEN = "n_tokens_seen"
_VALIDATION = "validation_metrics/"


class TorchtitanLogger:
    """torchtitan's logger interface over a ``RunLogger`` of the logging rank.

    ``n_tokens_seen`` (cumulative) gives each ``step`` its ``tokens`` since the previous log and each ``eval``
    its ``cum_tokens``.
    A value that is not a number is refused by the ``RunLogger`` (``TypeError``); what was recorded before stays."""

    def __init__(self, run_dir: str | Path | None = None, *, logger: RunLogger | None = None, **options: Any) -> None:
        if run_dir is not None and logger is None:
            self.logger = RunLogger(run_dir, **options)
        elif run_dir is None and logger is not None:
            self.logger = logger
        else:
            raise ValueError("TorchtitanLogger takes either a run directory or a RunLogger, not both or neither")
        self._tokens_seen: float | None = None

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record one call of torchtitan's metrics processor."""
        validation = {k.removeprefix(_VALIDATION): v for k, v in metrics.items() if k.startswith(_VALIDATION)}
        training = {_STEP_NAMES.get(k, k): v for k, v in metrics.items() if not k.startswith(_VALIDATION)}
        tokens_seen = training.pop(_TOKENS_SEEN, None)
        if tokens_seen is not None:
            training["tokens"] = tokens_seen - (self._tokens_seen or 0)
            self._tokens_seen = tokens_seen
        if validation:
            self.logger.eval(step, validation, cum_tokens=self._tokens_seen)
        if training:
            self.logger.step(step, **training)

    def close(self) -> None:
        """End the run (``run_end`` finished) and flush."""
        self.logger.close(RunEndStatus.FINISHED)
