"""Multi-head latent attention (:class:`attnspec.spec.mixers.mla.MlaMixer` states it). The full sequence
decompresses every head's keys and values and runs softmax attention; decoding keeps the latent
(c_t, k^R_t) in a key/value cache of one head (:mod:`attnspec.ops.softmax.cache`: keys [c, k^R], values
c) and attends in the absorbed form, W_UK folded into the query and W_UV applied after the sum. The
parameters carry the names DeepSeek's checkpoints give them."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnspec.nn.mixers.base import Mixer, check_position_held, check_prompt_fits, positions_held
from attnspec.nn.positions import build_position
from attnspec.nn.registry import register
from attnspec.ops.documents import Documents, same_document
from attnspec.ops.softmax import cache_of, empty_cache, softmax_attention, softmax_step


@register("mixer", "mla")
class MlaMixer(Mixer):
    """Latent attention: (B, L, d_model) -> (B, L, d_model)."""

    def __init__(self, node, *, d_model: int, max_len: int, seed: int):
        super().__init__(node, d_model=d_model, max_len=max_len, seed=seed)
        H, self.rope, self.rank = self.heads, node.rope_dim, node.kv_rank
        self.nope = self.d_qk - self.rope
        if node.q_rank is None:
            self.q_proj = nn.Linear(d_model, H * self.d_qk, bias=False)
            self.q_a_proj = self.q_norm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = nn.Linear(d_model, node.q_rank, bias=node.qkv_bias)
            self.q_norm = nn.Parameter(torch.ones(node.q_rank))
            self.q_b_proj = nn.Linear(node.q_rank, H * self.d_qk, bias=False)
        self.kv_a_proj = nn.Linear(d_model, self.rank + self.rope, bias=node.qkv_bias)  # rows: c | k^R
        self.kv_norm = nn.Parameter(torch.ones(self.rank))
        self.kv_b_proj = nn.Linear(self.rank, H * (self.nope + self.d_v), bias=False)  # per head: k^C | v
        self.out_proj = nn.Linear(H * self.d_v, d_model, bias=node.out_bias)
        self.norm_eps = node.norm_eps
        self.position = build_position(node.position, heads=H, d_qk=self.rope, d_model=d_model, max_len=max_len)
        self.cache_capacity = node.cache_capacity(max_len)
        with torch.no_grad():
            for projection in self.projections():
                projection.weight.mul_(node.init_scale)

    def projections(self) -> list[nn.Linear]:
        found = [self.q_proj, self.q_a_proj, self.q_b_proj, self.kv_a_proj, self.kv_b_proj, self.out_proj]
        return [projection for projection in found if projection is not None]

    def state_size(self, length: int) -> int:
        """The latent of each position attended to: kv_rank + rope_dim numbers."""
        return min(length, self.cache_capacity) * (self.rank + self.rope)

    def _rms(self, t: Tensor, weight: Tensor) -> Tensor:
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + self.norm_eps) * weight.to(t.dtype)

    def _project(self, u: Tensor, offset: Tensor | int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """u (B, L, d) -> q^C (B, H, L, nope), RoPE(q^R) (B, H, L, rope), the latent c (B, L, rank) and
        RoPE(k^R) (B, 1, L, rope), at positions offset .. offset + L - 1."""
        B, L = u.shape[:2]
        q = self.q_proj(u) if self.q_proj is not None else self.q_b_proj(self._rms(self.q_a_proj(u), self.q_norm))
        q = q.view(B, L, self.heads, self.d_qk).transpose(1, 2)
        c, k_rope = self.kv_a_proj(u).split([self.rank, self.rope], dim=-1)
        q_rope, k_rope = self.position.rotate(q[..., self.nope:], k_rope.unsqueeze(1), offset)
        return q[..., :self.nope], q_rope, self._rms(c, self.kv_norm), k_rope

    def _attend(self, u: Tensor, documents: Documents | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The full sequence, every head's keys and values decompressed: (output, c, RoPE(k^R)); packed
        ``documents`` attend within each, at positions restarting in each."""
        q_nope, q_rope, c, k_rope = self._project(u, 0 if documents is None else documents.positions)
        B, L = u.shape[:2]
        kv = self.kv_b_proj(c).view(B, L, self.heads, self.nope + self.d_v).transpose(1, 2)
        k = torch.cat([kv[..., :self.nope], k_rope.expand(-1, self.heads, -1, -1)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)
        o = softmax_attention(q, k, kv[..., self.nope:], causal=self.causal, scale=self.scale,
                              mask=None if documents is None else same_document(documents.ids))
        return self.out_proj(o.transpose(1, 2).reshape(B, L, -1)), c, k_rope

    takes_documents = True

    def forward(self, u: Tensor, mode: str | None = None, documents: Documents | None = None) -> Tensor:
        self._checked_mode(mode)
        return self._attend(u, documents)[0]

    # -- decoding through a cache of the latent
    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None,
                   capacity: int | None = None) -> tuple[Tensor, ...]:
        """Empty latent cache of C positions (``max_len``, or ``capacity``: :func:`positions_held`): keys
        [c, k^R] (batch, 1, C, rank + rope), values c (batch, 1, C, rank), the (unused) decay bias (batch, H, C)."""
        return empty_cache(batch, self.heads, 1, 1, positions_held(self.cache_capacity, capacity),
                           self.rank + self.rope, self.rank, dtype, device)

    def prefill(self, u: Tensor, capacity: int | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The prompt u (B, L, d_model) -> (y (B, L, d_model), its latent cache of C positions)."""
        y, c, k_rope = self._attend(u)
        C = positions_held(self.cache_capacity, capacity)
        check_prompt_fits(u.shape[1], C)
        bias = torch.zeros(u.shape[0], self.heads, C, dtype=u.dtype, device=u.device)  # no decay
        keys = cache_of(torch.cat([c.unsqueeze(1), k_rope], dim=-1), C).to(u.dtype)
        values = cache_of(c.unsqueeze(1), C).to(u.dtype)
        return y, (keys, values, bias)

    def step(self, u_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token in the absorbed form: ``u_t`` (B, d_model), ``position`` (B,) -> (y_t, new cache)."""
        check_position_held(position, state[0].shape[2], "latent attention's cache")
        q_nope, q_rope, c, k_rope = self._project(u_t.unsqueeze(1), position)
        weight = self.kv_b_proj.weight.view(self.heads, self.nope + self.d_v, self.rank)
        w_uk, w_uv = weight[:, :self.nope], weight[:, self.nope:]  # (H, nope, rank), (H, d_v, rank)
        # per-head products as bmm over the heads, (H, B, .): an einsum's reshapes make export guard the batch
        q_latent = torch.bmm(q_nope[:, :, 0].transpose(0, 1), w_uk.to(q_nope.dtype)).transpose(0, 1)
        query = torch.cat([q_latent, q_rope[:, :, 0]], dim=-1)  # (B, H, rank + rope)
        key = torch.cat([c[:, 0], k_rope[:, 0, 0]], dim=-1).unsqueeze(1)  # (B, 1, rank + rope)
        o, cache = softmax_step(query, key, c[:, 0].unsqueeze(1), state[:3], position, scale=self.scale)
        o = torch.bmm(o.transpose(0, 1), w_uv.transpose(1, 2).to(o.dtype))  # (H, B, d_v)
        return self.out_proj(torch.cat(o.unbind(0), dim=-1)), cache  # heads side by side: (B, H d_v)
