"""A synthetic language with a known entropy floor, and the sharded corpus drawn from it.

``MarkovLanguage`` is a sparse random first-order Markov chain over tokens. Its
entropy rate is computed exactly, so a model that sees the previous token can at
best reach ``entropy_rate()`` nats per token: evals report the loss above that floor.
``ShardedCorpus`` cuts the language into numbered shards of fixed-length samples
(``seq_len + 1`` tokens: inputs and targets are a shift) plus a held-out split; each
sample is a pure function of (corpus seed, split, id), generated on demand.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field
from enum import IntEnum
from functools import cached_property

import numpy as np


@dataclass(frozen=True, kw_only=True)
class MarkovLanguage:
    """A first-order Markov chain over ``vocab_size`` tokens, deterministic from ``seed``.

    Every token has ``branching`` successors with Dirichlet(``concentration``)
    probabilities. One successor of each token follows a random cycle through the
    whole vocabulary, so the chain is irreducible; if it is still periodic, one token
    gets a self-loop in place of a random successor, which makes it aperiodic. The
    stationary distribution is then unique and strictly positive.
    """

    vocab_size: int
    branching: int
    seed: int
    concentration: float = 1.0
    successors: np.ndarray = field(init=False, repr=False, compare=False)
    probabilities: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"seed must be non-negative, got {self.seed}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {self.vocab_size}")
        if not 2 <= self.branching <= self.vocab_size:
            raise ValueError(f"branching must be in [2, vocab_size={self.vocab_size}], got {self.branching}")
        if not self.concentration > 0:
            raise ValueError(f"concentration must be positive, got {self.concentration}")
        rng = np.random.default_rng(self.seed)
        successors = _draw_successors(self.vocab_size, self.branching, rng)
        probabilities = rng.dirichlet(np.full(self.branching, float(self.concentration)), size=self.vocab_size)
        if np.any(probabilities <= 0):
            raise ValueError(f"concentration {self.concentration} is too small: a transition probability underflowed")
        for name, table in (("successors", successors), ("probabilities", probabilities)):
            table.flags.writeable = False  # the chain is frozen along with its settings
            object.__setattr__(self, name, table)

    def transition_matrix(self) -> np.ndarray:
        """The dense ``(vocab, vocab)`` row-stochastic matrix P[i, j] = Pr(next = j | current = i)."""
        matrix = np.zeros((self.vocab_size, self.vocab_size))
        np.put_along_axis(matrix, self.successors, self.probabilities, axis=1)
        return matrix

    def stationary_distribution(self) -> np.ndarray:
        """The exact stationary distribution pi (pi P = pi, sum 1), from a linear solve."""
        return self._stationary.copy()

    def entropy_rate(self) -> float:
        """H = -sum_i pi_i sum_j P_ij log P_ij in nats per token: the next-token loss floor."""
        row_entropy = -(self.probabilities * np.log(self.probabilities)).sum(axis=1)
        return float(self._stationary @ row_entropy)

    def sample(self, length: int, generator: np.random.Generator) -> np.ndarray:
        """``length`` tokens (int64) of the chain started from the stationary distribution."""
        if length < 0:
            raise ValueError(f"length must be non-negative, got {length}")
        uniforms = generator.random(length).tolist()
        if not uniforms:
            return np.zeros(0, dtype=np.int64)
        successors, cumulative, start_cdf = self._tables
        token = min(bisect.bisect_right(start_cdf, uniforms[0]), self.vocab_size - 1)
        tokens = [token]
        for u in uniforms[1:]:
            token = successors[token][bisect.bisect_right(cumulative[token], u)]
            tokens.append(token)
        return np.asarray(tokens, dtype=np.int64)

    @cached_property
    def _stationary(self) -> np.ndarray:
        system = self.transition_matrix().T - np.eye(self.vocab_size)
        system[-1, :] = 1.0  # replace one (redundant) balance equation by sum(pi) = 1
        rhs = np.zeros(self.vocab_size)
        rhs[-1] = 1.0
        pi = np.linalg.solve(system, rhs)
        return pi / pi.sum()

    @cached_property
    def _tables(self) -> tuple[list[list[int]], list[list[float]], list[float]]:
        """Python lists for the per-token loop: successors, their CDFs, the stationary CDF."""
        cumulative = np.cumsum(self.probabilities, axis=1)
        cumulative[:, -1] = 1.0  # u < 1 always lands on a successor despite rounding
        start_cdf = np.cumsum(self._stationary)
        start_cdf[-1] = 1.0
        return self.successors.tolist(), cumulative.tolist(), start_cdf.tolist()


def _draw_successors(vocab_size: int, branching: int, rng: np.random.Generator) -> np.ndarray:
    """``(vocab, branching)`` successor ids: column 0 walks one random cycle through every token."""
    order = rng.permutation(vocab_size)
    cycle_next = np.empty(vocab_size, dtype=np.int64)
    cycle_next[order] = np.roll(order, -1)
    successors = np.empty((vocab_size, branching), dtype=np.int64)
    successors[:, 0] = cycle_next
    for token in range(vocab_size):
        picks = rng.choice(vocab_size - 1, size=branching - 1, replace=False)
        successors[token, 1:] = picks + (picks >= cycle_next[token])  # any token but the cycle's
    if chain_period(successors) > 1:
        start = int(order[0])
        successors[start, -1] = start  # a self-loop: a cycle of length 1 makes the chain aperiodic
    return successors


def chain_period(successors: np.ndarray) -> int:
    """The period of an irreducible chain given as successor lists (1 means aperiodic).

    Breadth-first levels from token 0; the period is the gcd over every edge u -> v of
    level(u) + 1 - level(v).
    """
    levels = np.full(len(successors), -1, dtype=np.int64)
    levels[0] = 0
    queue = deque([0])
    while queue:
        token = queue.popleft()
        for successor in successors[token]:
            if levels[successor] < 0:
                levels[successor] = levels[token] + 1
                queue.append(int(successor))
    if np.any(levels < 0):
        raise ValueError("the chain is not irreducible: some token is unreachable from token 0")
    gaps = levels[:, None] + 1 - levels[successors]
    return int(np.gcd.reduce(np.abs(gaps).ravel()))


class Split(IntEnum):
    """The two id spaces of a corpus; each seeds its own generator streams."""

    TRAIN = 0
    HELDOUT = 1


@dataclass(frozen=True)
class ShardedCorpus:
    """Numbered shards of ``samples_per_shard`` samples of ``seq_len + 1`` tokens, plus a held-out split.

    Train sample ids run from 0 to ``num_train_samples - 1``; shard ``s`` holds the
    contiguous ids ``[s * samples_per_shard, (s + 1) * samples_per_shard)``. Held-out
    samples have their own ids ``0 .. heldout_samples - 1`` and their own generator
    streams. Every target has its previous token in the inputs, so for a first-order
    chain the loss floor is exactly ``language.entropy_rate()``.
    """

    language: MarkovLanguage
    _: KW_ONLY
    seq_len: int
    num_shards: int
    samples_per_shard: int
    heldout_samples: int
    seed: int

    def __post_init__(self) -> None:
        for name in ("seq_len", "num_shards", "samples_per_shard", "heldout_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.seed < 0:
            raise ValueError(f"seed must be non-negative, got {self.seed}")

    @property
    def num_train_samples(self) -> int:
        return self.num_shards * self.samples_per_shard

    def train_sample(self, sample_id: int) -> np.ndarray:
        """Train sample ``sample_id``: ``seq_len + 1`` int64 tokens."""
        _check_index("train sample id", sample_id, self.num_train_samples)
        return self._generate(Split.TRAIN, sample_id)

    def heldout_sample(self, index: int) -> np.ndarray:
        """Held-out sample ``index``: ``seq_len + 1`` int64 tokens, from a stream apart from training."""
        _check_index("held-out sample index", index, self.heldout_samples)
        return self._generate(Split.HELDOUT, index)

    def train_batch(self, sample_ids: Iterable[int]) -> np.ndarray:
        """The train samples stacked into ``(len(ids), seq_len + 1)``."""
        return np.stack([self.train_sample(i) for i in sample_ids])

    def heldout_batch(self, indices: Iterable[int]) -> np.ndarray:
        """The held-out samples stacked into ``(len(indices), seq_len + 1)``."""
        return np.stack([self.heldout_sample(i) for i in indices])

    def shard_of(self, sample_id: int) -> int:
        """The shard that holds train sample ``sample_id``."""
        _check_index("train sample id", sample_id, self.num_train_samples)
        return sample_id // self.samples_per_shard

    def shard_ids(self, sample_ids: np.ndarray) -> np.ndarray:
        """``shard_of`` over an array of train sample ids (unchecked, vectorised)."""
        return np.asarray(sample_ids, dtype=np.int64) // self.samples_per_shard

    def _generate(self, split: Split, index: int) -> np.ndarray:
        generator = np.random.default_rng([self.seed, int(split), index])
        return self.language.sample(self.seq_len + 1, generator)


def _check_index(what: str, index: int, size: int) -> None:
    if not 0 <= index < size:
        raise IndexError(f"{what} {index} is out of range [0, {size})")
