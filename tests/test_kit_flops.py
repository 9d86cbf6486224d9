"""The kit's FLOPs accounting from a model description, without torch."""

from __future__ import annotations

import pytest

from bedside.collectors.kit import ModelShape, flops_per_token


@pytest.mark.parametrize("layers,d,seq,vocab", [(1, 8, 4, 3), (3, 32, 17, 101), (12, 768, 1024, 50257)])
def test_flops_grow_six_per_weight_plus_attention(layers: int, d: int, seq: int, vocab: int) -> None:
    shape = ModelShape(n_layers=layers, d_model=d, d_mlp=4 * d, seq_len=seq, vocab_size=vocab)
    weights = layers * 12 * d * d + d * vocab
    assert flops_per_token(shape) == 6 * weights + 6 * layers * seq * d


def test_a_shape_with_a_size_not_above_zero_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="seq_len"):
        ModelShape(n_layers=2, d_model=16, d_mlp=64, seq_len=0, vocab_size=10)
