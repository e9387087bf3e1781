"""xLSTM's mLSTM cell (:class:`attnspec.spec.mixers.mlstm.MlstmMixer` states the equations): the shared
projections, convolutions, output norm and gate of :class:`ProjectedMixer`, the two gates here, and the
matrix memory with its normaliser as gated linear attention over the values [v, 1] in every mode of
:func:`attnspec.ops.linear.linear_attention`; the max state m, which only floors the denominator, is a
cumulative max over the sequence and one max per decoded token."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.nn.mixers.base import autocast_dtype, full_precision
from attnspec.nn.mixers.parts import ProjectedMixer
from attnspec.nn.registry import register
from attnspec.ops.documents import Documents, segment_cummax
from attnspec.ops.linear import Decay, PairState, linear_attention, recurrent_step


@register("mixer", "mlstm")
class MlstmMixer(ProjectedMixer):
    """The mLSTM: gates i_t, f_t per head; C, n by the linear family's ops; h = C q / (max(|n q|, 1) + eps e^m)."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int, d_in: int | None = None):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed, d_in=d_in)
        self.igate = nn.Linear(self.d_in, self.heads)
        self.fgate = nn.Linear(self.d_in, self.heads)
        self.softcap, self.eps = node.gate_softcap, node.eps
        # xLSTM's start: gates from their biases alone, writing little and forgetting slowly (the gates are
        # not among ``projections``, so `init.projection_std` leaves them so)
        with torch.no_grad():
            for gate in (self.igate, self.fgate):
                gate.weight.zero_()
            self.igate.bias.fill_(-10.0)
            self.fgate.bias.copy_(torch.linspace(3.0, 6.0, self.heads))

    # -- shared by forward, prefill and step
    def _prepare(self, x: Tensor, offset: Tensor | int = 0, conv_state: tuple[Tensor, ...] | None = None,
                 documents: Documents | None = None):
        """q (B, H, L, Dk) scaled, keys exp(i_t) k_t, values [v, 1] (B, H, L, Dv + 1), the decay log σ(f_t)
        (B, H, L, 1), the capped input gate i and log σ(f) (B, H, L), v, and the convolutions' new state."""
        q, k, v, conv_state = self._project(x, offset, conv_state, documents=documents)
        i, f = (full_precision(gate(x)).transpose(1, 2) for gate in (self.igate, self.fgate))
        i, f = self.softcap * torch.tanh(i / self.softcap), self.softcap * torch.tanh(f / self.softcap)
        log_f = F.logsigmoid(f)
        keys = k * torch.exp(i).unsqueeze(-1).to(k.dtype)
        values = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        return q * self.scale, keys, values, Decay(log_f.unsqueeze(-1).to(k.dtype), None), i, log_f, v, conv_state

    def _hidden(self, o: Tensor, m: Tensor) -> Tensor:
        """o (B, H, L, Dv + 1): C q and n q; m (B, H, L) -> h (B, H, L, Dv)."""
        numerator, denominator = o[..., :-1], o[..., -1:]
        return numerator / (denominator.abs().clamp_min(1.0) + self.eps * torch.exp(m).unsqueeze(-1).to(o.dtype))

    def _max_state(self, i: Tensor, log_f: Tensor, documents: Documents | None = None) -> Tensor:
        """m_t = max(log σ(f_t) + m_(t-1), i_t) from m_0 = 0, all at once: b_t + max(0, max_(j<=t)(i_j - b_j))
        with b_t the running sum of log σ(f) (B, H, L); with packed ``documents`` the sum and the maximum
        restart at each document (m is 0 before it)."""
        b = torch.cumsum(log_f, dim=-1)
        if documents is None:
            return b + torch.cummax(i - b, dim=-1).values.clamp_min(0.0)
        first = torch.arange(b.shape[-1], device=b.device) - documents.positions  # each document's start (B, L)
        before = (b - log_f).gather(-1, first.unsqueeze(1).expand_as(b))  # the running sum before it
        b = b - before
        return b + segment_cummax(i - b, documents.ids, self.max_len).clamp_min(0.0)

    def _run(self, x: Tensor, mode: str, return_state: bool, documents: Documents | None = None):
        q, k, values, decay, i, log_f, v, conv_state = self._prepare(x, documents=documents)
        q, k, values = autocast_dtype(q), autocast_dtype(k), autocast_dtype(values)
        out = linear_attention(q, k, values, decay, mode=mode, chunk_size=self.chunk_size,
                               backend=self.kernel_for(mode, q, k, values, *decay), max_length=self.max_len,
                               return_state=return_state, starts=None if documents is None else documents.starts)
        o, final = out if return_state else (out, None)
        m = self._max_state(i, log_f, documents)
        return self._output(self._hidden(o, m), x, v), final, m[..., -1], conv_state

    takes_documents = True

    def forward(self, x: Tensor, mode: str | None = None, documents: Documents | None = None) -> Tensor:
        return self._run(x, self._checked_mode(mode), return_state=False, documents=documents)[0]

    # -- decoding: C with n as its last column (B, H, Dk, Dv + 1), m (B, H), the convolutions' last inputs
    def prefill(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The planned mode over the prompt, and its final state in the step's layout."""
        y, final, m, conv_state = self._run(x, self.mode, return_state=True)
        return y, (final.to(x.dtype), m.to(x.dtype)) + conv_state

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> tuple[Tensor, ...]:
        """Zero state: C | n (batch, H, Dk, Dv + 1), m (batch, H), then the convolutions'."""
        memory = torch.zeros(batch, self.heads, self.d_qk, self.d_v + 1, dtype=dtype, device=device)
        max_state = torch.zeros(batch, self.heads, dtype=dtype, device=device)
        return (memory, max_state) + self.conv.init_state(batch, dtype, device)

    def step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token: ``x_t`` (B, d_model), ``position`` (B,) 0-based -> (y_t (B, d_model), new state)."""
        x = x_t.unsqueeze(1)
        q, k, values, decay, i, log_f, v, conv_state = self._prepare(x, position, state[2:])
        o, pair = recurrent_step(q[:, :, 0], k[:, :, 0], values[:, :, 0], Decay(decay.log_mag[:, :, 0], None),
                                 PairState(state[0].to(k.dtype), None))
        m = torch.maximum(log_f[..., 0] + state[1].to(log_f.dtype), i[..., 0])
        y = self._output(self._hidden(o.unsqueeze(2), m.unsqueeze(-1)), x, v)
        return y[:, 0], (pair.re.to(x_t.dtype), m.to(x_t.dtype)) + conv_state
