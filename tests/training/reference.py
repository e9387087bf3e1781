"""A plain nanoGPT-style Transformer and training loop, written here without attnspec, as the
reference attnspec's trained models are compared with (same data, seed, optimiser and budget).

Model (Karpathy's nanoGPT, minus dropout): token + learned position embeddings, pre-LayerNorm
blocks of causal softmax attention (scaled_dot_product_attention) and a 4x GELU MLP, a final
LayerNorm and an LM head tied to the token embedding; nanoGPT's initialisation (N(0, 0.02), the
residual projections N(0, 0.02 / sqrt(2 n_layer))).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

IGNORE = -100


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        B, L, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(B, L, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, L, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, max_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.position = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.embed.weight.T


def train_reference(model: nn.Module, task, *, steps: int, batch_size: int, lr: float, warmup: int,
                    weight_decay: float, betas, seed: int, eval_every: int, test_examples: int,
                    target: float) -> tuple[int | None, float]:
    """AdamW (decay on matrices only), linear warm-up + cosine to 10%, clip 1.0. Returns the first
    evaluation step whose test accuracy reaches ``target`` (None if none) and the last accuracy."""
    decay = [p for p in model.parameters() if p.dim() >= 2 and p is not model.embed.weight]
    rest = [p for p in model.parameters() if not (p.dim() >= 2 and p is not model.embed.weight)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=lr, betas=tuple(betas))
    test_x, test_y = task.batch("test", 0, test_examples, seed)
    accuracy = 0.0
    for step in range(steps):
        if step < warmup:
            rate = lr * (step + 1) / warmup
        else:
            progress = (step - warmup) / max(1, steps - warmup)
            rate = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = rate
        x, y = task.batch("train", step, batch_size, seed)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % eval_every == 0:
            with torch.no_grad():
                predictions = model(test_x).argmax(-1)
            mask = test_y != IGNORE
            accuracy = (predictions[mask] == test_y[mask]).float().mean().item()
            if accuracy >= target:
                return step + 1, accuracy
    return None, accuracy
