"""The transformer's shape, checked, and the tiny preset's: plain data with no torch, so that a launcher can check a
configuration before any rank starts."""

from __future__ import annotations

from dataclasses import dataclass

from ..collectors.kit import ModelShape


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of the transformer; ``d_model`` must split evenly across ``n_heads``."""

    vocab_size: int
    seq_len: int
    d_model: int
    n_layers: int
    n_heads: int
    mlp_ratio: int = 4
    dropout: float = 0.0
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "n_layers", "n_heads", "mlp_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model.{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def d_mlp(self) -> int:
        return self.mlp_ratio * self.d_model

    @property
    def shape(self) -> ModelShape:
        """The description the kit's FLOPs accounting reads."""
        return ModelShape(
            n_layers=self.n_layers,
            d_model=self.d_model,
            d_mlp=self.d_mlp,
            seq_len=self.seq_len,
            vocab_size=self.vocab_size,
        )


def tiny_model_config(vocab_size: int, seq_len: int) -> ModelConfig:
    """Two layers of width 64: a few hundred steps on 2 CPU cores in about a minute."""
    return ModelConfig(vocab_size=vocab_size, seq_len=seq_len, d_model=64, n_layers=2, n_heads=4)
