"""The chunk mode of gated linear attention as Triton kernels (GPU), forward and backward.

Per batch and head, with ``G``/``T`` the log-magnitude/phase of the decay summed from the start of
each chunk of ``BT`` positions (``G_last``/``T_last`` at the chunk's last position), ``h_c`` the
(complex) state entering chunk ``c`` and ``D_ij = exp(G_i - G_j) * cos(T_i - T_j)`` for ``j <= i``:

    o_i     = scale * (sum_{j <= i in chunk} (q_i . k_j) D_ij v_j + Re(exp(G_i + i T_i) q_i h_c))
    h_(c+1) = exp(G_last + i T_last) h_c + sum_j exp((G_last - G_j) + i (T_last - T_j)) k_j^T v_j

Four kernels, each one program per (value block, batch*head) or (chunk, batch*head):

* ``_states_forward``: walks the chunks in order and writes every entering state (float32);
* ``_output_forward``: the output of every chunk in parallel from its entering state;
* ``_states_backward``: walks the chunks backwards, writing the gradient of every leaving state;
* ``_grads_backward``: dq, dk, dv and the gradients of ``G`` and ``T`` of every chunk in parallel.

States, decays and scores are float32 whatever the input dtype (bfloat16, float16 or float32);
half-precision operands enter the matrix products in their own dtype with float32 accumulation
(as flash-linear-attention does), except the float32 states, which enter as TF32 (:func:`_state_dot`);
float32 operands as exact IEEE products. The within-chunk sums
``G`` and ``T`` come in as float64 and every difference ``G_i - G_j`` is taken in float64 before it
is narrowed, so strong decays (``G`` down to ``BT * LOG_ZERO``) lose no digits, the way the graph
path's float64 segment sums do. Gradients of ``G``/``T`` leave as per-position values; the caller's
``cumsum`` (plain torch) turns them into gradients of the per-position decays.

The kernels are registered with :func:`torch.library.triton_op`, so ``torch.compile(fullgraph=True)``
keeps them in its graph (the length stays symbolic) and ``torch.export``/AOTInductor package them.
With ``TRITON_INTERPRET=1`` (set before this module is imported) Triton runs them on the CPU through
its interpreter: slow, but exact, and that is how CI tests them without a GPU. The graph path
(:mod:`attnspec.ops.linear.chunk`) computes the same function and both are tested against the same
float64 reference.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import Tensor

from attnspec.ops.linear.backends.native import chunk_shape_problem
from attnspec.ops.linear.common import LOG_ZERO, wrap_phase
from attnspec.spec.family import KernelInputs, Regime

try:
    import triton
    import triton.language as tl
    from torch.library import triton_op, wrap_triton
except ImportError:  # the CPU-only install: the graph path serves every case
    triton = None

MAX_KEY_WIDTH = 256  # the keys of a chunk are one tile; wider keys take the graph path
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def available() -> bool:
    """Whether Triton is importable (the kernels then run on CUDA, or anywhere under its interpreter)."""
    return triton is not None


def interpreted() -> bool:
    """Whether the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(_states_forward, InterpretedFunction)


def supports(q: Tensor) -> bool:
    """Whether the kernels take inputs like ``q`` (B, H, L, Dk): a CUDA tensor (or any under the
    interpreter) of a dtype in :data:`DTYPES` with ``Dk <= MAX_KEY_WIDTH``."""
    if triton is None or q.dtype not in DTYPES or q.shape[-1] > MAX_KEY_WIDTH:
        return False
    return q.device.type == "cuda" or interpreted()


def problem(inputs: KernelInputs, regime: Regime) -> str | None:
    """Why the kernels do not run a call (None: they do): the one predicate the plan and the op ask.

    They compute the causal chunk mode with no decay or one real or complex decay per head, on CUDA,
    in float32, bfloat16 or float16, keys at most :data:`MAX_KEY_WIDTH` wide; they have a backward
    and stay inside compiled and exported programs, so training and export keep them.
    """
    shape = chunk_shape_problem(inputs)
    if shape is not None:
        return shape
    if triton is None:
        return "Triton is not installed (pip install triton)"
    if regime.device != "cuda":
        return f"it runs on CUDA, not on {regime.device}"
    if regime.dtype not in ("float32", "bfloat16", "float16"):
        return f"it takes float32, bfloat16 or float16, not {regime.dtype}"
    if inputs.key_width > MAX_KEY_WIDTH:
        return f"keys are one tile of at most {MAX_KEY_WIDTH} channels, not {inputs.key_width}"
    return None


def tile_length(chunk_size: int) -> int:
    """The kernels' chunk: ``chunk_size`` when it is a power of two in [16, 128] (a matrix-product
    tile), else 64. The chunk length changes the order of sums only, never the function."""
    return chunk_size if chunk_size in (16, 32, 64, 128) else 64


