"""Skip requests in any loop: a batch-sampler wrapper that drops the requested batches and records their ids.

``SkippingSampler`` wraps an iterable of batches of sample ids (a ``torch.utils.data.BatchSampler``,
or any batch sampler that yields the same global batches on every rank). Batches are numbered
from 0 in the order read, across epochs: the ``first_batch`` and ``last_batch`` of a skip request.
It makes itself the ``ControlClient``'s skip handler: the request stays open
until the sampler has passed its last batch, and is then acknowledged ``applied`` with the exact
ids dropped (``args.sample_ids``; a skip the loop's ``close`` rejects lists those dropped before). Its ``state_dict`` (position, ranges, open requests) belongs
in the loop's checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..control_inbox import Rejected, Request
from .actions import Action, ControlClient, int_arg


@dataclass
class _Skip:
    """One skip request in force: the batches to drop, and its action (whose details keep the ids dropped)."""

    first: int
    last: int
    action: Action

    @property
    def sample_ids(self) -> list[int]:
        ids: list[int] = self.action.details.setdefault("sample_ids", [])
        return ids


class SkippingSampler:
    """Yields the wrapped sampler's batches except those a skip request names; it handles ``client``'s skips."""

    def __init__(self, batches: Iterable[Sequence[int]], client: ControlClient) -> None:
        self.batches, self.client = batches, client
        client.handlers["skip"] = self.skip
        self.position = 0
        """The number of the next batch read (every batch counts, skipped or not)."""
        self._skips: list[_Skip] = []

    def skip(self, action: Action) -> None:
        """Drop batches ``first_batch`` to ``last_batch`` when they come (``Rejected`` when all were read)."""
        first, last = int_arg(action, "first_batch"), int_arg(action, "last_batch")
        if first > last:
            raise Rejected(f"skip needs first_batch <= last_batch, got {first} > {last}")
        if last < self.position:
            raise Rejected(f"batches {first} to {last} were already read: the next batch is {self.position}")
        action.defer()
        self._skips.append(_Skip(max(first, self.position), last, action))

    def __iter__(self) -> Iterator[Sequence[int]]:
        for batch in self.batches:
            index, self.position = self.position, self.position + 1
            skip = next((s for s in self._skips if s.first <= index <= s.last), None)
            if skip is None:
                yield batch
                continue
            skip.sample_ids.extend(int(i) for i in batch)
            if index == skip.last:
                self._finish(skip)

    def _finish(self, skip: _Skip) -> None:
        self._skips.remove(skip)
        asked = skip.action.args["first_batch"]
        late = f" (batches before {skip.first} were already read)" if asked < skip.first else ""
        skip.action.applied(
            f"skipped batches {skip.first} to {skip.last}: {len(skip.sample_ids)} samples not read{late}"
        )

    def state_dict(self) -> dict[str, Any]:
        """The position and the skips still open, with their requests and the ids dropped so far (JSON)."""
        return {
            "position": self.position,
            "skips": [
                {
                    "first": s.first,
                    "last": s.last,
                    "request": _request_state(s.action.request),
                    "sample_ids": s.sample_ids,
                }
                for s in self._skips
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``; its open skip requests are answered when their batches have passed."""
        self.position = int(state["position"])
        self._skips = []
        for saved in state["skips"]:
            skip = _Skip(int(saved["first"]), int(saved["last"]), self.client.action_for(Request(**saved["request"])))
            skip.sample_ids.extend(int(i) for i in saved["sample_ids"])
            self._skips.append(skip)


def _request_state(request: Request) -> dict[str, Any]:
    return {name: value for name, value in asdict(request).items() if name not in ("problem", "retaken")}
