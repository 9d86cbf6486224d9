"""``RunQueueClock``: the time a thread waits for a CPU that another process holds, and not the time it sleeps."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bedside.collectors.kit.runqueue import RunQueueClock

pytestmark = pytest.mark.skipif(
    not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists(), reason="the kernel keeps no schedstat"
)


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_thread_waits_for_a_cpu_it_shares_with_a_spinning_process_and_not_while_it_sleeps() -> None:
    cpu = sorted(os.sched_getaffinity(0))[0]
    spinner = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    waits: dict[str, float] = {}

    def measure() -> None:  # a thread of its own, so that pinning it leaves this process's other threads alone
        os.sched_setaffinity(0, {cpu})
        clock = RunQueueClock()
        spin(0.5)  # the spinner is surely running by now
        for name, act in (("spinning", spin), ("sleeping", time.sleep)):
            start = clock.read()
            act(0.6)
            end = clock.read()
            assert start is not None and end is not None
            waits[name] = end - start
        clock.close()

    try:
        thread = threading.Thread(target=measure)
        thread.start()
        thread.join()
    finally:
        spinner.kill()
        spinner.wait()
    assert waits["spinning"] > 0.15, waits  # about half of 0.6 s on a CPU shared by two
    assert waits["sleeping"] < 0.1, waits


def waited_so_far() -> float:
    """The calling thread's run-queue wait read from its schedstat file directly."""
    return int(Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()[1]) / 1e9


def test_a_clock_reads_the_thread_that_read_it_first_and_says_nothing_on_another() -> None:
    clock = RunQueueClock()
    before, read, after = waited_so_far(), clock.read(), waited_so_far()
    assert read is not None and before <= read <= after
    elsewhere: list[float | None] = []
    thread = threading.Thread(target=lambda: elsewhere.append(clock.read()))
    thread.start()
    thread.join()
    assert elsewhere == [None]  # a hook a framework calls from a thread of its own measures nothing
    clock.close()
