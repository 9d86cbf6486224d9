"""Follow mode against real writers: concurrent ranks, a late rank, rescans and file events.

The first tests run ``bedside collect RUN --follow --until-finished`` as a process
while four RunLogger processes append; the others run the Follower in a thread of
the test so that the test can read the store it writes (through ``store.cursor()``).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, EventEmitter

from bedside.collectors.follow import Follower
from bedside.collectors.format import encode_line
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

WORLD = 4
STEPS = 400
EVENTUALLY_S = 10.0
ROW_TABLES = ("steps", "rank_steps", "evals", "checkpoints", "actions", "events", "faults")
MALFORMED = b'{"kind": "rank_step", oops}\n'

WRITER = f"""
import os, sys, time
from bedside.collectors.writer import RunLogger

run_dir, rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def mid_run(log, step):
    if rank == 0:
        log.eval(step, {{"loss": 2.5}}, cum_tokens=step * 4096, cum_flops=step * 1e12)
        log.checkpoint(step, "saved", path=f"checkpoints/step-{{step}}", duration_s=0.5, bytes=1e6)
    elif rank == 1:
        log.event("fault_injected", step, fault="straggler", target_ranks=[1], args={{"factor": 1.5}})
    elif rank == 2:
        log.log(step, "halfway", level="warning")
        log.flush()
        fd = os.open(log.layout.rank_file(rank), os.O_WRONLY | os.O_APPEND)
        os.write(fd, {MALFORMED!r})
        os.close(fd)
    else:
        log.event("custom_probe", step, metrics={{"value": 1.0}}, note="a kind unknown to v1")

with RunLogger(run_dir, rank=rank, world_size={WORLD}, name="follow", flush_every_s=0.05) as log:
    for step in range(1, steps + 1):
        log.rank_step(step, step_time=0.01, compute_time=0.007, comm_time=0.002, tokens_per_s=1e5)
        if rank == 0:
            log.step(step, loss=2.0 / step, grad_norm=1.0, lr=1e-3, tokens=4096.0)
        if step == steps // 2:
            mid_run(log, step)
        time.sleep(0.003)
