"""Training FLOPs per token from a model description, and model FLOPs utilisation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What FLOPs accounting needs to know of a decoder-only transformer."""

    n_layers: int
    d_model: int
    d_mlp: int
    seq_len: int
    vocab_size: int

    def __post_init__(self) -> None:
        bad = {name: value for name, value in vars(self).items() if value <= 0}
        if bad:
            raise ValueError(f"ModelShape sizes must be > 0, got {bad}")


def flops_per_token(shape: ModelShape) -> float:
    """Training FLOPs (forward + backward) per token, Kaplan et al. 2020 (Table 1) convention.

    Forward per token: 2 FLOPs per matmul weight, ``2 * N`` with
    ``N = n_layers * (4 d_model^2 + 2 d_model d_mlp)`` (QKV, attention output and both
    MLP matrices; ``d_attn = d_model``), plus attention over the context
    ``2 * n_layers * seq_len * d_model`` (QK^T and AV under the causal mask, each query
    seeing seq_len / 2 keys on average), plus the LM head ``2 * d_model * vocab_size``
    (kept because it dominates tiny models). Training is 3x forward (backward = 2x), so
    ``6 * (N + d_model * vocab_size) + 6 * n_layers * seq_len * d_model``.

    Not counted (O(d_model) per token, as in Kaplan and Chinchilla's 6N): biases,
    LayerNorms, GELU, softmax, dropout, embedding lookups, the loss and the optimizer.
    PaLM / nanoGPT's ``estimate_mfu`` count unmasked attention (``12 * n_layers * seq_len
    * d_model``), so their MFU for the same run reads higher.
    """
    d, layers = shape.d_model, shape.n_layers
    matmul_weights = layers * (4 * d * d + 2 * d * shape.d_mlp) + d * shape.vocab_size
    return float(6 * matmul_weights + 6 * layers * shape.seq_len * d)


def mfu(tokens_per_second: float, shape: ModelShape, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved training FLOP/s over ``peak_flops``.

    ``peak_flops`` is the peak of whatever produced ``tokens_per_second``: one device's
    peak for per-rank throughput, ``world_size`` times it for global throughput.
    """
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be > 0, got {peak_flops!r}")
    return tokens_per_second * flops_per_token(shape) / peak_flops
