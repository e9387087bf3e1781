"""A whole mixer family as an attnspec plugin: a damped exponential moving average (EMA) of the values.

Per value channel c (H heads x d_v channels), with a learnt rate a_c in (0, 1):

    h_t = a ⊙ h_(t-1) + (1 - a) ⊙ v_t,        y_t = sigmoid(W_g x_t) ⊙ h_t

(MEGA's EMA without its multi-dimensional expansion, gated as in its output). A family states what
the planner, verification and decoding read: its modes (``recurrent``, a loop over positions, and
``quadratic``, the L x L weights (1 - a) a^(t-s) at once), the cost of each, its decoding state
(h, one number per channel) and step, and its float64 reference (:func:`ema_reference`). attnspec
gives it validation, planning, ``verify`` (quadratic against the recurrence), export of
``model.pt2``/``step.pt2`` and ``run --generate`` like a built-in family.

One file, both halves: the IR class (facts, no torch) and the nn module, built on first use.
Use ``plugins: [ema]`` and ``mixer: {kind: ema, heads: 2}``, allowed with ``attnspec --plugin ema``,
with this folder on PYTHONPATH.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from attnspec.spec.components import component
from attnspec.spec.family import BYTES, Cost
from attnspec.spec.ir import MixerComponent


@component("mixer")
class EmaMixer(MixerComponent):
    """A damped EMA of the values per channel, gated by sigmoid(W_g x)."""

    kind: Literal["ema"]
    rate_init: Annotated[list[Annotated[float, Field(gt=0, lt=1)]], Field(min_length=2, max_length=2)] = Field(
        default_factory=lambda: [0.5, 0.99])
    """Range of the rates a at initialisation, spread over the channels."""
    implementation: ClassVar[str] = "ema:EmaModule"

    def modes(self) -> tuple[str, ...]:
        return ("quadratic", "recurrent")

    def mode_costs(self, L: int) -> dict[str, Cost]:
        channels = self.heads * self.d_v
        return {"recurrent": Cost(macs=2 * L * channels, bytes=3 * L * channels * BYTES, state_bytes=channels * BYTES,
                                  sequential_steps=L),
                "quadratic": Cost(macs=L * L * channels, bytes=L * L * channels * BYTES,
                                  state_bytes=channels * BYTES, sequential_steps=3)}

    @property
    def has_step(self) -> bool:
        return self.causal

    def problems(self, *, max_len: int, d_qk: int | None):
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        if not self.causal:
            yield ("causal",), "an EMA runs in position order: it needs `causal: true`"
        if self.rate_init[0] > self.rate_init[1]:
            yield ("rate_init",), f"rate_init is a range [low, high]; got low {self.rate_init[0]} above high"

    def describe(self) -> str:
        return f"ema {self.on_heads()}"


def ema_reference(v, rate):
    """The float64 reference: the recurrence, position by position. v (B, L, C), rate (C,) -> (B, L, C)."""
    import torch

    v, rate = v.double(), rate.double()
    h, out = torch.zeros_like(v[:, 0]), []
    for t in range(v.shape[1]):
        h = rate * h + (1 - rate) * v[:, t]
        out.append(h)
    return torch.stack(out, 1)


def _module_class():
    import torch
    from torch import nn

    from attnspec.nn.mixers import Mixer

    class EmaModule(Mixer):
        """``forward(x, mode)``: (B, L, d_model) -> (B, L, d_model); ``step`` decodes one token."""

        def __init__(self, node: EmaMixer, *, d_model: int, max_len: int, seed: int):
            super().__init__(node, d_model=d_model, max_len=max_len, seed=seed)
            self.channels = self.heads * self.d_v  # an EMA has values only: no q/k projections to opt into
            self.v_proj = nn.Linear(d_model, self.channels)
            self.out_proj = nn.Linear(self.channels, d_model)
            low, high = node.rate_init
            rates = torch.linspace(low, high, self.channels)
            self.rate_logit = nn.Parameter(torch.log(rates) - torch.log1p(-rates))
            self.ema_gate = nn.Linear(d_model, self.channels, bias=False)

        def projections(self):
            return [self.v_proj, self.ema_gate, self.out_proj]

        def _values(self, x):
            return self.v_proj(x)  # (B, L, C)

        def _gated(self, h, x):
            return self.out_proj(torch.sigmoid(self.ema_gate(x)) * h)

        def forward(self, x, mode: str | None = None):
            mode = self._checked_mode(mode)
            v, rate = self._values(x), torch.sigmoid(self.rate_logit)
            if mode == "recurrent":
                h, out = v.new_zeros(v.shape[0], self.channels), []
                for v_t in v.unbind(1):
                    h = rate * h + (1 - rate) * v_t
                    out.append(h)
                return self._gated(torch.stack(out, 1), x)
            L = x.shape[1]
            positions = torch.arange(L, device=x.device, dtype=v.dtype)
            lag = positions[:, None] - positions[None, :]  # t - s
            log_rate = torch.log(rate)  # (C,)
            # (C, L, L) weights (1 - a) a^(t-s) below the diagonal; the exponent is clamped so the
            # masked entries stay finite (and their gradient zero)
            weights = (1 - rate)[:, None, None] * torch.exp(log_rate[:, None, None] * lag.clamp(min=0))
            weights = weights * (lag >= 0)
            h = torch.einsum("cts,bsc->btc", weights, v)
            return self._gated(h, x)

        def init_state(self, batch: int, dtype=torch.float32, device=None):
            """Zero state: h (batch, H * d_v)."""
            return (torch.zeros(batch, self.channels, dtype=dtype, device=device),)

        def step(self, x_t, state, position):
            """One token: ``x_t`` (B, d_model) -> (y_t (B, d_model), (h,))."""
            rate = torch.sigmoid(self.rate_logit)
            h = rate * state[0] + (1 - rate) * self._values(x_t)
            return self._gated(h, x_t), (h,)

    return EmaModule


def __getattr__(name: str):  # the nn half is built on first use, so validating a spec imports no torch
    if name == "EmaModule":
        cls = _module_class()
        globals()["EmaModule"] = cls
        return cls
    raise AttributeError(name)
