"""The trainer's synthetic data: a Markov language with an exact entropy floor, the
sharded corpus, and the deterministic batch sampler with skips and quarantine."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bedside.trainer.language import MarkovLanguage, ShardedCorpus, chain_period
from bedside.trainer.sampler import BatchSampler, merge_ranges

LANGUAGES = [(2, 2, 0), (5, 2, 1), (32, 4, 2), (64, 16, 3), (200, 8, 4)]


def make_language(seed: int = 0, **overrides) -> MarkovLanguage:
    return MarkovLanguage(**{"vocab_size": 64, "branching": 8, "seed": seed, **overrides})


def make_corpus(seed: int = 0, **overrides) -> ShardedCorpus:
    settings = {"seq_len": 16, "num_shards": 8, "samples_per_shard": 12, "heldout_samples": 24, "seed": seed}
    return ShardedCorpus(make_language(), **{**settings, **overrides})


def make_sampler(seed: int = 0, global_batch_size: int = 8, **corpus_overrides) -> BatchSampler:
    return BatchSampler(make_corpus(**corpus_overrides), global_batch_size=global_batch_size, seed=seed)


def batches(sampler: BatchSampler, count: int) -> list[tuple[int, list[int]]]:
    return [sampler.next_batch() for _ in range(count)]


# --- the language -------------------------------------------------------------------


@pytest.mark.parametrize("vocab, branching, seed", LANGUAGES)
def test_transition_matrix_is_sparse_stochastic_and_primitive(vocab: int, branching: int, seed: int) -> None:
    matrix = MarkovLanguage(vocab_size=vocab, branching=branching, seed=seed).transition_matrix()
    np.testing.assert_allclose(matrix.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert ((matrix > 0).sum(axis=1) == branching).all()
    reach, power = (matrix > 0).astype(float), 1  # primitive: P^m > 0 for m >= (V-1)^2 + 1 (Wielandt)
    while power < (vocab - 1) ** 2 + 1:
        reach, power = ((reach @ reach) > 0).astype(float), 2 * power
    assert reach.all()


@pytest.mark.parametrize("vocab, branching, seed", LANGUAGES)
def test_stationary_distribution_is_stationary(vocab: int, branching: int, seed: int) -> None:
    language = MarkovLanguage(vocab_size=vocab, branching=branching, seed=seed)
    pi = language.stationary_distribution()
    assert pi.shape == (vocab,) and (pi > 0).all()
    assert pi.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(pi @ language.transition_matrix(), pi, rtol=0, atol=1e-12)


def test_entropy_rate_matches_a_long_sample() -> None:
    language = make_language(seed=7)
    tokens = language.sample(300_000, np.random.default_rng(1))
    counts = np.zeros((language.vocab_size,) * 2)
    np.add.at(counts, (tokens[:-1], tokens[1:]), 1)
    estimated = np.where(counts > 0, counts / counts.sum(axis=1, keepdims=True), 1.0)
    empirical = -(counts * np.log(estimated)).sum() / counts.sum()  # plug-in, independent of P
    assert empirical == pytest.approx(language.entropy_rate(), rel=0.02)
    frequencies = np.bincount(tokens, minlength=language.vocab_size) / len(tokens)
    assert np.abs(frequencies - language.stationary_distribution()).sum() < 0.03
    assert (counts[language.transition_matrix() == 0] == 0).all()  # only allowed transitions


@pytest.mark.parametrize("vocab, branching, seed", LANGUAGES)
def test_entropy_rate_is_below_log_branching_and_log_vocab(vocab: int, branching: int, seed: int) -> None:
    rate = MarkovLanguage(vocab_size=vocab, branching=branching, seed=seed).entropy_rate()
    assert 0 < rate <= math.log(branching) + 1e-12
    assert rate < math.log(vocab) or branching == vocab


def test_uniform_ish_probabilities_approach_log_branching() -> None:
    rate = make_language(concentration=1000.0).entropy_rate()
    assert math.log(8) * 0.99 < rate <= math.log(8)


def test_chain_period_counts_cycle_lengths() -> None:
    # cycle 0->1->2->3->0 plus the reverse edges: every cycle has even length
    assert chain_period(np.array([[1, 3], [2, 0], [3, 1], [0, 2]])) == 2
    assert chain_period(np.array([[1, 0], [2, 0], [3, 1], [0, 2]])) == 1  # self-loop at 0
    with pytest.raises(ValueError, match="not irreducible"):
        chain_period(np.array([[0, 0], [1, 0]]))


def test_language_is_deterministic_from_its_seed() -> None:
    np.testing.assert_array_equal(make_language(3).transition_matrix(), make_language(3).transition_matrix())
    assert not np.array_equal(make_language(3).transition_matrix(), make_language(4).transition_matrix())
    assert make_language(3) == make_language(3) != make_language(4)


def test_sample_starts_anywhere_and_honours_length() -> None:
    language = make_language()
    assert language.sample(0, np.random.default_rng(0)).shape == (0,)
    sample = language.sample(1, np.random.default_rng(0))
    assert sample.dtype == np.int64 and sample.shape == (1,)
    firsts = {int(language.sample(1, np.random.default_rng(i))[0]) for i in range(400)}
    assert len(firsts) > language.vocab_size // 2  # drawn from pi, not a fixed start


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"vocab_size": 1}, "vocab_size"),
        ({"branching": 1}, "branching"),
        ({"branching": 65}, "branching"),
        ({"concentration": 0.0}, "concentration"),
        ({"seed": -1}, "seed"),
    ],
)
def test_language_rejects_bad_settings(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_language(**settings)


# --- the corpus ---------------------------------------------------------------------


def test_samples_are_deterministic_and_follow_the_chain() -> None:
    corpus, again, other = make_corpus(seed=1), make_corpus(seed=1), make_corpus(seed=2)
    sample = corpus.train_sample(5)
    assert sample.shape == (17,) and sample.dtype == np.int64
    np.testing.assert_array_equal(sample, again.train_sample(5))
    np.testing.assert_array_equal(corpus.heldout_sample(3), again.heldout_sample(3))
    assert not np.array_equal(sample, other.train_sample(5))
    assert not np.array_equal(sample, corpus.train_sample(6))
    assert (corpus.language.transition_matrix()[sample[:-1], sample[1:]] > 0).all()
    np.testing.assert_array_equal(corpus.train_batch([5, 6])[0], sample)


def test_heldout_is_apart_from_training() -> None:
    corpus = make_corpus()
    train = {tuple(corpus.train_sample(i)) for i in range(corpus.num_train_samples)}
    heldout = {tuple(corpus.heldout_sample(i)) for i in range(corpus.heldout_samples)}
    assert len(heldout) == corpus.heldout_samples
    assert not train & heldout
    assert corpus.heldout_batch(range(4)).shape == (4, 17)


def test_shards_are_contiguous_ranges_of_ids() -> None:
    corpus = make_corpus()
    assert [corpus.shard_of(i) for i in (0, 11, 12, 95)] == [0, 0, 1, 7]
    for bad in (-1, 96):
        with pytest.raises(IndexError):
            corpus.shard_of(bad)
    with pytest.raises(IndexError):
        corpus.heldout_sample(24)


@pytest.mark.parametrize("name", ["seq_len", "num_shards", "samples_per_shard", "heldout_samples"])
def test_corpus_rejects_empty_sizes(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        make_corpus(**{name: 0})


# --- the sampler --------------------------------------------------------------------


def test_each_epoch_is_a_seeded_permutation_of_the_train_ids() -> None:
    sampler = make_sampler()  # 96 samples, 8 per batch: 12 batches an epoch
    epochs = [sum((sampler.ids_for_batch(b) for b in range(e * 12, (e + 1) * 12)), []) for e in range(2)]
    for ids in epochs:
        assert sorted(ids) == list(range(96))
    assert epochs[0] != epochs[1]
    assert sampler.ids_for_batch(13) == make_sampler().ids_for_batch(13)
    assert sampler.ids_for_batch(13) != make_sampler(seed=1).ids_for_batch(13)


def test_batches_straddle_epochs_when_the_batch_does_not_divide_them() -> None:
    sampler = make_sampler(global_batch_size=10)
    stream = sum((sampler.ids_for_batch(b) for b in range(20)), [])
    assert sorted(stream[:96]) == sorted(stream[96:192]) == list(range(96))


def test_next_batch_passes_skip_ranges_and_continues_after() -> None:
    sampler, plain = make_sampler(), make_sampler()
    sampler.skip(3, 5)
    sampler.skip(9, 9)
    got = batches(sampler, 8)
    assert [index for index, _ in got] == [0, 1, 2, 6, 7, 8, 10, 11]
    assert all(ids == plain.ids_for_batch(index) for index, ids in got)  # skipping keeps the mapping
    assert sampler.cursor == 12
    assert sampler.is_skipped(4) and not sampler.is_skipped(6)


def test_skip_ranges_merge() -> None:
    assert merge_ranges([(5, 7), (1, 2), (3, 3), (6, 9), (12, 12)]) == [(1, 3), (5, 9), (12, 12)]
    sampler = make_sampler()
    sampler.skip(4, 6)
    sampler.skip(7, 8)
    assert sampler.skip_ranges == ((4, 8),)
    assert [index for index, _ in batches(sampler, 5)] == [0, 1, 2, 3, 9]
    with pytest.raises(ValueError, match="first <= last"):
        sampler.skip(5, 4)


def test_quarantined_shards_are_never_read_and_batches_stay_full() -> None:
    sampler, plain = make_sampler(), make_sampler()
    sampler.quarantine(2)
    sampler.quarantine(5)
    for index in range(40):  # more than three epochs
        ids = sampler.ids_for_batch(index)
        assert len(ids) == 8
        assert not {2, 5} & set(sampler.shards_of(ids))
        original = plain.ids_for_batch(index)
        if not {2, 5} & set(plain.shards_of(original)):
            assert ids == original  # only batches that read the shards change
    assert sampler.quarantined_shards == (2, 5)


def test_quarantine_keeps_one_shard_to_read() -> None:
    sampler = make_sampler(num_shards=2)
    sampler.quarantine(0)
    with pytest.raises(ValueError, match="nothing to read"):
        sampler.quarantine(1)
    with pytest.raises(ValueError, match="out of range"):
        sampler.quarantine(2)
    assert set(sampler.shards_of(sampler.ids_for_batch(0))) == {1}


def test_state_dict_round_trip_gives_bit_identical_batches() -> None:
    original = make_sampler(seed=3)
    original.skip(10, 12)
    original.quarantine(4)
    batches(original, 7)
    state = json.loads(json.dumps(original.state_dict()))
    assert state == {
        "seed": 3,
        "global_batch_size": 8,
        "cursor": 7,
        "skip_ranges": [[10, 12]],
        "quarantined_shards": [4],
    }
    restored = make_sampler(seed=3)
    restored.load_state_dict(state)
    assert batches(restored, 20) == batches(original, 20)


def test_state_dict_from_another_sampler_is_refused() -> None:
    state = make_sampler(seed=3).state_dict()
    with pytest.raises(ValueError, match="seed"):
        make_sampler(seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match="global_batch_size"):
        make_sampler(seed=3, global_batch_size=16).load_state_dict(state)
    target = make_sampler(seed=3)
    with pytest.raises(ValueError, match="first <= last"):
        target.load_state_dict({**state, "cursor": 5, "skip_ranges": [[3, 1]]})
    assert target.cursor == 0  # a refused state changes nothing


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_rank_slices_cover_the_global_batch_once(world_size: int) -> None:
    ids = make_sampler().ids_for_batch(0)
    slices = [BatchSampler.rank_slice(ids, rank, world_size) for rank in range(world_size)]
    assert sum(slices, []) == ids
    assert {len(part) for part in slices} == {8 // world_size}


def test_rank_slice_rejects_uneven_splits_and_bad_ranks() -> None:
    ids = list(range(8))
    with pytest.raises(ValueError, match="evenly"):
        BatchSampler.rank_slice(ids, 0, 3)
    for rank, world_size in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match="rank"):
            BatchSampler.rank_slice(ids, rank, world_size)


def test_sampler_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="global_batch_size"):
        make_sampler(global_batch_size=0)
    with pytest.raises(ValueError, match="seed"):
        make_sampler(seed=-1)
    with pytest.raises(ValueError, match="batch_index"):
        make_sampler().ids_for_batch(-1)


def test_shards_of_is_sorted_and_unique() -> None:
    assert make_sampler().shards_of([95, 0, 13, 1, 14]) == [0, 1, 7]
