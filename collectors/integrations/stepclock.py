"""Per-rank phase times of one training step, read from the host clock at a framework's hooks."""

from __future__ import annotations

import time
from typing import Any

from bedside.collectors.kit.runqueue import RunQueueClock, waited_between


class StepClock:
    """Marks a step's start, the end of forward and backward, and the end of the optimizer step.

    ``times()`` gives the ``rank_step`` timings: ``step_time`` from start to the last mark, ``compute_time``
    (forward and backward, with the gradient all-reduce they overlap) and ``optimizer_time``. Given
    ``local_done``, the host time the last gradient bucket was ready (the kit's DDP comm hook), backward splits
    there: ``compute_time`` is this rank's own work and ``comm_time`` the wait for the all-reduce after it (a
    slow rank shows long compute, its peers long waits). ``cpu_wait_time`` is how long the thread waited for a
    CPU over the same span as ``compute_time`` (kit.md). A phase whose marks are missing is left out. Reading
    the clock costs no device sync."""

    def __init__(self, run_queue: RunQueueClock | None = None) -> None:
        """``run_queue``: the clock the comm hook reads too, so that both read the loop's thread (a hook that
        runs on another thread then reads nothing, and no wait is recorded rather than one of two threads')."""
        self._start: float | None = None
        self._backward_done: float | None = None
        self._optimizer_done: float | None = None
        self._run_queue = run_queue or RunQueueClock()
        self._waited: float | None = None
        self._waited_at_backward: float | None = None

    def start(self) -> None:
        self._start, self._backward_done, self._optimizer_done = time.perf_counter(), None, None
        self._waited, self._waited_at_backward = self._run_queue.read(), None

    def backward_done(self) -> None:
        self._backward_done = time.perf_counter()
        self._waited_at_backward = self._run_queue.read()

    def optimizer_done(self) -> None:
        self._optimizer_done = time.perf_counter()

    def times(self, local_done: float | None = None, waited_at_ready: float | None = None) -> dict[str, Any]:
        """The timings; ``waited_at_ready`` is the thread's run-queue wait read at ``local_done``."""
        if self._start is None:
            return {}
        end = time.perf_counter()
        times: dict[str, Any] = {"step_time": end - self._start}
        if self._backward_done is not None:
            times["compute_time"] = self._backward_done - self._start
            waited = self._waited_at_backward
            if local_done is not None and self._start <= local_done <= self._backward_done:
                times["compute_time"] = local_done - self._start
                times["comm_time"] = self._backward_done - local_done
                waited = waited_at_ready
            if self._optimizer_done is not None:
                times["optimizer_time"] = self._optimizer_done - self._backward_done
            if (cpu_wait := waited_between(self._waited, waited)) is not None:
                times["cpu_wait_time"] = cpu_wait
        self._start = None
        return times
