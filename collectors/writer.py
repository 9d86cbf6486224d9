"""RunLogger: the telemetry writer for any PyTorch (or plain Python) training loop.

The calling thread only checks and captures values (``capture.py``) and appends
a tuple to a deque; a background thread encodes the records and appends them to
the rank's file, so a record reaches the OS (and survives ``kill -9`` of the
process) within ``flush_every_s`` plus the time to encode the backlog.
``close()`` flushes.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from .appendfile import AppendFile, tail_records
from .capture import (
    Pending,
    capture,
    capture_digest,
    capture_field,
    capture_metrics,
    capture_shards,
    capture_step,
    resolve,
)
from .format import ENVELOPE_FIELDS, Kind, RunEndStatus
from .layout import RunLayout
from .records import Checkpoint, Eval, Heartbeat, Log, RankInfo, RankStep, Record, RunEnd, Step, build_record, to_line
from .resume import DEFAULT_RESUME_WAIT_S, await_timeline, decide_timeline, refusal
from .runinfo import RankPlacement, RunInfo, default_placement, read_run_info, write_run_info

DEFAULT_FLUSH_EVERY_S = 0.2
_EARLY_FLUSH_BACKLOG = 4096
_RESERVED_FIELDS = frozenset(ENVELOPE_FIELDS) | {"metrics"}
RecordKind = type[Record] | str
"""What a queued record is: the record class of one of RunLogger's own methods, or event()'s kind."""


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


class RunLogger:
    """Writes one rank's telemetry for a run directory (format v1).

    ``previous_record`` is the last complete record already in this rank's file when the logger
    opened it (None for a new run); ``left_off`` the newest timeline its last records reached and
    the furthest step taken on it: where a restarted rank left off (the last record may be an
    earlier step's: a save that finished after later steps were taken, the run's end).

    A rank file that already holds records is refused (``RunExistsError``) unless ``resume`` is
    True: then the run continues on a new timeline, one past the newest any rank file carries,
    agreed by every rank through rank 0 (``collectors/resume.py``), or on ``timeline`` when the
    caller gives one (a trainer that takes its timeline from its checkpoint).

    Job-level metrics (``step()``) belong to one rank, ``job_rank``: another rank that calls
    ``step()`` is warned once (each copy would count the job's tokens and FLOPs again).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        placement: RankPlacement | None = None,
        topology: Iterable[RankPlacement] = (),
        timeline: int | None = None,
        resume: bool = False,
        job_rank: int = 0,
        resume_wait_s: float = DEFAULT_RESUME_WAIT_S,
        flush_every_s: float = DEFAULT_FLUSH_EVERY_S,
    ) -> None:
        self.layout = RunLayout(Path(run_dir))
        self.rank = _env_int("RANK", 0) if rank is None else rank
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
        self.local_rank = _env_int("LOCAL_RANK", 0) if local_rank is None else local_rank
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        self.flush_every_s = flush_every_s
        self.job_rank = job_rank
        self.placement = placement or default_placement(self.rank, self.local_rank)
        tail = tail_records(self.layout.rank_file(self.rank))
        self.previous_record = tail[-1] if tail else None
        self.left_off = furthest_step(tail)
        if self.previous_record is not None and not resume:
            raise refusal(self.layout, self.rank, self.previous_record)
        self.timeline = self._first_timeline(timeline, resume, resume_wait_s)
        if self.rank == 0:
            self._ensure_run_info(name, config, tuple(topology))
        self._files = {Kind.FAULT_INJECTED: AppendFile(self.layout.ground_truth_file(self.rank))}
        self._warned_job_level = self.rank == job_rank
        self._telemetry = AppendFile(self.layout.rank_file(self.rank))
        self._queue: deque[tuple | threading.Event] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._last_step = 0
        self._thread = threading.Thread(target=self._run, name=f"bedside-writer-{self.rank}", daemon=True)
        self._thread.start()
        atexit.register(self.flush)
        self._put(RankInfo, 0, fields=self._rank_info_fields())

    # -- public API -------------------------------------------------------
    def step(self, step: int, *, shards: Iterable[int | str] | None = None, **metrics: Any) -> None:
        """Job-level metrics of ``step`` (loss, grad_norm, lr, tokens, flops, any other), from one rank:
        ``job_rank``; any other rank is warned once."""
        if not self._warned_job_level:
            self._warned_job_level = True
            warnings.warn(
                f"RunLogger.step() called on rank {self.rank}, but job-level metrics are recorded by one rank "
                f"(job_rank={self.job_rank}): each rank that calls step() adds a copy of the step, and its tokens "
                f"and FLOPs are counted once per copy. Call step() on rank {self.job_rank} only (rank_step() is "
                f"per rank), or pass job_rank={self.rank} to the logger of the rank that holds the job's metrics",
                RuntimeWarning,
                stacklevel=2,
            )
        fields = {"shards": capture_shards(shards)} if shards is not None else None
        self._put(Step, step, *capture_metrics(metrics), fields=fields)

    def rank_step(self, step: int, *, param_checksum: Any = None, **metrics: Any) -> None:
        """This rank's metrics of ``step`` (step_time and phases, local_grad_norm, any other).

        ``param_checksum`` is a string, or a one-element integer tensor (the kit's on-device digest)
        that is written as the 16 hex digits of its 64 bits, read by the writer thread."""
        fields = {"param_checksum": capture_digest(param_checksum)} if param_checksum is not None else None
        self._put(RankStep, step, *capture_metrics(metrics), fields=fields)

    def eval(
        self,
        step: int,
        scores: Mapping[str, Any],
        *,
        cum_tokens: Any = None,
        cum_flops: Any = None,
        split: str = "heldout",
    ) -> None:
        """Held-out scores at ``step`` with the cumulative tokens and FLOPs spent so far."""
        fields = {"split": split, "cum_tokens": capture(cum_tokens), "cum_flops": capture(cum_flops)}
        self._put(Eval, step, *capture_metrics(scores), fields=fields)

    def checkpoint(
        self,
        step: int,
        event: str,
        *,
        path: str | None = None,
        duration_s: float | None = None,
        bytes: int | None = None,
        message: str | None = None,
    ) -> None:
        """A checkpoint lifecycle event (save_started, saved, verified, corrupt, loaded...)."""
        metrics = capture_metrics({"duration_s": duration_s, "bytes": bytes})
        self._put(Checkpoint, step, *metrics, fields={"event": event, "path": path, "message": message})

    def event(self, kind: str, step: int, *, metrics: Mapping[str, Any] | None = None, **fields: Any) -> None:
        """Any other record: action, heartbeat, log, fault_injected, or a kind of your own."""
        if reserved := sorted(_RESERVED_FIELDS & fields.keys()):
            raise ValueError(f"{', '.join(reserved)} are set by RunLogger, not by event() fields")
        captured = {name: capture_field(value) for name, value in fields.items()}
        self._put(str(kind), step, *capture_metrics(metrics or {}), fields=captured)

    def log(self, step: int, message: str, level: str = "info") -> None:
        """A human-readable line for the run's event log."""
        self._put(Log, step, fields={"level": level, "message": str(message)})

    def heartbeat(self, step: int, *, control: bool | None = None) -> None:
        """Proof of life between steps (long evals, checkpoints, data stalls); ``control``: a control reader
        polls this run's requests (``kit.ControlClient`` says so)."""
        self._put(Heartbeat, step, fields={"control": True} if control else None)

    def flush(self) -> None:
        """Block until every record handed over so far has been written to the OS."""
        done = threading.Event()
        self._queue.append(done)
        self._wake.set()
        while not done.wait(self.flush_every_s):
            if not self._thread.is_alive():  # closed meanwhile: its last pass may have missed us
                self._drain()

    def close(self, status: str = RunEndStatus.FINISHED, message: str | None = None) -> None:
        """Write ``run_end``, flush and stop the writer thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._enqueue(RunEnd, self._last_step, None, None, {"status": status, "message": message})
            self._closed = True
        self._wake.set()
        self._thread.join()
        self._drain()
        for channel in (self._telemetry, *self._files.values()):
            channel.close()
        atexit.unregister(self.flush)

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(
            RunEndStatus.FINISHED if exc_type is None else RunEndStatus.FAILED, None if exc is None else repr(exc)
        )

    # -- internals --------------------------------------------------------
    def _first_timeline(self, timeline: int | None, resume: bool, wait_s: float) -> int:
        """The caller's timeline, else 0 for a new run, else the one the ranks agree on for a resumed run."""
        if timeline is not None:
            return timeline
        if not resume:
            return 0
        if self.rank == 0:
            return decide_timeline(self.layout)
        return await_timeline(self.layout, self.rank, wait_s)

    def _put(
        self,
        kind: RecordKind,
        step: Any,
        metrics: dict | None = None,
        pending: Pending | None = None,
        *,
        fields: dict | None = None,
    ) -> None:
        step = capture_step(step)
        with self._lock:
            if self._closed:
                raise RuntimeError("RunLogger is closed")
            self._enqueue(kind, step, metrics, pending, fields)

    def _enqueue(
        self, kind: RecordKind, step: int, metrics: dict | None, pending: Pending | None, fields: dict | None
    ) -> None:
        self._last_step = step
        self._queue.append((kind, time.time(), step, self.timeline, metrics, pending, fields))
        if len(self._queue) > _EARLY_FLUSH_BACKLOG:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_every_s)
            self._wake.clear()
            stop = self._closed
            self._drain()
            if stop:
                return

    def _drain(self) -> None:
        """Encode and write everything queued. Never raises: the thread must outlive a bad record."""
        pending: dict[AppendFile, list[str]] = {}
        waiters = []
        for channel in (self._telemetry, *self._files.values()):
            channel.recover()
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, threading.Event):
                waiters.append(item)
                continue
            channel = self._files.get(item[0], self._telemetry)
            pending.setdefault(channel, []).append(self._encode_or_report(channel, item))
        # Telemetry last: once a reader sees run_end, the rank's other files are complete too.
        for channel in sorted(pending, key=lambda c: c is self._telemetry):
            _write_lines(channel, pending[channel])
        for waiter in waiters:
            waiter.set()

    def _encode_or_report(self, channel: AppendFile, item: tuple) -> str:
        """The record's line, or an error log line saying which record could not be encoded."""
        try:
            return self._encode(channel, item)
        except Exception as exc:
            kind, when, step, timeline = item[:4]
            name = kind if isinstance(kind, str) else kind.kind
            message = f"bedside: dropped a {name} record of step {step}: {exc!r}"
            report = (Log, when, step, timeline, None, None, {"level": "error", "message": message})
            return self._encode(channel, report)

    def _encode(self, channel: AppendFile, item: tuple) -> str:
        kind, when, step, timeline, metrics, pending, fields = item
        if pending is not None:
            pending.wait()
        given = (
            {k: v if isinstance(v, (str, bool, list, dict)) else resolve(v) for k, v in fields.items() if v is not None}
            if fields
            else {}
        )
        resolved = {name: resolve(v) for name, v in metrics.items()} if metrics else None
        envelope = {"time": when, "rank": self.rank, "step": step, "timeline": timeline, "seq": channel.next_seq}
        record = (
            build_record(kind, given, resolved, **envelope)
            if isinstance(kind, str)
            else kind(**envelope, metrics=resolved, **given)
        )  # one of ours: the fields fit
        line = to_line(record)
        channel.next_seq += 1
        return line

    def _rank_info_fields(self) -> dict[str, Any]:
        p = self.placement
        return {
            "host": p.host,
            "local_rank": p.local_rank,
            "world_size": self.world_size,
            "pid": os.getpid(),
            "mesh": {"dp": p.dp, "tp": p.tp, "pp": p.pp},
        }

    def _ensure_run_info(self, name: str | None, config: Mapping[str, Any] | None, topology: tuple) -> None:
        """Write run.json on a new run; on a relaunch with another world size, update it."""
        existing = read_run_info(self.layout)
        if existing is None:
            info = RunInfo(
                name=name or self.layout.root.name,
                world_size=self.world_size,
                topology=topology,
                config=dict(config or {}),
            )
            write_run_info(self.layout, info)
        elif existing.world_size != self.world_size:
            write_run_info(self.layout, replace(existing, world_size=self.world_size, topology=topology))


def furthest_step(records: list[dict[str, Any]]) -> tuple[int, int] | None:
    """The newest timeline of ``records`` and the furthest step taken on it (its step and rank_step records;
    without any, its records' furthest step, such as a checkpoint loaded); None when no record has both."""
    placed = [r for r in records if isinstance(r.get("timeline"), int) and isinstance(r.get("step"), int)]
    if not placed:
        return None
    newest = max(r["timeline"] for r in placed)
    on_it = [r for r in placed if r["timeline"] == newest]
    taken = [r["step"] for r in on_it if r.get("kind") in (Kind.STEP, Kind.RANK_STEP)]
    return newest, max(taken or [r["step"] for r in on_it])


def _write_lines(channel: AppendFile, lines: list[str]) -> None:
    """Append ``lines``; an I/O error (disk full, lost mount) is reported, never raised."""
    try:
        channel.write("".join(lines).encode("utf-8", "replace"))
    except OSError as exc:
        print(f"bedside: could not write {len(lines)} telemetry lines to {channel.path}: {exc}", file=sys.stderr)
