"""Small torch models built in code for module-dump tests (embedding, attention, MLP, layer norm, head)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + a
        return x + self.mlp(x)


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 11, d: int = 8, layers: int = 3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Block(d) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


def tiny_lm(seed: int = 0, layers: int = 3) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(layers=layers)


def token_ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(seed))
