"""Mamba-1's selective scan (:class:`attnspec.spec.mixers.mamba.MambaMixer` states the equations): the
projections, the convolution of x and the selection (Δ, B, C) here, the scan itself in every mode of
:func:`attnspec.ops.linear.linear_attention`, with each of the ``d_inner`` channels a head of value
width 1, keys Δ_t[c] B_t, queries C_t and the decay exp(Δ_t[c] A[c]) per key channel. The
parameters carry the names transformers' ``MambaMixer`` gives them."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.nn.mixers.base import Mixer, autocast_dtype, full_precision
from attnspec.nn.registry import build, register
from attnspec.ops.documents import Documents
from attnspec.ops.linear import Decay, PairState, linear_attention, recurrent_step


@register("mixer", "mamba")
class MambaMixer(Mixer):
    """Mamba-1: in_proj -> conv(x) -> selection -> scan -> (y + D x) silu(z) -> out_proj."""

    float32_parameters = ("A_log", "D")
    """Kept in float32 in a bfloat16 or float16 model (:func:`attnspec.nn.model.cast_parameters`): the decay's
    rate enters exp(-exp(A_log) Δ) and the skip adds to the scan's float32 output."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed)
        channels, state, rank = node.d_inner, node.d_qk, node.dt_rank
        self.channels, self.state, self.rank = channels, state, rank
        self.in_proj = nn.Linear(d_model, 2 * channels, bias=node.qkv_bias)  # rows: x | z
        self.conv = build("conv", node.conv, channels={"v": channels})
        self.x_proj = nn.Linear(channels, rank + 2 * state, bias=False)  # rows: Δ's rank | B | C
        self.dt_proj = nn.Linear(rank, channels, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, state + 1, dtype=torch.float32)).repeat(channels, 1))
        self.D = nn.Parameter(torch.ones(channels))
        self.out_proj = nn.Linear(channels, d_model, bias=node.out_bias)
        self.selection_norm, self.norm_eps = node.selection_norm, node.norm_eps
        self.selection_weight = nn.ParameterDict({name: nn.Parameter(torch.ones(width)) for name, width in
                                                  (("dt", rank), ("B", state), ("C", state))}
                                                 ) if node.selection_norm == "rmsnorm" else None
        with torch.no_grad():
            bound = rank ** -0.5  # Mamba's "random" Δ projection init at time_step_scale 1
            self.dt_proj.weight.uniform_(-bound, bound)
            low, high = node.dt_init
            dt = torch.exp(torch.rand(channels) * (math.log(high) - math.log(low)) + math.log(low)).clamp(min=1e-4)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(Δ)
            for projection in (self.in_proj, self.x_proj, self.out_proj):
                projection.weight.mul_(node.init_scale)

    def projections(self) -> list[nn.Linear]:
        return [self.in_proj, self.x_proj, self.out_proj]

    # -- shared by forward, prefill and step
    def _normalized(self, t: Tensor, name: str) -> Tensor:
        """``selection_norm``: RMS over the last axis, with a learnt weight for ``rmsnorm``."""
        if self.selection_norm == "none":
            return t
        t = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        return t if self.selection_weight is None else t * self.selection_weight[name].to(t.dtype)

    def _scan_inputs(self, u: Tensor, conv_state: tuple[Tensor, ...] | None = None, positions: Tensor | None = None):
        """u (B, L, d_model) -> queries C (B, d_inner, L, N), keys Δ B (B, d_inner, L, N), values x
        (B, d_inner, L, 1), the decay Δ A (B, d_inner, L, N), x and z (B, L, d_inner), and the
        convolution's new state. ``positions``: packed documents' (the convolution reads within each)."""
        x, z = self.in_proj(u).chunk(2, dim=-1)
        x, new_conv = self.conv("v", x, conv_state[0] if conv_state else None, positions)
        # x_proj's rows one product each: a split of one product is a strided view, and a linear map of
        # a strided view makes export guard on the batch (its reshape is a view only at batch 1)
        dt, b, c = (F.linear(x, rows) for rows in self.x_proj.weight.split([self.rank, self.state, self.state]))
        dt, b, c = (full_precision(self._normalized(t, name)) for t, name in ((dt, "dt"), (b, "B"), (c, "C")))
        # Δ (B, d_inner, L, 1), in float32 in a half-precision model as the other parts of the decay
        step = F.softplus(F.linear(dt, self.dt_proj.weight.to(dt.dtype), self.dt_proj.bias.to(dt.dtype)))
        step = step.transpose(1, 2).unsqueeze(-1)
        log_a = step * -torch.exp(full_precision(self.A_log)).unsqueeze(1)  # (B, d_inner, L, N)
        keys = step.to(b.dtype) * b.unsqueeze(1)
        queries = c.unsqueeze(1).expand(-1, self.channels, -1, -1)
        values = full_precision(x).transpose(1, 2).unsqueeze(-1)
        return queries, keys, values, Decay(log_a.to(keys.dtype), None), x, z, () if new_conv is None else (new_conv,)

    def _output(self, o: Tensor, x: Tensor, z: Tensor) -> Tensor:
        """o (B, d_inner, L, 1), x and z (B, L, d_inner) -> (B, L, d_model): (y + D x) silu(z), projected."""
        y = o.squeeze(-1).transpose(1, 2).to(x.dtype) + x * self.D.to(x.dtype)
        return self.out_proj(y * F.silu(z))

    takes_documents = True

    def forward(self, u: Tensor, mode: str | None = None, documents: Documents | None = None) -> Tensor:
        mode = self._checked_mode(mode)
        q, k, v, decay, x, z, _ = self._scan_inputs(u, positions=None if documents is None else documents.positions)
        q, k, v = autocast_dtype(q), autocast_dtype(k), autocast_dtype(v)
        o = linear_attention(q, k, v, decay, mode=mode, chunk_size=self.chunk_size,
                             backend=self.kernel_for(mode, q, k, v, *decay), max_length=self.max_len,
                             starts=None if documents is None else documents.starts)
        return self._output(o, x, z)

    # -- decoding: the state h (B, d_inner, N, 1) and the convolution's last inputs
    def prefill(self, u: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The planned mode over the prompt, and its final state in the step's layout."""
        q, k, v, decay, x, z, conv_state = self._scan_inputs(u)
        q, k, v = autocast_dtype(q), autocast_dtype(k), autocast_dtype(v)
        o, final = linear_attention(q, k, v, decay, mode=self.mode, chunk_size=self.chunk_size,
                                    backend=self.kernel_for(self.mode, q, k, v, *decay), max_length=self.max_len,
                                    return_state=True)
        return self._output(o, x, z), (final.to(u.dtype),) + conv_state

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> tuple[Tensor, ...]:
        """Zero state: h (batch, d_inner, N, 1), then the convolution's (batch, width - 1, d_inner)."""
        return ((torch.zeros(batch, self.channels, self.state, 1, dtype=dtype, device=device),)
                + self.conv.init_state(batch, dtype, device))

    def step(self, u_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token: ``u_t`` (B, d_model) -> (y_t (B, d_model), new state)."""
        q, k, v, decay, x, z, conv_state = self._scan_inputs(u_t.unsqueeze(1), state[1:])
        o, pair = recurrent_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], Decay(decay.log_mag[:, :, 0], None),
                                 PairState(state[0].to(k.dtype), None))
        return self._output(o.unsqueeze(2), x, z)[:, 0], (pair.re.to(u_t.dtype),) + conv_state
