"""The trainer's transformer: shapes, causality, init, accounting and that it can learn."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from bedside.collectors.kit import flops_per_token, mfu
from bedside.trainer.model import Transformer, parameter_count
from bedside.trainer.model_config import ModelConfig, tiny_model_config

SMALL = ModelConfig(vocab_size=32, seq_len=16, d_model=32, n_layers=2, n_heads=4)


def build(config: ModelConfig = SMALL, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(config)


def tokens(config: ModelConfig = SMALL, batch: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randint(config.vocab_size, (batch, config.seq_len), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "change",
    [
        {"vocab_size": 0},
        {"seq_len": -1},
        {"d_model": 30},
        {"n_layers": 0},
        {"n_heads": 0},
        {"mlp_ratio": 0},
        {"dropout": 1.0},
        {"dropout": -0.1},
        {"d_model": 32.0},
        {"n_layers": True},
    ],
)
def test_config_rejects_bad_values(change: dict) -> None:
    with pytest.raises(ValueError, match="model\\."):
        dataclasses.replace(SMALL, **change)


def test_config_is_frozen_and_keyword_only() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SMALL.d_model = 64  # type: ignore[misc]
    with pytest.raises(TypeError):
        ModelConfig(32, 16, 32, 2, 4)  # type: ignore[misc]


@pytest.mark.parametrize("T", [1, 7, SMALL.seq_len])
def test_forward_shapes(T: int) -> None:
    logits = build()(tokens()[:, :T])
    assert logits.shape == (4, T, SMALL.vocab_size) and logits.dtype == torch.float32


def test_sequence_longer_than_seq_len_is_rejected() -> None:
    with pytest.raises(ValueError, match="seq_len"):
        build()(torch.zeros(1, SMALL.seq_len + 1, dtype=torch.long))


def test_blocks_are_a_module_list_for_fsdp() -> None:
    model = build()
    assert isinstance(model.blocks, torch.nn.ModuleList) and len(model.blocks) == SMALL.n_layers


def test_attention_is_causal() -> None:
    model, x = build().eval(), tokens()
    k = 9
    y = x.clone()
    y[:, k] = (y[:, k] + 1) % SMALL.vocab_size
    with torch.no_grad():
        before, after = model(x), model(y)
    torch.testing.assert_close(after[:, :k], before[:, :k], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, k:], before[:, k:])


@pytest.mark.parametrize("tie", [True, False])
def test_parameter_count_matches_the_module(tie: bool) -> None:
    config = dataclasses.replace(SMALL, tie_embeddings=tie)
    model = build(config)
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())
    embedding = {"tok_emb.weight", "pos_emb.weight", "lm_head.weight"}
    body = sum(p.numel() for n, p in model.named_parameters(remove_duplicate=False) if n not in embedding)
    assert parameter_count(config, embeddings=False) == body
    assert (model.lm_head.weight is model.tok_emb.weight) is tie


def test_flops_per_token_by_hand() -> None:
    config = ModelConfig(vocab_size=10, seq_len=8, d_model=16, n_layers=2, n_heads=2)
    n = 2 * (4 * 16 * 16 + 2 * 16 * 64)  # 6144 non-embedding matmul weights
    head = 16 * 10
    attention = 2 * 8 * 16  # n_layers * n_ctx * d_attn
    assert flops_per_token(config.shape) == 6 * (n + head) + 6 * attention == 39360.0


def test_mfu() -> None:
    config = ModelConfig(vocab_size=10, seq_len=8, d_model=16, n_layers=2, n_heads=2)
    assert mfu(1000.0, config.shape, peak_flops=39360.0 * 4000) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        mfu(1000.0, config.shape, peak_flops=0.0)


def test_loss_at_init_is_close_to_uniform() -> None:
    x = tokens(batch=8)
    loss = Transformer.loss(build()(x[:, :-1]), x[:, 1:])
    assert abs(loss.item() - math.log(SMALL.vocab_size)) < 0.05


def test_overfits_a_fixed_batch() -> None:
    model, x = build(), tokens(batch=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = model.loss(model(x[:, :-1]), x[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_same_seed_same_parameters_other_seed_differs() -> None:
    a, b, c = build(seed=3).state_dict(), build(seed=3).state_dict(), build(seed=4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["tok_emb.weight"], c["tok_emb.weight"])


def test_init_scales_residual_projections() -> None:
    config = dataclasses.replace(SMALL, d_model=128, n_layers=8)
    block = build(config).blocks[0]
    assert block.attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.mlp.proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)
    assert torch.count_nonzero(block.attn.qkv.bias) == 0


def test_tiny_model_config() -> None:
    config = tiny_model_config(vocab_size=64, seq_len=64)
    assert (config.d_model, config.n_layers, config.n_heads) == (64, 2, 4)
    assert parameter_count(config) < 200_000