"""


def expected_rows(steps: int) -> dict[str, int]:
    """Rows per table that the WRITER processes above produce."""
    return {
        "steps": steps,
        "rank_steps": WORLD * steps,
        "evals": 1,
        "checkpoints": 1,
        "actions": 0,
        "faults": 1,
        "events": 2 * WORLD + 2,
        "rejected_lines": 1,
    }


# -- helpers: processes ----------------------------------------------------------


def start_writer(run: Path, rank: int, steps: int = STEPS) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(run), str(rank), str(steps)])


def start_follow_collector(run: Path, log: Path) -> subprocess.Popen:
    args = ["collect", str(run), "--follow", "--until-finished", "--rescan-every", "0.5", "--quiet"]
    with open(log, "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "bedside.app.cli", *args], stderr=err)


def finish(proc: subprocess.Popen, timeout: float = 120.0) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def eventually(check: Callable[[], bool], what: str, timeout: float = EVENTUALLY_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.02)


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


# -- helpers: what the store holds -----------------------------------------------


def all_keys_sql() -> str:
    tables = ROW_TABLES + ("rejected_lines",)
    return " UNION ALL ".join(f"SELECT source_id, line_offset FROM {t}" for t in tables)


def line_offsets(data: bytes) -> list[int]:
    """Byte offset of every complete line in ``data``."""
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    return [0, *(ends[:-1] + 1).tolist()] if len(ends) else []


def table_counts(cur) -> dict[str, int]:
    return {t: cur.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in ROW_TABLES + ("rejected_lines",)}


def assert_exactly_once(run: Path, cur) -> None:
    """No (source_id, line_offset) twice; every line of every file is a row or a rejected line."""
    keys = cur.execute(all_keys_sql()).fetchall()
    assert [k for k, n in Counter(keys).items() if n > 1] == []
    by_source: dict[int, list[int]] = {}
    for source_id, offset in keys:
        by_source.setdefault(source_id, []).append(offset)
    sources = cur.execute("SELECT source_id, path, committed_offset FROM sources").fetchall()
    assert {path for _, path, _ in sources} == {RunLayout(run).relative(p) for p in RunLayout(run).source_files()}
    for source_id, path, committed in sources:
        data = (run / path).read_bytes()
        assert committed == len(data), path
        assert sorted(by_source.get(source_id, [])) == line_offsets(data), path


def assert_run_ingested(run: Path, steps: int = STEPS) -> None:
    with Store.open(RunLayout(run).store, read_only=True) as store:
        cur = store.cursor()
        assert table_counts(cur) == expected_rows(steps)
        per_rank = dict(cur.execute("SELECT rank, count(*) FROM rank_steps GROUP BY rank").fetchall())
        assert per_rank == {rank: steps for rank in range(WORLD)}
        assert cur.execute("SELECT DISTINCT rank FROM steps").fetchall() == [(0,)]
        assert cur.execute("SELECT status FROM run").fetchall() == [("finished",)]
        assert_exactly_once(run, cur)


# -- the collector process against four writer processes -------------------------


@pytest.mark.parametrize("late_rank", [None, 3], ids=["all-ranks-together", "rank-3-starts-late"])
def test_follow_until_finished_ingests_concurrent_writers_exactly_once(tmp_path: Path, late_rank: int | None) -> None:
    run = tmp_path / "run"
    run.mkdir()
    collector = start_follow_collector(run, tmp_path / "collect.log")
    writers = [start_writer(run, rank) for rank in range(WORLD) if rank != late_rank]
    if late_rank is not None:
        eventually(lambda: line_count(RunLayout(run).rank_file(0)) > STEPS // 2, "rank 0 halfway", 60)
        assert not RunLayout(run).rank_file(late_rank).exists()
        writers.append(start_writer(run, late_rank))
    assert [finish(w) for w in writers] == [0] * WORLD
    assert finish(collector) == 0, (tmp_path / "collect.log").read_text()
    assert "warning" not in (tmp_path / "collect.log").read_text()
    assert_run_ingested(run)


# -- the Follower in a thread of the test ----------------------------------------


@contextmanager
def following(run: Path, rescan_every_s: float, **follower_options) -> Iterator[Store]:
    """Run a Follower over ``run`` in a thread (options passed on); yield its store (read it via ``store.cursor()``)."""
    store = Store.open(RunLayout(run).store)
    follower = Follower(Collector(run, store), rescan_every_s=rescan_every_s, **follower_options)
    stop, failure = threading.Event(), []

    def follow() -> None:
        try:
            follower.run(stop)
        except BaseException as exc:  # reported by the test thread
            failure.append(exc)

    thread = threading.Thread(target=follow, name="test-follower")
    thread.start()
    try:
        yield store
    finally:
        stop.set()
        follower.wake()
        thread.join(timeout=30)
        store.close()
    assert not thread.is_alive() and failure == []


def record(rank: int, seq: int) -> bytes:
    return encode_line(
        {
            "kind": "rank_step",
            "time": time.time(),
            "rank": rank,
            "step": seq + 1,
            "timeline": 0,
            "seq": seq,
            "metrics": {"step_time": 0.01},
        }
    ).encode()


def append(path: Path, data: bytes) -> int:
    """Append ``data`` with one O_APPEND write, as a writer does; return the new size."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def committed(store: Store, run: Path, path: Path) -> int:
    key = RunLayout(run).relative(path)
    rows = store.cursor().execute("SELECT committed_offset FROM sources WHERE path = ?", [key]).fetchall()
    return rows[0][0] if rows else -1


@contextmanager
def recording_events(folder: Path) -> Iterator[list[FileSystemEvent]]:
    """Every watchdog event under ``folder`` while the block runs."""
    seen: list[FileSystemEvent] = []
    handler = FileSystemEventHandler()
    handler.on_any_event = seen.append
    observer = Observer()
    observer.schedule(handler, str(folder), recursive=False)
    observer.start()
    try:
        yield seen
    finally:
        observer.stop()
        observer.join()


def rank_file_with_hidden_writes(tmp_path: Path, run: Path) -> tuple[Path, Path]:
    """Rank 0's file, hard-linked from outside the run: writes through that link raise no event
    in the run's folders (inotify reports a change to the directory it went through), like a
    file written by another host on a network filesystem."""
    outside = tmp_path / "elsewhere" / "rank-00000.jsonl"
    outside.parent.mkdir()
    append(outside, record(0, 0))
    inside = RunLayout(run).rank_file(0)
    inside.parent.mkdir(parents=True)
    os.link(outside, inside)
    return outside, inside


