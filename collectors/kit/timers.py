"""Phase timing without a device sync: host clocks on CPU, CUDA events on a GPU.

A step's phases are the spans between consecutive marks (``PHASES``: data, forward and
backward compute, the wait for gradient communication, the optimizer), so they add up to
the step time. On CPU a mark is ``time.perf_counter()``. On CUDA a mark is an event recorded
on the current stream: the spans are what the device's stream saw, and the writer thread
reads them (``Later``) after the step's last event completed, so the step never waits.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from bedside.collectors.capture import Later

PHASES = ("data", "compute", "comm", "optimizer")
"""The phases of a step, in order; each is recorded as ``<phase>_time`` next to ``step_time``."""


class HostClock:
    """Marks are ``time.perf_counter()`` seconds; spans are numbers at once."""

    def mark(self) -> float:
        return time.perf_counter()

    def mark_unblocked(self, blocked_s: float) -> float:
        """Now, moved back by the ``blocked_s`` seconds the host spent blocked (gloo's reduce-scatters)."""
        return time.perf_counter() - blocked_s

    def span(self, start: float, end: float) -> float:
        return end - start


class CudaClock:
    """Marks are CUDA events on the current stream; spans are read by the writer thread."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def mark_unblocked(self, blocked_s: float) -> torch.cuda.Event:
        """Now: reductions run on streams of their own and block the host ~0 s."""
        return self.mark()

    def span(self, start: torch.cuda.Event, end: torch.cuda.Event) -> Later:
        def elapsed() -> float:
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return Later(elapsed)


Clock = HostClock | CudaClock


def clock_for(device: torch.device) -> Clock:
    """CUDA events for a CUDA device, the host's monotonic clock for anything else."""
    return CudaClock(device) if device.type == "cuda" else HostClock()


def phase_times(clock: Clock, marks: tuple[Any, ...]) -> dict[str, Any]:
    """``step_time`` and each ``<phase>_time`` from the step's marks (start, then one per phase end)."""
    if len(marks) != len(PHASES) + 1:
        raise ValueError(f"{len(PHASES) + 1} marks needed (start and each phase's end), got {len(marks)}")
    times = {f"{phase}_time": clock.span(a, b) for phase, a, b in zip(PHASES, marks, marks[1:])}
    return {"step_time": clock.span(marks[0], marks[-1]), **times}
