"""Multi-head latent attention's IR (DeepSeek-V2/V3; Kimi Linear's full-attention layers)."""

from __future__ import annotations

from typing import ClassVar, Iterator, Literal

from attnspec.spec import limits
from attnspec.spec.family import Cost, softmax_cost
from attnspec.spec.nodes import Count, Node
from attnspec.spec.mixers.base import MixerComponent


class SparseIndexer(Node):
    """DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2): each query attends only to the `topk` earlier
    positions (itself included) whose index score is highest, every key where fewer are there. The score of key s
    for query t is

        I_t,s = Σ_h w_t,h ReLU(q^I_t,h · k^I_s / sqrt(d_head)),   w_t = W_w u_t / sqrt(heads)
        q^I_t,h = RoPE(W_qI,h c^Q_t),   k^I_s = RoPE(LayerNorm(W_kI u_s))   (d_head each)

    with c^Q_t the query's normalised latent (so the mixer needs `q_rank`), the rotation on the first `rope_dim`
    channels (in halves, or `interleaved` pairs; the mixer's RoPE base and scaling), the LayerNorm with weight and bias
    (eps 1e-6). Decoding caches k^I beside the latent. The choice is not differentiable: the indexer's weights
    receive no gradient from the model's loss (DeepSeek trains them by a loss of their own)."""

    heads: Count(limits.MAX_HEADS)
    """Heads of the indexer's queries (`index_n_heads`)."""
    d_head: Count(limits.MAX_HEAD_WIDTH)
    """Width of its queries and of its one key per position (`index_head_dim`)."""
    topk: Count(limits.MAX_LEN)
    """Positions each query attends to (`index_topk`)."""
    rope_dim: Count(limits.MAX_HEAD_WIDTH) | None = None
    """Channels of the indexer's queries and keys that RoPE turns (its first ones); unset: the mixer's `rope_dim`."""
    interleaved: bool = False
    """RoPE turns adjacent pairs of those channels (GLM-MoE-DSA's indexer) rather than their two halves
    (DeepSeek-V3.2's)."""


class MlaMixer(MixerComponent):
    """Multi-head latent attention: softmax attention whose keys and values are decompressed, per head,
    from one latent per position that every head shares. From the block input u_t:

        c_t = RMSNorm(W_DKV u_t)  (kv_rank),   k^R_t = RoPE(W_KR u_t)  (rope_dim, shared by the heads)
        k_t,h = [W_UK,h c_t, k^R_t],   v_t,h = W_UV,h c_t   (d_qk = nope + rope_dim, d_v)
        q_t,h = [q^C_t,h, RoPE(q^R_t,h)] = W_UQ,h RMSNorm(W_DQ u_t)   (W_Q u_t without `q_rank`)

    The RoPE part is the last rope_dim channels of each head (`position: rope`; `none` leaves it unrotated,
    as Kimi Linear does). Decoding caches
    the latent (c_t, k^R_t), kv_rank + rope_dim numbers per position rather than heads (d_qk + d_v), and
    attends in the absorbed form: q'_h = [W_UK,h^T q^C_h, q^R_h] against [c, k^R], then W_UV,h of the
    weighted c. `qkv_bias` puts biases on W_DQ and W_DKV (DeepSeek's `attention_bias`), `out_bias` on
    the output projection."""

    kind: Literal["mla"]
    not_applicable: ClassVar[tuple[str, ...]] = ("kv_heads", "qk_groups", "qk_norm", "qk_norm_after_rope", "qkv_clip",
                                                 "query_scale_beta", "output_gate", "gate_per_head", "group_norm",
                                                 "norm_span", "norm_center", "gate_before_norm", "shared_norm_weight",
                                                 "skip", "conv")
    kv_rank: Count(limits.MAX_D_MODEL)
    """Width of the latent c_t (`kv_lora_rank`)."""
    q_rank: Count(limits.MAX_D_MODEL) | None = None
    """Width of the query's latent (`q_lora_rank`); unset: one full projection W_Q."""
    rope_dim: Count(limits.MAX_HEAD_WIDTH) = 64
    """Channels of each query and key head that carry RoPE (`qk_rope_head_dim`); the first d_qk - rope_dim
    carry none (`qk_nope_head_dim`)."""
    indexer: SparseIndexer | None = None
    """DeepSeek Sparse Attention: a lightning indexer choosing the keys each query attends to (`SparseIndexer`);
    unset: every earlier key."""

    def modes(self) -> tuple[str, ...]:
        return ("quadratic",)

    def mode_costs(self, L: int) -> dict[str, Cost]:
        return {"quadratic": softmax_cost(L, self.heads, self.d_qk or 1, self.d_v or 1)}

    @property
    def softmax_kernel(self) -> bool:
        return True

    @property
    def has_step(self) -> bool:
        return self.causal

    @property
    def decode_mode(self) -> str | None:
        return "cache" if self.causal else None

    def cache_capacity(self, max_len: int) -> int | None:
        return max_len

    def mode_problem(self, mode: str) -> str:
        return f"latent attention is softmax attention, computed quadratically; mode '{mode}' is impossible"

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        if self.position is None or self.position.kind not in ("rope", "none"):
            yield ("position",), ("latent attention's decoupled RoPE part takes `position: rope`, or `none` to "
                                  "carry it unrotated (Kimi Linear's NoPE)")
        elif self.position.kind == "rope" and self.position.rotary_fraction != 1.0:
            yield ("position", "rotary_fraction"), "the RoPE part is `rope_dim` channels: leave rotary_fraction at 1"
        if self.rope_dim % 2:
            yield ("rope_dim",), f"RoPE turns channels in pairs: rope_dim must be even, got {self.rope_dim}"
        if self.indexer is not None:
            yield from self._indexer_problems()
        if d_qk is not None and self.rope_dim >= d_qk:
            yield ("rope_dim",), (f"rope_dim {self.rope_dim} leaves no channels for the latent's keys in d_qk {d_qk}: "
                                  "d_qk is the nope part plus rope_dim")

    def _indexer_problems(self) -> Iterator[tuple[tuple, str]]:
        rope = self.indexer.rope_dim or self.rope_dim
        if self.q_rank is None:
            yield ("indexer",), "the indexer's queries read the query's latent: set `q_rank`"
        if not self.causal:
            yield ("indexer",), "the indexer chooses among earlier positions: it needs `causal: true`"
        if rope % 2 or rope > self.indexer.d_head:
            yield ("indexer", "rope_dim"), (f"the indexer's RoPE turns channel pairs within its d_head "
                                            f"{self.indexer.d_head}: an even rope_dim at most that, got {rope}")

    def describe(self) -> str:
        sparse = f", top {self.indexer.topk} keys" if self.indexer is not None else ""
        return f"mla[latent {self.kv_rank}, rope {self.rope_dim}{sparse}] {self.on_heads()}"


__all__ = ["MlaMixer", "SparseIndexer"]
