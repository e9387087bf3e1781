"""Position schemes, one module per IR kind. Each acts where its IR node's ``acts_on`` fact says:

* ``embed(x, offset)``: added to the token embeddings (x: (B, L, d_model));
* ``rotate(q, k, offset)``: q and k (B, H, L, d_qk) rotated before the feature map;
* ``decay(x)``: a fixed real Decay (B, H, L, 1) that joins the mixer's transition.

The other two are identities, so the model and the mixers call all three without asking which
kind they hold. Positions are 0-based and start at ``offset``: an int for a full sequence, a (B,)
tensor of cache positions in decoding, or a (B, L) tensor of every position (packed documents).
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from attnspec.errors import ShapeError
from attnspec.nn.registry import register
from attnspec.ops.linear import Decay
from attnspec.ops.per_step import shared


def positions(length: int, offset: Tensor | int, device, dtype) -> Tensor:
    """Absolute positions: (L,) for an int offset, (B, L) for a (B,) tensor of offsets, or the (B, L)
    tensor given (packed documents' positions, which restart at each document)."""
    if isinstance(offset, Tensor) and offset.dim() == 2:
        return offset.to(dtype)
    steps = torch.arange(length, device=device, dtype=dtype)
    if isinstance(offset, Tensor):
        return offset.to(dtype).view(-1, 1) + steps
    return steps + offset


class Position(nn.Module):
    """Base: every hook is the identity; a kind overrides the one it acts through."""

    decays = False
    """Whether :meth:`decay` gives one (a decoding cache then keeps its running bias)."""

    def __init__(self, node=None, **_):
        super().__init__()

    def embed(self, x: Tensor, offset: Tensor | int = 0) -> Tensor:
        return x

    def rotate(self, q: Tensor, k: Tensor | None, offset: Tensor | int = 0) -> tuple[Tensor, Tensor | None]:
        return q, k

    def decay(self, x: Tensor) -> Decay | None:
        return None


register("position", "none")(Position)


@register("position", "learned")
class LearnedPosition(Position):
    """A learned table (max_len, d_model), N(0, 0.02^2) as GPT-2, added to the embeddings."""

    def __init__(self, node, *, d_model: int, max_len: int, **_):
        super().__init__()
        self.table = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def embed(self, x: Tensor, offset: Tensor | int = 0) -> Tensor:
        L = x.shape[1]
        if isinstance(offset, Tensor):
            index = positions(L, offset, x.device, torch.long)  # (B, L)
            return x + self.table[index].to(x.dtype)
        return x + self.table[offset:offset + L].to(x.dtype)


@register("position", "sinusoidal")
class SinusoidalPosition(Position):
    """Fixed sin/cos(t / base^(2i/d)) added to the embeddings (no parameters)."""

    def __init__(self, node, *, d_model: int, **_):
        super().__init__()
        self.base, self.d_model, self.first = node.base, d_model, node.offset
        self.spacing = self.d_model // 2 - (1 if node.spacing == "half_minus_one" else 0)

    def embed(self, x: Tensor, offset: Tensor | int = 0) -> Tensor:
        t = positions(x.shape[1], offset, x.device, torch.float64).unsqueeze(-1) + self.first  # (..., L, 1)
        half = self.d_model // 2
        frequencies = self.base ** (-torch.arange(half, device=x.device, dtype=torch.float64) / max(self.spacing, 1))
        angle = t * frequencies
        table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)
        if table.shape[-1] < self.d_model:  # odd d_model: the last channel carries no position
            table = torch.nn.functional.pad(table, (0, self.d_model - table.shape[-1]))
        return x + table.to(x.dtype)


