"""State transitions a_t, produced as a real ``Decay(log_mag, phase)`` of shape (B, H, L, 1 or Dk).

All transitions are carried in log space: ``log|a|`` (always < 0 by construction) and the
phase ``theta`` (None for real transitions).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.nn.registry import register
from attnspec.ops.linear import Decay


def spread(bounds: list[float], count: int) -> Tensor:
    """``count`` values from lo to hi, evenly spaced (float64): channel c gets lo + (hi - lo) c / (count - 1).
    On the CPU whatever the default device (they initialise biases, copied where the module lives): a meta
    ``linspace`` imports torch's symbolic-shape machinery (0.5 s of a size check)."""
    lo, hi = bounds
    return torch.linspace(lo, hi, count, dtype=torch.float64, device="cpu")


class Transition(nn.Module):
    """Base: ``forward(x)`` with x (B, L, d_model) -> Decay or None. Whether it is complex or per
    channel is the IR node's fact, copied here for the mixer's state layout."""

    decays = True
    """False where ``forward`` is None whatever x is: mixers then do not call it (a module call costs
    microseconds per layer of every decoding step)."""

    def __init__(self, node):
        super().__init__()
        self.is_complex, self.per_channel = node.is_complex, node.per_channel

    def input_scale(self, x: Tensor) -> Tensor | None:
        """A factor (B, H, L, 1 or Dk) on what position t writes to the state (Mamba2's Δ_t), or None."""
        return None


@register("transition", "none")
class NoTransition(Transition):
    decays = False

    def __init__(self, node, **_):
        super().__init__(node)

    def forward(self, x: Tensor) -> Decay | None:
        return None


