"""Griffin's recurrent block (:class:`attnspec.spec.mixers.rglru.RglruMixer` states it): the branches, the
convolution and the RG-LRU's gates here, its recurrence in every mode of
:func:`attnspec.ops.linear.linear_attention` with each channel a head of one key and one value and
a decay of its own. The parameters carry RecurrentGemma's names and shapes."""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.nn.channel import _ACTIVATIONS
from attnspec.nn.mixers.base import Mixer, autocast_dtype, full_precision
from attnspec.nn.positions import positions
from attnspec.nn.registry import build, register
from attnspec.ops.documents import Documents
from attnspec.ops.linear import Decay, PairState, linear_attention, recurrent_step


@register("mixer", "rglru")
class RglruMixer(Mixer):
    """(B, L, d_model) -> (B, L, d_model): W_out (RG-LRU(conv(W_x u)) ⊙ act(W_y u))."""

    float32_parameters = ("recurrent_param",)
    """Kept in float32 in a bfloat16 or float16 model (:func:`attnspec.nn.model.cast_parameters`): the decay
    a = sigmoid(Λ)^(c r_t) is raised to the power c = 8, which magnifies a half-precision rounding of Λ."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed)
        width, heads = node.width, node.heads
        self.width, self.block, self.gate_scale = width, width // heads, node.gate_scale
        self.activation = _ACTIVATIONS[node.activation]
        self.linear_y = nn.Linear(d_model, width, bias=node.qkv_bias)
        self.linear_x = nn.Linear(d_model, width, bias=node.qkv_bias)
        self.conv = build("conv", node.conv, channels={"v": width})
        bound = self.block ** -0.5  # the gates' blocks: x (.., block) @ W (block, block) per head
        self.input_gate_weight = nn.Parameter(torch.empty(heads, self.block, self.block).uniform_(-bound, bound))
        self.input_gate_bias = nn.Parameter(torch.zeros(heads, self.block))
        self.recurrent_gate_weight = nn.Parameter(torch.empty(heads, self.block, self.block).uniform_(-bound, bound))
        self.recurrent_gate_bias = nn.Parameter(torch.zeros(heads, self.block))
        low, high = node.a_init  # a^c uniform in [low², high²] (Griffin), Λ = softplus⁻¹(-log(a^c) / c)
        a = torch.empty(width).uniform_(low ** 2, high ** 2).sqrt()
        rate = -torch.log(a) / self.gate_scale
        self.recurrent_param = nn.Parameter(rate + torch.log(-torch.expm1(-rate)))
        self.linear_out = nn.Linear(width, d_model, bias=node.out_bias)
        with torch.no_grad():
            for projection in self.projections():
                projection.weight.mul_(node.init_scale)

    @property
    def out_proj(self) -> nn.Linear:
        return self.linear_out  # what writes into the residual stream (Mixer's ``out_proj``)

    def projections(self) -> list[nn.Linear]:
        return [self.linear_y, self.linear_x, self.linear_out]

    def _gate(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """sigmoid of the block-diagonal map x W (W's blocks (heads, block, block)): (B, L, width) -> (B, L,
        width). Applied as one dense (width, width) product: a product per block needs the heads moved to
        the front and back, and that reshape makes an exported program guard on the batch (the dense form
        costs heads times the multiply-adds of the gates)."""
        dense = torch.block_diag(*weight.to(x.dtype).unbind(0))  # (width, width): x @ dense
        return torch.sigmoid(F.linear(x, dense.t(), bias.to(x.dtype).flatten()))

    def _scan_inputs(self, u: Tensor, offset: Tensor | int = 0, conv_state: tuple[Tensor, ...] | None = None):
        """u (B, L, d) -> queries and keys of ones (B, width, L, 1), values (B, width, L, 1), the decay, y
        (B, L, width) and the convolution's new state, at positions offset .. offset + L - 1 (or, for a
        (B, L) ``offset``, packed documents' positions: the first of each is a document's first)."""
        y = self.activation(self.linear_y(u))
        restart = offset if isinstance(offset, Tensor) and offset.dim() == 2 else None
        x, new_conv = self.conv("v", self.linear_x(u), conv_state[0] if conv_state else None, restart)
        x = full_precision(x)
        log_a = -self.gate_scale * self._gate(x, self.recurrent_gate_weight, self.recurrent_gate_bias) * \
            F.softplus(full_precision(self.recurrent_param))
        multiplier = torch.sqrt(-torch.expm1(2 * log_a))  # sqrt(1 - a²), 1 at the first position
        first = positions(u.shape[1], offset, u.device, torch.float32) == 0
        multiplier = torch.where(first.view(-1, u.shape[1], 1), torch.ones_like(multiplier), multiplier)
        values = (x * self._gate(x, self.input_gate_weight, self.input_gate_bias) * multiplier).transpose(1, 2)
        ones = torch.ones_like(values).unsqueeze(-1)
        decay = Decay(log_a.transpose(1, 2).unsqueeze(-1), None)
        return ones, ones, values.unsqueeze(-1), decay, y, () if new_conv is None else (new_conv,)

    def _output(self, o: Tensor, y: Tensor) -> Tensor:
        return self.linear_out(o.squeeze(-1).transpose(1, 2).to(y.dtype) * y)

    takes_documents = True

    def forward(self, u: Tensor, mode: str | None = None, documents: Documents | None = None) -> Tensor:
        mode = self._checked_mode(mode)
        q, k, v, decay, y, _ = self._scan_inputs(u, 0 if documents is None else documents.positions)
        q, k, v = autocast_dtype(q), autocast_dtype(k), autocast_dtype(v)
        o = linear_attention(q, k, v, decay, mode=mode, chunk_size=self.chunk_size,
                             backend=self.kernel_for(mode, q, k, v, *decay), max_length=self.max_len,
                             starts=None if documents is None else documents.starts)
        return self._output(o, y)

    # -- decoding: h (B, width, 1, 1) and the convolution's last inputs
    def prefill(self, u: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        q, k, v, decay, y, conv_state = self._scan_inputs(u)
        q, k, v = autocast_dtype(q), autocast_dtype(k), autocast_dtype(v)
        o, final = linear_attention(q, k, v, decay, mode=self.mode, chunk_size=self.chunk_size,
                                    backend=self.kernel_for(self.mode, q, k, v, *decay), max_length=self.max_len,
                                    return_state=True)
        return self._output(o, y), (final.to(u.dtype),) + conv_state

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None) -> tuple[Tensor, ...]:
        """Zero state: h (batch, width, 1, 1), then the convolution's (batch, width - 1, width)."""
        return ((torch.zeros(batch, self.width, 1, 1, dtype=dtype, device=device),)
                + self.conv.init_state(batch, dtype, device))

    def step(self, u_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        q, k, v, decay, y, conv_state = self._scan_inputs(u_t.unsqueeze(1), position, state[1:])
        o, pair = recurrent_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], Decay(decay.log_mag[:, :, 0], None),
                                 PairState(state[0].to(v.dtype), None))
        return self._output(o.unsqueeze(2), y)[:, 0], (pair.re.to(u_t.dtype),) + conv_state
