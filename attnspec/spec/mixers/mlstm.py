"""The mLSTM's IR: xLSTM's matrix-memory cell with exponential input gates (Beck et al. 2024; xLSTM 7B)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Iterator, Literal

from pydantic import Field

from attnspec.spec.family import Backend, Cost, GRAPH, KernelInputs, NATIVE_CPU, TRITON
from attnspec.spec.nodes import PositiveFloat
from attnspec.spec.mixers.base import MixerComponent, OutputGate, _linear_family_costs


class MlstmMixer(MixerComponent):
    """The mLSTM cell, per head, from the block input x_t (q, k, v the shared projections and convolutions):

        i_t = cap(w_i x_t + b_i),  f_t = cap(w_f x_t + b_f)      (one of each per head; cap: `gate_softcap`)
        C_t = σ(f_t) C_(t-1) + exp(i_t) k_t v_tᵀ,   n_t = σ(f_t) n_(t-1) + exp(i_t) k_t
        m_t = max(log σ(f_t) + m_(t-1), i_t),  m_0 = 0        (the max state of the stabilised form)
        h_t = s q_t C_t / (max(|s q_t · n_t|, 1) + eps exp(m_t)),  s = `scale` (1/sqrt(d_qk) unset)

    then a LayerNorm per head (`group_norm` with `norm_center`), the sigmoid output gate and the output
    projection. This is the stabilised cell of the paper exactly: its C, n are the ones here times
    exp(-m_t), and the ratio is unchanged but for eps, which the stabilised form adds at that scale
    (hence eps exp(m_t)). With the input gate capped (|i_t| <= `gate_softcap` <= 30, so exp(i_t) <= e^30),
    C and n are gated linear attention of keys exp(i_t) k_t with a decay σ(f_t) per head and the values
    [v_t, 1]: every mode of the linear family computes them, and m_t is a cumulative max,
    m_t = b_t + max(0, max_(j<=t) (i_j - b_j)) with b_t = Σ_(r<=t) log σ(f_r). The decoding state is C
    with n beside it (d_qk x (d_v + 1) per head), m per head, and the convolutions' last inputs."""

    projects_input: ClassVar[bool] = True
    kind: Literal["mlstm"]
    gate_softcap: Annotated[float, Field(gt=0, le=30)] = 15.0
    """The soft cap of both gates' pre-activations, cap tanh(x / cap) (xLSTM 7B's `gate_soft_cap`): it
    bounds exp(i_t), which the un-stabilised sums rely on (at most e^30, far inside float32)."""
    eps: PositiveFloat = 1e-6
    """Added to the stabilised denominator max(|q · n| e^(-m), e^(-m)) (the paper's, and xLSTM 7B's `eps`)."""
    output_gate: OutputGate = "sigmoid"
    group_norm: bool = True
    norm_center: bool = True

    def modes(self) -> tuple[str, ...]:
        return ("chunk", "recurrent", "scan", "quadratic")

    def mode_costs(self, L: int) -> dict[str, Cost]:
        return _linear_family_costs(self, L, (self.d_v or 1) + 1, None)  # values and the normaliser's column

    def backends(self, mode: str) -> tuple[Backend, ...]:
        return (TRITON, NATIVE_CPU, GRAPH) if mode == "chunk" else (GRAPH,)

    def kernel_inputs(self, mode: str) -> KernelInputs:
        return KernelInputs(mode, self.causal, "head", self.d_qk)

    @property
    def has_step(self) -> bool:
        return True

    @property
    def softmax_temperature(self) -> bool:
        return True  # s = 1/sqrt(d_qk), as the paper and xLSTM 7B scale q

    def problems(self, *, max_len: int, d_qk: int | None) -> Iterator[tuple[tuple, str]]:
        yield from super().problems(max_len=max_len, d_qk=d_qk)
        if not self.causal:
            yield ("causal",), "the mLSTM's gates are a recurrence in position order: it needs `causal: true`"

    def describe(self) -> str:
        return f"mlstm[gates capped at {self.gate_softcap:g}] {self.on_heads()}"


__all__ = ["MlstmMixer"]
