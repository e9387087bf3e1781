"""Softmax attention: GQA, QK-norm, rotary or ALiBi positions, a real decay as additive log-bias, a
sliding window, a logit soft-cap, attention sinks, differential attention's paired maps and an output gate;
decoded through a key/value cache (a ring buffer for a window)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnspec.errors import ShapeError
from attnspec.nn.mixers.base import full_precision
from attnspec.nn.mixers.parts import KeyValueCache, ProjectedMixer
from attnspec.nn.registry import build, register
from attnspec.ops.documents import Documents


@register("mixer", "softmax")
class SoftmaxMixer(KeyValueCache, ProjectedMixer):
    """Softmax attention; a real per-head decay becomes an additive log-bias (GateLoop sec. 3.4)."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int, d_in: int | None = None, depth: int = 0):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed, d_in=d_in)
        self.window = node.window  # a sliding window: its cache is a ring buffer
        self.chunk = node.chunk  # chunked attention: its cache is a ring of one chunk
        self.softcap = node.softcap
        self.sinks = torch.nn.Parameter(torch.zeros(self.heads)) if node.sinks else None
        self.transition = build("transition", node.transition, d_model=self.d_in, heads=self.heads, d_qk=self.d_qk)
        self.differential = node.differential
        if self.differential:
            # value heads pair up, kv heads 2i and 2i + 1 side by side: the v projection's rows as they are, read as
            # half the heads at twice the width (the attention, its cache and its GQA reads then need nothing else)
            self.v_heads, self.d_v = self.v_heads // 2, 2 * self.d_v
            self.lambdas = torch.nn.ParameterDict({name: torch.nn.Parameter(torch.randn(self.d_qk) * 0.1)
                                                   for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")})
            # a fixed function of depth (not in the weights, as ALiBi's slopes); float64, so that a float64 model
            # holds it exactly (a float32 model has it cast); (1,), as a 0-d float64 tensor is a number to
            # torch.compile, which then traces every graph twice
            self.register_buffer("lambda_init", torch.tensor([0.8 - 0.6 * math.exp(-0.3 * depth)], dtype=torch.float64),
                                 persistent=False)
        self.query_experts = node.query_experts
        if self.query_experts is not None:  # JetMoE's: the q and output projections hold every expert side by side
            self.router = torch.nn.Linear(self.d_in, self.query_experts.experts, bias=False)

    takes_documents = True

    def forward(self, x: Tensor, mode: str | None = None, documents: Documents | None = None,
                kv: tuple[Tensor, Tensor] | None = None, lend: bool = False
                ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """x (B, L, d_model) -> (B, L, d_model). ``kv``: the keys (B, H_k, L, Dk) and values (B, H_v, L, Dv)
        another block lent, which an attention with ``kv_from`` reads (and needs); ``lend``: also return this
        attention's own, for the blocks that read them (``lends_kv``)."""
        self._checked_mode(mode)
        self._check_kv(kv)
        o, k, v = self._softmax_attention(x, documents, kv)
        y = self._output(o, x, v)
        return (y, (k, v)) if lend else y

    def _check_kv(self, kv) -> None:
        """Refuse a call of an attention that reads another block's keys and values without them (or with them
        where it has its own), naming what to call instead."""
        if (kv is None) == self.borrows_kv:
            raise ShapeError("this attention reads the keys and values of the block that lends them (`kv_from`): run "
                             "it through the model, which hands them over" if kv is None else
                             "this attention projects its own keys and values; it takes no `kv`")

    def _project(self, x: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, ...]]:
        q, k, v, conv_state = super()._project(x, *args, **kwargs)
        return (q if self.query_experts is None else self._by_key(q, True)), k, v, conv_state

    def _output(self, o: Tensor, x: Tensor, v: Tensor | None = None) -> Tensor:
        if self.query_experts is not None:
            o = self._gated_experts(self._by_key(o, False), x)
        return super()._output(self._differences(o) if self.differential else o, x, v)

    def _by_key(self, t: Tensor, forward: bool) -> Tensor:
        """Expert-major heads (expert e's head h at e H + h, as the projections hold them) to key-major ones (the
        query heads of each key head consecutive, as grouped attention reads them), or back: (B, E H, L, D)."""
        B, heads, L, D = t.shape
        E, kv = self.query_experts.experts, self.k_heads
        grouped = (B, E, kv, heads // (E * kv), L, D) if forward else (B, kv, E, heads // (E * kv), L, D)
        return t.reshape(grouped).transpose(1, 2).reshape(B, heads, L, D)

    def _gated_experts(self, o: Tensor, x: Tensor) -> Tensor:
        """Each expert's heads of o (B, E H, L, Dv), expert-major, times its gate for each token: the softmax of the
        router's ``top_k`` largest logits of x (B, L, d) at the experts chosen, 0 elsewhere."""
        B, heads, L, D = o.shape
        E, top_k = self.query_experts.experts, self.query_experts.top_k
        logits = full_precision(self.router(x))
        chosen = logits.topk(top_k, dim=-1)
        gates = torch.zeros_like(logits).scatter(-1, chosen.indices, torch.softmax(chosen.values, dim=-1))
        return (o.view(B, E, heads // E, L, D) * gates.transpose(1, 2).unsqueeze(2).unsqueeze(-1).to(o.dtype)
                ).view(B, heads, L, D)

    def _differences(self, o: Tensor) -> Tensor:
        """Differential attention's pairs: o (B, H, L, 2 Dv), query head 2gi + s g + t the map s of pair
        (i, t) -> (B, H / 2, L, 2 Dv), RMS-normalised (A_first V - λ A_second V) (1 - λ_init), pair gi + t."""
        B, H, L, width = o.shape
        lambdas = {name: full_precision(weight) for name, weight in self.lambdas.items()}
        lam = (torch.exp((lambdas["lambda_q1"] * lambdas["lambda_k1"]).sum())
               - torch.exp((lambdas["lambda_q2"] * lambdas["lambda_k2"]).sum()) + self.lambda_init)
        pairs = o.view(B, self.v_heads, 2, H // (2 * self.v_heads), L, width)
        y = (pairs[:, :, 0] - lam.to(o.dtype) * pairs[:, :, 1]).reshape(B, H // 2, L, width)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        return y * (1 - self.lambda_init).to(y.dtype)

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None,
                   capacity: int | None = None) -> tuple[Tensor, ...]:
        """The key/value cache (:meth:`KeyValueCache._init_cache`), of ``capacity`` positions if given."""
        return self._init_cache(batch, dtype, device, capacity)

    def prefill(self, x: Tensor, capacity: int | None = None, kv: tuple[Tensor, Tensor] | None = None,
                lend: bool = False) -> tuple:
        """Attention over the prompt and the cache it leaves (:meth:`KeyValueCache._cache_prefill`); ``kv``
        and ``lend`` as :meth:`forward`'s (with ``lend``, the keys and values come third)."""
        self._check_kv(kv)
        y, state, own = self._cache_prefill(x, capacity, kv)
        return (y, state, own) if lend else (y, state)

    def step(self, x_t: Tensor, state: tuple[Tensor, ...], position: Tensor,
             kv: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token through the cache: ``x_t`` (B, d_model), ``position`` (B,) -> (y_t (B, d_model), new state).
        ``kv``: the lender's cache (keys, values) after its step, for an attention with ``kv_from``."""
        self._check_kv(kv)
        return self._cache_step(x_t, state, position, kv)
