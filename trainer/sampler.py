"""A deterministic, indexable batch sampler with skip ranges and shard quarantine.

Global batch ``b`` reads positions ``[b * G, (b + 1) * G)`` of an endless stream that
concatenates one seeded permutation of all train sample ids per epoch (so epoch =
``b * G // num_train_samples``). A quarantined shard's samples are passed over and the
batch is filled with the next samples of the stream, so batches stay full and only
the batches that would have read the shard change (their fillers are read again by
the batch after). Skip ranges never change the mapping: they only move the cursor
past batches that must not be trained. The cursor, skip ranges and quarantined
shards are the sampler's state, saved in every checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .language import ShardedCorpus

_CACHED_EPOCHS = 2


class BatchSampler:
    """Maps global batch indices to train sample ids of ``corpus``; deterministic from ``seed``."""

    def __init__(self, corpus: ShardedCorpus, *, global_batch_size: int, seed: int) -> None:
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be at least 1, got {global_batch_size}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        self.corpus = corpus
        self.global_batch_size = global_batch_size
        self.seed = seed
        self._cursor = 0
        self._skip_ranges: list[tuple[int, int]] = []
        self._quarantined: set[int] = set()
        self._permutations: dict[int, np.ndarray] = {}

    @property
    def cursor(self) -> int:
        """The next global batch index to consider (``next_batch`` passes skipped ones)."""
        return self._cursor

    @property
    def skip_ranges(self) -> tuple[tuple[int, int], ...]:
        """Merged, sorted inclusive ranges ``(first, last)`` of global batch indices never trained."""
        return tuple(self._skip_ranges)

    @property
    def quarantined_shards(self) -> tuple[int, ...]:
        return tuple(sorted(self._quarantined))

    def ids_for_batch(self, batch_index: int) -> list[int]:
        """The ``global_batch_size`` train sample ids of global batch ``batch_index``."""
        if batch_index < 0:
            raise ValueError(f"batch_index must be non-negative, got {batch_index}")
        size = self.global_batch_size
        position = batch_index * size
        if not self._quarantined:
            return self._stream(position, size).tolist()
        ids: list[int] = []
        while len(ids) < size:
            block = self._stream(position, size)
            position += size
            ids.extend(block[~self._is_quarantined(block)][: size - len(ids)].tolist())
        return ids

    def next_batch(self) -> tuple[int, list[int]]:
        """The next batch to train, past any skip range, as ``(batch_index, ids)``; advances the cursor."""
        batch_index = self._first_unskipped(self._cursor)
        self._cursor = batch_index + 1
        return batch_index, self.ids_for_batch(batch_index)

    def is_skipped(self, batch_index: int) -> bool:
        return any(first <= batch_index <= last for first, last in self._skip_ranges)

    def skip(self, first: int, last: int) -> None:
        """Never train global batches ``first`` to ``last`` (inclusive)."""
        self._skip_ranges = merge_ranges(self._skip_ranges + [_checked_range(first, last)])

    def quarantine(self, shard: int) -> None:
        """Stop reading ``shard``; its samples are replaced by the next ones of the stream."""
        self._quarantined = self._checked_quarantine(self._quarantined | {shard})

    def shards_of(self, ids: Sequence[int]) -> list[int]:
        """The sorted unique shard ids that ``ids`` read."""
        return np.unique(self.corpus.shard_ids(np.asarray(ids, dtype=np.int64))).tolist()

    @staticmethod
    def rank_slice(ids: Sequence[int], rank: int, world_size: int) -> list[int]:
        """Rank ``rank``'s contiguous, equal share of a global batch split over ``world_size`` ranks."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size) with world_size >= 1, got {rank}, {world_size}")
        if len(ids) % world_size:
            raise ValueError(f"a batch of {len(ids)} does not split evenly over {world_size} ranks")
        share = len(ids) // world_size
        return list(ids[rank * share : (rank + 1) * share])

    def state_dict(self) -> dict[str, Any]:
        """The position and the edits, as plain JSON types (seed and batch size are checked on load)."""
        return {
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "cursor": self._cursor,
            "skip_ranges": [[first, last] for first, last in self._skip_ranges],
            "quarantined_shards": sorted(self._quarantined),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()``'s cursor, skip ranges and quarantined shards."""
        for name in ("seed", "global_batch_size"):
            if state[name] != getattr(self, name):
                raise ValueError(f"sampler state has {name}={state[name]}, this sampler {getattr(self, name)}")
        cursor = int(state["cursor"])
        if cursor < 0:
            raise ValueError(f"cursor must be non-negative, got {cursor}")
        ranges = merge_ranges([_checked_range(int(first), int(last)) for first, last in state["skip_ranges"]])
        quarantined = self._checked_quarantine({int(shard) for shard in state["quarantined_shards"]})
        self._cursor, self._skip_ranges, self._quarantined = cursor, ranges, quarantined

    def _checked_quarantine(self, shards: set[int]) -> set[int]:
        for shard in shards:
            if not 0 <= shard < self.corpus.num_shards:
                raise ValueError(f"shard {shard} is out of range [0, {self.corpus.num_shards})")
        if len(shards) == self.corpus.num_shards:
            raise ValueError("quarantining every shard would leave nothing to read")
        return shards

    def _first_unskipped(self, batch_index: int) -> int:
        for first, last in self._skip_ranges:  # sorted and merged: one pass suffices
            if first <= batch_index <= last:
                batch_index = last + 1
        return batch_index

    def _is_quarantined(self, ids: np.ndarray) -> np.ndarray:
        return np.isin(self.corpus.shard_ids(ids), list(self._quarantined))

    def _stream(self, position: int, count: int) -> np.ndarray:
        """``count`` ids of the epoch-permutation stream from ``position`` on."""
        total = self.corpus.num_train_samples
        parts = []
        while count > 0:
            epoch, offset = divmod(position, total)
            part = self._permutation(epoch)[offset : offset + count]
            parts.append(part)
            position += len(part)
            count -= len(part)
        return np.concatenate(parts)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._permutations:
            if len(self._permutations) >= _CACHED_EPOCHS:
                self._permutations.pop(next(iter(self._permutations)))
            generator = np.random.default_rng([self.seed, epoch])
            self._permutations[epoch] = generator.permutation(self.corpus.num_train_samples)
        return self._permutations[epoch]


def _checked_range(first: int, last: int) -> tuple[int, int]:
    if not 0 <= first <= last:
        raise ValueError(f"a skip range needs 0 <= first <= last, got ({first}, {last})")
    return first, last


def merge_ranges(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted inclusive ranges with overlapping or adjacent ones joined."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged
