"""A small GPT-style decoder (pre-LayerNorm) in plain torch.nn, and its exact
parameter counts; training FLOPs per token and MFU come from the kit (``ModelConfig.shape``).

Blocks live in ``Transformer.blocks`` (an ``nn.ModuleList``) so FSDP2 ``fully_shard``
can wrap each one. Initialisation draws from the global torch RNG only: the same
seed gives bit-identical parameters.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model_config import ModelConfig

INIT_STD = 0.02


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t sees positions <= t."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.dropout = config.n_heads, config.dropout
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class MLP(nn.Module):
    """Position-wise feed-forward: d_model -> mlp_ratio * d_model -> d_model with GELU."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.d_mlp)
        self.proj = nn.Linear(config.d_mlp, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm residual block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(config.d_model), CausalSelfAttention(config)
        self.ln2, self.mlp = nn.LayerNorm(config.d_model), MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Decoder-only language model: ``forward(tokens[B, T]) -> logits[B, T, vocab_size]``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases, residual projections scaled by 1/sqrt(2 n_layers)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.modules():  # the blocks, in order (ModuleList iteration is typed as plain Modules)
            if isinstance(block, Block):
                for proj in (block.attn.proj, block.mlp.proj):
                    nn.init.normal_(proj.weight, std=INIT_STD / math.sqrt(2 * self.config.n_layers))

    def forward(self, tokens: Tensor) -> Tensor:
        T = tokens.shape[1]
        if self.config.seq_len < T:
            raise ValueError(f"sequence of {T} tokens is longer than seq_len {self.config.seq_len}")
        positions = torch.arange(T, device=tokens.device)
        x = self.drop(self.tok_emb(tokens) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    @staticmethod
    def loss(logits: Tensor, targets: Tensor) -> Tensor:
        """Mean next-token cross-entropy in nats over every position of ``logits[B, T, V]``."""
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def parameter_count(config: ModelConfig, *, embeddings: bool = True) -> int:
    """Exact parameter count of ``Transformer(config)``, a tied embedding counted once.

    ``embeddings=False`` leaves out the token and position embeddings and the LM head
    weight (the de-embedding, tied or not), as Kaplan et al. 2020 do for N; it keeps
    every block parameter (biases and LayerNorms included) and the final LayerNorm.
    """
    d, h = config.d_model, config.d_mlp
    block = (2 * d) + (3 * d * d + 3 * d) + (d * d + d) + (2 * d) + (d * h + h) + (h * d + d)
    body = config.n_layers * block + 2 * d
    if not embeddings:
        return body
    head = 0 if config.tie_embeddings else config.vocab_size * d
    return body + (config.vocab_size + config.seq_len) * d + head
