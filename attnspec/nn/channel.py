"""The per-position parts of a block: norms over the model width and the channel mixer (MLP).

Each is registered for its IR kind; ``none`` kinds are the IR's ``is_identity`` fact, which the
block reads (a block without an MLP has no second norm either).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.nn.registry import register


@register("norm", "layernorm")
class LayerNorm(nn.LayerNorm):
    """LayerNorm over the last dimension, with weight and bias."""

    def __init__(self, node, *, dim: int, **_):
        super().__init__(dim)


@register("norm", "rmsnorm")
class RMSNorm(nn.Module):
    """``x / rms(x) * weight``."""

    def __init__(self, node, *, dim: int, **_):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = node.eps

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


@register("norm", "none")
class NoNorm(nn.Identity):
    def __init__(self, node, **_):
        super().__init__()


_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "silu": F.silu}


@register("mlp", "mlp", "glu")
class Mlp(nn.Module):
    """``W2 act(W1 x)``, or with a gate (``glu``) ``W2 (act(W1 x) * W3 x)``; hidden width ``hidden`` or expansion * d_model."""

    def __init__(self, node, *, d_model: int, **_):
        super().__init__()
        hidden = node.hidden or node.expansion * d_model
        self.activation = _ACTIVATIONS[node.activation]
        self.up = nn.Linear(d_model, hidden, bias=node.bias)
        self.gate = nn.Linear(d_model, hidden, bias=node.bias) if node.gated else None
        self.down = nn.Linear(hidden, d_model, bias=node.bias)

    def projections(self) -> list[nn.Linear]:
        """Its linear maps (``down`` writes into the residual stream)."""
        return [p for p in (self.up, self.gate, self.down) if p is not None]

    def forward(self, x: Tensor) -> Tensor:
        h = self.activation(self.up(x))
        if self.gate is not None:
            h = h * self.gate(x)
        return self.down(h)
