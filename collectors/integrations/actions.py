"""What the framework integrations share to apply control requests through the kit's ``ControlClient``.

A rewind loads the newest checkpoint saved at or before the step asked, the one rank 0 found (``rewind_target``).
A skip goes through the kit's ``SkippingSampler`` over the job's *step batches*: the sample ids of one optimizer
step on every rank, numbered from 0 in the order read. ``StepBatches`` joins a framework's batches into step
batches, and ``StepShare`` cuts the step batches the sampler lets through back into the framework's batches (on
a rank that reads a share of each, that rank's share). Every rank holds the same sampler, so every rank drops the
same steps and rank 0 records exactly the ids dropped on all of them."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist

from ..control_inbox import Rejected
from ..kit.actions import Action, ControlClient, Handler, int_arg
from ..writer import RunLogger

T = TypeVar("T")


def opened(value: T | None, hook: str) -> T:
    """What a callback's ``hook`` made (its logger, control client, trainer), or a clear error for an event
    that came before it."""
    if value is None:
        raise RuntimeError(f"BedsideCallback received a training event before {hook} opened its logger")
    return value


def rewind_target(action: Action, client: ControlClient, step: int, saved: Mapping[int, Path]) -> tuple[int, Path]:
    """The step and path of the newest checkpoint of ``saved`` at or before the rewind's ``to_step``, as rank 0
    sees them (every rank loads the same one); ``Rejected`` naming why when there is none."""
    to_step = int_arg(action, "to_step")
    if to_step > step:
        raise Rejected(f"cannot rewind forward: to_step {to_step} is after the current step {step}")
    candidates = [at for at in saved if at <= to_step]
    found = (max(candidates), saved[max(candidates)]) if candidates else None
    if client.distributed:
        box: list[Any] = [found]
        dist.broadcast_object_list(box, src=0, group=client.group)
        found = box[0]
    if found is None:
        kept = ", ".join(str(at) for at in sorted(saved)) or "none"
        raise Rejected(f"no checkpoint at or before step {to_step} (checkpoints saved at steps: {kept})")
    return found


def continue_on_new_timeline(log: RunLogger, step: int, path: Path) -> str:
    """After a rewind loaded ``path`` at ``step`` (every rank): the run goes on on a new timeline, so the steps
    trained again stay apart from the abandoned ones; rank 0 records the load. What the acknowledgment says."""
    log.timeline += 1
    if log.rank == 0:
        log.checkpoint(step, "loaded", path=str(path), message=f"rewind: continuing on timeline {log.timeline}")
    return f"rewound to the checkpoint of step {step} ({path.name}); continuing on timeline {log.timeline}"


class SavedCheckpoints:
    """The checkpoints a rewind may load: the paths under the framework's folders named with their step
    (``pattern``'s first group), the newest where two share a step, less those of a branch a rewind abandoned
    (saved before it, past the step it restored: the steps after it are trained again)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._rewinds: list[tuple[int, int]] = []
        """(when, in ns of the file clock, the step restored) of each rewind of this process."""

    def found(self, folders: Iterable[Path]) -> dict[int, Path]:
        saved: dict[int, tuple[int, Path]] = {}
        for folder in folders:
            for path in folder.iterdir() if folder.is_dir() else ():
                if not (match := re.fullmatch(self.pattern, path.name)):
                    continue
                step, mtime = int(match.group(1)), _saved_at(path)
                abandoned = any(mtime < when and step > restored for when, restored in self._rewinds)
                if not abandoned and (step not in saved or saved[step][0] < mtime):
                    saved[step] = (mtime, path)
        return {step: path for step, (_, path) in saved.items()}

    def rewound(self, step: int) -> None:
        """A rewind restored ``step``: what was saved past it until now belongs to the abandoned branch."""
        self._rewinds.append((time.time_ns(), step))


def _saved_at(path: Path) -> int:
    """When a checkpoint was last written: a folder's newest entry (a save rewrites its files in place)."""
    entries = [path, *path.iterdir()] if path.is_dir() else [path]
    return max(entry.stat().st_mtime_ns for entry in entries)


def refuse(reason: str) -> Handler:
    """A handler that rejects its action with ``reason`` (an action the framework cannot apply)."""

    def handler(action: Action) -> str:
        raise Rejected(reason)

    return handler


class StepBatches:
    """The batches of ``batches`` joined ``per_step`` at a time into one list of sample ids (the last may be short)."""

    def __init__(self, batches: Iterable[Sequence[int]], per_step: int) -> None:
        self.batches, self.per_step = batches, per_step

    def __iter__(self) -> Iterator[list[int]]:
        ids: list[int] = []
        joined = 0
        for batch in self.batches:
            ids.extend(int(i) for i in batch)
            joined += 1
            if joined == self.per_step:
                yield ids
                ids, joined = [], 0
        if ids:
            yield ids


class StepShare:
    """The step batches of ``steps`` cut back into batches of ``size`` ids, of which this ``rank`` takes every
    ``world``-th id (all of them when ``world`` is 1).

    It stands where the framework's own batch sampler stood: ``len()`` and ``sampler`` are those of ``replaced``
    (the framework reads them), and ``set_epoch`` reaches the samplers underneath (``epochs``)."""

    def __init__(
        self,
        steps: Iterable[Sequence[int]],
        replaced: Any,
        *,
        size: int,
        rank: int = 0,
        world: int = 1,
        epochs: Iterable[Any] = (),
    ) -> None:
        self.steps, self.replaced, self.size, self.rank, self.world = steps, replaced, size, rank, world
        self.epochs = list(epochs)

    @property
    def sampler(self) -> Any:
        return getattr(self.replaced, "sampler", None)

    def __len__(self) -> int:
        return len(self.replaced)

    def set_epoch(self, epoch: int) -> None:
        for sampler in self.epochs:
            sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        for ids in self.steps:
            for at in range(0, len(ids), self.size):
                yield list(ids[at : at + self.size][self.rank :: self.world])


class StepShareIds(StepShare):
    """``StepShare``'s ids one by one: an index sampler under the framework's own batch sampler, which cuts them
    into the same batches again."""

    def __iter__(self) -> Iterator[int]:  # type: ignore[override]
        for batch in super().__iter__():
            yield from batch


class Interleaved:
    """The ids of one sampler per rank dealt out in turn: the global order a ``DistributedSampler`` hands its ranks
    their shares of (every ``len(samplers)``-th id, from its rank)."""

    def __init__(self, samplers: Sequence[Any]) -> None:
        self.samplers = samplers

    def __iter__(self) -> Iterator[int]:
        for ids in zip(*self.samplers, strict=True):
            yield from ids

    def __len__(self) -> int:
        return sum(len(sampler) for sampler in self.samplers)
