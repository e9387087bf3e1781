"""Causal depthwise convolutions inside a mixer (short convolutions, token shift).

One module holds a filter per stream its IR node names (``node.streams()``: ``x`` the mixer input,
``q``/``k``/``v`` the projections, each with a kernel width w). ``forward(name, x, state)`` convolves
(B, L, C) causally: output t sees inputs t - w + 1 .. t. With ``state`` (B, w - 1, C), the last
inputs before this call, it continues a sequence (decoding); without, the past is zeros. It
returns the output and the new state, so one code path serves the full sequence and the step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.nn.registry import register
from attnspec.ops.documents import shifted


@register("conv", "none", "short", "shift")
class Convolutions(nn.Module):
    """Depthwise causal filters, one per stream; ``shift`` starts as the mean of x_(t-1) and x_t,
    ``short`` as PyTorch's Conv1d default (uniform in +-1/sqrt(width))."""

    def __init__(self, node, *, channels: dict[str, int], **_):
        super().__init__()
        self.widths: dict[str, int] = dict(node.streams())
        self.filters = nn.ParameterDict()
        self.biases = nn.ParameterDict()
        self.silu = node.output_activation() == "silu"
        for name, width in self.widths.items():
            if node.starts_as_mean():
                weight = torch.full((channels[name], width), 1.0 / width)
            else:
                bound = width ** -0.5
                weight = torch.empty(channels[name], width).uniform_(-bound, bound)
            self.filters[name] = nn.Parameter(weight)
            if node.has_bias():  # as Conv1d's default: uniform in +-1/sqrt(fan_in)
                self.biases[name] = nn.Parameter(torch.empty(channels[name]).uniform_(-width ** -0.5, width ** -0.5))
        self.channels = {name: channels[name] for name in self.widths}

    def forward(self, name: str, x: Tensor, state: Tensor | None = None,
                positions: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Convolve stream ``name``: x (B, L, C), state (B, w - 1, C) or None -> (y (B, L, C), new state).
        ``positions`` (B, L): packed documents' positions (:class:`attnspec.ops.documents.Documents`); a
        tap that would read across a document's start reads zeros, as the document alone would."""
        if name not in self.widths:
            return x, state
        weight = self.filters[name]
        width = weight.shape[1]
        L = x.shape[1]
        if state is None:
            padded = F.pad(x, (0, 0, width - 1, 0))
        else:
            padded = torch.cat([state.to(x.dtype), x], dim=1)
        bias = self.biases[name].to(x.dtype) if name in self.biases else None
        if positions is not None:  # tap j reads x_(t - (w - 1 - j)) of the same document only
            taps = weight.t().to(x.dtype)  # (w, C)
            y = sum(taps[j] * shifted(x, width - 1 - j, positions) for j in range(width))
            y = y if bias is None else y + bias
        elif type(L) is int and L == 1:
            # one position (a decoding step, whose length is a plain 1 even when traced): a dot of the
            # window with the filter. A depthwise conv1d call cost ~70 us on a 2-core CPU (three per Mamba2
            # block: a fifth of an imported Mamba2's step, 8.4 of 41 ms profiled); the product and sum ~3 us.
            y = (padded * weight.t().to(x.dtype)).sum(dim=1, keepdim=True)
            y = y if bias is None else y + bias
        else:
            y = F.conv1d(padded.transpose(1, 2), weight.to(x.dtype).unsqueeze(1), bias, groups=weight.shape[0])
            y = y.transpose(1, 2)
        return (F.silu(y) if self.silu else y), padded[:, L:]

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> tuple[Tensor, ...]:
        """Zero decoding state, one (batch, w - 1, C) tensor per stream in ``self.widths`` order."""
        return tuple(torch.zeros(batch, width - 1, self.channels[name], dtype=dtype, device=device)
                     for name, width in self.widths.items())
