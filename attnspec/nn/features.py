"""Feature maps phi applied per head to queries and keys: (B, H, L, n) -> (B, H, L, m).

Every feature map returns ``(features, log_scale)``: ``log_scale`` is a per-query log factor
(only Performer has one; None otherwise) such that the kernel is
``exp(log_scale_i) * phi(q_i).phi(k_j)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.nn.registry import register
from attnspec.ops.features import performer_features, random_projection


class FeatureMap(nn.Module):
    """Base class: ``forward(x, query) -> (features, log_scale)``. The facts (feature width, whether
    the map applies the mixer's scale itself, ...) are the IR node's (``node.width(n)``, ...)."""

    def regularization_loss(self) -> Tensor | None:
        return None


@register("feature_map", "identity")
class IdentityFeatures(FeatureMap):
    def __init__(self, node, **_):
        super().__init__()

    def forward(self, x: Tensor, query: bool) -> tuple[Tensor, Tensor | None]:
        return x, None


@register("feature_map", "elu1")
class Elu1Features(IdentityFeatures):
    def forward(self, x, query):
        return F.elu(x) + 1.0, None


@register("feature_map", "relu")
class ReluFeatures(IdentityFeatures):
    def forward(self, x, query):
        return F.relu(x), None


@register("feature_map", "softplus")
class SoftplusFeatures(IdentityFeatures):
    def forward(self, x, query):
        return F.softplus(x), None


@register("feature_map", "silu")
class SiluFeatures(IdentityFeatures):
    def forward(self, x, query):
        return F.silu(x), None


@register("feature_map", "l2norm")
class L2NormFeatures(FeatureMap):
    """x (or silu(x)) times rsqrt(|x|² + 1e-6) along the head width: flash-linear-attention's and
    transformers' l2norm (smooth at 0, unlike a clamp; |phi| = 1 - 5e-7/|x|² for |x| >> 1e-3)."""

    def __init__(self, node, **_):
        super().__init__()
        self.silu = node.activation == "silu"

    def forward(self, x, query):
        x = F.silu(x) if self.silu else x
        return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6), None


@register("feature_map", "exp")
class ExpFeatures(IdentityFeatures):
    """The softmax kernel; it has no finite features, so mixers compute it quadratically."""

    def forward(self, x, query):  # pragma: no cover - never called: the mixer takes the softmax path
        raise NotImplementedError("exp features are computed as softmax attention")


@register("feature_map", "performer")
class PerformerFeatures(FeatureMap):
    """Positive random features, fixed by a seed (redrawn only through :func:`redraw_random_features`)."""

    def __init__(self, node, *, dim: int, heads: int, scale: float, seed: int, **_):
        super().__init__()
        self.num_features, self.orthogonal = node.num_features, node.projection == "orthogonal"
        self.seed = seed + node.seed
        self.redraw_interval = node.redraw_interval if node.redraw == "interval" else None
        self.sqrt_scale = math.sqrt(scale)
        self.register_buffer("projection", random_projection(self.num_features, dim, orthogonal=self.orthogonal,
                                                             seed=self.seed))

    def redraw(self, step: int) -> None:
        """Draw a new projection, reproducibly from the seed and ``step``."""
        fresh = random_projection(self.num_features, self.projection.shape[-1], orthogonal=self.orthogonal,
                                  seed=self.seed + 1_000_003 * step)
        self.projection.copy_(fresh.to(self.projection.dtype))

    def forward(self, x, query):
        return performer_features(x * self.sqrt_scale, self.projection, query=query)


@register("feature_map", "aoglu", "glu", "oglu", "softplus_linear")
class TrainableKernel(FeatureMap):
    """The FFN kernels of Yorsh & Kovalenko: ``stack`` units, the last one strictly positive.

    * softplus_linear: ``Softplus(X W)`` per unit;
    * glu: ``(X W_f) * sigmoid(X W_g)``, last unit ``Softplus(X W_f) * sigmoid(X W_g)``;
    * oglu: glu with W_f orthogonal (init + regulariser);
    * aoglu: oglu with a low-rank gate ``W_g = U V`` of rank r.

    Weights are ``(G, n, n)`` with G = 1 (shared across heads) or H (per head).
    """

    def __init__(self, node, *, dim: int, heads: int, **_):
        super().__init__()
        groups = 1 if node.share_across_heads else heads
        self.stack = node.stack
        orthogonal = node.is_orthogonal()
        self.ortho_weight = node.regulariser_weight()
        self.orthogonal = orthogonal
        gated = node.is_gated()
        self.w_f = nn.ParameterList([nn.Parameter(self._init_square(groups, dim, orthogonal)) for _ in range(self.stack)])
        if not gated:
            self.w_g = None
        elif node.gate_rank() is not None:
            rank = node.gate_rank()
            self.gate_u = nn.ParameterList([nn.Parameter(torch.randn(groups, dim, rank) / math.sqrt(dim))
                                            for _ in range(self.stack)])
            self.gate_v = nn.ParameterList([nn.Parameter(torch.randn(groups, rank, dim) / math.sqrt(rank))
                                            for _ in range(self.stack)])
            self.w_g = None
        else:
            self.w_g = nn.ParameterList([nn.Parameter(self._init_square(groups, dim, False)) for _ in range(self.stack)])
        self.gated = gated

    @staticmethod
    def _init_square(groups: int, dim: int, orthogonal: bool) -> Tensor:
        weight = torch.empty(groups, dim, dim)
        for g in range(groups):
            if orthogonal:
                nn.init.orthogonal_(weight[g])
            else:
                nn.init.normal_(weight[g], std=1.0 / math.sqrt(dim))
        return weight

    def _gate_weight(self, unit: int) -> Tensor:
        if self.w_g is not None:
            return self.w_g[unit]
        return self.gate_u[unit] @ self.gate_v[unit]

    @staticmethod
    def _matmul_groups(x: Tensor, weight: Tensor) -> Tensor:
        # x (B, H, L, n) times (G, n, n) with G in {1, H}
        return x @ weight.to(x.dtype).unsqueeze(0)  # (a half-precision model's weights, float32 features)

    def forward(self, x, query):
        for unit in range(self.stack):
            last = unit == self.stack - 1
            transformed = self._matmul_groups(x, self.w_f[unit])
            if not self.gated:
                x = F.softplus(transformed)
                continue
            gate = torch.sigmoid(self._matmul_groups(x, self._gate_weight(unit)))
            x = (F.softplus(transformed) if last else transformed) * gate
        return x, None

    def regularization_loss(self) -> Tensor | None:
        """``ortho_weight * sum ||W^T W - I||_F^2`` over the orthogonal matrices (None if none)."""
        if not self.orthogonal or self.ortho_weight == 0:
            return None
        eye = torch.eye(self.w_f[0].shape[-1], dtype=self.w_f[0].dtype, device=self.w_f[0].device)
        total = sum(((w.transpose(-1, -2) @ w - eye) ** 2).sum() for w in self.w_f)
        return self.ortho_weight * total
