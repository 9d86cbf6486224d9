"""Asynchronous, verified checkpoints with torch.distributed.checkpoint (DCP).

``CheckpointManager.save`` takes the model and optimizer state through
``get_state_dict`` (so DDP and FSDP2 shards work alike), stages it to CPU memory and
returns; DCP writes in a background thread over the manager's own gloo group, so the
training loop's collectives never interleave with the checkpoint's. When every rank
has written, rank 0 writes the manifest (see ``manifest.py``), publishes the
directory by renaming it and applies retention (the newest ``keep_last`` verified checkpoints
stay, so a corrupt one never takes the place of a good one). ``latest_good`` verifies checkpoints
newest first and reports the corrupt ones it passed; ``load`` restores model,
optimizer and this rank's trainer state on all ranks.

Each rank's ``extra`` (JSON: step, timeline, sampler state, RNG states from
``rng_state()``, the control channel's handled requests and pause) is stored as
``extra-rank-NNNNN.json`` in the checkpoint, covered by the manifest; rank 0's copy is
also in the manifest itself.
"""

from __future__ import annotations

import base64
import json
import random
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from .manifest import (
    PARTIAL_SUFFIX,
    CheckpointChoice,
    CheckpointError,
    CheckpointInfo,
    Skipped,
    checkpoint_name,
    find_latest_good,
    fsync_dir,
    leftovers,
    remove_tree,
    retention_victims,
    verify,
    write_json_atomic,
    write_manifest,
)

__all__ = [
    "CheckpointChoice",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "SaveHandle",
    "SaveResult",
    "rng_state",
    "set_rng_state",
]


@dataclass(frozen=True)
class SaveResult:
    """How a save ended. ``bytes`` is the whole checkpoint on rank 0, this rank's tensor payload elsewhere."""

    path: Path
    step: int
    timeline: int
    duration_s: float
    bytes: int
    status: str  # "saved" or "save_failed", as the checkpoint telemetry events are named
    error: str | None = None
    deleted: tuple[Path, ...] = ()
    corrupt: tuple[Skipped, ...] = ()  # older checkpoints that retention found corrupt (kept out of its places)


class SaveHandle:
    """A save in flight: poll ``done()`` from the training loop, ``wait()`` when it must be finished."""

    def __init__(self, future: Future[SaveResult], staging_s: float) -> None:
        self._future = future
        self.staging_s = staging_s  # how long save() held the training loop

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> SaveResult:
        return self._future.result(timeout)

    def result(self) -> SaveResult:
        """The outcome of a finished save; CheckpointError while it is still in flight."""
        if not self._future.done():
            raise CheckpointError("the save is still in flight: poll done() or call wait()")
        return self._future.result()