@register("transition", "fixed")
class FixedTransition(Transition):
    """A learnable input-independent transition ``a = exp(-exp(nu) + i theta)`` (so |a| < 1 always).

    Initialisations: ``retnet`` |a| = 1 - 2^(-5-c) and theta = 10000^(-c/n) (xPos-like);
    ``lru`` |a| uniform in [0.9, 0.999] on the ring, theta uniform in [0, 2 pi);
    ``s4d_lin`` the ZOH discretisation exp(dt (-1/2 + i pi c)) with dt log-uniform in [1e-3, 1e-1];
    ``alibi`` |a_h| = exp(-2^(-8 (h + 1) / H)). Not ``learnable``: buffers, kept as initialised (or loaded).
    """

    float32_parameters = ("nu", "theta")
    """Kept in float32 in a bfloat16 or float16 model (:func:`attnspec.nn.model.cast_parameters`): the decay exp(-exp(nu) + i theta) over many steps: a half-precision nu or theta drifts."""

    def __init__(self, node, *, heads: int, d_qk: int, **_):
        super().__init__(node)
        self.heads, self.width = heads, d_qk if self.per_channel else 1
        count = heads * self.width
        index = torch.arange(count, dtype=torch.float64)
        if node.init == "retnet":
            exponent = 5.0 + index * (heads / count) if self.per_channel else 5.0 + index
            theta = torch.pow(10000.0, -(index % max(self.width, 1)) / max(self.width, 1)) if self.per_channel \
                else torch.pow(10000.0, -index / count)
            # log(1 - 2^-e) through log1p: 1 - 2^-e rounds to 1 (log 0, nu = -inf) from e = 53 on,
            # which 64 heads reach; log1p keeps -log|a| = 2^-e exact
            log_mag = torch.log1p(-torch.pow(2.0, -exponent))
        elif node.init == "lru":
            r_min, r_max = 0.9, 0.999
            u = torch.rand(count, dtype=torch.float64)
            log_mag = 0.5 * torch.log(u * (r_max ** 2 - r_min ** 2) + r_min ** 2)
            theta = 2 * math.pi * torch.rand(count, dtype=torch.float64)
        elif node.init == "alibi":  # the slopes as ALiBi (and MiniMax) compute them, base^(h + 1)
            log_mag = -torch.pow(2.0 ** (-8.0 / heads), index + 1)
            theta = torch.zeros(count, dtype=torch.float64)
        else:  # s4d_lin
            dt = torch.exp(torch.rand(count, dtype=torch.float64) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
            channel = index % max(self.width, 1) if self.per_channel else index
            log_mag = -0.5 * dt
            theta = math.pi * channel * dt
        if node.magnitude_init is not None:
            log_mag = torch.log(spread(node.magnitude_init, count))
        if node.phase_init is not None:
            theta = spread(node.phase_init, count)
        nu, theta = torch.log(-log_mag).float().view(heads, self.width), theta.float().view(heads, self.width)
        if node.learnable:
            self.nu = nn.Parameter(nu)
            self.theta = nn.Parameter(theta) if self.is_complex else None
        else:
            self.register_buffer("nu", nu)
            self.register_buffer("theta", theta if self.is_complex else None)

    def forward(self, x: Tensor) -> Decay:
        B, L = x.shape[:2]
        log_mag = (-torch.exp(self.nu)).to(x.dtype).view(1, self.heads, 1, self.width).expand(B, -1, L, -1)
        phase = None if self.theta is None else self.theta.to(x.dtype).view(1, self.heads, 1, self.width).expand(B, -1, L, -1)
        return Decay(log_mag, phase)


@register("transition", "data")
class DataTransition(Transition):
    """GateLoop: ``a_t = f(W_gamma x_t) exp(i g(W_theta x_t))``; f = sigmoid or exp(-exp(.)), g = identity."""

    def __init__(self, node, *, d_model: int, heads: int, d_qk: int, **_):
        super().__init__(node)
        self.heads, self.width = heads, d_qk if self.per_channel else 1
        self.magnitude = node.magnitude
        self.gamma = nn.Linear(d_model, heads * self.width)
        self.theta = nn.Linear(d_model, heads * self.width) if self.is_complex else None
        # The biases set a_t at zero input: |a| spread over magnitude_init, theta over phase_init.
        count = heads * self.width
        magnitude = spread(node.magnitude_init, count)
        bias = torch.log(magnitude / (1 - magnitude)) if self.magnitude == "sigmoid" else torch.log(-torch.log(magnitude))
        with torch.no_grad():
            self.gamma.bias.copy_(bias)
            if self.theta is not None:
                self.theta.bias.copy_(spread(node.phase_init, count))

    def _split(self, y: Tensor) -> Tensor:
        B, L = y.shape[:2]
        return y.view(B, L, self.heads, self.width).transpose(1, 2)

    def forward(self, x: Tensor) -> Decay:
        gamma = self._split(self.gamma(x))
        # log sigmoid(g) = -softplus(-g) never rounds to log 0; exp(-exp(g)) has log -exp(g) directly.
        log_mag = F.logsigmoid(gamma) if self.magnitude == "sigmoid" else -torch.exp(gamma)
        phase = None if self.theta is None else self._split(self.theta(x))
        return Decay(log_mag, phase)


@register("transition", "mamba")
class MambaTransition(Transition):
    """Mamba's gate: ``log a_t = -exp(A_log) softplus(W_Δ x_t + dt_bias)`` per head or key channel.

    A = exp(A_log) starts uniform in ``a_init``, softplus(dt_bias) log-uniform in ``dt_init`` (floored
    at 1e-4, as Mamba2); Δ clamped to [``dt_min``, ``dt_max``] where set. ``input_scale(x)`` is the step Δ_t when
    the node scales the input, else None.
    """

    float32_parameters = ("A_log", "dt_bias")
    """Kept in float32 in a bfloat16 or float16 model (:func:`attnspec.nn.model.cast_parameters`): the decay -exp(A_log) softplus(W x + dt_bias) compounds over steps."""

    def __init__(self, node, *, d_model: int, heads: int, d_qk: int, **_):
        super().__init__(node)
        self.heads, self.width = heads, d_qk if self.per_channel else 1
        count = heads * self.width
        if node.rank is None:
            self.dt_proj = nn.Linear(d_model, count, bias=False)
        else:  # KDA's gate projection: d_model -> rank -> count
            self.dt_proj = nn.Sequential(nn.Linear(d_model, node.rank, bias=False), nn.Linear(node.rank, count, bias=False))
        low, high = node.a_init
        self.a_width = 1 if node.shared_a else self.width  # Kimi: one A per head over per-channel Δ
        self.A_log = nn.Parameter(torch.log(torch.empty(heads * self.a_width).uniform_(low, high)))
        low, high = node.dt_init
        dt = torch.exp(torch.empty(count).uniform_(math.log(low), math.log(high))).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
        self.scales_input = node.scale_input
        self.dt_min, self.dt_max = node.dt_min, node.dt_max

    def _step(self, x: Tensor) -> Tensor:
        """Δ_t = softplus(W_Δ x_t + dt_bias): (B, L, d_model) -> (B, H, L, width), in full precision."""
        B, L = x.shape[:2]
        wide = torch.promote_types(x.dtype, torch.float32)  # half-precision activations: the gate in float32
        rate = F.softplus(self.dt_proj(x).to(wide) + self.dt_bias.to(wide))
        if self.dt_min is not None or self.dt_max is not None:
            rate = rate.clamp(self.dt_min, self.dt_max)
        return rate.view(B, L, self.heads, self.width).transpose(1, 2)

    def forward(self, x: Tensor) -> Decay:
        step = self._step(x)
        return Decay(-torch.exp(self.A_log.to(step.dtype)).view(1, self.heads, 1, self.a_width) * step, None)

    def input_scale(self, x: Tensor) -> Tensor | None:
        return self._step(x) if self.scales_input else None
