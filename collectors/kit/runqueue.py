"""How long this thread waited for a CPU: Linux's run-queue delay, from ``/proc/self/task/TID/schedstat``.

A rank that competes with other processes for the host's cores is runnable but not
running for part of its step; its wall-clock compute grows although its own work did
not. The second field of schedstat is that wait (nanoseconds, since the thread began),
so a step's ``cpu_wait_time`` is the difference of two reads: about 1 us each, a
``pread`` on a descriptor kept open. A sleep, a blocked collective or a device wait is
not counted (the thread is not runnable then). Elsewhere than Linux, or without
schedstats in the kernel, the reads give ``None`` and nothing is recorded.
"""

from __future__ import annotations

import os
import threading


def waited_between(start: float | None, end: float | None) -> float | None:
    """Seconds waited between two ``read()`` s of one clock (None when either said nothing)."""
    return None if start is None or end is None else max(0.0, end - start)


class RunQueueClock:
    """Cumulative seconds one thread, the first that reads it, has spent runnable but waiting for a CPU."""

    def __init__(self) -> None:
        self._tid: int | None = None
        self._fd: int | None = None

    def read(self) -> float | None:
        """The thread's run-queue wait so far, in seconds; None where the kernel does not say, and on any other
        thread (a hook that a framework calls from a thread of its own)."""
        tid = threading.get_native_id()
        if self._tid is None:
            self._tid = tid
            try:
                self._fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._fd = None
        if self._fd is None or tid != self._tid:
            return None
        try:
            return int(os.pread(self._fd, 96, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            self.close()
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()