class CheckpointManager:
    """Saves, verifies, selects and loads the checkpoints of one run under ``root`` (``RUN/checkpoints``).

    Construct it on every rank at the same point of the program: without ``process_group`` it
    creates a gloo group of all ranks for checkpoint traffic (a collective call).
    """

    def __init__(
        self,
        root: Path,
        *,
        keep_last: int = 3,
        milestone_every: int | None = None,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        if milestone_every is not None and milestone_every < 1:
            raise ValueError(f"milestone_every must be >= 1 or None, got {milestone_every}")
        self.root, self.keep_last, self.milestone_every = Path(root), keep_last, milestone_every
        self.distributed = dist.is_available() and dist.is_initialized()
        self._owns_group = self.distributed and process_group is None
        self.group = dist.new_group(backend="gloo") if self._owns_group else process_group
        self.rank = dist.get_rank(self.group) if self.distributed else 0
        self.world_size = dist.get_world_size(self.group) if self.distributed else 1
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._in_flight: SaveHandle | None = None
        self._last_saved: tuple[int, int] | None = None
        self._verdicts: dict[str, str | None] = {}  # rank 0: checkpoint name -> None when verified, else why corrupt
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            for path in leftovers(self.root):  # no save is in flight anywhere yet
                remove_tree(path)
        self._barrier()

    # -- saving ---------------------------------------------------------------------
    def save(
        self, step: int, timeline: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, extra: dict[str, Any]
    ) -> SaveHandle:
        """Stage model, optimizer and ``extra`` and write them in the background (all ranks)."""
        started = time.perf_counter()
        name = checkpoint_name(step, timeline)
        if self._last_saved is not None and (timeline, step) <= self._last_saved:
            raise CheckpointError(
                f"{self.root / name}: not newer than the last save (timeline, step) {self._last_saved}"
            )
        encoded = _encode_extra(extra, self.root / name)
        self.wait()  # one save at a time: blocks only when the previous one is still writing
        partial = self.root / (name + PARTIAL_SUFFIX)
        partial.mkdir(parents=True, exist_ok=True)
        write_json_atomic(partial / _extra_name(self.rank), encoded)
        model_state, optim_state = get_state_dict(model, optimizer)
        upload = dcp.async_save(
            {"model": model_state, "optim": optim_state},
            checkpoint_id=partial,
            process_group=self.group,
            no_dist=not self.distributed,
        )
        completion: Future = getattr(upload, "upload_completion", upload)  # type: ignore[arg-type]
        self._last_saved = (timeline, step)
        future = self._executor.submit(self._finish, completion, partial, step, timeline, encoded, started)
        self._in_flight = SaveHandle(future, time.perf_counter() - started)
        return self._in_flight

    def _finish(
        self, upload: Future, partial: Path, step: int, timeline: int, extra: dict[str, Any], started: float
    ) -> SaveResult:
        final = self.root / checkpoint_name(step, timeline)
        try:
            metadata = upload.result()  # on return every rank has written and fsynced its files
            if self.rank != 0:
                return SaveResult(
                    final, step, timeline, time.perf_counter() - started, _payload_bytes(metadata, self.rank), "saved"
                )
            info = write_manifest(partial, step=step, timeline=timeline, world_size=self.world_size, extra=extra)
            self._publish(partial, final)
            self._verdicts[final.name] = None  # hashed just now
            deleted, corrupt = self._apply_retention((timeline, step))
            return SaveResult(
                final,
                step,
                timeline,
                time.perf_counter() - started,
                info.bytes,
                "saved",
                deleted=deleted,
                corrupt=corrupt,
            )
        except Exception as error:  # reported, not raised: the trainer logs a failed checkpoint event
            return SaveResult(
                final,
                step,
                timeline,
                time.perf_counter() - started,
                0,
                "save_failed",
                error=f"{partial}: {type(error).__name__}: {error}",
            )

    def _publish(self, partial: Path, final: Path) -> None:
        if final.exists():  # a save of the same step and timeline by an earlier process: replaced
            remove_tree(final)
        partial.rename(final)
        fsync_dir(self.root)

    def _apply_retention(self, published: tuple[int, int]) -> tuple[tuple[Path, ...], tuple[Skipped, ...]]:
        """Delete what retention lets go; the paths deleted, and the checkpoints first found corrupt on the way."""
        found: list[Skipped] = []

        def is_good(path: Path) -> bool:
            if path.name not in self._verdicts:
                self._verdicts[path.name] = _corruption(path)
                if self._verdicts[path.name] is not None:
                    found.append(Skipped(path, str(self._verdicts[path.name])))
            return self._verdicts[path.name] is None

        victims = retention_victims(
            self.root,
            keep_last=self.keep_last,
            milestone_every=self.milestone_every,
            published=published,
            is_good=is_good,
        )
        for path in victims:
            remove_tree(path)
            self._verdicts.pop(path.name, None)
        return tuple(victims), tuple(found)

    def wait(self) -> SaveResult | None:
        """Wait for this rank's save in flight, if any, and return its result."""
        handle, self._in_flight = self._in_flight, None
        return handle.wait() if handle is not None else None

    # -- choosing and loading -------------------------------------------------------------
    def latest_good(self, at_or_before_step: int | None = None) -> CheckpointChoice:
        """The newest verified checkpoint at or before a step, and the corrupt ones skipped (all ranks).

        Rank 0 verifies (sha256 of every file) and tells the others, so every rank loads the same one.
        """
        self.wait()
        outcome: Any = None
        if self.rank == 0:
            try:
                outcome = find_latest_good(self.root, at_or_before_step)
            except Exception as error:  # sent to every rank rather than leaving them waiting
                outcome = CheckpointError(f"{self.root}: cannot list checkpoints: {error}")
        outcome = self._from_rank0(outcome)
        if isinstance(outcome, Exception):
            raise outcome
        self._verdicts.update({passed.path.name: passed.reason for passed in outcome.skipped})
        if outcome.checkpoint is not None:
            self._verdicts[outcome.checkpoint.path.name] = None
        return outcome

    def load(self, info: CheckpointInfo, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Restore model and optimizer from ``info`` on every rank; this rank's ``extra`` state."""
        self.wait()
        model_state, optim_state = get_state_dict(model, optimizer)
        state: dict[str, Any] = {"model": model_state, "optim": optim_state}
        try:
            dcp.load(state, checkpoint_id=info.path, process_group=self.group, no_dist=not self.distributed)
        except Exception as error:
            raise CheckpointError(f"{info.path}: cannot load model and optimizer: {error}") from error
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        return self._read_extra(info)

    def _read_extra(self, info: CheckpointInfo) -> dict[str, Any]:
        path = info.path / _extra_name(self.rank)
        if not path.exists():  # a different world size: this rank had no predecessor; rank 0's job-wide state
            return info.extra
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{path}: unreadable trainer state ({error})") from error

    # -- plumbing -----------------------------------------------------------------------
    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.group)

    def _from_rank0(self, value: Any) -> Any:
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        return box[0]

    def close(self) -> None:
        """Finish the save in flight and release the background thread (and the group this manager made)."""
        self.wait()
        self._executor.shutdown(wait=True)
        if self._owns_group:
            dist.destroy_process_group(self.group)
            self._owns_group = False

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _corruption(path: Path) -> str | None:
    """Why the checkpoint at ``path`` is corrupt, or None when it verifies."""
    try:
        verify(path)
    except (CheckpointError, OSError) as error:
        return str(error)
    return None


def _extra_name(rank: int) -> str:
    return f"extra-rank-{rank:05d}.json"


def _encode_extra(extra: dict[str, Any], path: Path) -> dict[str, Any]:
    """``extra`` as it will read back from JSON; CheckpointError when it is not JSON-able."""
    try:
        return json.loads(json.dumps(extra, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: trainer state is not JSON-able ({error})") from error


def _payload_bytes(metadata: Any, rank: int) -> int:
    """Bytes this rank wrote, from DCP's metadata (``__{rank}_*`` files)."""
    storage = getattr(metadata, "storage_data", None) or {}
    return sum(
        getattr(info, "length", 0)
        for info in storage.values()
        if str(getattr(info, "relative_path", "")).startswith(f"__{rank}_")
    )


# -- RNG state as JSON ------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """This process's torch (CPU and CUDA), numpy and Python RNG states as JSON types."""
    kind, keys, position, has_gauss, gauss = np.random.get_state(legacy=True)
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": _b64(torch.get_rng_state()),
        "numpy": [kind, np.asarray(keys).tolist(), int(position), int(has_gauss), float(gauss)],
        "python": [version, list(internal), gauss_next],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state()`` captured."""
    torch.set_rng_state(_unb64(state["torch"]))
    kind, keys, position, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


def _b64(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