def test_rescan_ingests_writes_that_raise_no_file_event(tmp_path: Path) -> None:
    run = tmp_path / "run"
    outside, inside = rank_file_with_hidden_writes(tmp_path, run)
    with following(run, rescan_every_s=0.05) as store, recording_events(inside.parent) as seen:
        for seq in range(1, 51):
            size = append(outside, record(0, seq))
            time.sleep(0.005)
        eventually(lambda: committed(store, run, inside) == size, "rescan ingested the hidden writes")
        assert store.cursor().execute("SELECT count(*) FROM rank_steps").fetchall() == [(51,)]
    assert [e for e in seen if e.event_type in ("modified", "closed", "created")] == []


@pytest.mark.parametrize("parent", ["runs", "old bedside.duckdb copies"])
def test_file_event_wakes_the_follower_long_before_a_rescan(tmp_path: Path, parent: str) -> None:
    run = tmp_path / parent / "run"
    path = RunLayout(run).rank_file(0)
    path.parent.mkdir(parents=True)
    size = append(path, record(0, 0))
    with following(run, rescan_every_s=30.0) as store:
        eventually(lambda: committed(store, run, path) == size, "first pass")
        size = append(path, record(0, 1))
        eventually(lambda: committed(store, run, path) == size, "ingested on the file event, before the 30 s rescan")
        assert store.cursor().execute("SELECT count(*) FROM rank_steps").fetchall() == [(2,)]


def test_idle_follower_does_not_reread_files_on_its_own_reads(tmp_path: Path) -> None:
    run = tmp_path / "run"
    path = RunLayout(run).rank_file(0)
    path.parent.mkdir(parents=True)
    size = append(path, record(0, 0))
    with following(run, rescan_every_s=30.0) as store:
        eventually(lambda: committed(store, run, path) == size, "first pass")
        with recording_events(path.parent) as seen:
            time.sleep(1.0)
    reads = [e for e in seen if e.event_type == "opened" and Path(e.src_path) == path]
    assert len(reads) <= 1


# -- stopping while ranks write, and following without file events --------------------


@contextmanager
def writing_continuously(path: Path) -> Iterator[None]:
    """A thread appends a record to ``path`` every millisecond while the block runs."""
    stop = threading.Event()

    def write() -> None:
        seq = 0
        while not stop.is_set():
            append(path, record(0, seq))
            seq += 1
            time.sleep(0.001)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = threading.Thread(target=write, name="test-writer")
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_follow_promptly_while_a_rank_keeps_writing(tmp_path: Path, start_bedside, signum: int) -> None:
    run = tmp_path / "run"
    log = tmp_path / "collect.log"
    with writing_continuously(RunLayout(run).rank_file(0)):
        eventually(lambda: RunLayout(run).rank_file(0).exists(), "the writer started")
        with open(log, "w") as err:
            collector = start_bedside("collect", run, "--follow", "--rescan-every", "0.1", stderr=err)
        eventually(lambda: "ingested" in log.read_text() or collector.poll() is not None, "first pass", 60)
        assert collector.poll() is None, log.read_text()
        collector.send_signal(signum)
        assert finish(collector, timeout=EVENTUALLY_S) == 0, log.read_text()
    assert log.read_text().splitlines()[-1].startswith("done: ")


class WatchLimitEmitter(EventEmitter):
    """A watchdog emitter that fails to start as inotify's does at the watch limit."""

    def on_thread_start(self) -> None:
        raise OSError(errno.ENOSPC, "inotify watch limit reached")

    def queue_events(self, timeout: float) -> None:
        pass


def no_inotify_instance() -> BaseObserver:
    """An observer factory that fails as watchdog's does at the inotify instance limit."""
    raise OSError(errno.EMFILE, "inotify instance limit reached")


@pytest.mark.parametrize(
    ("observer_factory", "reason"),
    [
        (lambda: BaseObserver(WatchLimitEmitter), "inotify watch limit reached"),
        (no_inotify_instance, "inotify instance limit reached"),
    ],
    ids=["watch limit", "instance limit"],
)
def test_without_file_events_the_follower_warns_once_and_keeps_rescanning(
    tmp_path: Path, observer_factory: Callable[[], BaseObserver], reason: str
) -> None:
    run = tmp_path / "run"
    path = RunLayout(run).rank_file(0)
    path.parent.mkdir(parents=True)
    warnings: list[str] = []
    with following(run, rescan_every_s=0.05, warn=warnings.append, observer_factory=observer_factory) as store:
        for seq in range(20):
            size = append(path, record(0, seq))
            time.sleep(0.01)
        eventually(lambda: committed(store, run, path) == size, "the rescans ingested every write")
        assert store.cursor().execute("SELECT count(*) FROM rank_steps").fetchall() == [(20,)]
    assert warnings == [f"no file events ({reason}); polling every 0.05 s instead"]
