"""Multi-head latent attention (:class:`attnspec.spec.mixers.mla.MlaMixer` states it). The full sequence
decompresses every head's keys and values and runs softmax attention; decoding keeps the latent
(c_t, k^R_t) in a key/value cache of one head (:mod:`attnspec.ops.softmax.cache`: keys [c, k^R], values
c) and attends in the absorbed form, W_UK folded into the query and W_UV applied after the sum. With an
``indexer`` (DeepSeek Sparse Attention) each query attends to the keys :class:`LightningIndexer` chooses, and
decoding caches the indexer's keys beside the latent. The parameters carry the names DeepSeek's checkpoints give
them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnspec.nn.mixers.base import Mixer, check_position_held, check_prompt_fits, positions_held
from attnspec.nn.positions import build_position
from attnspec.nn.registry import register
from attnspec.ops.documents import Documents, same_document
from attnspec.ops.softmax import cache_of, empty_cache, softmax_attention, softmax_step


class LightningIndexer(nn.Module):
    """DeepSeek Sparse Attention's indexer (:class:`attnspec.spec.mixers.mla.SparseIndexer` states it): index scores
    of keys for queries, and each query's choice of its ``topk`` highest. Parameters under DeepSeek's names."""

    def __init__(self, node, *, q_rank: int, d_model: int, rope_dim: int, position, max_len: int):
        super().__init__()
        self.heads, self.d_head, self.topk = node.heads, node.d_head, node.topk
        self.rope = node.rope_dim or rope_dim
        self.wq_b = nn.Linear(q_rank, self.heads * self.d_head, bias=False)
        self.wk = nn.Linear(d_model, self.d_head, bias=False)
        self.k_norm = nn.LayerNorm(self.d_head, eps=1e-6)
        self.weights_proj = nn.Linear(d_model, self.heads, bias=False)
        # the mixer's RoPE turning the first `rope` channels, in halves (DeepSeek-V3.2's) or interleaved pairs (GLM's)
        if position.kind == "rope":
            position = position.model_copy(update={"interleaved": node.interleaved})
        self.position = build_position(position, heads=self.heads, d_qk=self.rope, d_model=d_model, max_len=max_len)

    def project(self, u: Tensor, c_q: Tensor, offset: Tensor | int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """u (B, L, d_model), the query latent c_q (B, L, q_rank) -> its queries (B, heads, L, d_head), their
        weights (B, L, heads) and its keys (B, L, d_head), rotated at positions offset .. offset + L - 1 (float32
        at least)."""
        B, L = u.shape[:2]
        wide = torch.promote_types(u.dtype, torch.float32)
        q = self.wq_b(c_q).view(B, L, self.heads, self.d_head).transpose(1, 2).to(wide)
        k = self.k_norm(self.wk(u)).unsqueeze(1).to(wide)
        q_rot, k_rot = self.position.rotate(q[..., :self.rope], k[..., :self.rope], offset)
        q, k = torch.cat([q_rot, q[..., self.rope:]], -1), torch.cat([k_rot, k[..., self.rope:]], -1)[:, 0]
        return q, self.weights_proj(u).to(wide) * self.heads ** -0.5, k

    def chosen(self, q: Tensor, weights: Tensor, keys: Tensor, allowed: Tensor) -> Tensor:
        """The keys each query reads: q (B, heads, Lq, d_head), weights (B, Lq, heads), keys (B, Lk, d_head), allowed
        (B or 1, Lq, Lk) bool -> (B, Lq, Lk) bool, the ``topk`` allowed keys of highest score
        Σ_h w_h ReLU(q_h · k / sqrt(d_head)) (every allowed key where fewer are allowed)."""
        scores = torch.relu(q @ keys.unsqueeze(1).transpose(-1, -2) * self.d_head ** -0.5)  # (B, heads, Lq, Lk)
        scores = torch.einsum("bqh,bhqk->bqk", weights, scores).masked_fill(~allowed, float("-inf"))
        # topk columns of -inf on the right: a static k however few keys there are (no guard on the length)
        padded = F.pad(scores, (0, self.topk), value=float("-inf"))
        picked = torch.zeros_like(padded, dtype=torch.bool).scatter_(-1, padded.topk(self.topk, dim=-1).indices, True)
        return picked[..., :scores.shape[-1]] & allowed


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
        self.indexer = None if node.indexer is None else LightningIndexer(
            node.indexer, q_rank=node.q_rank, d_model=d_model, rope_dim=self.rope, position=node.position,
            max_len=max_len)
        self.cache_capacity = node.cache_capacity(max_len)
        with torch.no_grad():
            for projection in self.projections():
                projection.weight.mul_(node.init_scale)

    def projections(self) -> list[nn.Linear]:
        found = [self.q_proj, self.q_a_proj, self.q_b_proj, self.kv_a_proj, self.kv_b_proj, self.out_proj]
        return [projection for projection in found if projection is not None]

    def state_size(self, length: int) -> int:
        """The latent of each position attended to: kv_rank + rope_dim numbers (and the indexer's key)."""
        per_position = self.rank + self.rope + (self.indexer.d_head if self.indexer is not None else 0)
        return min(length, self.cache_capacity) * per_position

    def _rms(self, t: Tensor, weight: Tensor) -> Tensor:
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + self.norm_eps) * weight.to(t.dtype)

    def _project(self, u: Tensor, offset: Tensor | int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """u (B, L, d) -> q^C (B, H, L, nope), RoPE(q^R) (B, H, L, rope), the latent c (B, L, rank),
        RoPE(k^R) (B, 1, L, rope) and the query's latent c^Q (B, L, q_rank; None without `q_rank`), at positions
        offset .. offset + L - 1."""
        B, L = u.shape[:2]
        c_q = None if self.q_proj is not None else self._rms(self.q_a_proj(u), self.q_norm)
        q = self.q_proj(u) if c_q is None else self.q_b_proj(c_q)
        q = q.view(B, L, self.heads, self.d_qk).transpose(1, 2)
        c, k_rope = self.kv_a_proj(u).split([self.rank, self.rope], dim=-1)
        q_rope, k_rope = self.position.rotate(q[..., self.nope:], k_rope.unsqueeze(1), offset)
        return q[..., :self.nope], q_rope, self._rms(c, self.kv_norm), k_rope, c_q

    def _attend(self, u: Tensor, documents: Documents | None = None
                ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """The full sequence, every head's keys and values decompressed: (output, c, RoPE(k^R), the indexer's keys
        or None); packed ``documents`` attend within each, at positions restarting in each."""
        offset = 0 if documents is None else documents.positions
        q_nope, q_rope, c, k_rope, c_q = self._project(u, offset)
        B, L = u.shape[:2]
        kv = self.kv_b_proj(c).view(B, L, self.heads, self.nope + self.d_v).transpose(1, 2)
        k = torch.cat([kv[..., :self.nope], k_rope.expand(-1, self.heads, -1, -1)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)
        mask = None if documents is None else same_document(documents.ids)
        index_keys = None
        if self.indexer is not None:  # the keys each query reads: the indexer's choice among the earlier ones
            index_queries, weights, index_keys = self.indexer.project(u, c_q, offset)
            allowed = torch.ones(L, L, dtype=torch.bool, device=u.device).tril().unsqueeze(0)
            allowed = allowed if mask is None else allowed & mask[:, 0]
            mask = self.indexer.chosen(index_queries, weights, index_keys, allowed).unsqueeze(1)
        o = softmax_attention(q, k, kv[..., self.nope:], causal=self.causal, scale=self.scale, mask=mask)
        return self.out_proj(o.transpose(1, 2).reshape(B, L, -1)), c, k_rope, index_keys

    takes_documents = True

    def forward(self, u: Tensor, mode: str | None = None, documents: Documents | None = None) -> Tensor:
        self._checked_mode(mode)
        return self._attend(u, documents)[0]

    # -- decoding through a cache of the latent
    def init_state(self, batch: int, dtype: torch.dtype = torch.float32, device=None,
                   capacity: int | None = None) -> tuple[Tensor, ...]:
        """Empty latent cache of C positions (``max_len``, or ``capacity``: :func:`positions_held`): keys
        [c, k^R] (batch, 1, C, rank + rope), values c (batch, 1, C, rank), the (unused) decay bias (batch, H, C),
        and with an indexer its keys (batch, C, d_head)."""
        C = positions_held(self.cache_capacity, capacity)
        cache = empty_cache(batch, self.heads, 1, 1, C, self.rank + self.rope, self.rank, dtype, device)
        if self.indexer is None:
            return cache
        return cache + (torch.zeros(batch, C, self.indexer.d_head, dtype=dtype, device=device),)

    def prefill(self, u: Tensor, capacity: int | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The prompt u (B, L, d_model) -> (y (B, L, d_model), its latent cache of C positions)."""
        y, c, k_rope, index_keys = self._attend(u)
        C = positions_held(self.cache_capacity, capacity)
        check_prompt_fits(u.shape[1], C)
        bias = torch.zeros(u.shape[0], self.heads, C, dtype=u.dtype, device=u.device)  # no decay
        keys = cache_of(torch.cat([c.unsqueeze(1), k_rope], dim=-1), C).to(u.dtype)
        values = cache_of(c.unsqueeze(1), C).to(u.dtype)
        if index_keys is None:
            return y, (keys, values, bias)
        return y, (keys, values, bias, cache_of(index_keys.unsqueeze(1), C)[:, 0].to(u.dtype))

    def step(self, u_t: Tensor, state: tuple[Tensor, ...], position: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One token in the absorbed form: ``u_t`` (B, d_model), ``position`` (B,) -> (y_t, new cache)."""
        check_position_held(position, state[0].shape[2], "latent attention's cache")
        q_nope, q_rope, c, k_rope, c_q = self._project(u_t.unsqueeze(1), position)
        selected = None
        if self.indexer is not None:  # this position's indexer key into its slot, then its choice among slots 0..p
            index_keys = state[3]
            index_queries, weights, index_key = self.indexer.project(u_t.unsqueeze(1), c_q, position)
            rows = torch.arange(u_t.shape[0], device=u_t.device)
            index_keys.index_put_((rows, position), index_key[:, 0].to(index_keys.dtype))
            slots = torch.arange(index_keys.shape[1], device=u_t.device)
            allowed = (slots.view(1, 1, -1) <= position.view(-1, 1, 1))  # (B, 1, C): the slots written
            selected = self.indexer.chosen(index_queries, weights, index_keys.to(index_key.dtype), allowed)[:, 0]
        weight = self.kv_b_proj.weight.view(self.heads, self.nope + self.d_v, self.rank)
        w_uk, w_uv = weight[:, :self.nope], weight[:, self.nope:]  # (H, nope, rank), (H, d_v, rank)
        # per-head products as bmm over the heads, (H, B, .): an einsum's reshapes make export guard the batch
        q_latent = torch.bmm(q_nope[:, :, 0].transpose(0, 1), w_uk.to(q_nope.dtype)).transpose(0, 1)
        query = torch.cat([q_latent, q_rope[:, :, 0]], dim=-1)  # (B, H, rank + rope)
        key = torch.cat([c[:, 0], k_rope[:, 0, 0]], dim=-1).unsqueeze(1)  # (B, 1, rank + rope)
        o, cache = softmax_step(query, key, c[:, 0].unsqueeze(1), state[:3], position, scale=self.scale,
                                selected=selected)
        o = torch.bmm(o.transpose(0, 1), w_uv.transpose(1, 2).to(o.dtype))  # (H, B, d_v)
        return self.out_proj(torch.cat(o.unbind(0), dim=-1)), cache + state[3:]  # heads side by side: (B, H d_v)