@register("position", "rope")
class RotaryPosition(Position):
    """RoPE (GPT-NeoX layout) on the first r = rotary_fraction * d channels: channel i < r/2 pairs with
    i + r/2 and both turn by t / base^(2i/r) (``interleaved``: channel 2i with 2i + 1); channels from r on
    pass unrotated (partial RoPE)."""

    def __init__(self, node, *, d_qk: int, **_):
        super().__init__()
        self.base, self.d_qk, self.rotary = node.base, d_qk, node.rotary_width(d_qk)
        self.node = SimpleNamespace(**node.model_dump())  # its scaling's fields, as plain data for tracing
        self.cos_sin_scale = node.cos_sin_scale
        self.config = json.dumps(node.model_dump(), sort_keys=True, default=str)  # what its angles follow

    def rotate(self, q: Tensor, k: Tensor | None, offset: Tensor | int = 0) -> tuple[Tensor, Tensor | None]:
        """q, k (B, heads, L, d_qk) rotated at positions offset.. (k None: an attention reading keys another
        block rotated, `kv_from`)."""
        r = self.rotary
        # the same angles for every layer of a decoding step: computed once (ops.per_step)
        cos, sin = shared("rope angles", (offset, q.shape[2], r, self.config, q.dtype, q.device),
                          lambda: self._cos_sin(offset, q.shape[2], r, q.dtype, q.device))

        def turned(x: Tensor) -> Tensor:  # the first r channels rotated, the rest as they are
            if self.node.proportional and r < self.d_qk:  # channels i and d/2 + i, i < r/2, gathered as halves
                pairs = shared("proportional rope channels", (self.d_qk, r, x.device), lambda: torch.cat(
                    [torch.arange(r // 2, device=x.device), self.d_qk // 2 + torch.arange(r // 2, device=x.device)]))
                return x.index_copy(-1, pairs, _rotate_half(x.index_select(-1, pairs), cos, sin))
            rotated = x[..., :r] if r < self.d_qk else x
            rotated = _interleaved(rotated, lambda y: _rotate_half(y, cos, sin)) if self.node.interleaved \
                else _rotate_half(rotated, cos, sin)  # interleaved: pairs (2i, 2i + 1) gathered into halves
            return torch.cat([rotated, x[..., r:]], -1) if r < self.d_qk else rotated

        return turned(q), None if k is None else turned(k)

    def _cos_sin(self, offset: Tensor | int, L: int, width: int, dtype: torch.dtype, device) -> tuple[Tensor, Tensor]:
        """cos and sin of the angles, laid out for :func:`_rotate_half`: [cos, cos] and [-sin, sin] (1, 1, L,
        width), or (B, 1, L, width) for tensor offsets, in ``dtype``."""
        half = width // 2
        # angles in float64: t * frequency loses digits in float32 at long lengths
        t = positions(L, offset, device, torch.float64)
        # f_i = base^(-2i/width); proportional RoPE's, the whole head's base^(-2i/d_qk)
        exponents = -torch.arange(half, device=device, dtype=torch.float64) / (
            self.d_qk // 2 if self.node.proportional else half)
        if self.node.scaling == "dynamic":
            if t.dim() == 2 and not (torch.compiler.is_compiling() or torch.compiler.is_exporting()) \
                    and isinstance(offset, Tensor) and offset.dim() == 2:
                raise ShapeError("dynamic RoPE scaling stretches by the whole sequence's length, so packed "
                                 "documents would not compute as they do alone; use another `scaling`, or "
                                 "unpacked sequences")
            frequencies = dynamic_base(t.max() + 1, self.node, self.base, width) ** exponents
        else:
            frequencies = scaled_frequencies(self.base ** exponents, self.node, self.base, width)
        angle = t.unsqueeze(-1) * frequencies  # (L, half) or (B, L, half)
        angle = angle.view(1, 1, L, half) if angle.dim() == 2 else angle.unsqueeze(1)
        cos, sin = torch.cos(angle), torch.sin(angle)
        if self.node.reverse:  # a turn by -angle
            sin = -sin
        if self.cos_sin_scale != 1.0:
            cos, sin = cos * self.cos_sin_scale, sin * self.cos_sin_scale
        return torch.cat([cos, cos], -1).to(dtype), torch.cat([-sin, sin], -1).to(dtype)


def scaled_frequencies(frequencies: Tensor, node, base: float, width: int) -> Tensor:
    """RoPE's frequencies f_i = base^(-2i/width) (``half`` of them, float64) stretched as ``node.scaling``
    says (:class:`attnspec.spec.positions.RotaryPosition`): none, linear, llama3 (Llama 3.1) or yarn
    (dynamic changes the base: :func:`dynamic_base`)."""
    if node.scaling == "none":
        return frequencies
    if node.scaling == "linear":
        return frequencies / node.factor
    old = node.original_max_len
    if node.scaling == "llama3":
        wavelength = 2 * math.pi / frequencies
        low, high = old / node.low_freq_factor, old / node.high_freq_factor
        smooth = (old / wavelength - node.low_freq_factor) / (node.high_freq_factor - node.low_freq_factor)
        blended = (1 - smooth) * frequencies / node.factor + smooth * frequencies
        stretched = torch.where(wavelength > low, frequencies / node.factor, frequencies)
        return torch.where((wavelength >= high) & (wavelength <= low), blended, stretched)
    # yarn: dimension d turns old * f_d / 2pi times in the trained context; those turning more than
    # beta_fast times keep f_d, fewer than beta_slow take f_d / factor, a linear ramp between
    def dimension(turns: float) -> float:
        return width * math.log(old / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension(node.beta_fast), dimension(node.beta_slow)
    if node.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, width - 1)
    high = high + 0.001 if low == high else high  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(frequencies.shape[0], dtype=torch.float64, device=frequencies.device) - low)
            / (high - low)).clamp(0, 1)
    return frequencies / node.factor * ramp + frequencies * (1 - ramp)


def dynamic_base(length: Tensor, node, base: float, width: int) -> Tensor:
    """Dynamic NTK's base at a call reaching ``length`` positions (a float64 scalar tensor: the batch's
    furthest, as transformers takes it): base (factor n / original_max_len - factor + 1)^(width / (width - 2))
    once n > original_max_len, else base."""
    old, factor = node.original_max_len, node.factor
    grown = base * (factor * length / old - (factor - 1)) ** (width / (width - 2))
    return torch.where(length > old, grown, torch.full_like(grown, base))


def _interleaved(x: Tensor, rotate) -> Tensor:
    """``rotate`` (of the (i, i + r/2) layout) applied to channels paired (2i, 2i + 1): gathered into halves
    by index (a reshape of the transposed pairs would make an exported program guard on the batch)."""
    width = x.shape[-1]
    halves = torch.cat([torch.arange(0, width, 2, device=x.device), torch.arange(1, width, 2, device=x.device)])
    return rotate(x.index_select(-1, halves)).index_select(-1, torch.argsort(halves))


def _rotate_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Each pair (x1_i, x2_i) of the halves turned: [x1 cos - x2 sin, x2 cos + x1 sin], from the tables
    ``cos`` = [cos, cos] and ``sin`` = [-sin, sin] (:meth:`RotaryPosition._cos_sin`): equal bit for bit to
    the two halves computed apart (a negation and a swapped sum are exact) in fewer ops, which a decoding
    step pays per layer."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([x[..., half:], x[..., :half]], dim=-1) * sin


@register("position", "alibi")
class AlibiPosition(Position):
    """ALiBi as a fixed per-head decay: log a_h = -m_h with m_h = 2^(-8 (h+1) / H)."""

    decays = True

    def __init__(self, node, *, heads: int, **_):
        super().__init__()
        slopes = torch.pow(2.0, -8.0 * torch.arange(1, heads + 1, dtype=torch.float64) / heads)
        self.register_buffer("slopes", slopes.float(), persistent=False)  # a fixed function of `heads`

    def decay(self, x: Tensor) -> Decay:
        B, L = x.shape[:2]
        H = self.slopes.shape[0]
        return Decay((-self.slopes).to(x.dtype).view(1, H, 1, 1).expand(B, H, L, 1), None)


def build_position(node, **context) -> Position:
    """The module of a position node (an unresolved mixer's ``None`` means none)."""
    from attnspec.nn.registry import build

    return Position() if node is None else build("position", node, **context)