def _chunk_count(L, BT: int):
    """Chunks the kernels walk: ``ceil(L / BT) + 1``, the last all padding (a = 1, nothing written). As in
    the graph path, the extra chunk keeps the count >= 2 for every L, so compiled and exported programs
    never specialise on "one chunk", and one floor division keeps the shapes simple for sympy."""
    return (L + 2 * BT - 1) // BT


def chunked_linear_attention(q: Tensor, k: Tensor, v: Tensor, log_mag: Tensor | None, phase: Tensor | None,
                             initial_re: Tensor | None, initial_im: Tensor | None, scale: float, chunk_size: int,
                             out_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """Causal gated linear attention in chunks on the Triton kernels; differentiable in every input.

    Args:
        q, k: ``(B, H, L, Dk)``; v: ``(B, H, L, Dv)``; one dtype of :data:`DTYPES`, last dim contiguous.
        log_mag: ``(B, H, L)`` log-magnitude of one decay per head (``-inf`` resets), or None.
        phase: ``(B, H, L)`` phase of a complex decay, or None (real); needs ``log_mag``.
        initial_re, initial_im: ``(B, H, Dk, Dv)`` state before position 0 (float32), or None.
        scale: multiplier on q. chunk_size: see :func:`tile_length`.
        out_dtype: dtype of the output; default the inputs'.

    Returns:
        ``(out (B, H, L, Dv), final_re (B, H, Dk, Dv) float32, final_im or None)``.
    """
    B, H, L, Dk = q.shape
    BT = tile_length(chunk_size)
    padded = _chunk_count(L, BT) * BT
    is_complex = phase is not None
    if log_mag is not None:
        # G, T: sums of the decay from each chunk's start, in float64; padded positions have a = 1.
        chunks = lambda t: F.pad(t, [0, padded - L]).reshape(B, H, padded // BT, BT)  # noqa: E731
        G = torch.cumsum(chunks(log_mag.to(torch.float64).clamp_min(LOG_ZERO)), dim=-1).reshape(B, H, padded)
        T = None
        if phase is not None:
            T = wrap_phase(torch.cumsum(chunks(phase.to(torch.float64)), dim=-1)).reshape(B, H, padded)
    else:
        G = T = None
    if initial_re is not None and is_complex and initial_im is None:
        initial_im = torch.zeros_like(initial_re)
    out, final_re, final_im = torch.ops.attnspec.triton_chunk(
        q, k, v, G, T, None if initial_re is None else initial_re.float(),
        None if initial_im is None else initial_im.float(), float(scale), BT, out_dtype or q.dtype)
    return out, final_re, (final_im if is_complex else None)


# -- kernels ------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _dot(a, b, DT: tl.constexpr):
        """``a @ b`` with operands narrowed to the input dtype ``DT`` and float32 accumulation: exact IEEE
        products for float32 (no TF32), tensor-core products for half precision."""
        if DT == tl.float32:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a.to(DT), b.to(DT))

    @triton.jit
    def _state_dot(a, b, DT: tl.constexpr):
        """A product with a float32 state (or its gradient) as one operand: exact IEEE products for float32
        inputs, TF32 tensor-core products for half precision. The state is never narrowed to bfloat16 or
        float16: on an H100 with Triton 3.6 that product (a state tile converted in registers) gave
        outputs 70% off, growing chunk by chunk, and illegal memory accesses; TF32 keeps 10 mantissa bits
        (fp16's, above bf16's 7) and float32's range."""
        if DT == tl.float32:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32")

    @triton.jit
    def _load_tile(base, row0, rows_total, row_stride, col0, cols_total, BR: tl.constexpr, BC: tl.constexpr):
        """Rows row0.. (BR) and columns col0.. (BC) of a (rows_total, cols_total) matrix with unit column
        stride, zero outside it. (Plain pointers: block pointers are gone from recent Triton.)"""
        rows, cols = row0 + tl.arange(0, BR), col0 + tl.arange(0, BC)
        mask = (rows[:, None] < rows_total) & (cols[None, :] < cols_total)
        return tl.load(base + rows[:, None] * row_stride + cols[None, :], mask=mask, other=0.0)

    @triton.jit
    def _store_tile(base, value, row0, rows_total, row_stride, col0, cols_total, BR: tl.constexpr,
                    BC: tl.constexpr):
        """Store ``value`` (BR, BC) where :func:`_load_tile` reads, in the destination's dtype."""
        rows, cols = row0 + tl.arange(0, BR), col0 + tl.arange(0, BC)
        mask = (rows[:, None] < rows_total) & (cols[None, :] < cols_total)
        tl.store(base + rows[:, None] * row_stride + cols[None, :], value.to(base.dtype.element_ty), mask=mask)

    @triton.jit
    def _state_tiles(re_ptr, im_ptr, start, offsets, mask, BK: tl.constexpr, BV: tl.constexpr,
                     PRESENT: tl.constexpr, IS_COMPLEX: tl.constexpr):
        """A (BK, BV) float32 tile of a state pair (re, im) at ``start + offsets``; zeros where absent."""
        re = tl.zeros([BK, BV], dtype=tl.float32)
        im = tl.zeros([BK, BV], dtype=tl.float32)
        if PRESENT:
            re += tl.load(re_ptr + start + offsets, mask=mask, other=0.0)
            if IS_COMPLEX:
                im += tl.load(im_ptr + start + offsets, mask=mask, other=0.0)
        return re, im

    @triton.jit
    def _store_state_tiles(re_ptr, im_ptr, start, offsets, mask, re, im, IS_COMPLEX: tl.constexpr):
        """Store the tiles of :func:`_state_tiles` (the imaginary one for complex states only)."""
        tl.store(re_ptr + start + offsets, re, mask=mask)
        if IS_COMPLEX:
            tl.store(im_ptr + start + offsets, im, mask=mask)

    @triton.jit
    def _in_chunk_sums(ptr, start, BT: tl.constexpr, PRESENT: tl.constexpr):
        """One of G, T for a chunk, as float32 values of float64 differences: from the chunk's start to each
        position, from each position to the chunk's end, and across the chunk. Zeros when absent."""
        if PRESENT:
            sums = tl.load(ptr + start + tl.arange(0, BT))
            last = tl.load(ptr + start + BT - 1)
            return sums.to(tl.float32), (last - sums).to(tl.float32), last.to(tl.float32)
        zeros = tl.zeros([BT], dtype=tl.float32)
        return zeros, zeros, tl.sum(zeros, axis=0)

    @triton.jit
    def _chunk_decays(G_ptr, T_ptr, start, BT: tl.constexpr, HAS_DECAY: tl.constexpr, IS_COMPLEX: tl.constexpr):
        """The chunk's log-magnitudes (g from its start, g_end to its end, g_last across it) and phases
        (t, t_end, t_last), see :func:`_in_chunk_sums`. Without a decay all are 0."""
        g, g_end, g_last = _in_chunk_sums(G_ptr, start, BT, HAS_DECAY)
        t, t_end, t_last = _in_chunk_sums(T_ptr, start, BT, IS_COMPLEX)
        return g, g_end, g_last, t, t_end, t_last

    @triton.jit
    def _pair_decays(G_ptr, T_ptr, start, BT: tl.constexpr, HAS_DECAY: tl.constexpr, IS_COMPLEX: tl.constexpr):
        """Within-chunk pair decays for j <= i (0 above the diagonal): magnitude exp(G_i - G_j) times cos and
        sin of T_i - T_j, each (BT, BT) float32, differences taken in float64."""
        o_t = tl.arange(0, BT)
        causal = o_t[:, None] >= o_t[None, :]
        if HAS_DECAY:
            G = tl.load(G_ptr + start + o_t)
            diff = (G[:, None] - G[None, :]).to(tl.float32)
            mag = tl.where(causal, tl.exp(tl.where(causal, diff, 0.0)), 0.0)
        else:
            mag = tl.where(causal, 1.0, 0.0)
        if IS_COMPLEX:
            T = tl.load(T_ptr + start + o_t)
            angle = (T[:, None] - T[None, :]).to(tl.float32)
            return mag * tl.cos(angle), mag * tl.sin(angle)
        return mag, mag * 0.0

    @triton.jit
    def _states_forward(k, v, G, T, h0_re, h0_im, states_re, states_im, final_re, final_im,
                        L, n_chunks, s_kb, s_kh, s_kl, s_vb, s_vh, s_vl,
                        H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                        BV: tl.constexpr, DT: tl.constexpr, HAS_DECAY: tl.constexpr, IS_COMPLEX: tl.constexpr,
                        HAS_INITIAL: tl.constexpr):
        """Program (value block, b*H + h): every chunk's entering state into ``states`` (B*H, n, K, V)
        and the state after the last position into ``final`` (B*H, K, V), float32."""
        i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)  # int64: offsets pass 2^31 at 32K x 128
        i_b, i_h = i_bh // H, i_bh % H
        o_k, o_v = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
        kv_mask = (o_k[:, None] < K) & (o_v[None, :] < V)
        kv_offsets = o_k[:, None] * V + o_v[None, :]
        h_re, h_im = _state_tiles(h0_re, h0_im, i_bh * K * V, kv_offsets, kv_mask, BK, BV, HAS_INITIAL, IS_COMPLEX)
        seq = i_bh * n_chunks * BT
        for c in range(0, n_chunks):
            at = (i_bh * n_chunks + c) * K * V
            _store_state_tiles(states_re, states_im, at, kv_offsets, kv_mask, h_re, h_im, IS_COMPLEX)
            b_k = _load_tile(k + i_b * s_kb + i_h * s_kh, c * BT, L, s_kl, 0, K, BT, BK)
            b_v = _load_tile(v + i_b * s_vb + i_h * s_vh, c * BT, L, s_vl, i_v * BV, V, BT, BV)
            g, g_end, g_last, t, t_end, t_last = _chunk_decays(G + seq, T + seq, c * BT, BT, HAS_DECAY, IS_COMPLEX)
            across = tl.exp(g_last)
            to_end = tl.exp(g_end)
            if IS_COMPLEX:
                cos_last, sin_last = tl.cos(t_last), tl.sin(t_last)
                re = across * (cos_last * h_re - sin_last * h_im)
                im = across * (sin_last * h_re + cos_last * h_im)
                k_cos = b_k * (to_end * tl.cos(t_end))[:, None]
                k_sin = b_k * (to_end * tl.sin(t_end))[:, None]
                h_re = re + _dot(tl.trans(k_cos), b_v, DT)
                h_im = im + _dot(tl.trans(k_sin), b_v, DT)
            else:
                h_re = across * h_re + _dot(tl.trans(b_k * to_end[:, None]), b_v, DT)
        _store_state_tiles(final_re, final_im, i_bh * K * V, kv_offsets, kv_mask, h_re, h_im, IS_COMPLEX)

    @triton.jit
    def _output_forward(q, k, v, G, T, states_re, states_im, out, scale,
                        L, n_chunks, s_qb, s_qh, s_ql, s_vb, s_vh, s_vl,
                        H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                        BV: tl.constexpr, DT: tl.constexpr, HAS_DECAY: tl.constexpr, IS_COMPLEX: tl.constexpr):
        """Program (value block, chunk, b*H + h): the chunk's output, within-chunk part plus the entering
        state read by the decayed queries. ``k`` shares ``q``'s strides; ``out`` is contiguous."""
        i_v, c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        i_b, i_h = i_bh // H, i_bh % H
        b_q = _load_tile(q + i_b * s_qb + i_h * s_qh, c * BT, L, s_ql, 0, K, BT, BK)
        b_k = _load_tile(k + i_b * s_qb + i_h * s_qh, c * BT, L, s_ql, 0, K, BT, BK)
        b_v = _load_tile(v + i_b * s_vb + i_h * s_vh, c * BT, L, s_vl, i_v * BV, V, BT, BV)
        seq = i_bh * n_chunks * BT
        g, g_end, g_last, t, t_end, t_last = _chunk_decays(G + seq, T + seq, c * BT, BT, HAS_DECAY, IS_COMPLEX)
        pair_cos, pair_sin = _pair_decays(G + seq, T + seq, c * BT, BT, HAS_DECAY, IS_COMPLEX)
        scores = _dot(b_q, tl.trans(b_k), DT) * pair_cos
        b_o = _dot(scores, b_v, DT)
        o_k, o_v = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
        kv_mask = (o_k[:, None] < K) & (o_v[None, :] < V)
        at = (i_bh * n_chunks + c) * K * V + o_k[:, None] * V + o_v[None, :]
        h_re = tl.load(states_re + at, mask=kv_mask, other=0.0)
        from_start = tl.exp(g)
        if IS_COMPLEX:
            h_im = tl.load(states_im + at, mask=kv_mask, other=0.0)
            q_re = b_q * (from_start * tl.cos(t))[:, None]
            q_im = b_q * (from_start * tl.sin(t))[:, None]
            b_o += _state_dot(q_re, h_re, DT) - _state_dot(q_im, h_im, DT)
        else:
            b_o += _state_dot(b_q * from_start[:, None], h_re, DT)
        _store_tile(out + i_bh * L * V, b_o * scale, c * BT, L, V, i_v * BV, V, BT, BV)

    @triton.jit
    def _states_backward(q, do, G, T, dfinal_re, dfinal_im, dstates_re, dstates_im, dh0_re, dh0_im, scale,
                         L, n_chunks, s_qb, s_qh, s_ql, s_db, s_dh, s_dl,
                         H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                         BV: tl.constexpr, DT: tl.constexpr, HAS_DECAY: tl.constexpr, IS_COMPLEX: tl.constexpr,
                         HAS_DFINAL: tl.constexpr):
        """Program (value block, b*H + h): the gradient of every chunk's leaving state into ``dstates``
        (B*H, n, K, V), walking backwards, and the gradient of the initial state into ``dh0``."""
        i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)  # int64: offsets pass 2^31 at 32K x 128
        i_b, i_h = i_bh // H, i_bh % H
        o_k, o_v = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
        kv_mask = (o_k[:, None] < K) & (o_v[None, :] < V)
        kv_offsets = o_k[:, None] * V + o_v[None, :]
        dh_re, dh_im = _state_tiles(dfinal_re, dfinal_im, i_bh * K * V, kv_offsets, kv_mask, BK, BV, HAS_DFINAL,
                                    IS_COMPLEX)
        seq = i_bh * n_chunks * BT
        for back in range(0, n_chunks):
            c = n_chunks - 1 - back
            at = (i_bh * n_chunks + c) * K * V
            _store_state_tiles(dstates_re, dstates_im, at, kv_offsets, kv_mask, dh_re, dh_im, IS_COMPLEX)
            b_q = _load_tile(q + i_b * s_qb + i_h * s_qh, c * BT, L, s_ql, 0, K, BT, BK)
            b_do = _load_tile(do + i_b * s_db + i_h * s_dh, c * BT, L, s_dl, i_v * BV, V, BT, BV)
            g, g_end, g_last, t, t_end, t_last = _chunk_decays(G + seq, T + seq, c * BT, BT, HAS_DECAY, IS_COMPLEX)
            across = tl.exp(g_last)
            from_start = tl.exp(g) * scale
            if IS_COMPLEX:  # the transpose of the rotation by exp(G_last + i T_last), then the outputs' reads
                cos_last, sin_last = tl.cos(t_last), tl.sin(t_last)
                re = across * (cos_last * dh_re + sin_last * dh_im)
                im = across * (cos_last * dh_im - sin_last * dh_re)
                q_cos = b_q * (from_start * tl.cos(t))[:, None]
                q_sin = b_q * (from_start * tl.sin(t))[:, None]
                dh_re = re + _dot(tl.trans(q_cos), b_do, DT)
                dh_im = im - _dot(tl.trans(q_sin), b_do, DT)
            else:
                dh_re = across * dh_re + _dot(tl.trans(b_q * from_start[:, None]), b_do, DT)
        _store_state_tiles(dh0_re, dh0_im, i_bh * K * V, kv_offsets, kv_mask, dh_re, dh_im, IS_COMPLEX)

    @triton.jit
    def _grads_backward(q, k, v, do, G, T, states_re, states_im, dstates_re, dstates_im, final_re, final_im,
                        dq, dk, dv, dG, dT, scale,
                        L, n_chunks, s_qb, s_qh, s_ql, s_vb, s_vh, s_vl, s_db, s_dh, s_dl,
                        H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                        BV: tl.constexpr, DT: tl.constexpr, HAS_DECAY: tl.constexpr, IS_COMPLEX: tl.constexpr):
        """Program (chunk, b*H + h): dq, dk (contiguous like q), dv (contiguous like v), and the gradients of
        the within-chunk sums G and T (B*H, n*BT) float32.

        With dA_ij = do_i . v_j, P = pair decays (cos and sin parts), h / h' the entering / leaving state
        and dh' the leaving state's gradient:
          dq_i = scale (sum_j dA_ij P^cos_ij k_j + Re-part of exp(G_i + i T_i) do_i h^T)
          dk_j = scale sum_i dA_ij P^cos_ij q_i + exp(G_last - G_j) (cos v_j dh'_re^T + sin v_j dh'_im^T)
          dv_j = scale sum_i P^cos_ij (q_i . k_j) do_i + exp(G_last - G_j) (cos k_j dh'_re + sin k_j dh'_im)
        and the decays' gradients collect, per position, every term its exponent appears in.
        """
        c, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
        i_b, i_h = i_bh // H, i_bh % H
        o_t = tl.arange(0, BT)
        o_k = tl.arange(0, BK)
        b_q = _load_tile(q + i_b * s_qb + i_h * s_qh, c * BT, L, s_ql, 0, K, BT, BK)
        b_k = _load_tile(k + i_b * s_qb + i_h * s_qh, c * BT, L, s_ql, 0, K, BT, BK)
        seq = i_bh * n_chunks * BT
        g, g_end, g_last, t, t_end, t_last = _chunk_decays(G + seq, T + seq, c * BT, BT, HAS_DECAY, IS_COMPLEX)
        pair_cos, pair_sin = _pair_decays(G + seq, T + seq, c * BT, BT, HAS_DECAY, IS_COMPLEX)
        qk = _dot(b_q, tl.trans(b_k), DT)  # (BT, BT) q_i . k_j
        scores = qk * pair_cos * scale
        end_cos = tl.exp(g_end)
        end_sin = end_cos * 0.0
        if IS_COMPLEX:
            end_sin = end_cos * tl.sin(t_end)
            end_cos = end_cos * tl.cos(t_end)
        d_scores = tl.zeros([BT, BT], dtype=tl.float32)  # dA_ij
        read_re = tl.zeros([BT, BK], dtype=tl.float32)  # do_i h_re^T
        read_im = tl.zeros([BT, BK], dtype=tl.float32)
        write_re = tl.zeros([BT, BK], dtype=tl.float32)  # v_j dh'_re^T
        write_im = tl.zeros([BT, BK], dtype=tl.float32)
        leave = tl.sum(tl.zeros([BT], dtype=tl.float32), axis=0)  # <dh', h'>
        leave_rot = leave  # <dh'_im, h'_re> - <dh'_re, h'_im>
        for i_v in range(0, tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            kv_mask = (o_k[:, None] < K) & (o_v[None, :] < V)
            kv_at = o_k[:, None] * V + o_v[None, :]
            at = (i_bh * n_chunks + c) * K * V + kv_at
            b_v = _load_tile(v + i_b * s_vb + i_h * s_vh, c * BT, L, s_vl, i_v * BV, V, BT, BV)
            b_do = _load_tile(do + i_b * s_db + i_h * s_dh, c * BT, L, s_dl, i_v * BV, V, BT, BV)
            h_re = tl.load(states_re + at, mask=kv_mask, other=0.0)
            dh_re = tl.load(dstates_re + at, mask=kv_mask, other=0.0)
            d_scores += _dot(b_do, tl.trans(b_v), DT)
            read_re += _state_dot(b_do, tl.trans(h_re), DT)
            write_re += _state_dot(b_v, tl.trans(dh_re), DT)
            b_dv = _dot(tl.trans(scores), b_do, DT) + _state_dot(b_k * end_cos[:, None], dh_re, DT)
            if HAS_DECAY:  # the leaving state: the next chunk's entering one, or the final state
                if c == n_chunks - 1:
                    after_re = tl.load(final_re + i_bh * K * V + kv_at, mask=kv_mask, other=0.0)
                else:
                    after_re = tl.load(states_re + at + K * V, mask=kv_mask, other=0.0)
                leave += tl.sum(tl.sum(dh_re * after_re, axis=1), axis=0)
            if IS_COMPLEX:
                h_im = tl.load(states_im + at, mask=kv_mask, other=0.0)
                dh_im = tl.load(dstates_im + at, mask=kv_mask, other=0.0)
                read_im += _state_dot(b_do, tl.trans(h_im), DT)
                write_im += _state_dot(b_v, tl.trans(dh_im), DT)
                b_dv += _state_dot(b_k * end_sin[:, None], dh_im, DT)
                if c == n_chunks - 1:
                    after_im = tl.load(final_im + i_bh * K * V + kv_at, mask=kv_mask, other=0.0)
                else:
                    after_im = tl.load(states_im + at + K * V, mask=kv_mask, other=0.0)
                leave += tl.sum(tl.sum(dh_im * after_im, axis=1), axis=0)
                leave_rot += tl.sum(tl.sum(dh_im * after_re - dh_re * after_im, axis=1), axis=0)
            _store_tile(dv + i_bh * L * V, b_dv, c * BT, L, V, i_v * BV, V, BT, BV)

        start_cos = tl.exp(g) * scale
        start_sin = start_cos * 0.0
        if IS_COMPLEX:
            start_sin = start_cos * tl.sin(t)
            start_cos = start_cos * tl.cos(t)
        weighted = d_scores * pair_cos * scale  # dA_ij P^cos_ij scale
        b_dq = _dot(weighted, b_k, DT) + read_re * start_cos[:, None]
        b_dk = _dot(tl.trans(weighted), b_q, DT) + write_re * end_cos[:, None]
        if IS_COMPLEX:
            b_dq -= read_im * start_sin[:, None]
            b_dk += write_im * end_sin[:, None]
        _store_tile(dq + i_bh * L * K, b_dq, c * BT, L, K, 0, K, BT, BK)
        _store_tile(dk + i_bh * L * K, b_dk, c * BT, L, K, 0, K, BT, BK)

        if HAS_DECAY:
            b_qf = b_q.to(tl.float32)
            b_kf = b_k.to(tl.float32)
            read_q_re = tl.sum(b_qf * read_re, axis=1)  # do_i . (q_i h_re)
            write_k_re = tl.sum(b_kf * write_re, axis=1)  # (k_j dh'_re) . v_j
            within = d_scores * scores  # dA_ij scale (q_i.k_j) P^cos_ij: G_i gains it, G_j loses it
            d_g = tl.sum(within, axis=1) - tl.sum(within, axis=0)
            d_g += read_q_re * start_cos - write_k_re * end_cos
            if IS_COMPLEX:
                read_q_im = tl.sum(b_qf * read_im, axis=1)
                write_k_im = tl.sum(b_kf * write_im, axis=1)
                d_g += -read_q_im * start_sin - write_k_im * end_sin
                turned = d_scores * qk * pair_sin * scale  # dA_ij scale (q_i.k_j) P^sin_ij: T_i loses it, T_j gains it
                d_t = tl.sum(turned, axis=0) - tl.sum(turned, axis=1)
                d_t += -read_q_re * start_sin - read_q_im * start_cos
                d_t -= -write_k_re * end_sin + write_k_im * end_cos
                d_t += tl.where(o_t == BT - 1, leave_rot, 0.0)
                tl.store(dT + seq + c * BT + o_t, d_t)
            d_g += tl.where(o_t == BT - 1, leave, 0.0)
            tl.store(dG + seq + c * BT + o_t, d_g)

    def _meta(q: Tensor, v: Tensor, BT: int) -> dict:
        """Compile-time arguments of every kernel: sizes, tiles and ``DT``, the operand dtype of the
        matrix products. Triton's interpreter multiplies bfloat16 operands as raw 16-bit integers (numpy
        has no bfloat16), so there bfloat16 inputs multiply in float32, more exactly than on a GPU."""
        K, V = q.shape[-1], v.shape[-1]
        operand = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[q.dtype]
        if operand == tl.bfloat16 and interpreted():
            operand = tl.float32
        BK = max(16, triton.next_power_of_2(K))
        # a (BT, BK) float32 tile per accumulator: eight warps spread wide keys' tiles over more registers
        return dict(H=q.shape[1], K=K, V=V, BT=BT, BK=BK, BV=min(64, max(16, triton.next_power_of_2(V))), DT=operand,
                    num_warps=8 if BK >= 128 else 4)

    def _given(t: Tensor | None, stand_in: Tensor) -> Tensor:
        """``t``, or ``stand_in`` where it is absent: the kernels never read a pointer their flags say is
        absent, but every pointer argument must be a tensor."""
        return stand_in if t is None else t

    def _row_major(t: Tensor) -> Tensor:
        """``t`` with a unit stride in its last dimension (the kernels' block pointers need it)."""
        return t if t.stride(-1) == 1 else t.contiguous()

    def _states(k, v, G, T, h0_re, h0_im, BT):
        """Entering states (B*H, n, K, V) of every chunk and the final state, float32 (re, im or None)."""
        B, H, L, K = k.shape
        V = v.shape[-1]
        n = _chunk_count(L, BT)
        meta = _meta(k, v, BT)
        is_complex = T is not None
        states_re = k.new_empty(B, H, n, K, V, dtype=torch.float32)
        states_im = torch.empty_like(states_re) if is_complex else states_re
        final_re = k.new_empty(B, H, K, V, dtype=torch.float32)
        final_im = torch.empty_like(final_re) if is_complex else k.new_empty(0, dtype=torch.float32)
        grid = (triton.cdiv(V, meta["BV"]), B * H)
        wrap_triton(_states_forward)[grid](
            k, v, _given(G, k), _given(T, k), _given(h0_re, k), _given(h0_im, k), states_re, states_im, final_re,
            final_im if is_complex else final_re,
            L, n, k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            HAS_DECAY=G is not None, IS_COMPLEX=is_complex, HAS_INITIAL=h0_re is not None, **meta)
        return states_re, states_im, final_re, final_im

    @triton_op("attnspec::triton_chunk", mutates_args={})
    def _forward_op(q: Tensor, k: Tensor, v: Tensor, G: Tensor | None, T: Tensor | None, h0_re: Tensor | None,
                    h0_im: Tensor | None, scale: float, BT: int, out_dtype: torch.dtype
                    ) -> tuple[Tensor, Tensor, Tensor]:
        """Output (B, H, L, V) in ``out_dtype``, final state re and im (im empty for real decays)."""
        q, k, v = _row_major(q), _row_major(k), _row_major(v)
        if k.stride() != q.stride():
            k = k.contiguous()
            q = q.contiguous()
        B, H, L, K = q.shape
        V = v.shape[-1]
        n = _chunk_count(L, BT)
        states_re, states_im, final_re, final_im = _states(k, v, G, T, h0_re, h0_im, BT)
        out = q.new_empty(B, H, L, V, dtype=out_dtype)
        meta = _meta(q, v, BT)
        grid = (triton.cdiv(V, meta["BV"]), n, B * H)
        wrap_triton(_output_forward)[grid](
            q, k, v, _given(G, q), _given(T, q), states_re, states_im, out, scale, L, n,
            q.stride(0), q.stride(1), q.stride(2), v.stride(0), v.stride(1), v.stride(2),
            HAS_DECAY=G is not None, IS_COMPLEX=T is not None, **meta)
        return out, final_re, final_im

    @triton_op("attnspec::triton_chunk_backward", mutates_args={})
    def _backward_op(q: Tensor, k: Tensor, v: Tensor, G: Tensor | None, T: Tensor | None, h0_re: Tensor | None,
                     h0_im: Tensor | None, do: Tensor, dfinal_re: Tensor | None, dfinal_im: Tensor | None,
                     scale: float, BT: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """dq, dk, dv (input dtype), dG, dT (float64, like G and T; empty without them), dh0 re and im."""
        q, k, v, do = _row_major(q), _row_major(k), _row_major(v), _row_major(do)
        if k.stride() != q.stride():
            k = k.contiguous()
            q = q.contiguous()
        B, H, L, K = q.shape
        V = v.shape[-1]
        n = _chunk_count(L, BT)
        is_complex = T is not None
        meta = _meta(q, v, BT)
        states_re, states_im, final_re, final_im = _states(k, v, G, T, h0_re, h0_im, BT)  # recomputed, not kept
        dstates_re = torch.empty_like(states_re)
        dstates_im = torch.empty_like(states_re) if is_complex else dstates_re
        dh0_re = torch.empty_like(final_re)
        dh0_im = torch.empty_like(final_re) if is_complex else q.new_empty(0, dtype=torch.float32)
        wrap_triton(_states_backward)[(triton.cdiv(V, meta["BV"]), B * H)](
            q, do, _given(G, q), _given(T, q), _given(dfinal_re, q), _given(dfinal_im, q), dstates_re, dstates_im,
            dh0_re, dh0_im if is_complex else dh0_re,
            scale, L, n, q.stride(0), q.stride(1), q.stride(2), do.stride(0), do.stride(1), do.stride(2),
            HAS_DECAY=G is not None, IS_COMPLEX=is_complex, HAS_DFINAL=dfinal_re is not None, **meta)
        dq = torch.empty(B, H, L, K, dtype=q.dtype, device=q.device)
        dk = torch.empty_like(dq)
        dv = torch.empty(B, H, L, V, dtype=v.dtype, device=v.device)
        dG = q.new_empty(B, H, n * BT, dtype=torch.float32) if G is not None else q.new_empty(0, dtype=torch.float32)
        dT = q.new_empty(B, H, n * BT, dtype=torch.float32) if is_complex else q.new_empty(0, dtype=torch.float32)
        wrap_triton(_grads_backward)[(n, B * H)](
            q, k, v, do, _given(G, q), _given(T, q), states_re, states_im, dstates_re, dstates_im, final_re,
            final_im if is_complex else final_re, dq, dk, dv, dG, dT, scale, L, n,
            q.stride(0), q.stride(1), q.stride(2), v.stride(0), v.stride(1), v.stride(2),
            do.stride(0), do.stride(1), do.stride(2),
            HAS_DECAY=G is not None, IS_COMPLEX=is_complex, **meta)
        return dq, dk, dv, dG.double(), dT.double(), dh0_re, dh0_im

    def _setup_context(ctx, inputs, output):
        q, k, v, G, T, h0_re, h0_im, scale, BT, out_dtype = inputs
        ctx.save_for_backward(q, k, v, G, T, h0_re, h0_im)
        ctx.scale, ctx.BT = scale, BT
        ctx.flags = (G is not None, T is not None, h0_re is not None, h0_im is not None)

    def _backward(ctx, d_out, d_final_re, d_final_im):
        q, k, v, G, T, h0_re, h0_im = ctx.saved_tensors
        has_g, has_t, has_h0, has_h0_im = ctx.flags
        is_complex = has_t
        if d_final_re is not None and is_complex and d_final_im is None:
            d_final_im = torch.zeros_like(d_final_re)
        if d_final_im is not None and d_final_re is None:
            d_final_re = torch.zeros_like(d_final_im)
        dq, dk, dv, dG, dT, dh0_re, dh0_im = torch.ops.attnspec.triton_chunk_backward(
            q, k, v, G if has_g else None, T if has_t else None, h0_re if has_h0 else None,
            h0_im if has_h0_im else None, d_out.to(q.dtype), d_final_re,
            d_final_im if is_complex else None, ctx.scale, ctx.BT)
        return (dq, dk, dv, dG if has_g else None, dT if has_t else None, dh0_re if has_h0 else None,
                (dh0_im if has_h0_im else None), None, None, None)

    _forward_op.register_autograd(_backward, setup_context=_setup_context)
